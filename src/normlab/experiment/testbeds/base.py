"""The interface every testbed keeps, and the checks the testbeds share.

A testbed (:class:`Testbed`) says what a run records of the experiment's settings
(:meth:`Testbed.run_settings`: the config sections it uses, under the config's own section and
key names, and the data's record), how to build an arm's model from a resolved run config
(``run.json``, :meth:`Testbed.build_model`) and which quality fields a run's summary holds; an
instance, made in the worker from the run config, draws training batches and computes their
loss, validates, and adds its summary fields. Before the output folder is written,
:meth:`Testbed.check_inputs` checks what the experiment reads from outside;
:meth:`Testbed.prepare_data` builds the data and :meth:`Testbed.arm_fields` adds per-arm fields
to ``run.json``, so the runner and the training loop name no testbed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from rich.console import Console
from torch import nn

from normlab.experiment.config import ExperimentConfig

__all__ = ["Testbed", "check_data_fits", "check_fingerprint"]


class Testbed(Protocol):
    """A testbed: what a run records of the config and how its model is built (class level),
    and one run's model and data as the training loop uses them (an instance, made from the
    run config and the run folder: ``cls(spec, run_dir)``).

    Optional: ``health_batch(model, device)`` runs ``model`` on a fixed validation batch; where
    a testbed has it, the training loop records norm health on that batch at every evaluation
    (:func:`normlab.experiment.training.train.health_record`)."""

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
        post-training fields of :data:`normlab.experiment.measure.posttrain.POSTTRAIN_FIELDS`
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


def check_fingerprint(found: str, spec: dict[str, Any], what: str) -> None:
    """Raise ``RuntimeError`` unless the data's fingerprint ``found`` is the one the run config
    ``spec`` was planned with (``spec["data"]["fingerprint"]``); ``what`` names the data."""
    expected = spec["data"]["fingerprint"]
    if found != expected:
        raise RuntimeError(f"data: the {what} reads as {found}, run.json expects {expected}")
