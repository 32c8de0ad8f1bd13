"""What differs between the testbeds, behind one interface the grid and the training loop share.

A testbed says how to build an arm's model from a resolved run config (``run.json``), and, in the
worker, how to draw a training batch and compute its loss, how to validate, and which quality
fields a run's summary holds:

- ``gpt``: the byte-level GPT on the token cache; cross-entropy; validation in nats and bits per
  byte on fixed windows; summary ``final_val_loss``, ``final_val_bpb``, ``best_val_bpb``.
- ``dit``: the flow-matching DiT on the embedded shapes; the flow-matching loss (MSE of the
  velocity) on batches whose labels are dropped to the null class with probability
  ``flow.label_dropout``; validation on fixed (x1, label, x0, t) triples with the true labels;
  summary ``final_val_loss``, ``best_val_loss`` and, from the samples a finished run generates
  with classifier-free guidance at ``flow.cfg_scale`` (:meth:`DiTTask.finish`),
  ``final_sample_sw2`` and the scale used, ``sample_cfg_scale``; the first samples are kept in
  the run folder's ``samples.npy``.

A run config without ``testbed`` is a GPT run (folders written before the DiT testbed existed).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from normlab._io import write_bytes_atomic
from normlab.data.batches import TrainBatches, validation_windows
from normlab.data.cache import load_tokens
from normlab.data.flow_batches import FlowBatches, flow_seed, sample_inputs, validation_triples
from normlab.data.shapes import balanced_selection, load_shapes, unpatchify
from normlab.experiment.evaluate import (
    bits_per_byte,
    flow_validation_loss,
    generate_samples,
    validation_loss,
)
from normlab.experiment.posttrain import BFloat16Inputs, posttrain_summary
from normlab.models import (
    GPT,
    DiT,
    DiTConfig,
    GPTConfig,
    build_dit,
    build_gpt,
    flow_matching_loss,
    interpolate,
    sliced_wasserstein2,
)

__all__ = [
    "QUALITY_FIELDS",
    "REFERENCE_FILE",
    "SAMPLES_FILE",
    "SAMPLE_BATCH",
    "SAMPLE_GRID",
    "SAMPLE_STEPS",
    "SW2_PROJECTIONS",
    "Task",
    "build_model",
    "dit_parameter_groups",
    "make_task",
    "quality_fields",
    "testbed_of",
    "warm_up_gpt",
]

QUALITY_FIELDS: dict[str, tuple[str, ...]] = {
    "gpt": ("final_val_loss", "final_val_bpb", "best_val_bpb"),
    "dit": ("final_val_loss", "best_val_loss", "final_sample_sw2", "sample_cfg_scale"),
}
"""The validation fields of a run's summary, per testbed (in the order summary.json has them);
a DiT's end with the guidance scale its samples were generated with."""

SAMPLE_STEPS = 32
"""Euler steps of the samples a finished DiT run generates."""
SAMPLE_BATCH = 256
"""Samples generated at a time."""
SW2_PROJECTIONS = 256
"""Random unit projections of the sliced Wasserstein-2 distance ``final_sample_sw2``."""
SAMPLE_GRID = 16
"""The first generated images kept in ``samples.npy`` (4 per class with the 4 shape classes)."""
SAMPLES_FILE = "samples.npy"
REFERENCE_FILE = "reference.npy"
"""Validation images with the labels of ``samples.npy``, for the report's Samples figure."""


def testbed_of(spec: dict[str, Any]) -> str:
    """The testbed of a resolved run config (``gpt`` when it names none)."""
    testbed = spec.get("testbed", "gpt")
    if testbed not in QUALITY_FIELDS:
        raise ValueError(f"testbed: expected one of {', '.join(QUALITY_FIELDS)}, got {testbed!r}")
    return testbed


def quality_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The validation fields a summary of this run holds (see :data:`QUALITY_FIELDS`)."""
    return QUALITY_FIELDS[testbed_of(spec)]


def dit_config(spec: dict[str, Any]) -> DiTConfig:
    """The DiT of a resolved DiT run config (``model`` holds every DiTConfig field but the
    norm)."""
    return DiTConfig(**spec["model"], norm=spec["norm"])


def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
    """The arm's model with the paired initialisation for ``seed``; ``spec`` needs ``model``,
    ``norm``, ``placement`` (and ``testbed`` for a DiT)."""
    if testbed_of(spec) == "dit":
        return build_dit(dit_config(spec), seed)
    return build_gpt(
        GPTConfig(**spec["model"], norm=spec["norm"], placement=spec["placement"]), seed
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


def warm_up_gpt(model: GPT, device: torch.device, batch_size: int) -> None:
    """One forward and backward on a batch of the training shape [``batch_size``, context], in
    eval mode, before anything is timed, so that what the norms and torch set up on first use
    (kernels compiled and cached on disk, lazily initialised libraries) is not charged to the run.

    The shape matters: kernels specialise on it (the Triton norms pick their rows per program
    from the number of rows, N = batch_size · context), so a smaller warm-up batch would leave the
    training shape's compilation to step 1. Gradients are cleared afterwards."""
    was_training = model.training
    model.eval()
    idx = torch.zeros(batch_size, model.config.context, dtype=torch.long, device=device)
    _, loss = model(idx, idx)
    if loss is not None:
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)


class Task(Protocol):
    """One run's model and data, as the training loop uses them."""

    model: nn.Module
    tokens_per_step: int
    data_fingerprint: str

    def warm_up(self, device: torch.device) -> None:
        """A forward and backward on a batch of the training shape in eval mode (gradients
        cleared afterwards), so that first-use set-up is not charged to the run."""

    def train_loss(self, device: torch.device) -> torch.Tensor:
        """The next training batch's loss (a 0-d tensor with a graph)."""

    def evaluate(self, device: torch.device) -> dict[str, float]:
        """The validation record's values: ``val_loss`` (and, for the GPT, ``val_bpb``)."""

    def parameter_groups(self) -> dict[str, list[str]]:
        """Parameter names grouped for the ``layer_grad_norms`` records."""

    def quality_summary(
        self, final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The summary's validation fields: ``final`` is the last eval record of a finished run
        (None otherwise), ``finite_evals`` the eval records with a finite loss."""

    def finish(self, device: torch.device) -> dict[str, Any]:
        """Called once on a finished run, after the last evaluation: summary fields beyond
        :meth:`quality_summary`'s (they replace its nulls) and files written to the run
        folder. Nothing for the GPT."""

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Called once on a finished run, after :meth:`finish`, with its last eval record: the
        post-training fields of :data:`normlab.experiment.posttrain.POSTTRAIN_FIELDS`
        (quantization and bf16 deltas against ``final``'s quality metric, activation outliers
        on the first validation batch)."""


def _check_fingerprint(found: str, spec: dict[str, Any], what: str) -> None:
    expected = spec["data"]["fingerprint"]
    if found != expected:
        raise RuntimeError(f"data: the {what} reads as {found}, run.json expects {expected}")


class GPTTask:
    """The GPT testbed: byte windows of the token cache in ``run_dir/../../data``."""

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t = spec["train"]
        data = load_tokens(Path(run_dir).parent.parent / "data")
        _check_fingerprint(data.info["fingerprint"], spec, "cache")
        cfg = GPTConfig(**spec["model"], norm=spec["norm"], placement=spec["placement"])
        self.model = build_gpt(cfg, spec["seed"])
        self.batch_size = t["batch_size"]
        self.batches = TrainBatches(data.train, t["batch_size"], cfg.context, spec["seed"])
        self.windows = validation_windows(data.val, cfg.context, t["eval_windows"])
        self.tokens_per_step = t["batch_size"] * cfg.context
        self.data_fingerprint = data.info["fingerprint"]

    def warm_up(self, device: torch.device) -> None:
        warm_up_gpt(self.model, device, self.batch_size)

    def train_loss(self, device: torch.device) -> torch.Tensor:
        x, y = self.batches.next()
        _, loss = self.model(x.to(device), y.to(device))
        return loss

    def evaluate(self, device: torch.device) -> dict[str, float]:
        val_loss = validation_loss(self.model, self.windows, self.batch_size, str(device))
        return {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss)}

    def parameter_groups(self) -> dict[str, list[str]]:
        return self.model.parameter_groups()

    def quality_summary(
        self, final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            "final_val_loss": final["val_loss"] if final else None,
            "final_val_bpb": final["val_bpb"] if final else None,
            "best_val_bpb": min((e["val_bpb"] for e in finite_evals), default=None),
        }

    def finish(self, device: torch.device) -> dict[str, Any]:
        return {}

    def _val_bpb(self, model: nn.Module, device: torch.device) -> float:
        loss = validation_loss(model, self.windows, self.batch_size, str(device))
        return bits_per_byte(loss)

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Deltas in validation bpb (the bf16 copy's logits go to the cross-entropy in
        float32); activations on the first ``batch_size`` validation windows."""

        def metric(model: nn.Module) -> float:
            return self._val_bpb(model, device)

        def run_batch(model: nn.Module) -> object:
            return model(self.windows[: self.batch_size, :-1].to(device))

        return posttrain_summary(self.model, final["val_bpb"], metric, metric, run_batch)


class DiTTask:
    """The DiT testbed: the embedded shapes, made again from ``spec["data"]`` and checked
    against its fingerprint; paired batches, noises and times from the run's seed."""

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t, d = spec["train"], spec["data"]
        data = load_shapes(d["image_size"], d["patch_size"], d["n_train"], d["n_val"], d["seed"])
        _check_fingerprint(data.info["fingerprint"], spec, "shapes dataset")
        cfg = dit_config(spec)
        if (cfg.seq_len, cfg.in_channels) != data.train.shape[1:]:
            raise RuntimeError(
                f"model: seq_len {cfg.seq_len} and in_channels {cfg.in_channels} do not match the "
                f"data's tokens {tuple(data.train.shape[1:])}"
            )
        self.model = build_dit(cfg, spec["seed"])
        self.conditional = cfg.n_classes > 0
        self.null_class = cfg.null_class
        self.batch_size = t["batch_size"]
        flow = spec["flow"]
        distribution = flow["time_distribution"]
        # run.json written before guidance existed: no label dropout, unguided samples
        self.cfg_scale = float(flow.get("cfg_scale", 1.0))
        self.batches = FlowBatches(
            data.train,
            data.train_labels,
            t["batch_size"],
            spec["seed"],
            distribution,
            label_dropout=float(flow.get("label_dropout", 0.0)),
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
            "sample_cfg_scale": None,
        }

    def finish(self, device: torch.device) -> dict[str, Any]:
        """Generate one sample per validation image and compare the two sets.

        The noises and the balanced labels come from the data seed
        (:func:`normlab.data.flow_batches.sample_inputs`), so every arm and seed starts from the
        same noise; :data:`SAMPLE_STEPS` Euler steps in eval mode without gradients, with
        classifier-free guidance v = v_∅ + w · (v_c − v_∅) at w = ``flow.cfg_scale`` for a
        class-conditional model (w = 1: unguided). Returns ``final_sample_sw2``: the sliced
        Wasserstein-2 distance between the generated and the validation images, flattened
        pixels, over :data:`SW2_PROJECTIONS` projections drawn from the data seed, and
        ``sample_cfg_scale``: the w used (1.0 without labels). Writes the first
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
        _save_npy(self.run_dir / SAMPLES_FILE, images[:grid])
        _save_npy(self.run_dir / REFERENCE_FILE, self.val_images[pick])
        return {"final_sample_sw2": sw2, "sample_cfg_scale": scale}

    def _val_loss(self, model: nn.Module, device: torch.device) -> float:
        x1, label, x0, t = self.triples
        return flow_validation_loss(
            model, x1, x0, t, label if self.conditional else None, self.batch_size, device
        )

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


def _save_npy(path: Path, images: np.ndarray) -> None:
    """``images`` as a float32 ``.npy`` file, written to a temporary name and renamed."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(images, dtype=np.float32))
    write_bytes_atomic(path, buf.getvalue())


def make_task(spec: dict[str, Any], run_dir: Path) -> Task:
    """The testbed's :class:`Task` for the run config ``spec`` (its data checked against the
    fingerprint in ``spec``, its model built with the paired initialisation)."""
    if testbed_of(spec) == "dit":
        return DiTTask(spec, run_dir)
    return GPTTask(spec, run_dir)
