"""A ladder folder (``compare --ladder``) on disk → the ``ladder`` value of its summary.json.

The folder's ``ladder.json`` lists the rungs; each rung is a compare folder read by
:func:`normlab.analysis.runs.load_compare_folder`, so its runs are grouped by rung by
construction. Per rung and per non-baseline arm: the paired per-seed differences of the
testbed's quality metric (arm − baseline; only runs whose status counts for that metric, paired
by seed), at N = the rung's baseline parameter count (``experiment.json``'s
``parameter_counts``). Then :func:`normlab.analysis.ladder.ladder_record` per arm (the fit
d = a + b·log₁₀ N and the calibrated prediction interval at the target) and
:func:`normlab.analysis.ladder.ladder_summary`. With a learning-rate sweep (``ladder.json``'s
``lr_sweep``: the rates, the tuning seeds, the swept rungs and the rung each one's rates were
chosen at), each swept rung's curves are read from its tuning folders
(:mod:`normlab.analysis.lr_sweep_folder`) into the record's ``learning_rates``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab._plural import counted
from normlab.analysis.ladder import Rung, ladder_record, ladder_summary, paired_rung
from normlab.analysis.lr_sweep import lr_sweep_record
from normlab.analysis.lr_sweep_folder import read_sweep
from normlab.analysis.runs import CompareFolder, load_compare_folder
from normlab.analysis.training_budget import planned_budget
from normlab.run_format import folder as run_folder
from normlab.run_format import testbed_format

__all__ = ["analyze_ladder", "ladder_sweep", "load_rungs"]


def load_rungs(out: Path) -> tuple[dict[str, Any], dict[str, CompareFolder]]:
    """``ladder.json`` and {setting: the rung's loaded compare folder}, in the plan's order;
    ``ValueError`` naming the rung when its folder is missing or not a compare folder."""
    plan = run_folder.read_ladder_plan(out)
    folders = {}
    for setting in plan.get("rungs", []):
        try:
            folders[setting] = load_compare_folder(run_folder.rung_path(out, setting))
        except ValueError as err:
            raise ValueError(f"ladder: rung {setting}: {err}") from None
    return plan, folders


def _rung_values(folder: CompareFolder, arm: str, metric: str) -> dict[int, float]:
    spec = testbed_format(folder.testbed).metric(metric)
    values = {}
    for run in folder.runs_of(arm):
        v = run.value(metric)
        if run.status in spec.statuses and v is not None:
            values[run.seed] = v
    return values


def _rung_size(folder: CompareFolder) -> float:
    counts = folder.experiment.get("parameter_counts", {})
    entry = counts.get(folder.baseline_arm)
    if not isinstance(entry, dict) or not entry.get("n_params"):
        raise ValueError(
            f"ladder: {folder.path} has no parameter count of {folder.baseline_arm!r} in "
            "experiment.json"
        )
    return float(entry["n_params"])


def ladder_sweep(out: Path, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The ``learning_rates`` record (:func:`normlab.analysis.lr_sweep.lr_sweep_record`) of
    the ladder folder ``out`` from its tuning folders, or None when ``plan`` (ladder.json) has
    no ``lr_sweep``."""
    sweep = plan.get("lr_sweep")
    if not sweep:
        return None
    curves = {}
    for setting in sweep["swept"]:
        folders = {float(r): run_folder.sweep_path(out, float(r), setting) for r in sweep["rates"]}
        try:
            curves[setting] = read_sweep(folders)[1]
        except ValueError as err:
            raise ValueError(f"ladder: learning-rate sweep at {setting}: {err}") from None
    return lr_sweep_record(curves, sweep["tuning_seeds"], sweep["chosen_at"])


def analyze_ladder(out: Path, n_boot: int | None = None) -> dict[str, Any]:
    """The ``ladder`` value (:data:`normlab.run_format.LADDER_KEY`) of the ladder folder
    ``out``: one :func:`ladder_record` per non-baseline arm at ``ladder.json``'s target.
    ``ValueError`` when a rung has fewer than two paired seeds (no spread to weigh it by)."""
    plan, folders = load_rungs(out)
    first = next(iter(folders.values()))
    fmt = testbed_format(first.testbed)
    baseline = first.baseline_arm
    records = []
    for arm in first.arms:
        if arm == baseline:
            continue
        rungs: list[Rung] = []
        for setting, folder in folders.items():
            rungs.append(
                paired_rung(
                    setting,
                    _rung_size(folder),
                    _rung_values(folder, arm, fmt.quality),
                    _rung_values(folder, baseline, fmt.quality),
                    planned_budget(folder),
                )
            )
            if len(rungs[-1].diffs) < 2:
                paired = counted(len(rungs[-1].diffs), "paired seed")
                raise ValueError(
                    f"ladder: rung {setting} has {paired} of {arm} and {baseline} on "
                    f"{fmt.quality}; expected at least two"
                )
        extra = {} if n_boot is None else {"n_boot": n_boot}
        records.append(
            ladder_record(
                rungs,
                float(plan["target_params"]),
                arm=arm,
                baseline=baseline,
                metric=fmt.quality,
                unit=fmt.short_unit,
                margin=first.margin,
                **extra,
            )
        )
    return ladder_summary(records, ladder_sweep(out, plan))
