"""The ``dit`` testbed: the flow-matching DiT on the embedded shapes; the flow-matching loss
(MSE of the velocity) on batches whose labels are dropped to the null class with probability
``dit.label_dropout``; validation on fixed (x1, label, x0, t) triples with the true labels;
summary ``final_val_loss``, ``best_val_loss`` and, from the samples a finished run generates
with classifier-free guidance at ``dit.cfg_scale`` (:meth:`DiTTestbed.finish`),
``final_sample_sw2`` and the scale used, ``sample_cfg_scale``; the first samples are kept in the
run folder's ``samples.npy``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator
from rich.console import Console
from torch import nn

from normlab._resources import check_fits
from normlab.data.shapes import balanced_selection, load_shapes, prepare_shapes, unpatchify
from normlab.experiment.measure.evaluate import flow_validation_loss, generate_samples
from normlab.experiment.measure.posttrain import BFloat16Inputs, posttrain_summary
from normlab.experiment.testbeds.base import (
    Experiment,
    TestbedConfig,
    check_fingerprint,
    data_seed,
    init_seed,
)
from normlab.models import (
    DiT,
    DiTConfig,
    DiTSettings,
    build_dit,
    check_dit_norm,
    flow_matching_loss,
    interpolate,
    sliced_wasserstein2,
)
from normlab.models.config import ConfigModel
from normlab.models.flow_batches import FlowBatches, flow_seed, sample_inputs, validation_triples
from normlab.models.sample_metrics import sample_quality
from normlab.run_format import testbed_format
from normlab.run_format.folder import write_images

__all__ = [
    "DIT_DEFAULT_NORMS",
    "DIT_TRAIN_DEFAULTS",
    "SAMPLE_BATCH",
    "SAMPLE_GRID",
    "SAMPLE_STEPS",
    "SW2_PROJECTIONS",
    "DiTTestbed",
    "ShapesSettings",
    "dit_config",
    "dit_parameter_groups",
]

DIT_DEFAULT_NORMS = ("adaln_zero", "adarms")
"""The DiT testbed's norms when a config gives none: its conditional norms."""
DIT_TRAIN_DEFAULTS: dict[str, Any] = {
    "steps": 2400,
    "batch_size": 32,
    "lr": 3e-3,
    "weight_decay": 0.0,
    "target_val_loss": 0.3,
}
"""The DiT testbed's defaults for the ``train`` keys a config leaves out, where they differ from
the GPT's: 2400 steps of 32 images at a peak learning rate of 3e-3 (the budget at which the
end-of-run samples are recognisable shapes, about 0.9 of them of the requested class, while
the default 2 arms x 3 seeds stay within a few minutes on 2 CPU cores), no weight decay (as
DiT), and a target in the unit of its validation loss (the flow-matching MSE, about 1.9 at
initialisation)."""
SAMPLE_STEPS = 32
"""Euler steps of the samples a finished DiT run generates."""
SAMPLE_BATCH = 256
"""Samples generated at a time."""
SW2_PROJECTIONS = 256
"""Random unit projections of the sliced Wasserstein-2 distance ``final_sample_sw2``."""
SAMPLE_GRID = 16
"""The first generated images kept in ``samples.npy`` (4 per class with the 4 shape classes)."""


class ShapesSettings(ConfigModel):
    """The DiT testbed's embedded data (:mod:`normlab.data.shapes`), the ``shapes`` section:
    ``n_train`` and ``n_val`` disjoint grayscale images of ``image_size`` × ``image_size``
    pixels, made from ``seed``, cut into ``patch_size`` × ``patch_size`` patches:
    T = (image_size / patch_size)² tokens of patch_size² channels each."""

    image_size: int = Field(16, ge=4, le=256)
    patch_size: int = Field(4, ge=1)
    n_train: int = Field(4096, ge=1)
    n_val: int = Field(512, ge=1)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _patch_divides(self) -> ShapesSettings:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size {self.patch_size} does not divide image_size {self.image_size}"
            )
        return self

    @property
    def seq_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def in_channels(self) -> int:
        return self.patch_size**2


def check_dit_config(cfg: Experiment) -> None:
    """The DiT is pre-norm only: its conditional norms modulate the input of each sublayer and
    gate its output."""
    if cfg.placements != ["pre"]:
        others = ", ".join(p for p in cfg.placements if p != "pre") or "pre twice"
        raise ValueError(
            f"placements: the dit testbed is pre-norm only (its conditional norms modulate "
            f"the input of each sublayer and gate its output); got {others}. Expected: pre"
        )


def dit_config(spec: dict[str, Any]) -> DiTConfig:
    """The DiT of a resolved DiT run config: its ``dit`` section on the token shapes of its
    ``shapes`` section, with a label per class of its data (``data.classes``) when
    ``dit.class_conditional``, and its ``norm``."""
    shapes = ShapesSettings(**spec["shapes"])
    return DiTSettings(**spec["dit"]).dit_config(
        shapes.in_channels, shapes.seq_len, len(spec["data"]["classes"]), spec["norm"]
    )


def dit_parameter_groups(model: DiT) -> dict[str, list[str]]:
    """Parameter names grouped for per-layer gradient norms, as the GPT's groups:
    ``embed`` (tokens, positions, time and label embeddings), ``block{i}.attn``,
    ``block{i}.mlp``, ``block{i}.norms`` (their modulation), ``norm_final``, ``head``."""
    norms = set(model.norm_parameter_names())
    groups: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        if parts[0] == "blocks":
            key = f"block{parts[1]}.{'norms' if name in norms else parts[2]}"
        elif name in norms:
            key = "norm_final"
        elif parts[0] == "head":
            key = "head"
        else:
            key = "embed"
        groups.setdefault(key, []).append(name)
    return groups


def check_dit_sizes(cfg: Experiment, memory: int, disk: int, on_disk: str) -> None:
    """The DiT's size estimate (:data:`~normlab.experiment.testbeds.base.SizeCheck`): its
    images, ``(n_train + n_val) · image_size² · 3`` float32 values, in memory."""
    s = cfg.shapes
    check_fits(
        (s.n_train + s.n_val) * s.image_size**2 * 3 * 4,
        memory,
        f"the images (shapes.n_train + shapes.n_val = {s.n_train + s.n_val:,} of "
        f"{s.image_size}×{s.image_size} pixels)",
        "in memory",
        "use fewer or smaller images",
    )


class DiTTestbed:
    """The DiT testbed: the embedded shapes, made again from ``spec["shapes"]`` and checked
    against ``spec["data"]["fingerprint"]``; paired batches, noises and times from the run's
    data seed (:func:`~normlab.experiment.testbeds.base.data_seed`), its initial weights from
    its init seed."""

    name: ClassVar[str] = "dit"
    config: ClassVar[TestbedConfig] = TestbedConfig(
        summary="dit (flow-matching DiT on embedded shapes; norms default to "
        + ",".join(DIT_DEFAULT_NORMS)
        + ")",
        sections={"dit": DiTSettings, "shapes": ShapesSettings},
        sample_length=("shapes", "seq_len"),
        options=("margin_val_loss",),
        train_defaults=DIT_TRAIN_DEFAULTS,
        default_norms=DIT_DEFAULT_NORMS,
        check_norm=check_dit_norm,
        check=check_dit_config,
        hints={
            "model": "the DiT's settings are under dit",
            "data": "the dit testbed trains on its embedded shapes (set under shapes); --data "
            "(text) is for the gpt testbed",
            "margin_bpb": "the dit testbed's equivalence margin is margin_val_loss",
            "train.eval_windows": "the dit testbed validates on every image of shapes.n_val",
            "train.full_val": "the dit testbed already validates on every image of "
            "shapes.n_val (its val_loss is the whole split's)",
        },
        arms_hint="two or more norms (--norms, e.g. adaln_zero,adarms; the dit testbed is "
        "pre-norm only)",
        check_sizes=check_dit_sizes,
    )
    quality_fields: ClassVar[tuple[str, ...]] = testbed_format("dit").validation_fields
    """A DiT's validation fields end with the guidance scale its samples were generated with."""

    @staticmethod
    def run_settings(cfg: Experiment, data_info: dict[str, Any]) -> dict[str, Any]:
        """``testbed``, ``dit`` (the config's section as the run uses it: label dropout and
        guidance scale 0 and 1 without class labels), ``shapes`` (the config's section: the
        request that makes the images again) and ``data``: the images' source, classes and
        fingerprint."""
        return {
            "testbed": "dit",
            "dit": cfg.dit.resolved().model_dump(),
            "shapes": cfg.shapes.model_dump(),
            "data": {k: data_info[k] for k in ("source", "classes", "fingerprint")},
        }

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        return build_dit(dit_config(spec), seed)

    @staticmethod
    def check_inputs(cfg: Experiment) -> None:
        """Nothing: the images are made from the config."""

    @staticmethod
    def prepare_data(cfg: Experiment, data_dir: Path, console: Console) -> dict[str, Any]:
        """The description of the embedded shapes (:func:`normlab.data.shapes.prepare_shapes`)."""
        started = time.perf_counter()
        s = cfg.shapes
        info = prepare_shapes(data_dir, s.image_size, s.patch_size, s.n_train, s.n_val, s.seed)
        console.print(
            f"data: {info['source']} ({info['fingerprint']}), {info['n_train']:,} train / "
            f"{info['n_val']:,} val images of {s.image_size}×{s.image_size} pixels, "
            f"{len(info['classes'])} classes ({', '.join(info['classes'])}), each "
            f"{info['seq_len']} tokens of {info['in_channels']} channels "
            f"({time.perf_counter() - started:.1f} s)"
        )
        return info

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        return {}

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t, d = spec["train"], spec["shapes"]
        data = load_shapes(d["image_size"], d["patch_size"], d["n_train"], d["n_val"], d["seed"])
        check_fingerprint(data.info["fingerprint"], spec, "shapes dataset")
        cfg = dit_config(spec)
        if (cfg.seq_len, cfg.in_channels) != data.train.shape[1:]:
            raise RuntimeError(
                f"model: seq_len {cfg.seq_len} and in_channels {cfg.in_channels} do not match the "
                f"data's tokens {tuple(data.train.shape[1:])}"
            )
        self.model = build_dit(cfg, init_seed(spec))
        self.conditional = cfg.n_classes > 0
        self.null_class = cfg.null_class
        self.batch_size = t["batch_size"]
        dit = DiTSettings(**spec["dit"])
        distribution = dit.time_distribution
        self.cfg_scale = dit.cfg_scale
        self.batches = FlowBatches(
            data.train,
            data.train_labels,
            t["batch_size"],
            data_seed(spec),
            distribution,
            label_dropout=dit.label_dropout,
            null_class=self.null_class,
        )
        self.triples = validation_triples(data.val, data.val_labels, d["seed"], distribution)
        self.tokens_per_step = t["batch_size"] * cfg.seq_len
        self.data_fingerprint = data.info["fingerprint"]
        self.run_dir = Path(run_dir)
        self.data_seed = d["seed"]
        self.image_size = d["image_size"]
        self.n_classes = cfg.n_classes
        self.val_images = unpatchify(data.val, d["image_size"])
        self.val_labels = np.asarray(data.val_labels)

    def _loss(self, batch: tuple[torch.Tensor, ...], device: torch.device) -> torch.Tensor:
        x1, label, x0, t = (v.to(device) for v in batch)
        return flow_matching_loss(self.model, x1, x0, t, label if self.conditional else None)

    def warm_up(self, device: torch.device) -> None:
        """On zeros of the training shape [batch_size, T, C]."""
        model = self.model
        was_training = model.training
        model.eval()
        shape = (self.batch_size, *self.batches.images.shape[1:])
        zeros = torch.zeros(shape)
        batch = (
            zeros,
            torch.zeros(self.batch_size, dtype=torch.long),
            zeros,
            torch.zeros(shape[0]),
        )
        self._loss(batch, device).backward()
        model.zero_grad(set_to_none=True)
        model.train(was_training)

    def train_loss(self, device: torch.device) -> torch.Tensor:
        return self._loss(self.batches.next(), device)

    def stream_state(self) -> object:
        return self.batches.get_state()

    def restore_stream(self, state: object) -> None:
        self.batches.set_state(state)  # type: ignore[arg-type]

    def evaluate(self, device: torch.device) -> dict[str, float]:
        """The flow-matching loss on the validation triples with their true labels (no label
        dropout), so it measures the conditional model and stays comparable across runs."""
        x1, label, x0, t = self.triples
        val_loss = flow_validation_loss(
            self.model, x1, x0, t, label if self.conditional else None, self.batch_size, device
        )
        return {"val_loss": val_loss}

    def parameter_groups(self) -> dict[str, list[str]]:
        return dit_parameter_groups(self.model)

    def quality_summary(
        self, final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "final_val_loss": final["val_loss"] if final else None,
            "best_val_loss": min((e["val_loss"] for e in finite_evals), default=None),
            "final_sample_sw2": None,
            "final_sample_class_acc": None,
            "final_sample_fd": None,
            "sample_cfg_scale": None,
        }

    def finish(self, device: torch.device) -> dict[str, Any]:
        """Generate one sample per validation image and compare the two sets.

        The noises and the balanced labels come from the data seed
        (:func:`normlab.models.flow_batches.sample_inputs`), so every arm and seed starts from the
        same noise; :data:`SAMPLE_STEPS` Euler steps in eval mode without gradients, with
        classifier-free guidance v = v_∅ + w · (v_c − v_∅) at w = ``dit.cfg_scale`` for a
        class-conditional model (w = 1: unguided). Returns ``final_sample_sw2``: the sliced
        Wasserstein-2 distance between the generated and the validation images, flattened
        pixels, over :data:`SW2_PROJECTIONS` projections drawn from the data seed, and
        ``sample_cfg_scale``: the w used (1.0 without labels), and the shape classifier's view
        of the same images (:func:`normlab.models.sample_metrics.sample_quality`):
        ``final_sample_class_acc``, the share classified as the label they were generated with,
        and ``final_sample_fd``, the Fréchet distance of their classifier features to the
        validation images'. Writes the first
        :data:`SAMPLE_GRID` images, [SAMPLE_GRID, H, W] float32 as generated (not clipped), to
        ``samples.npy`` in the run folder, and validation images with the same labels to
        ``reference.npy`` (so the report reads both from disk), each atomically.
        """
        n, seq_len, channels = self.triples[0].shape
        x0, labels = sample_inputs(n, seq_len, channels, self.n_classes, self.data_seed)
        label = labels if self.conditional else None
        scale = self.cfg_scale if self.conditional else 1.0
        tokens = generate_samples(
            self.model, x0, label, SAMPLE_STEPS, SAMPLE_BATCH, device, scale, self.null_class
        )
        images = unpatchify(tokens.numpy(), self.image_size)
        generator = torch.Generator().manual_seed(flow_seed(self.data_seed, "sample-sw2"))
        sw2 = sliced_wasserstein2(
            torch.from_numpy(images),
            torch.from_numpy(self.val_images),
            generator,
            SW2_PROJECTIONS,
        )
        grid = min(SAMPLE_GRID, images.shape[0])
        pick = balanced_selection(self.val_labels, grid, self.n_classes, wrap=True)
        write_images(self.run_dir, images[:grid], self.val_images[pick])
        quality = sample_quality(images, label, self.val_images)
        return {"final_sample_sw2": sw2, **quality, "sample_cfg_scale": scale}

    def _val_loss(self, model: nn.Module, device: torch.device) -> float:
        x1, label, x0, t = self.triples
        return flow_validation_loss(
            model, x1, x0, t, label if self.conditional else None, self.batch_size, device
        )

    def health_batch(self, model: nn.Module, device: torch.device) -> object:
        """``model`` on the first ``batch_size`` validation triples at x_t = (1 − t)·x0 + t·x1
        (norm health's batch)."""
        x1, label, x0, t = (v[: self.batch_size].to(device) for v in self.triples)
        x_t = interpolate(x0, x1, t)
        return model(x_t, t, label) if self.conditional else model(x_t, t)

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Deltas in the validation flow-matching MSE (the bf16 copy gets x_t and t in bf16,
        its velocity goes back to float32 against the float32 target); activations on the
        first ``batch_size`` validation triples, x_t = (1 − t)·x0 + t·x1."""
        x1, label, x0, t = (v[: self.batch_size].to(device) for v in self.triples)

        def metric(model: nn.Module) -> float:
            return self._val_loss(model, device)

        def metric_bf16(model: nn.Module) -> float:
            return self._val_loss(BFloat16Inputs(model), device)

        def run_batch(model: nn.Module) -> object:
            x_t = interpolate(x0, x1, t)
            return model(x_t, t, label) if self.conditional else model(x_t, t)

        return posttrain_summary(self.model, final["val_loss"], metric, metric_bf16, run_batch)
