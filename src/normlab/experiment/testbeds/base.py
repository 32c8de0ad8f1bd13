"""The interface every testbed keeps, and the checks the testbeds share.

A testbed (:class:`Testbed`) declares what it adds to the experiment config
(:class:`TestbedConfig`: its sections, defaults and rules, from which
:mod:`normlab.experiment.config` builds the config), says what a run records of the experiment's
settings (:meth:`Testbed.run_settings`: the config sections it uses, under the config's own
section and key names, and the data's record), how to build an arm's model from a resolved run
config (``run.json``, :meth:`Testbed.build_model`) and which quality fields a run's summary
holds; an instance, made in the worker from the run config, draws training batches and computes
their loss, validates, and adds its summary fields. Before the output folder is written,
:meth:`Testbed.check_inputs` checks what the experiment reads from outside;
:meth:`Testbed.prepare_data` builds the data and :meth:`Testbed.arm_fields` adds per-arm fields
to ``run.json``, so the runner and the training loop name no testbed. A testbed whose model a
size ladder can vary declares how (:class:`LadderRule`, ``TestbedConfig.ladder``), so the
ladder names no testbed either; where its model keeps ``--parametrization``
(:class:`ParametrizationKey`, ``TestbedConfig.parametrization``) and what memory and disk a
grid of it needs (``TestbedConfig.check_sizes``) are its declarations too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from pydantic import BaseModel
from rich.console import Console
from torch import nn

from normlab.models.norms import check_model_norm
from normlab.run_format.train_options import train_option

__all__ = [
    "Experiment",
    "LadderRule",
    "ParametrizationKey",
    "Testbed",
    "TestbedConfig",
    "baseline_factors",
    "check_data_fits",
    "check_fingerprint",
    "data_seed",
    "init_seed",
]

Experiment = Any
"""The validated experiment config (:class:`normlab.experiment.config.ExperimentConfig`, which
is built from the testbeds and so sits above them): its ``testbed``, ``train`` and the sections
of :attr:`TestbedConfig.sections` as attributes."""

ARMS_HINT = (
    "two or more norms (--norms, e.g. layernorm,rmsnorm), placements (--placements, e.g. "
    "pre,post) or precisions (--precision, e.g. fp32,bf16)"
)
"""What a config with a single arm is told to give, unless the testbed says otherwise."""


@dataclass(frozen=True)
class LadderRule:
    """What a size ladder (``compare --ladder KEY=v1,v2,…``,
    :mod:`normlab.study.ladder`) may vary in a testbed's model, and how a rung is
    made.

    ``keys``: what KEY may be, in words (for errors). ``rule``: the size rule in one sentence,
    recorded in ``ladder.json``. ``check_key(cfg, key)``: ValueError naming ``--ladder`` for a
    KEY the model cannot ladder. ``rung(cfg, key, value, smallest)``: the config sections that
    put the experiment config ``cfg``'s model at ``key`` = ``value`` (``smallest``: the ladder's
    smallest value, μP's base width for a width key), validated, and {setting: value} of every
    model setting the rung changes; ValueError naming ``--ladder`` for a rung that is no valid
    model. ``n_params(rung)``: the parameter count of a rung config's baseline arm, nothing
    written. ``parametrization(cfg)``: ``sp`` or ``mup``, as the config sets it.
    ``base_width_key``: the setting a width ladder's rungs get under μP (the base width, set to
    the smallest rung); a rung that changes it is a μP width ladder, whose rates carry across
    its rungs."""

    keys: str
    rule: str
    check_key: Callable[[Any, str], None]
    rung: Callable[[Any, str, int, int], tuple[dict[str, BaseModel], dict[str, Any]]]
    n_params: Callable[[Any], int]
    parametrization: Callable[[Any], str]
    base_width_key: str


@dataclass(frozen=True)
class ParametrizationKey:
    """Where a testbed's model keeps its parametrisation (``sp`` or ``mup``), which
    ``compare --parametrization`` sets: ``key``, the dotted config key (``model.parametrization``),
    and ``owner``, what holds it in words (``the gpt testbed's model``), for the one-line refusal
    a testbed without one gives."""

    key: str
    owner: str


SizeCheck = Callable[[Any, int, int, str], None]
"""A testbed's size estimate (``TestbedConfig.check_sizes``): ``check(cfg, memory, disk,
on_disk)`` raises ``ValueError`` naming the config key when the data or the model of the
validated experiment config ``cfg`` would need more than ``memory`` bytes of memory or ``disk``
bytes of the output folder's disk (``on_disk`` names that disk in messages)."""


@dataclass(frozen=True)
class TestbedConfig:
    """What a testbed adds to the experiment config (:class:`Testbed`'s ``config``).

    ``summary`` describes it in ``--testbed``'s help. ``sections``: its config sections by key
    (pydantic models; a section two testbeds share is the same class in both).
    ``sample_length``: the (section, key) that holds the tokens of one training sample
    (``train.tokens`` and ``train.tokens_per_param`` are converted into steps with it).
    ``options``: its options outside its sections (a top-level key, or ``section.key``); an
    option that some testbeds declare and others do not is an error in the others' configs.
    ``train_defaults``: its defaults for the ``train`` keys a config leaves out (``steps`` only
    when neither ``train.tokens`` nor ``train.tokens_per_param`` is given);
    ``default_norms``: the norms when the config gives none. ``check_norm`` raises for a norm
    name it cannot train; ``check`` for a validated config it cannot run (ValueError naming the
    key). ``selected_by``: a section whose presence in a config without ``testbed`` selects this
    testbed. ``hints``: for an option of another testbed given to this one, where its setting
    lives here; ``arms_hint``: what a config with a single arm is told to give. ``ladder``: how
    a size ladder varies its model (None: the testbed has no ladder). ``parametrization``:
    where ``--parametrization`` goes (None: the model has none, and the flag is refused).
    ``check_sizes``: the testbed's memory and disk estimate (:data:`SizeCheck`; None: nothing
    beyond the grid's own)."""

    summary: str
    sections: Mapping[str, type[BaseModel]]
    sample_length: tuple[str, str]
    options: tuple[str, ...] = ()
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    default_norms: tuple[str, ...] | None = None
    check_norm: Callable[[str], object] = check_model_norm
    check: Callable[[Any], None] | None = None
    selected_by: str | None = None
    hints: Mapping[str, str] = field(default_factory=dict)
    arms_hint: str = ARMS_HINT
    ladder: LadderRule | None = None
    parametrization: ParametrizationKey | None = None
    check_sizes: SizeCheck | None = None


def init_seed(spec: Mapping[str, Any]) -> int:
    """The seed of a run's initial weights: ``train.init_seed`` of the run config ``spec``, or
    the run's ``seed`` where it is None or not recorded. It drives the paired initialisation
    (every shared parameter's generator, :func:`normlab._seeds.parameter_seed`) and nothing
    else."""
    value = train_option(spec["train"], "init_seed")
    return int(spec["seed"] if value is None else value)


def data_seed(spec: Mapping[str, Any]) -> int:
    """The seed of what a run draws while it trains: ``train.data_seed`` of the run config
    ``spec``, or the run's ``seed`` where it is None or not recorded. It drives the batch order
    (the text testbeds' windows, :class:`normlab.data.TrainBatches`; the DiT's image order,
    noises, times and label dropout, :class:`normlab.models.flow_batches.FlowBatches`) and
    torch's global generator during training (dropout, where a model has it); not the DiT's
    images, validation triples or sample noises, which follow ``shapes.seed``."""
    value = train_option(spec["train"], "data_seed")
    return int(spec["seed"] if value is None else value)


class Testbed(Protocol):
    """A testbed: what a run records of the config and how its model is built (class level),
    and one run's model and data as the training loop uses them (an instance, made from the
    run config and the run folder: ``cls(spec, run_dir)``).

    Optional: ``health_batch(model, device)`` runs ``model`` on a fixed validation batch; where
    a testbed has it, the training loop records norm health on that batch at every evaluation
    (:func:`normlab.experiment.training.train.health_record`). ``full_evaluate(device)``: the
    validation record's values on the whole validation split (``train.full_val``; the text
    testbeds, whose ``evaluate`` sees ``train.eval_windows`` windows of it)."""

    name: ClassVar[str]
    """The experiment config's ``testbed`` value."""
    config: ClassVar[TestbedConfig]
    """What the testbed adds to the experiment config."""
    quality_fields: ClassVar[tuple[str, ...]]
    """The validation fields of a run's summary, in the order summary.json has them."""

    model: nn.Module
    tokens_per_step: int
    data_fingerprint: str

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        """One run of this testbed: its model (paired initialisation for :func:`init_seed`),
        its batches (drawn from :func:`data_seed`) and data (checked against
        ``spec["data"]["fingerprint"]``)."""

    @staticmethod
    def run_settings(cfg: Experiment, data_info: dict[str, Any]) -> dict[str, Any]:
        """What every run records of the testbed: the config sections it uses, as the config
        names them (``model``; ``dit``, ``shapes``), and ``data``, the record of the data
        (``data_info``, the data folder's description) that :meth:`build_model` and the
        worker read back."""

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        """The arm's model for the resolved run config ``spec``, with the paired initialisation
        for ``seed``."""

    @staticmethod
    def check_inputs(cfg: Experiment) -> None:
        """Check what the experiment reads from outside (a ``--data`` path, a tokenizer, a model
        source) before the output folder is created or written: ValueError naming the option."""

    @staticmethod
    def prepare_data(cfg: Experiment, data_dir: Path, console: Console) -> dict[str, Any]:
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

    def stream_state(self) -> object:
        """Where the training batches are (a copy): :meth:`restore_stream` with it makes the
        next batches the ones that followed then."""

    def restore_stream(self, state: object) -> None:
        """Put the training batches back where :meth:`stream_state` found them."""

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


def baseline_factors(cfg: Experiment) -> tuple[str, str]:
    """(norm, placement) of the experiment config's baseline arm."""
    base = cfg.baseline_arm()
    for arm, norm, placement, _precision in cfg.arm_factors():
        if arm == base:
            return str(norm), str(placement)
    raise AssertionError(base)  # the baseline is one of the arms


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
