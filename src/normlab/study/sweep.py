"""A learning-rate sweep (``compare --lr-sweep r1,r2,…``): the tuning runs and each arm's rate.

Every arm is trained at every rate r of the sweep on the tuning seeds (seeds apart from the
evaluation seeds, so choosing does not bias the comparison; after every seed ``--until-decided``
may add, :func:`sweep_seeds`), as an ordinary compare folder per rate,
:func:`normlab.run_format.folder.sweep_path`: ``OUT/lr-sweep/lr=<r>/`` beside a plain compare,
``OUT/lr-sweep/<setting>/lr=<r>/`` per swept rung of a ladder. Those folders resume like any
compare (finished runs are kept). The choice itself — the lowest mean loss over the tuning
seeds among the rates where none diverged — is the analysis's
(:mod:`normlab.analysis.lr_sweep`); the comparison then runs each arm at its own rate
(:func:`with_arm_rates`: ``train.arm_lr``, each run's own ``train.lr``), with the same
initialisation, data order and seeds as ever.

Which rungs of a ladder are swept (:func:`sweep_plan`): under the standard parametrisation
every rung, each running its own best rates; under μP with a width ladder (``d_model``,
``hidden_size``) the smallest rung, whose best rates every rung runs (μP's promise is that they
carry over), and the largest, to check that the optimum lines up there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

from normlab.analysis.lr_sweep import (
    PLAIN_SWEEP_SETTING,
    LrCurve,
    lr_sweep_record,
    sweep_lines,
    tuning_seeds,
)
from normlab.analysis.lr_sweep_folder import read_sweep
from normlab.experiment.config import ExperimentConfig
from normlab.run_format import folder as run_folder
from normlab.study.errors import Stopped
from normlab.study.rounds import seed_sequence
from normlab.study.rungs import LadderPlan
from normlab.study.spec import RoundsSpec, SweepSpec, Trainer

__all__ = [
    "SweepPlan",
    "ladder_sweep_record",
    "sweep_folders",
    "sweep_ladder",
    "sweep_one",
    "sweep_plan",
    "sweep_seeds",
    "tuning_config",
    "with_arm_rates",
]


@dataclass(frozen=True)
class SweepPlan:
    """The rungs to sweep (``swept``, ascending) and, per rung, the swept setting whose best
    rates it runs (``chosen_at``)."""

    swept: tuple[str, ...]
    chosen_at: dict[str, str]


def sweep_plan(plan: LadderPlan) -> SweepPlan:
    """Under μP with a width ladder (``d_model``, ``hidden_size``:
    :attr:`LadderPlan.carries_rates`): the smallest and the largest rung are swept and every rung
    runs the smallest's rates; otherwise every rung is swept and runs its own."""
    settings = plan.settings
    if plan.carries_rates:
        return SweepPlan((settings[0], settings[-1]), {s: settings[0] for s in settings})
    return SweepPlan(tuple(settings), {s: s for s in settings})


def tuning_config(cfg: ExperimentConfig, rate: float, seeds: Sequence[int]) -> ExperimentConfig:
    """``cfg`` on the tuning ``seeds`` with every arm at the peak rate ``rate``."""
    train = cfg.train.model_copy(update={"lr": float(rate), "arm_lr": None})
    return cfg.model_copy(update={"train": train, "seeds": [int(s) for s in seeds]})


def with_arm_rates(cfg: ExperimentConfig, rates: Mapping[str, float]) -> ExperimentConfig:
    """``cfg`` with each arm of ``rates`` at its own peak rate (``train.arm_lr``);
    ``ValueError`` naming ``--lr-sweep`` unless ``rates`` names every arm."""
    missing = [a for a in cfg.arm_names() if a not in rates]
    if missing:
        raise ValueError(f"--lr-sweep: no chosen rate for the arm {missing[0]!r}")
    chosen = {a: float(rates[a]) for a in cfg.arm_names()}
    train = cfg.train.model_copy(update={"arm_lr": chosen})
    return cfg.model_copy(update={"train": train})


def sweep_folders(
    out: Path, rates: Sequence[float], setting: str | None = None
) -> dict[float, Path]:
    """{rate: its compare folder of tuning runs} (:func:`normlab.run_format.folder.sweep_path`),
    in increasing rate."""
    return {float(r): run_folder.sweep_path(out, r, setting) for r in sorted(rates)}


def sweep_seeds(
    cfg: ExperimentConfig, sweep: SweepSpec, rounds: RoundsSpec | None = None
) -> list[int]:
    """The sweep's tuning seeds (:func:`normlab.analysis.lr_sweep.tuning_seeds`): after the
    evaluation seeds, which under ``--until-decided`` are every seed the rounds may add (up to
    ``--max-seeds``, :func:`normlab.study.rounds.seed_sequence`)."""
    evaluation = cfg.seed_list()
    if rounds is not None:
        evaluation = seed_sequence(cfg, max(rounds.max_seeds, len(evaluation)))
    return tuning_seeds(sweep.tuning_seeds, evaluation)


def ladder_sweep_record(
    cfg: ExperimentConfig, plan: LadderPlan, sweep: SweepSpec, rounds: RoundsSpec | None
) -> dict[str, Any]:
    """The sweep's plan of the ladder ``plan`` of ``cfg`` as ``ladder.json`` records it under
    ``lr_sweep``: ``rates``, ``tuning_seeds``, ``swept`` (the rungs swept), ``chosen_at``
    ({rung: the swept rung whose best rates it runs})."""
    which = sweep_plan(plan)
    return {
        "rates": sorted(sweep.rates),
        "tuning_seeds": sweep_seeds(cfg, sweep, rounds),
        "swept": list(which.swept),
        "chosen_at": which.chosen_at,
    }


def _train_rates(
    study: Trainer, cfg: ExperimentConfig, folders: dict[float, Path], seeds: list[int], where: str
) -> tuple[str, dict[str, LrCurve]]:
    """Train every rate's tuning runs of ``cfg`` (each arm at that rate, on ``seeds``) into
    ``folders`` ({rate: folder}; finished runs are kept) and read each arm's curve and best
    rate: (the quality metric, {arm: :class:`normlab.analysis.lr_sweep.LrCurve`})."""
    for rate, folder in folders.items():
        study.console.print(
            f"learning-rate sweep at {where}: every arm at {rate:g} on tuning seeds "
            f"{', '.join(map(str, seeds))}"
        )
        study.train(tuning_config(cfg, rate, seeds), folder, report=False, rounds=None)
    try:
        return read_sweep(folders)
    except ValueError as err:
        raise Stopped(err) from None


def _say(study: Trainer, record: dict[str, Any], metric: str) -> None:
    for line in sweep_lines(record, metric):
        study.console.print(escape(line), soft_wrap=True, highlight=False)


def sweep_one(study: Trainer, cfg: ExperimentConfig, sweep: SweepSpec) -> ExperimentConfig:
    """``--lr-sweep`` without ``--ladder``: train the tuning runs into
    ``OUT/lr-sweep/lr=<rate>/``, say the choice, and return ``cfg`` with each arm at its best
    rate (``--out`` is checked before, by the study)."""
    seeds = sweep_seeds(cfg, sweep, study.spec.rounds)
    folders = sweep_folders(study.spec.out, sweep.rates)
    metric, curves = _train_rates(study, cfg, folders, seeds, PLAIN_SWEEP_SETTING)
    _say(study, lr_sweep_record({PLAIN_SWEEP_SETTING: curves}, seeds), metric)
    return with_arm_rates(cfg, {arm: c.best for arm, c in curves.items()})


def sweep_ladder(
    study: Trainer, plan: LadderPlan, record: dict[str, Any]
) -> list[ExperimentConfig]:
    """The tuning runs of every swept rung (``record``: ladder.json's ``lr_sweep``), the words
    of the choice, and each rung's config with its arms at their chosen rates."""
    by_setting = dict(zip(plan.settings, plan.configs, strict=True))
    curves, metric = {}, ""
    for setting in record["swept"]:
        folders = sweep_folders(study.spec.out, record["rates"], setting)
        seeds = record["tuning_seeds"]
        metric, curves[setting] = _train_rates(study, by_setting[setting], folders, seeds, setting)
    choice = lr_sweep_record(curves, record["tuning_seeds"], record["chosen_at"])
    _say(study, choice, metric)
    return [with_arm_rates(by_setting[s], choice["chosen"][s]) for s in plan.settings]
