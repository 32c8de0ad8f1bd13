"""The testbeds: what differs between them, behind one interface the grid and the training loop
share.

A testbed (a class registered in :data:`TESTBEDS` under the experiment config's ``testbed``
name) says what a run records of the experiment's settings (:meth:`Testbed.run_settings`: the
config sections it uses, under the config's own section and key names, and the data's record),
how to build an arm's model from a resolved run config (``run.json``,
:meth:`Testbed.build_model`) and which quality fields a run's summary holds; an instance, made
in the worker from the run config, draws training batches and computes their loss, validates,
and adds its summary fields. The grid, the runner and the training loop go through this
interface only, so a new testbed is one new class in :data:`TESTBEDS`:

- ``gpt``: the byte-level GPT on the token cache; cross-entropy; validation in nats and bits per
  byte on fixed windows; summary ``final_val_loss``, ``final_val_bpb``, ``best_val_bpb``.
- ``dit``: the flow-matching DiT on the embedded shapes; the flow-matching loss (MSE of the
  velocity) on batches whose labels are dropped to the null class with probability
  ``dit.label_dropout``; validation on fixed (x1, label, x0, t) triples with the true labels;
  summary ``final_val_loss``, ``best_val_loss`` and, from the samples a finished run generates
  with classifier-free guidance at ``dit.cfg_scale`` (:meth:`DiTTestbed.finish`),
  ``final_sample_sw2`` and the scale used, ``sample_cfg_scale``; the first samples are kept in
  the run folder's ``samples.npy``.

- ``lm``: a user's causal LM from a model source on a token cache of any tokenizer
  (:mod:`normlab.experiment.testbeds_lm`); summary as the GPT's (``final_val_loss`` per token)
  and the arm's ``norm_swap`` record.

Before the output folder is written, :meth:`Testbed.check_inputs` checks what the experiment
reads from outside; :meth:`Testbed.prepare_data` builds the data, :meth:`Testbed.tokens_per_sample`
converts ``train.tokens`` into steps and :meth:`Testbed.arm_fields` adds per-arm fields to
``run.json``, so the runner and the config name no testbed.

A run config without ``testbed`` is a GPT run (folders written before the DiT testbed existed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from rich.console import Console
from torch import nn

from normlab.data.batches import TrainBatches, validation_windows
from normlab.data.cache import check_source, load_tokens, prepare_tokens
from normlab.data.shapes import balanced_selection, load_shapes, prepare_shapes, unpatchify
from normlab.experiment.config import ExperimentConfig, ShapesSettings
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
    DiTSettings,
    GPTConfig,
    build_dit,
    build_gpt,
    flow_matching_loss,
    interpolate,
    sliced_wasserstein2,
)
from normlab.models.flow_batches import FlowBatches, flow_seed, sample_inputs, validation_triples
from normlab.models.sample_metrics import sample_quality
from normlab.run_format import testbed_format
from normlab.run_format.folder import write_images

__all__ = [
    "QUALITY_FIELDS",
    "SAMPLE_BATCH",
    "SAMPLE_GRID",
    "SAMPLE_STEPS",
    "SW2_PROJECTIONS",
    "TESTBEDS",
    "DiTTestbed",
    "GPTTestbed",
    "Testbed",
    "build_model",
    "check_data_fits",
    "dit_config",
    "dit_parameter_groups",
    "gpt_config",
    "make_testbed",
    "quality_fields",
    "testbed_class",
    "testbed_of",
    "warm_up_gpt",
]

SAMPLE_STEPS = 32
"""Euler steps of the samples a finished DiT run generates."""
SAMPLE_BATCH = 256
"""Samples generated at a time."""
SW2_PROJECTIONS = 256
"""Random unit projections of the sliced Wasserstein-2 distance ``final_sample_sw2``."""
SAMPLE_GRID = 16
"""The first generated images kept in ``samples.npy`` (4 per class with the 4 shape classes)."""


def testbed_of(spec: dict[str, Any]) -> str:
    """The testbed of a resolved run config (``gpt`` when it names none)."""
    testbed = spec.get("testbed", "gpt")
    if testbed not in TESTBEDS:
        raise ValueError(f"testbed: expected one of {', '.join(TESTBEDS)}, got {testbed!r}")
    return testbed


def testbed_class(spec: dict[str, Any]) -> type[Testbed]:
    """The :class:`Testbed` class of a resolved run config."""
    return TESTBEDS[testbed_of(spec)]


def quality_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The validation fields a summary of this run holds (its testbed's ``quality_fields``)."""
    return testbed_class(spec).quality_fields


def gpt_config(spec: dict[str, Any]) -> GPTConfig:
    """The GPT of a resolved GPT run config: its ``model`` section, ``norm`` and ``placement``."""
    return GPTConfig(**spec["model"], norm=spec["norm"], placement=spec["placement"])


def dit_config(spec: dict[str, Any]) -> DiTConfig:
    """The DiT of a resolved DiT run config: its ``dit`` section on the token shapes of its
    ``shapes`` section, with a label per class of its data (``data.classes``) when
    ``dit.class_conditional``, and its ``norm``."""
    shapes = ShapesSettings(**spec["shapes"])
    return DiTSettings(**spec["dit"]).dit_config(
        shapes.in_channels, shapes.seq_len, len(spec["data"]["classes"]), spec["norm"]
    )


def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
    """The arm's model with the paired initialisation for ``seed``; ``spec`` is a resolved run
    config (its testbed's sections, ``norm``, ``placement``)."""
    return testbed_class(spec).build_model(spec, seed)


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


class Testbed(Protocol):
    """A testbed: what a run records of the config and how its model is built (class level),
    and one run's model and data as the training loop uses them (an instance, made from the
    run config and the run folder: ``cls(spec, run_dir)``).

    Optional: ``health_batch(model, device)`` runs ``model`` on a fixed validation batch; where
    a testbed has it, the training loop records norm health on that batch at every evaluation
    (:func:`normlab.experiment.train.health_record`)."""

    name: ClassVar[str]
    """The experiment config's ``testbed`` value."""
    quality_fields: ClassVar[tuple[str, ...]]
    """The validation fields of a run's summary, in the order summary.json has them."""

    model: nn.Module
    tokens_per_step: int
    data_fingerprint: str

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        """One run of this testbed: its model (paired initialisation for ``spec["seed"]``) and
        data (checked against ``spec["data"]["fingerprint"]``)."""

    @staticmethod
    def run_settings(cfg: ExperimentConfig, data_info: dict[str, Any]) -> dict[str, Any]:
        """What every run records of the testbed: the config sections it uses, as the config
        names them (``model``; ``dit``, ``shapes``), and ``data``, the record of the data
        (``data_info``, the data folder's description) that :meth:`build_model` and the
        worker read back."""

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        """The arm's model for the resolved run config ``spec``, with the paired initialisation
        for ``seed``."""

    @staticmethod
    def check_inputs(cfg: ExperimentConfig) -> None:
        """Check what the experiment reads from outside (a ``--data`` path, a tokenizer, a model
        source) before the output folder is created or written: ValueError naming the option."""

    @staticmethod
    def prepare_data(cfg: ExperimentConfig, data_dir: Path, console: Console) -> dict[str, Any]:
        """Prepare the testbed's data in ``data_dir`` once (a token cache, or the description of
        the images), say what it is on ``console`` and check that it fits the model; returns
        ``data.json``'s content."""

    @staticmethod
    def tokens_per_sample(cfg: ExperimentConfig) -> int:
        """Tokens in one training sample (a context window, or an image's patches)."""

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        """Per-arm fields of a run's ``run.json`` beyond the parameter counts ({} for none);
        the grid lets them differ between arms (a field's sub-fields included)."""

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


def check_data_fits(info: dict[str, Any], context: int, val_fraction: float, key: str) -> None:
    """Raise ``ValueError`` naming ``--data`` unless the training part holds at least
    ``context + 2`` tokens and the validation part at least ``context + 1`` (one window each);
    ``key`` names the context's config key."""
    n_train, n_val = info["n_train_tokens"], info["n_val_tokens"]
    if n_train >= context + 2 and n_val >= context + 1:
        return
    unit = "bytes" if info.get("token_bytes_file") is None else "tokens"
    raise ValueError(
        f"data: {info['source']!r} is too small for {key} = {context}: it gives "
        f"{n_train:,} training and {n_val:,} validation {unit} (data.val_fraction = "
        f"{val_fraction:g}); expected at least {context + 2} training and "
        f"{context + 1} validation {unit}. Give --data more text, or use a smaller {key}."
    )


def _check_fingerprint(found: str, spec: dict[str, Any], what: str) -> None:
    expected = spec["data"]["fingerprint"]
    if found != expected:
        raise RuntimeError(f"data: the {what} reads as {found}, run.json expects {expected}")


class GPTTestbed:
    """The GPT testbed: byte windows of the token cache in ``run_dir/../../data``."""

    name: ClassVar[str] = "gpt"
    quality_fields: ClassVar[tuple[str, ...]] = testbed_format("gpt").validation_fields

    @staticmethod
    def run_settings(cfg: ExperimentConfig, data_info: dict[str, Any]) -> dict[str, Any]:
        """``model`` (the config's section) and ``data``: the cache's fingerprint, the Python
        version whose standard library it read (when that is the source) and its source. No
        ``testbed`` key: a run config without one is a GPT run."""
        return {
            "model": cfg.model.model_dump(),
            "data": {
                "fingerprint": data_info["fingerprint"],
                "python_version": data_info["python_version"],
                "source": data_info["source"],
            },
        }

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        return build_gpt(gpt_config(spec), seed)

    @staticmethod
    def check_inputs(cfg: ExperimentConfig) -> None:
        check_source(cfg.data.path)

    @staticmethod
    def prepare_data(cfg: ExperimentConfig, data_dir: Path, console: Console) -> dict[str, Any]:
        """The byte token cache (:func:`normlab.data.cache.prepare_tokens`), checked to hold one
        context window per side (:func:`check_data_fits`)."""
        started = time.perf_counter()
        d = cfg.data
        info = prepare_tokens(data_dir, d.path, d.max_bytes, d.val_fraction)
        console.print(
            f"data: {info['source']} ({info['fingerprint']}), "
            f"{info['n_train_tokens']:,} train / {info['n_val_tokens']:,} val bytes "
            f"from {info['n_train_files']} / {info['n_val_files']} files "
            f"({time.perf_counter() - started:.1f} s)"
        )
        check_data_fits(info, cfg.model.context, d.val_fraction, "model.context")
        return info

    @staticmethod
    def tokens_per_sample(cfg: ExperimentConfig) -> int:
        return cfg.model.context

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        return {}

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t = spec["train"]
        data = load_tokens(Path(run_dir).parent.parent / "data")
        _check_fingerprint(data.info["fingerprint"], spec, "cache")
        cfg = gpt_config(spec)
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

    def health_batch(self, model: nn.Module, device: torch.device) -> object:
        """``model`` on the first ``batch_size`` validation windows (norm health's batch)."""
        return model(self.windows[: self.batch_size, :-1].to(device))

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Deltas in validation bpb (the bf16 copy's logits go to the cross-entropy in
        float32); activations on the first ``batch_size`` validation windows."""

        def metric(model: nn.Module) -> float:
            return self._val_bpb(model, device)

        def run_batch(model: nn.Module) -> object:
            return model(self.windows[: self.batch_size, :-1].to(device))

        return posttrain_summary(self.model, final["val_bpb"], metric, metric, run_batch)


class DiTTestbed:
    """The DiT testbed: the embedded shapes, made again from ``spec["shapes"]`` and checked
    against ``spec["data"]["fingerprint"]``; paired batches, noises and times from the run's
    seed."""

    name: ClassVar[str] = "dit"
    quality_fields: ClassVar[tuple[str, ...]] = testbed_format("dit").validation_fields
    """A DiT's validation fields end with the guidance scale its samples were generated with."""

    @staticmethod
    def run_settings(cfg: ExperimentConfig, data_info: dict[str, Any]) -> dict[str, Any]:
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
    def check_inputs(cfg: ExperimentConfig) -> None:
        """Nothing: the images are made from the config."""

    @staticmethod
    def prepare_data(cfg: ExperimentConfig, data_dir: Path, console: Console) -> dict[str, Any]:
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
    def tokens_per_sample(cfg: ExperimentConfig) -> int:
        return cfg.shapes.seq_len

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        return {}

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t, d = spec["train"], spec["shapes"]
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
        dit = DiTSettings(**spec["dit"])
        distribution = dit.time_distribution
        self.cfg_scale = dit.cfg_scale
        self.batches = FlowBatches(
            data.train,
            data.train_labels,
            t["batch_size"],
            spec["seed"],
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


def _registered() -> dict[str, type[Testbed]]:
    from normlab.experiment.testbeds_lm import LMTestbed

    return {t.name: t for t in (GPTTestbed, DiTTestbed, LMTestbed)}


TESTBEDS: dict[str, type[Testbed]] = _registered()
"""The testbeds by the experiment config's ``testbed`` name."""

QUALITY_FIELDS: dict[str, tuple[str, ...]] = {n: t.quality_fields for n, t in TESTBEDS.items()}
"""The validation fields of a run's summary, per testbed."""


def make_testbed(spec: dict[str, Any], run_dir: Path) -> Testbed:
    """The :class:`Testbed` of the run config ``spec`` for the run folder ``run_dir`` (its data
    checked against the fingerprint in ``spec``, its model built with the paired
    initialisation)."""
    return testbed_class(spec)(spec, run_dir)
