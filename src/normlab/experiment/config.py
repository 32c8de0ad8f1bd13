"""The experiment's configuration: validated, with errors that name the key and list the valid
ones.

A YAML file has the shape of :class:`ExperimentConfig` (top-level factors and run settings, the
sections ``train``, ``anomaly`` and ``scale`` of every testbed, and each testbed's own sections:
``model`` and ``data`` for the GPT testbed, ``dit`` and ``shapes`` for the DiT testbed, ``lm``
and ``data`` for the lm testbed); command-line flags override it.

Every setting is declared once, with its default, its bounds and (for those with a flag) its
help text: a testbed's sections, defaults and rules are declared by the testbed
(:class:`normlab.experiment.testbeds.TestbedConfig`, registered in
:data:`normlab.experiment.testbeds.TESTBEDS`), from which :func:`config_class` builds
:class:`ExperimentConfig`; the shared sections are defined here. ``normlab compare``'s flags
read their defaults and help from these fields. A run's ``run.json`` uses the same section and
key names.
"""

from __future__ import annotations

import importlib
import math
import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from normlab.distributed.wrap import DEFAULT_PRECISION, PRECISIONS
from normlab.experiment.measure.anomaly import (
    DEFAULT_MIN_SCALE,
    DEFAULT_THRESHOLD,
    DEFAULT_WARMUP,
    DEFAULT_WINDOW,
    SpikeRule,
)
from normlab.experiment.testbeds import TESTBEDS, Testbed
from normlab.models.config import ConfigModel
from normlab.run_format import DEFAULT_TESTBED, TESTBED_FORMATS, testbed_format
from normlab.run_format.budget import ALL_PARAMS, budget_steps
from normlab.run_format.script import check_script_command
from normlab.run_format.testbeds import script_testbed
from normlab.run_format.train_options import (
    BUDGET_SETTINGS,
    OPTIONS_OFF,
    RECORDED_WHEN_SET,
    WSD,
    WSD_SETTINGS,
    fraction_steps,
)
from normlab.trackers.exporting import TRACKER_KINDS, parse_kinds

__all__ = [
    "DEFAULT_NORMS",
    "DEFAULT_STEPS",
    "EXECUTORS",
    "LENGTH_KEYS",
    "OWN_GRID",
    "SCRIPT_GRID",
    "AnomalySettings",
    "ConfigError",
    "ExperimentConfig",
    "GridConfig",
    "ScaleSettings",
    "ScriptConfig",
    "TrainSettings",
    "arm_name",
    "check_scale",
    "config_class",
    "describe_errors",
    "load_config_file",
    "load_yaml",
    "merge_overrides",
    "selected_testbed",
    "testbed_defaults",
    "testbed_options",
    "validate_config",
]

DEFAULT_STEPS = 600
"""Training steps when a config gives neither ``train.steps`` nor ``train.tokens`` (and its
testbed has no default of its own)."""
DEFAULT_NORMS = ("layernorm", "rmsnorm")
"""The norms compared when a config gives none (and its testbed has no default of its own):
normlab's own runs and a ``--script`` grid alike."""


class Section(ConfigModel):
    """A config section, with the rules of the testbeds' sections (:class:`ConfigModel`):
    unknown keys, wrong types and non-finite floats (inf, nan) are errors."""


OWN_GRID = "own"
"""The kind of grid whose runs normlab trains on a registered testbed (:class:`ExperimentBase`)."""
SCRIPT_GRID = "script"
"""The kind of grid whose runs the user's own script trains (:class:`ScriptConfig`)."""


class GridConfig(Section):
    """What every grid's config holds, whoever trains its runs: the factors under study
    (``norms``, ``placements``, ``precisions``), the ``seeds`` (a count 0 … n−1, or a list) and
    the ``baseline`` arm, and the rules read from them: the arms are every norm × placement ×
    precision (:meth:`arm_factors`), the baseline is the first arm unless named, and a named one
    must be an arm (:meth:`check_baseline`).

    Each subclass declares those fields with its own defaults and checks, and
    ``grid_kind``: the kind of grid it describes (:data:`OWN_GRID` or :data:`SCRIPT_GRID`),
    which chooses how :mod:`normlab.experiment.execution` plans, checks and trains it.
    """

    grid_kind: ClassVar[str]

    if TYPE_CHECKING:  # declared by each subclass, with its own defaults and checks
        norms: list[str]
        placements: list[str]
        precisions: list[str]
        seeds: int | list[int]
        baseline: str | None
        parallel: int
        threads: int | None
        scale: ScaleSettings
        log_to: list[str]

        @property
        def testbed(self) -> str: ...

    def seed_list(self) -> list[int]:
        """The seeds: ``0 … seeds−1`` for a count, else the list as given."""
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def arm_factors(self) -> list[tuple[str, str, str, str]]:
        """(arm name, norm, placement, precision) in grid order: precisions outermost, then
        placements, norms inner. The name carries the precision only when several are given
        (:func:`arm_name`)."""
        several = len(self.precisions) > 1
        return [
            (arm_name(n, p, q if several else None), n, p, q)
            for q in self.precisions
            for p in self.placements
            for n in self.norms
        ]

    def arm_names(self) -> list[str]:
        """The arms' names, in grid order (:meth:`arm_factors`)."""
        return [a for a, _, _, _ in self.arm_factors()]

    def baseline_arm(self) -> str:
        """The arm the others are compared with: ``baseline``, else the first arm."""
        return self.baseline or self.arm_names()[0]

    def check_baseline(self) -> None:
        """Raise ``ValueError`` naming ``baseline`` when it is given and is not an arm."""
        if self.baseline is not None and self.baseline not in self.arm_names():
            raise ValueError(
                f"baseline: {self.baseline!r} is not an arm; expected one of "
                f"{', '.join(self.arm_names())}"
            )

    def margin(self) -> float | None:
        """The equivalence margin of the quality metric, in its unit (None: none)."""
        raise NotImplementedError

    def dump(self) -> dict[str, Any]:
        """The validated config as JSON-ready data (``experiment.json``'s ``config``)."""
        raise NotImplementedError

    def grid_fields(self) -> dict[str, Any]:
        """The fields of ``experiment.json`` that every kind of grid takes from its config
        (:func:`normlab.run_format.experiment_record.experiment_record`'s ``testbed``, ``arms``,
        ``baseline_arm``, ``seeds``, ``margin``, ``factors`` and ``config``)."""
        return {
            "testbed": self.testbed,
            "arms": self.arm_names(),
            "baseline_arm": self.baseline_arm(),
            "seeds": self.seed_list(),
            "margin": self.margin(),
            "factors": {
                "norm": self.norms,
                "placement": self.placements,
                "precision": self.precisions,
            },
            "config": self.dump(),
        }


EXECUTORS = ("local", "ray")
"""The executors that train a grid (``--executor``): ``local`` (worker processes on this
machine) and ``ray`` (one Ray task per run); :mod:`normlab.experiment.execution.executors`
implements them."""


def check_scale(
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    fsdp: bool = False,
    executor: str = "local",
) -> None:
    """Raise ``ValueError`` naming the option (``--nproc-per-node``, ``--nnodes``,
    ``--rdzv-endpoint``, ``--fsdp``, ``--executor``) unless the values describe a launch:
    N = nproc_per_node · nnodes >= 1 processes per run, a rendezvous endpoint across hosts,
    FSDP only with N >= 2, a known executor."""
    from normlab.distributed.launcher import Layout

    Layout(nproc_per_node, nnodes, 0, rdzv_endpoint, fsdp)
    if executor not in EXECUTORS:
        raise ValueError(f"--executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")


class ScaleSettings(Section):
    """How runs are executed, never what they compute: ``nproc_per_node`` processes per run on
    each of ``nnodes`` hosts (torchrun; DDP, or FSDP2 with ``fsdp``), meeting at
    ``rdzv_endpoint`` across hosts; ``executor`` (``local`` or ``ray``) trains the grid,
    ``ray_address`` names the Ray cluster (none: a local Ray instance). The global batch, data
    order and paired start do not depend on any of them."""

    nproc_per_node: int = Field(
        1, description="Processes per run (torchrun; DDP, or FSDP2 with --fsdp)."
    )
    nnodes: int = Field(1, description="Hosts per run (each runs --nproc-per-node processes).")
    rdzv_endpoint: str | None = Field(
        None, description="host:port where a run's hosts meet (needed with --nnodes > 1)."
    )
    fsdp: bool = Field(False, description="Shard the model with FSDP2 instead of DDP.")
    executor: str = Field("local", description="Who trains the grid: local or ray.")
    ray_address: str | None = Field(
        None, description="Ray cluster address (default: start a local Ray instance)."
    )

    @model_validator(mode="after")
    def _check_launch(self) -> ScaleSettings:
        check_scale(self.nproc_per_node, self.nnodes, self.rdzv_endpoint, self.fsdp, self.executor)
        return self

    @property
    def world_size(self) -> int:
        """Processes per run: N = nproc_per_node · nnodes."""
        return self.nproc_per_node * self.nnodes

    def launch_spec(self) -> dict[str, Any]:
        """The ``scale`` record of a run.json on several processes: how the run is started
        (its torchrun layout), under this section's own key names."""
        return {
            "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes,
            "rdzv_endpoint": self.rdzv_endpoint,
            "fsdp": self.fsdp,
        }


WSD_ONLY: tuple[str, ...] = (*WSD_SETTINGS, "branches")
"""The ``train`` keys that only the ``wsd`` schedule takes."""
LENGTH_KEYS: tuple[str, ...] = ("steps", "tokens", "tokens_per_param")
"""The ``train`` keys that give a run's length, one at a time: steps, tokens, or tokens per
parameter of the baseline arm (:mod:`normlab.run_format.budget`)."""


class TrainSettings(Section):
    """Optimisation and evaluation: AdamW, linear warm-up then cosine decay, gradient clipping.

    Give one of ``steps``, ``tokens`` (converted to ⌈tokens / (batch_size · tokens per
    sample)⌉ steps, tokens per sample being the GPT's context or the DiT's patches per image)
    and ``tokens_per_param`` (X: ⌈X · N / (batch_size · tokens per sample)⌉ steps, N the
    baseline arm's parameters as ``param_count`` counts them, resolved once per grid when it is
    planned: :mod:`normlab.run_format.budget`); with none, ``steps`` is 600 (the DiT testbed's:
    2400). ``warmup`` (steps of linear warm-up to the peak ``lr``) is 0 or fewer than the steps,
    so that the cosine decay follows it (checked by :class:`ExperimentConfig`, which knows the
    steps ``tokens`` gives, and for a budget of tokens per parameter by the grid).
    ``grad_clip`` 0 turns clipping off. ``target_val_loss`` (GPT: nats per byte; DiT: the
    validation flow-matching MSE) is the level for time- and tokens-to-target.
    ``throughput_warmup`` steps are left out of tokens/s. ``eval_windows`` (GPT only): the
    validation windows; the DiT validates on every image of ``shapes.n_val``.
    ``arm_lr`` ({arm: rate}) trains the arms it names at their own peak rate, everything else
    equal (each run's ``run.json`` holds its own ``train.lr``).
    A testbed may have its own defaults for some keys (its ``TestbedConfig.train_defaults``).

    Budget and noise studies (a run config records them only when set, so a run without them
    is the run it always was: :mod:`normlab.run_format.train_options`, whose values that turn
    them off are these fields' defaults):
    ``schedule`` ``wsd`` (warm-up, stable, decay) replaces the cosine decay by a constant peak
    and a ``cooldown`` over the last
    :func:`~normlab.run_format.train_options.fraction_steps` (steps, ``cooldown``) steps, of
    shape ``decay`` (:func:`normlab.experiment.training.schedule.wsd_lr_at`); ``branches``
    (wsd only) trains, from the one stable run, the cooldown of each shorter budget B as a run
    of ``steps: B`` would (:mod:`normlab.experiment.training.branches`). ``init_seed`` and
    ``data_seed`` (None: the run's seed) split the paired seed into its two streams
    (:func:`normlab.experiment.testbeds.init_seed`, :func:`~normlab.experiment.testbeds.data_seed`).
    ``full_val`` (gpt, lm) also validates the final model on the whole validation split;
    ``average_last`` evaluates a uniform average of the weights over the last
    ``fraction_steps`` (steps, ``average_last``) steps. Their rules against the resolved
    steps and processes: :meth:`check_options`.
    """

    steps: int | None = Field(
        None,
        ge=1,
        description=(
            f"Training steps per run (default: {DEFAULT_STEPS}"
            + "".join(
                f"; {name}: {t.config.train_defaults['steps']}"
                for name, t in TESTBEDS.items()
                if "steps" in t.config.train_defaults
            )
            + "; unless tokens are given)."
        ),
    )
    tokens: int | None = Field(
        None, ge=1, description="Training tokens per run (instead of --steps)."
    )
    tokens_per_param: float | None = Field(
        OPTIONS_OFF["tokens_per_param"],
        gt=0,
        description="Training tokens per parameter of the baseline arm (instead of --steps or "
        "--tokens): each grid (a ladder's rung, each its own) trains every arm "
        "ceil(X·N / tokens per step) steps, N its baseline arm's parameters as --param-count "
        "counts them; about 20 is compute-optimal (Hoffmann et al. 2022).",
    )
    param_count: Literal["all", "non_embedding"] = Field(
        ALL_PARAMS,
        description="With --tokens-per-param: which parameters N counts, all (tied weights "
        "once) or non_embedding (without the token, position and untied output embeddings).",
    )
    batch_size: int = Field(16, ge=1, description="Sequences (dit: images) per step.")
    lr: float = Field(5e-3, gt=0, description="Peak learning rate.")
    arm_lr: dict[str, float] | None = Field(
        None,
        description="Per-arm peak learning rates {arm: rate} (an arm not named trains at lr); "
        "set by --lr-sweep to each arm's best rate.",
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup: int = Field(30, ge=0, description="Linear warm-up steps: 0, or fewer than the steps.")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)
    eval_interval: int = Field(50, ge=1)
    eval_windows: int = Field(128, ge=1)
    layer_grad_interval: int = Field(10, ge=1)
    throughput_warmup: int = Field(5, ge=0)
    target_val_loss: float | None = Field(2.0, gt=0)
    schedule: Literal["cosine", "wsd"] = Field(
        OPTIONS_OFF["schedule"],
        description="Learning-rate schedule: cosine (warm-up, then cosine decay) or wsd "
        "(warm-up, constant peak, then a cooldown over the last --cooldown of the steps).",
    )
    cooldown: float = Field(
        0.2,
        gt=0,
        le=1,
        description="wsd: the fraction of the steps the cooldown takes (at least one step, "
        "after the warm-up).",
    )
    decay: Literal["linear", "sqrt"] = Field(
        "linear",
        description="wsd: the cooldown's shape, linear (1 − p) or sqrt (1 − √p), p its "
        "progress, down to min_lr_ratio of the peak.",
    )
    branches: list[Annotated[int, Field(ge=1)]] | None = Field(
        OPTIONS_OFF["branches"],
        description="wsd: shorter budgets (steps) whose cooldowns branch off the one stable "
        "run, each trained and evaluated as a run of that many steps.",
    )
    init_seed: int | None = Field(
        OPTIONS_OFF["init_seed"],
        ge=0,
        description="The seed of the initial weights in every run (default: the run's seed).",
    )
    data_seed: int | None = Field(
        OPTIONS_OFF["data_seed"],
        ge=0,
        description="The seed of the batch order and every draw during training in every run "
        "(default: the run's seed).",
    )
    full_val: bool = Field(
        OPTIONS_OFF["full_val"],
        description="Also validate the final model on every non-overlapping window of the "
        "validation split (gpt, lm).",
    )
    average_last: float | None = Field(
        OPTIONS_OFF["average_last"],
        gt=0,
        le=1,
        description="Also evaluate the uniform average of the weights over this last fraction "
        "of the steps (training is unchanged).",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and all(data.get(k) is None for k in LENGTH_KEYS):
            return {**data, "steps": DEFAULT_STEPS}
        return data

    @model_validator(mode="after")
    def _steps_or_tokens(self) -> TrainSettings:
        """One of :data:`LENGTH_KEYS` gives the run's length, never two."""
        given = [k for k in LENGTH_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in given)
            raise ValueError(
                f"give one of steps, tokens or tokens_per_param, not {' and '.join(given)} "
                f"together ({shown})"
            )
        return self

    @model_serializer(mode="wrap")
    def _record_options_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The section's data without the options that are off
        (:data:`~normlab.run_format.train_options.OPTIONS_OFF`) and, unless the schedule is
        ``wsd``, its settings, so that ``run.json`` and ``experiment.json`` of a run without
        them are what they were before they existed."""
        data = handler(self)
        for key in RECORDED_WHEN_SET:
            if key in WSD_SETTINGS:
                off = self.schedule != WSD
            elif key in BUDGET_SETTINGS:
                off = self.tokens_per_param is None
            else:
                off = getattr(self, key) == OPTIONS_OFF[key]
            if off:
                data.pop(key, None)
        return data

    def check_options(self, steps: int | None, world_size: int) -> None:
        """Raise ``ValueError`` naming the key unless the options fit the run's resolved
        ``steps`` and ``world_size`` processes: ``cooldown``, ``decay`` and ``branches`` only
        under ``wsd``, ``param_count`` only with ``tokens_per_param``; the steps' own rules
        (:meth:`check_steps`) unless ``steps`` is None (a budget of tokens per parameter,
        whose steps the grid resolves and checks); branches and averaging on one process."""
        if self.schedule != WSD:
            given = [
                k
                for k in WSD_ONLY
                if k in self.model_fields_set and not (k == "branches" and self.branches is None)
            ]
            if given:
                raise ValueError(
                    f"train.{given[0]}: only with train.schedule: wsd (--schedule wsd); the "
                    f"{self.schedule} schedule has no cooldown"
                )
        if self.tokens_per_param is None and "param_count" in self.model_fields_set:
            raise ValueError(
                "train.param_count: only with train.tokens_per_param (--tokens-per-param); "
                "a run of a given number of steps or tokens counts no parameters"
            )
        if steps is not None:
            self.check_steps(steps)
        one_process = [k for k in ("branches", "average_last") if getattr(self, k) is not None]
        if world_size > 1 and one_process:
            raise ValueError(
                f"train.{one_process[0]}: only for runs on one process, got {world_size} "
                "processes per run (--nproc-per-node, --nnodes)"
            )

    def check_steps(self, steps: int) -> None:
        """The options that depend on the run's ``steps``: under ``wsd`` each budget n (the
        steps and every branch) has 1 ≤ :func:`fraction_steps` (n, ``cooldown``) ≤ n −
        ``warmup`` (a cooldown of at least one step that starts after the warm-up); branches
        distinct and below the steps; ``average_last`` averaging at least one step.
        ``ValueError`` naming the key."""
        if self.schedule == WSD:
            for budget in (steps, *(self.branches or ())):
                self._check_cooldown(budget, steps)
        self._check_branches(steps)
        if self.average_last is not None and fraction_steps(steps, self.average_last) < 1:
            raise ValueError(
                f"train.average_last: {self.average_last:g} of {steps} steps averages no "
                "step; expected a fraction that rounds to at least one step"
            )

    def _check_cooldown(self, budget: int, steps: int) -> None:
        """1 ≤ D ≤ budget − warmup for D = :func:`fraction_steps` (budget, ``cooldown``)."""
        d = fraction_steps(budget, self.cooldown)
        if 1 <= d <= budget - self.warmup:
            return
        which = f"train.steps = {steps}" if budget == steps else f"the branch of {budget} steps"
        raise ValueError(
            f"train.cooldown: {self.cooldown:g} of {which} makes a cooldown of {d} step(s); "
            f"expected at least 1 step, starting after the {self.warmup} warm-up steps (at "
            f"most {budget} − {self.warmup} = {budget - self.warmup})"
        )

    def _check_branches(self, steps: int) -> None:
        """Branches distinct and shorter than the run."""
        branches = self.branches or []
        if len(set(branches)) != len(branches):
            raise ValueError(f"train.branches: a budget is listed twice in {branches}")
        longer = [b for b in branches if b >= steps]
        if longer:
            raise ValueError(
                f"train.branches: the branch of {longer[0]} steps is not shorter than the run "
                f"(train.steps = {steps}); expected budgets below it"
            )


class AnomalySettings(Section):
    """Spike detection (see :mod:`normlab.experiment.measure.anomaly`): robust z of the log value
    against the trailing ``window`` steps, judged after ``warmup`` steps."""

    window: int = Field(DEFAULT_WINDOW, ge=3)
    warmup: int = Field(DEFAULT_WARMUP, ge=0)
    loss_z: float = Field(DEFAULT_THRESHOLD, gt=0)
    grad_z: float = Field(DEFAULT_THRESHOLD, gt=0)
    min_scale: float = Field(DEFAULT_MIN_SCALE, gt=0)

    def loss_rule(self) -> SpikeRule:
        return SpikeRule(self.window, self.warmup, self.loss_z, self.min_scale)

    def grad_rule(self) -> SpikeRule:
        return SpikeRule(self.window, self.warmup, self.grad_z, self.min_scale)


def testbed_options(testbeds: Mapping[str, type[Testbed]]) -> dict[str, tuple[str, ...]]:
    """The options that belong to some testbeds only (a section, or ``section.key``: each
    testbed's sections and ``options``), with the testbeds that declare them: giving one to
    another testbed is an error, and :meth:`ExperimentBase.dump` leaves them out for the others.
    An option every testbed declares belongs to none in particular."""
    owners: dict[str, list[str]] = {}
    for name, testbed in testbeds.items():
        for option in (*testbed.config.sections, *testbed.config.options):
            owners.setdefault(option, []).append(name)
    return {o: tuple(n) for o, n in owners.items() if len(n) < len(testbeds)}


def selected_testbed(
    data: Mapping[str, Any], testbeds: Mapping[str, type[Testbed]] = TESTBEDS
) -> str:
    """The testbed a config's data (a YAML file with the flags laid over it) selects: its
    ``testbed``, else the first testbed whose ``selected_by`` section it holds (``lm``), else
    the default testbed."""
    name = data.get("testbed")
    if name is not None:
        return str(name)
    chosen = [n for n, t in testbeds.items() if t.config.selected_by in data]
    return chosen[0] if chosen else DEFAULT_TESTBED


def testbed_defaults(dotted: str) -> dict[str, Any]:
    """The testbeds whose own default for the dotted key ``dotted`` (``"norms"``,
    ``"train.steps"``) replaces the config's, with that default."""
    found: dict[str, Any] = {}
    for name, testbed in TESTBEDS.items():
        c = testbed.config
        if dotted == "norms" and c.default_norms is not None:
            found[name] = list(c.default_norms)
        section, _, key = dotted.partition(".")
        if section == "train" and key in c.train_defaults:
            found[name] = c.train_defaults[key]
    return found


LOG_TO_HELP = (
    f"Comma list of trackers ({', '.join(TRACKER_KINDS)}) to export each run to, offline, "
    "in OUT/trackers/<tracker>/ as it finishes: its curves, summary, arm and seed "
    "(needs normlab's trackers extra)."
)
"""What ``log_to`` (``--log-to``) does, in its help and the config's description."""


def check_log_to(value: Any) -> Any:
    """``log_to`` as a list of known trackers, each once (a comma-separated string is split);
    ``ValueError`` naming the unknown one. Any other type is left to the field's validation."""
    if isinstance(value, (str, list, tuple)):
        return list(parse_kinds(value))
    return value


class ExperimentBase(GridConfig):
    """The whole experiment: the factors under study and everything held equal (the fields
    every testbed shares; :func:`config_class` adds the testbeds' sections).

    ``testbed``: the name of a registered testbed (:data:`normlab.experiment.testbeds.TESTBEDS`):
    ``gpt`` (the byte-level GPT, sections ``model`` and ``data``), ``dit`` (the flow-matching DiT
    on the embedded shapes, sections ``dit`` and ``shapes``; conditional norms, ``adaln_zero``
    and ``adarms`` by default, pre-norm only) or ``lm`` (the user's causal LM, sections ``lm``
    and ``data``). Options of another testbed are errors, not silently ignored.
    Arms are every ``norm × placement × precision`` (named ``<norm>-<placement>``, and
    ``<norm>-<placement>-<precision>`` when several ``precisions`` are given), at least two of
    them; each arm runs once per seed. ``precisions``: the training precisions (``fp32``,
    ``bf16``, ``fp16``; see :mod:`normlab.experiment.training.precision`), ``fp16_init_scale`` the
    fp16
    gradient scaler's initial scale. ``seeds`` is a count (0 … n−1) or a list. ``baseline`` names
    the arm the others are compared with (default: the first). ``margin_bpb`` (GPT) is the
    equivalence margin in bits per byte; ``margin_val_loss`` (DiT) the equivalence margin of the
    validation flow-matching loss, an absolute difference in its own unit (mean squared error of
    the velocity).
    ``log_to``: trackers each run is exported to (:mod:`normlab.trackers.exporting`).
    ``imports`` are modules imported before norms are resolved, in this process and in every
    worker (e.g. a module that calls ``normlab.register_norm``). ``threads``: torch threads per
    worker (default: half the CPUs this process may use, at least 1). ``parallel``: runs trained
    at once (1 keeps timings clean).
    """

    grid_kind: ClassVar[str] = OWN_GRID
    testbeds: ClassVar[dict[str, type[Testbed]]] = {}
    """The registered testbeds this config class was built from (:func:`config_class`)."""
    option_owners: ClassVar[dict[str, tuple[str, ...]]] = {}
    """:func:`testbed_options` of :attr:`testbeds`."""

    testbed: str = Field(DEFAULT_TESTBED)
    imports: list[str] = Field(default_factory=list)
    norms: list[str] = Field(
        default_factory=lambda: list(DEFAULT_NORMS),
        min_length=1,
        description="Comma list of norms, e.g. layernorm,rmsnorm,dyt.",
    )
    placements: list[Literal["pre", "post", "sandwich"]] = Field(
        default_factory=lambda: ["pre"],
        min_length=1,
        description="Comma list of placements: pre, post, sandwich.",
    )
    precisions: list[str] = Field(
        default_factory=lambda: [DEFAULT_PRECISION],
        min_length=1,
        description="Comma list of training precisions: fp32, bf16, fp16 (autocast around "
        "forward and loss; fp16 with a gradient scaler).",
    )
    fp16_init_scale: float = Field(
        2.0**16,
        gt=0,
        description="fp16 only: the gradient scaler's initial scale (torch's default 2^16).",
    )
    seeds: int | list[int] = Field(
        3, description="Number of paired seeds (0 … n−1) or a list (e.g. 0,1,2)."
    )
    baseline: str | None = None
    margin_bpb: float = Field(0.02, gt=0)
    margin_val_loss: float = Field(0.002, gt=0)
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    threads: int | None = Field(
        None,
        ge=1,
        description="Torch threads per worker (default: half the CPUs, at least 1).",
    )
    parallel: int = Field(1, ge=1, description="Runs trained at once (1 keeps timings clean).")
    log_to: list[str] = Field(default_factory=list, description=LOG_TO_HELP)
    train: TrainSettings = Field(default_factory=TrainSettings)
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings)
    scale: ScaleSettings = Field(default_factory=ScaleSettings)

    @model_validator(mode="before")
    @classmethod
    def _testbed_defaults(cls, data: Any) -> Any:
        """The testbed a config without ``testbed`` selects by a section (``lm``), and its
        testbed's defaults for the norms and the ``train`` keys left out (a budget of tokens,
        or of tokens per parameter, replaces a default ``steps``)."""
        if not isinstance(data, dict):
            return data
        if data.get("testbed") is None:
            chosen = selected_testbed(data, cls.testbeds)
            if chosen != DEFAULT_TESTBED:
                data = {**data, "testbed": chosen}
        name = data.get("testbed", DEFAULT_TESTBED)
        testbed = cls.testbeds.get(name) if isinstance(name, str) else None
        if testbed is None:
            return data
        data = dict(data)
        if testbed.config.default_norms is not None:
            data.setdefault("norms", list(testbed.config.default_norms))
        train = data.get("train", {})
        if testbed.config.train_defaults and isinstance(train, dict):
            defaults = dict(testbed.config.train_defaults)
            if any(train.get(k) is not None for k in LENGTH_KEYS if k != "steps"):
                defaults.pop("steps", None)
            data["train"] = {**defaults, **train}
        return data

    @field_validator("testbed")
    @classmethod
    def _known_testbed(cls, v: str) -> str:
        if v not in cls.testbeds:
            raise ValueError(f"expected one of {', '.join(cls.testbeds)}")
        return v

    @field_validator("log_to", mode="before")
    @classmethod
    def _check_log_to(cls, v: Any) -> Any:
        return check_log_to(v)

    @field_validator("seeds")
    @classmethod
    def _check_seeds(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and v < 1:
            raise ValueError("a seed count must be >= 1")
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or min(v) < 0):
            raise ValueError("a seed list must be non-empty, with distinct values >= 0")
        return v

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if v != "auto" and v.split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
            raise ValueError("expected auto, cpu, cuda, cuda:N, mps or xpu")
        return v

    @field_validator("imports")
    @classmethod
    def _import_modules(cls, v: list[str]) -> list[str]:
        for module in v:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ValueError(f"cannot import {module!r}: {err}") from None
        return v

    @field_validator("norms")
    @classmethod
    def _check_norms(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a norm is listed twice")
        testbed = cls.testbeds.get(info.data.get("testbed", DEFAULT_TESTBED))
        check = (testbed or cls.testbeds[DEFAULT_TESTBED]).config.check_norm
        for norm in v:
            try:
                check(norm)
            except (TypeError, ValueError) as err:
                raise ValueError(str(err).removeprefix("norm: ")) from None
        return v

    @field_validator("precisions")
    @classmethod
    def _check_precisions(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a precision is listed twice")
        for precision in v:
            if precision not in PRECISIONS:
                raise ValueError(
                    f"{precision!r} is not a training precision (--precision); expected one of "
                    f"{', '.join(PRECISIONS)}"
                )
        return v

    @field_validator("placements")
    @classmethod
    def _check_placements(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a placement is listed twice")
        return v

    @model_validator(mode="after")
    def _check_testbed_options(self) -> ExperimentBase:
        """The testbed's own rules (its ``TestbedConfig.check``), then no option of another
        testbed."""
        config = self.testbeds[self.testbed].config
        if config.check is not None:
            config.check(self)
        for option, owners in self.option_owners.items():
            if self.testbed in owners:
                continue
            given = self._given(option)
            if given is not None:
                other = " or ".join(owners)
                default = f"set testbed: {owners[0]} (or --testbed {owners[0]})"
                hint = config.hints.get(option, default)
                raise ValueError(
                    f"{given}: an option of the {other} testbed, but this experiment's testbed "
                    f"is {self.testbed}; {hint}"
                )
        return self

    def _given(self, option: str) -> str | None:
        """The dotted name of the key ``option`` (``"data"``, ``"train.eval_windows"``) if the
        config gave it (for a section: its first key given, or the section itself), else None."""
        section, _, key = option.partition(".")
        if section not in self.model_fields_set:
            return None
        value = getattr(self, section)
        if not isinstance(value, BaseModel):
            return section
        if key:
            return option if key in value.model_fields_set else None
        given = [k for k in type(value).model_fields if k in value.model_fields_set]
        # a key that is an option of its own (data.tokenizer) is reported as that option
        own = [k for k in given if f"{section}.{k}" not in self.option_owners]
        if own or not given:
            return f"{section}.{own[0]}" if own else section
        return None

    @model_validator(mode="after")
    def _check_two_arms(self) -> ExperimentBase:
        """A comparison needs something to compare: at least two arms (norm × placement)."""
        arms = self.arm_names()
        if len(arms) >= 2:
            return self
        hint = self.testbeds[self.testbed].config.arms_hint
        raise ValueError(
            f"norms, placements, precisions: {len(self.norms)} norm, {len(self.placements)} "
            f"placement and {len(self.precisions)} precision make the single arm {arms[0]}; "
            f"a comparison needs at least two arms. Expected {hint}"
        )

    @model_validator(mode="after")
    def _check_warmup(self) -> ExperimentBase:
        """The warm-up against the steps the config gives (:meth:`_check_warmup_fits`; under a
        budget of tokens per parameter the grid checks it on the steps it resolves:
        :meth:`check_steps`)."""
        steps = self.fixed_steps()
        if steps is not None:
            self._check_warmup_fits(steps)
        return self

    @model_validator(mode="after")
    def _check_train_options(self) -> ExperimentBase:
        """The ``train`` options against the steps the config gives and the processes per run
        (:meth:`TrainSettings.check_options`)."""
        self.train.check_options(self.fixed_steps(), self.scale.world_size)
        return self

    def check_steps(self, steps: int) -> None:
        """``ValueError`` naming the key unless a run of ``steps`` steps fits the warm-up and
        the ``train`` options that depend on the steps (:meth:`TrainSettings.check_steps`): what
        the grid checks once it has resolved a budget of tokens per parameter."""
        self._check_warmup_fits(steps)
        self.train.check_steps(steps)

    def _check_warmup_fits(self, steps: int) -> None:
        """The schedule (:func:`normlab.experiment.training.schedule.lr_at`) reaches its peak at
        step ``warmup`` and decays until the last step, so a warm-up needs steps after it."""
        warmup, t = self.train.warmup, self.train
        if warmup > 0 and warmup >= steps:
            given, more = f"train.steps = {steps}", "--steps (or --tokens)"
            if t.tokens is not None:
                given += f" (from train.tokens = {t.tokens})"
            elif t.tokens_per_param is not None:
                given += f" (from train.tokens_per_param = {t.tokens_per_param:g})"
                more = "--tokens-per-param"
            raise ValueError(
                f"train.warmup: {warmup} warm-up steps with {given}; expected train.warmup < "
                "train.steps (the learning rate rises to its peak at step train.warmup, then "
                f"decays to the last step), or 0 for no warm-up. Lower --warmup or raise {more}"
            )

    @model_validator(mode="after")
    def _check_learning_rates(self) -> ExperimentBase:
        """Per-arm rates only for arms of the experiment, each positive and finite."""
        rates = self.train.arm_lr or {}
        unknown = [a for a in rates if a not in self.arm_names()]
        if unknown:
            raise ValueError(
                f"train.arm_lr: {unknown[0]!r} is not an arm; expected rates for arms among "
                f"{', '.join(self.arm_names())}"
            )
        bad = [f"{a}={r!r}" for a, r in rates.items() if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ValueError(f"train.arm_lr: expected positive learning rates, got {bad[0]}")
        return self

    @model_validator(mode="after")
    def _check_baseline(self) -> ExperimentBase:
        self.check_baseline()
        return self

    def arms(self) -> list[tuple[str, str, str]]:
        """(arm name, norm, placement) in grid order (see :meth:`arm_factors`)."""
        return [(a, n, p) for a, n, p, _ in self.arm_factors()]

    def tokens_per_sample(self) -> int:
        """Tokens in one training sample (the testbed's ``sample_length``: the GPT's
        ``model.context``, the DiT's patches per image, the lm's ``lm.context``)."""
        section, key = self.testbeds[self.testbed].config.sample_length
        return int(getattr(getattr(self, section), key))

    def tokens_per_step(self) -> int:
        """Training tokens of one step: ``train.batch_size`` · :meth:`tokens_per_sample`."""
        return self.train.batch_size * self.tokens_per_sample()

    def fixed_steps(self) -> int | None:
        """Training steps as the config gives them: ``train.steps``, or ⌈``train.tokens`` /
        tokens per step⌉; None under a budget of tokens per parameter (the grid resolves it:
        :meth:`resolved_steps`)."""
        t = self.train
        if t.steps is not None:
            return t.steps
        if t.tokens is not None:
            return math.ceil(t.tokens / self.tokens_per_step())
        return None

    def resolved_steps(self, budget_params: int | None = None) -> int:
        """Training steps: :meth:`fixed_steps`, or under ``train.tokens_per_param`` X
        ⌈X · N / tokens per step⌉ (:func:`normlab.run_format.budget.budget_steps`) with N =
        ``budget_params``, the grid's baseline-arm count; ValueError naming
        ``train.tokens_per_param`` when the budget has no N yet."""
        steps = self.fixed_steps()
        if steps is not None:
            return steps
        x = self.train.tokens_per_param
        assert x is not None  # TrainSettings guarantees one of the three
        if budget_params is None:
            raise ValueError(
                "train.tokens_per_param: the steps follow the baseline arm's parameter count, "
                "known once the grid is planned; expected it (budget_params)"
            )
        return budget_steps(x, budget_params, self.tokens_per_step())

    def arm_lr(self, arm: str) -> float:
        """The peak learning rate of ``arm``: ``train.arm_lr[arm]``, else ``train.lr``."""
        return float((self.train.arm_lr or {}).get(arm, self.train.lr))

    def margin(self) -> float:
        """The equivalence margin of the testbed's quality metric (in that metric's unit)."""
        return float(getattr(self, testbed_format(self.testbed).margin_key))

    def dump(self) -> dict[str, Any]:
        """The validated config as JSON-ready data, without the other testbeds' options."""
        other = [o for o, owners in self.option_owners.items() if self.testbed not in owners]
        exclude = {o for o in other if "." not in o}
        data = self.model_dump(mode="json", exclude=exclude)
        for option in other:
            section, _, key = option.partition(".")
            if key and section in data:
                data[section].pop(key, None)
        return data


def config_class(testbeds: Mapping[str, type[Testbed]]) -> type[ExperimentBase]:
    """The experiment config for the registered ``testbeds``: :class:`ExperimentBase` with each
    testbed's sections as fields (in registration order; a section two testbeds share once),
    the ``testbed`` field's help naming them. Raises ``TypeError`` when two testbeds declare
    one section with different classes, or a testbed has no run format
    (:data:`normlab.run_format.TESTBED_FORMATS`)."""
    sections: dict[str, type[BaseModel]] = {}
    for name, testbed in testbeds.items():
        if name not in TESTBED_FORMATS or testbed.name != name:
            raise TypeError(
                f"testbed {name!r}: expected a testbed registered under its own name with a "
                f"run format in normlab.run_format.TESTBED_FORMATS ({', '.join(TESTBED_FORMATS)})"
            )
        for key, section in testbed.config.sections.items():
            if sections.setdefault(key, section) is not section:
                raise TypeError(
                    f"testbed {name!r}: its section {key!r} is {section.__name__}, another "
                    f"testbed's is {sections[key].__name__}; expected one class per section"
                )
    summaries = [t.config.summary for t in testbeds.values()]
    described = ", ".join(summaries[:-1]) + " or " + summaries[-1] if len(summaries) > 1 else ""
    cls = create_model(
        "ExperimentConfig",
        __base__=ExperimentBase,
        __module__=__name__,
        __doc__=ExperimentBase.__doc__,
        testbed=(str, Field(DEFAULT_TESTBED, description=(described or summaries[0]) + ".")),
        **{k: (c, Field(default_factory=c)) for k, c in sections.items()},  # type: ignore[call-overload]
    )
    cls.testbeds = dict(testbeds)
    cls.option_owners = testbed_options(testbeds)
    return cls


ExperimentConfig = config_class(TESTBEDS)
"""The experiment config of the registered testbeds (:func:`config_class`)."""


def arm_name(norm: str, placement: str, precision: str | None = None) -> str:
    """``<norm>-<placement>``, e.g. ``rmsnorm-pre``; with a ``precision``,
    ``<norm>-<placement>-<precision>``, e.g. ``rmsnorm-pre-bf16``."""
    return f"{norm}-{placement}" if precision is None else f"{norm}-{placement}-{precision}"


class ConfigError(ValueError):
    """An invalid experiment configuration; the message names each bad key."""


def _section_at(loc: tuple[Any, ...], config: type[BaseModel]) -> type[BaseModel]:
    """The class of ``config`` (an experiment config class) that owns the key at ``loc`` (the
    last element)."""
    cls = config
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        sub = getattr(field, "annotation", None) if field else None
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            cls = sub
        else:
            break
    return cls


MAX_SHOWN_CHARS = 200
"""The most characters of a given value that a validation message quotes."""
MAX_CONFIG_VALUES = 100_000
"""The most values (scalars, lists and mappings, counted with YAML aliases expanded) a config
file may hold; a real config holds well under a hundred."""


def _shown_value(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_SHOWN_CHARS` characters, built without ever forming
    the whole text (a value built by YAML aliases can be astronomically large)."""
    limiter = reprlib.Repr()
    limiter.maxlevel, limiter.maxlist, limiter.maxtuple, limiter.maxdict = 3, 8, 8, 8
    limiter.maxstring, limiter.maxother, limiter.maxlong = MAX_SHOWN_CHARS, MAX_SHOWN_CHARS, 60
    text = limiter.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def describe_errors(err: ValidationError, config: type[BaseModel] | None = None) -> str:
    """One line per problem: the dotted key, what is wrong, and the valid keys for unknown ones
    (of ``config``, the experiment config class validated: :data:`ExperimentConfig` by
    default). Given values are quoted cut to :data:`MAX_SHOWN_CHARS` characters, and at most 20
    problems are listed."""
    lines = []
    errors = err.errors(include_url=False, include_context=False)
    for e in errors[:20]:
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "config"
        if e["type"] == "extra_forbidden":
            cls = _section_at(loc, config or ExperimentConfig)
            section = ".".join(str(p) for p in loc[:-1]) or "the top level"
            valid = ", ".join(cls.model_fields)
            lines.append(f"unknown key {key!r}; valid keys of {section}: {valid}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if len(msg) > 2 * MAX_SHOWN_CHARS:
                msg = msg[: 2 * MAX_SHOWN_CHARS - 3] + "..."
            given = e.get("input")
            shown = "" if isinstance(given, dict) else f" (got {_shown_value(given)})"
            lines.append(f"{key}: {msg}{shown}" if loc else msg)
    if len(errors) > 20:
        lines.append(f"... and {len(errors) - 20} more problems")
    return "invalid experiment config:\n  " + "\n  ".join(lines)


def validate_config(
    data: dict[str, Any], config: type[ExperimentBase] | None = None
) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` (or an instance of ``config``, a class made by
    :func:`config_class`) from a plain dict, raising :class:`ConfigError`."""
    config = config or ExperimentConfig
    if not isinstance(data, dict):
        raise ConfigError(
            f"config: expected a mapping of keys to values, got {type(data).__name__}"
        )
    try:
        return config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, config)) from None


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that scientific notation without a dot or without an
    exponent sign (``1e-3``, ``1E5``, ``2.5e4``, ``.5e-3``) is a float, as in YAML 1.2 and
    Python. PyYAML follows YAML 1.1 there and would read those as strings. A key given twice
    in one mapping is an error (PyYAML would keep the last value silently); keys brought in by a
    ``<<`` merge may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                key_node, yaml.ScalarNode
            ):
                continue
            key = key_node.value
            if key in seen:
                raise yaml.YAMLError(
                    f"the key {key!r} is given twice in one mapping (lines "
                    f"{seen[key].line + 1} and {key_node.start_mark.line + 1}); expected each "
                    "key once"
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def expanded_size(data: Any, limit: int = MAX_CONFIG_VALUES) -> int:
    """The number of values in ``data`` counting every list and mapping and each scalar once per
    place it appears (what a YAML alias shares counts at each use): n(x) = 1 + Σ n(child).
    Computed once per distinct object, so in time linear in the parsed document; stops counting
    (returns a number above ``limit``) as soon as the count passes ``limit``."""
    memo: dict[int, int] = {}

    def count(node: Any) -> int:
        if not isinstance(node, (list, dict)):
            return 1
        known = memo.get(id(node))
        if known is not None:
            return known
        memo[id(node)] = limit + 1  # a cycle (a recursive alias) counts as too large
        children = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
        total = 1
        for child in children:
            total += count(child)
            if total > limit:
                break
        memo[id(node)] = total
        return total

    return count(data)


def load_yaml(text: str) -> Any:
    """Parse YAML with :class:`ConfigLoader` (safe: plain data only). Raises
    ``yaml.YAMLError`` for a key given twice, and for a document whose aliases expand it to more
    than :data:`MAX_CONFIG_VALUES` values (an "alias bomb": tiny text, astronomically large
    data)."""
    data = yaml.load(text, Loader=ConfigLoader)
    size = expanded_size(data)
    if size > MAX_CONFIG_VALUES:
        raise yaml.YAMLError(
            f"its aliases expand it to more than {MAX_CONFIG_VALUES:,} values (a config holds "
            "a few dozen); expected plain settings"
        )
    return data


def _one_line(err: yaml.YAMLError) -> str:
    """A PyYAML error on one line: what is wrong and where (PyYAML's own text quotes the
    offending lines over several)."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        context = f"{err.context}: " if err.context else ""
        return f"{context}{err.problem}{where}"
    return " ".join(str(err).split())


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config into a dict (an empty file is an empty dict). Raises
    :class:`ConfigError` naming the file if it is missing, unreadable, not UTF-8 text or not
    valid YAML (see :func:`load_yaml`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        text = _one_line(err)
        if len(text) > 4 * MAX_SHOWN_CHARS:
            text = text[: 4 * MAX_SHOWN_CHARS - 3] + "..."
        raise ConfigError(f"config: {str(path)!r} is not valid YAML: {text}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config: {str(path)!r} is not UTF-8 text (byte {err.object[err.start]:#04x} at "
            f"offset {err.start}); expected a YAML file saved as UTF-8"
        ) from None
    except (OSError, RecursionError) as err:
        reason = err.strerror if isinstance(err, OSError) else "nested too deeply"
        raise ConfigError(f"config: cannot read {str(path)!r} ({reason})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the dotted keys of ``overrides`` (``"train.lr"``) set; ``None`` is skipped."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        *sections, key = dotted.split(".")
        node = merged
        for s in sections:
            child = node.get(s)
            if not isinstance(child, dict):
                child = {}
                node[s] = child
            node = child
        node[key] = value
    return merged


_FACTOR_VALUE = re.compile(r"^[^/\x00]+$")


class ScriptConfig(GridConfig):
    """``normlab compare --script``: the grid of a user's own training script.

    ``command`` is the script's command line with placeholders (checked by
    :func:`normlab.experiment.execution.script_run.check_script_command`); ``metric`` the
    ``eval`` metric that decides quality, ``lower_is_better`` its direction and
    ``equivalence_margin`` the difference in its unit that does not matter (> 0; None: no
    equivalence test, a quality verdict is better, worse or not determined). ``norms``,
    ``placements`` and ``precisions`` are the factors
    (any names the script understands; the arms are their product, named as
    :func:`arm_name` says), ``seeds`` a count or a list, ``baseline`` the arm the others are
    compared with (default: the first). ``parallel`` runs at once, ``threads`` the CPU threads
    each script is given (default: as for normlab's own runs), ``run_timeout`` the seconds after
    which a run is killed and recorded as timed out (None: no limit), ``steps`` the steps the
    script trains (only for the progress bar), ``cwd`` the folder the script starts in;
    ``scale`` chooses the executor (``local`` or ``ray``; the script starts its own processes,
    so a launch on several is its command's, e.g. ``torchrun …``); ``log_to`` the trackers each
    run is exported to.
    """

    grid_kind: ClassVar[str] = SCRIPT_GRID

    command: str
    metric: str
    lower_is_better: bool = True
    equivalence_margin: float | None = Field(None, gt=0)
    norms: list[str] = Field(default_factory=lambda: list(DEFAULT_NORMS), min_length=1)
    placements: list[str] = Field(default_factory=lambda: ["pre"], min_length=1)
    precisions: list[str] = Field(default_factory=lambda: [DEFAULT_PRECISION], min_length=1)
    seeds: int | list[int] = 3
    baseline: str | None = None
    parallel: int = Field(1, ge=1)
    threads: int | None = Field(None, ge=1)
    run_timeout: float | None = Field(None, gt=0)
    steps: int | None = Field(None, ge=1)
    cwd: str = "."
    scale: ScaleSettings = Field(default_factory=ScaleSettings)
    log_to: list[str] = Field(default_factory=list, description=LOG_TO_HELP)

    @field_validator("log_to", mode="before")
    @classmethod
    def _check_log_to(cls, v: Any) -> Any:
        return check_log_to(v)

    @field_validator("norms", "placements", "precisions")
    @classmethod
    def _check_factor_values(cls, v: list[str], info: ValidationInfo) -> list[str]:
        for value in v:
            if not _FACTOR_VALUE.match(value) or value in (".", ".."):
                raise ValueError(
                    f"{value!r} cannot name a run folder; expected a non-empty name without "
                    "'/' (any other character is passed to the script as it is)"
                )
        if len(set(v)) != len(v):
            raise ValueError(f"each value once, got {v}")
        return v

    @field_validator("seeds")
    @classmethod
    def _check_script_seeds(cls, v: int | list[int]) -> int | list[int]:
        bad_list = isinstance(v, list) and (not v or len(set(v)) < len(v))
        if (isinstance(v, int) and v < 1) or bad_list:
            raise ValueError(f"expected a count ≥ 1 or a list of distinct seeds, got {v!r}")
        return v

    @model_validator(mode="after")
    def _check_script(self) -> ScriptConfig:
        check_script_command(self.command)
        if self.scale.world_size > 1:
            raise ValueError(
                "scale: with --script, each run is your command; start several processes in it "
                "(e.g. torchrun --nproc-per-node 2 train.py …) instead of --nproc-per-node"
            )
        testbed_format(self.testbed)  # the metric's name
        if len(self.arm_names()) < 2:
            raise ValueError(
                "norms: a comparison needs two or more arms; expected --norms a,b (or several "
                "placements or precisions)"
            )
        self.check_baseline()
        return self

    @property
    def testbed(self) -> str:
        """The run format's name of this grid's testbed (``script:<metric>:min|max``)."""
        return script_testbed(self.metric, self.lower_is_better)

    def margin(self) -> float | None:
        """The equivalence margin, in the metric's unit (None when none was given)."""
        return self.equivalence_margin

    def dump(self) -> dict[str, Any]:
        """The validated config as JSON-ready data."""
        return self.model_dump()
