"""What a ``normlab compare`` is asked to do, as typed specs: the grid, and the transforms that
make plans from it.

A :class:`StudySpec` holds the grid config (normlab's own :class:`ExperimentConfig`, or the
:class:`ScriptConfig` of ``--script``), the output folder, and each transform with its own
small config: a :class:`LadderSpec` (one compare per model size; it wraps the experiment config
whose model it varies), a :class:`SweepSpec` (each arm at its best learning rate, chosen on
tuning seeds), a :class:`RoundsSpec` (``--until-decided``: paired seeds in rounds); then
whether to train or only prepare the runs (``--plan``), whether to build the report, and the
command's recorded flags. One compare's config knows nothing of ladders or sweeps: a config
file's top-level keys of :class:`StudySettings` are the study's, split off by
:mod:`normlab.study.loader` before the experiment config is validated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field
from rich.console import Console

from normlab.analysis.sequential import DEFAULT_MAX_SEEDS, look_schedule
from normlab.experiment.config import ExperimentConfig, ScriptConfig
from normlab.models.config import ConfigModel

__all__ = [
    "DEFAULT_MAX_TIME_S",
    "DEFAULT_TUNING_SEEDS",
    "STUDY_KEYS",
    "GridConfig",
    "LadderSpec",
    "RoundsSpec",
    "StudySettings",
    "StudySpec",
    "SweepSpec",
    "Trainer",
    "check_lr_sweep",
]

GridConfig = ExperimentConfig | ScriptConfig
"""A grid of arms × seeds: normlab's own testbeds, or a user's ``--script``."""

DEFAULT_TUNING_SEEDS = 2
"""Tuning seeds per arm and rate of a learning-rate sweep when ``tuning_seeds`` is left out."""
DEFAULT_MAX_TIME_S = 360.0
"""No round of ``--until-decided`` starts that would end later than this, by default."""


class StudySettings(ConfigModel):
    """The keys of a compare's config (a YAML file's top level, or the flags) that describe the
    study, not one compare: a size ladder and a learning-rate sweep. Their values are checked
    here for type; :class:`LadderSpec` and :class:`SweepSpec` check their rules."""

    ladder: dict[str, list[int]] | None = Field(
        None,
        description="A size ladder KEY=v1,v2,… (gpt: d_model or n_layers; lm: an integer key of "
        "the hf: config, hidden_size bringing heads and MLP width along): one paired "
        "comparison per size, the same seeds, data and fixed steps in each.",
    )
    target_params: float | None = Field(
        None,
        gt=0,
        description="With --ladder: the size to predict at (default: 100× the largest rung).",
    )
    lr_sweep: list[float] | None = Field(
        None,
        description="Learning rates to try each arm at, on tuning seeds apart from the "
        "evaluation seeds; each arm is then compared at its best (e.g. 1e-3,3e-3,1e-2).",
    )
    tuning_seeds: int | None = Field(
        None,
        description=f"With --lr-sweep: tuning seeds per arm and rate (default: "
        f"{DEFAULT_TUNING_SEEDS}), the seeds after the evaluation seeds.",
    )


STUDY_KEYS = tuple(StudySettings.model_fields)
"""The top-level keys of a compare config that belong to the study (:class:`StudySettings`)."""


def check_lr_sweep(rates: Any, tuning_seeds: Any = None, lr_given: bool = False) -> None:
    """Raise ``ValueError`` naming the option (``--lr-sweep``, ``--tuning-seeds``, ``--lr``)
    unless the values describe a learning-rate sweep, or none: at least two distinct positive
    finite rates, ``tuning_seeds`` (an integer >= 1) only with a sweep, and no single
    ``train.lr`` beside it (the sweep gives each arm its own rate)."""
    if rates is None:
        if tuning_seeds is not None:
            raise ValueError(
                f"--tuning-seeds: only with --lr-sweep (the seeds each rate is tried on), got "
                f"--tuning-seeds {tuning_seeds!r} without a sweep"
            )
        return
    shown = ",".join(f"{r:g}" if isinstance(r, float) else repr(r) for r in rates)
    if any(isinstance(r, bool) or not isinstance(r, (int, float)) for r in rates):
        raise ValueError(f"--lr-sweep: expected learning rates (numbers), got {shown}")
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"--lr-sweep: expected positive finite learning rates, got {shown}")
    if len(rates) < 2:
        raise ValueError(
            f"--lr-sweep: expected at least two learning rates to choose from, got {shown}"
        )
    if len({float(r) for r in rates}) != len(rates):
        raise ValueError(f"--lr-sweep: a learning rate is listed twice in {shown}")
    if tuning_seeds is not None and (
        isinstance(tuning_seeds, bool) or not isinstance(tuning_seeds, int) or tuning_seeds < 1
    ):
        raise ValueError(
            f"--tuning-seeds: expected an integer >= 1 (tuning seeds per arm and rate), got "
            f"{tuning_seeds!r}"
        )
    if lr_given:
        raise ValueError(
            "--lr: one learning rate for every arm, but --lr-sweep chooses each arm's own; "
            "expected one of the two"
        )


@dataclass(frozen=True)
class LadderSpec:
    """A size ladder (``--ladder KEY=v1,v2,…``): the experiment ``config`` whose model each rung
    sets to ``key`` = one of ``values``, and the size to predict at (``target_params``; None:
    100× the largest rung). ``ValueError`` naming ``--ladder`` unless it is one key, and
    naming ``--seeds`` unless the config has two paired seeds per rung (their spread weighs
    each rung); the rest (the key, the sizes, each rung's model) is
    :func:`normlab.study.ladder.plan_ladder`'s to check."""

    config: ExperimentConfig
    key: str
    values: tuple[int, ...]
    target_params: float | None = None

    def __post_init__(self) -> None:
        if len(self.config.seed_list()) < 2:
            raise ValueError(
                "--seeds: a ladder needs at least two paired seeds per rung (their spread "
                f"weighs each rung), got {len(self.config.seed_list())}"
            )

    @classmethod
    def of(
        cls, config: ExperimentConfig, ladder: dict[str, list[int]], target: float | None
    ) -> LadderSpec:
        """The spec of a config's ``ladder`` mapping ({KEY: sizes}, one key)."""
        if len(ladder) != 1:
            raise ValueError(
                f"--ladder: expected one KEY=v1,v2,… (e.g. d_model=32,64,128), got "
                f"{len(ladder)} keys"
            )
        ((key, values),) = ladder.items()
        return cls(config, key, tuple(values), target)


@dataclass(frozen=True)
class SweepSpec:
    """A learning-rate sweep (``--lr-sweep r1,r2,…``): the ``rates`` each arm is tried at and
    the ``tuning_seeds`` per arm and rate (:func:`check_lr_sweep`'s rules)."""

    rates: tuple[float, ...]
    tuning_seeds: int = DEFAULT_TUNING_SEEDS

    def __post_init__(self) -> None:
        check_lr_sweep(list(self.rates), self.tuning_seeds)


@dataclass(frozen=True)
class RoundsSpec:
    """``--until-decided``: at most ``max_seeds`` seeds per arm (the last planned look), and no
    round started after ``max_time`` seconds (checked when the rounds start)."""

    max_seeds: int = DEFAULT_MAX_SEEDS
    max_time: float = DEFAULT_MAX_TIME_S


@dataclass(frozen=True)
class StudySpec:
    """One ``normlab compare``: train (or with ``plan``, only prepare) the ``grid`` into
    ``out``, through the transforms given (``ladder``, ``sweep``, ``rounds``), building the
    report unless ``report`` is False; ``args`` are the command's flags, recorded in the
    folder for the settling command. A ladder wraps the grid's config (``ladder.config`` is
    ``grid``). ``ValueError`` naming ``--plan`` for a sweep with it (the comparison's rates
    come from the tuning runs' results)."""

    grid: GridConfig
    out: Path
    ladder: LadderSpec | None = None
    sweep: SweepSpec | None = None
    rounds: RoundsSpec | None = None
    plan: bool = False
    report: bool = True
    args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sweep is not None and self.plan:
            raise ValueError(
                "--plan: not available with --lr-sweep (the comparison's rates come from the "
                "tuning runs' results); run without --plan"
            )
        if self.ladder is not None and self.ladder.config is not self.grid:
            raise ValueError("ladder: expected a ladder of the study's own grid config")
        if self.rounds is not None:
            check_rounds(self.rounds, len(self.grid.seed_list()))


def check_rounds(rounds: RoundsSpec, n_seeds: int) -> tuple[int, ...]:
    """The look schedule of ``--until-decided`` from ``n_seeds`` seeds
    (:func:`normlab.analysis.sequential.look_schedule`); ``ValueError`` naming ``--max-time``,
    ``--max-seeds`` or ``--seeds`` when the options cannot make one (a usage error, found
    before anything is written)."""
    if not rounds.max_time > 0:
        raise ValueError(f"max_time: expected --max-time in seconds > 0, got {rounds.max_time!r}")
    return look_schedule(n_seeds, rounds.max_seeds)


class Trainer(Protocol):
    """What a transform asks of the study that runs it (:class:`normlab.study.study.Study`):
    its ``spec``, its ``console``, :meth:`train` a grid into a folder (in rounds with
    ``rounds``; the report with ``report``) → {run_id: summary}, and :meth:`check_results` of
    the runs trained."""

    spec: StudySpec
    console: Console

    def train(
        self, cfg: GridConfig, out: Path, *, report: bool, rounds: RoundsSpec | None
    ) -> dict[str, dict[str, Any]]: ...

    def check_results(self, summaries: dict[str, dict[str, Any]], out: Path) -> None: ...
