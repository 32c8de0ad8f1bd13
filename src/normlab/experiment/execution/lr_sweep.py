"""A learning-rate sweep (``compare --lr-sweep r1,r2,…``): the tuning runs and each arm's rate.

Every arm is trained at every rate r of the sweep on the tuning seeds (seeds apart from the
evaluation seeds, so choosing does not bias the comparison), as an ordinary compare folder per
rate, :func:`normlab.run_format.folder.sweep_path`: ``OUT/lr-sweep/lr=<r>/`` beside a plain
compare, ``OUT/lr-sweep/<setting>/lr=<r>/`` per swept rung of a ladder. Those folders resume
like any compare (finished runs are kept). The choice itself — the lowest mean loss over the
tuning seeds among the rates where none diverged — is the analysis's
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

from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.ladder import LadderPlan
from normlab.run_format import folder as run_folder

__all__ = ["SweepPlan", "sweep_folders", "sweep_plan", "tuning_config", "with_arm_rates"]


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
    """``cfg`` on the tuning ``seeds`` with every arm at the peak rate ``rate``, without the
    sweep's and the ladder's own fields."""
    train = cfg.train.model_copy(update={"lr": float(rate), "arm_lr": None})
    return cfg.model_copy(
        update={
            "train": train,
            "seeds": [int(s) for s in seeds],
            "lr_sweep": None,
            "tuning_seeds": None,
            "ladder": None,
            "target_params": None,
        }
    )


def with_arm_rates(cfg: ExperimentConfig, rates: Mapping[str, float]) -> ExperimentConfig:
    """``cfg`` with each arm of ``rates`` at its own peak rate (``train.arm_lr``), without the
    sweep's fields; ``ValueError`` naming ``--lr-sweep`` unless ``rates`` names every arm."""
    missing = [a for a in cfg.arm_names() if a not in rates]
    if missing:
        raise ValueError(f"--lr-sweep: no chosen rate for the arm {missing[0]!r}")
    chosen = {a: float(rates[a]) for a in cfg.arm_names()}
    train = cfg.train.model_copy(update={"arm_lr": chosen})
    return cfg.model_copy(update={"train": train, "lr_sweep": None, "tuning_seeds": None})


def sweep_folders(
    out: Path, rates: Sequence[float], setting: str | None = None
) -> dict[float, Path]:
    """{rate: its compare folder of tuning runs} (:func:`normlab.run_format.folder.sweep_path`),
    in increasing rate."""
    return {float(r): run_folder.sweep_path(out, r, setting) for r in sorted(rates)}
