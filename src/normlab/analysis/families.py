"""Comparison families: for each factor of the grid that varies, its levels compared with the
other factors held fixed.

An arm is a combination of levels of the factors :data:`FACTORS` (norm, placement, precision).
When only one factor varies, the analysis's comparison of every arm against the baseline arm is
already that factor's comparison. When several vary (e.g. norm × precision), comparing
``rmsnorm-pre-bf16`` with ``layernorm-pre-fp32`` would mix two effects; instead, for each
varying factor F, the arms are grouped by their levels of the other factors, and within a group
each arm is compared with the group's baseline: the arm at F's baseline level. That level is
the baseline arm's (for norm and placement), fp32 for precision (or, without fp32, the first
level given); a group without that level takes its first arm. Every comparison is paired by
seed on every metric, exactly as against the baseline arm (:func:`compare_metric`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from normlab.analysis.runs import CompareFolder
from normlab.run_format import FACTORS, MetricSpec

__all__ = ["FACTORS", "PREFERRED_BASELINE", "arm_levels", "comparison_families", "varied_factors"]

"""The factors of an arm, in the order arm names give them."""
FACTOR_DEFAULTS: dict[str, str] = {"precision": "fp32"}
"""The level of a factor a run records nothing for (runs from before that factor existed)."""
PREFERRED_BASELINE: dict[str, str] = {"precision": "fp32"}
"""A factor whose baseline level is fixed, whatever the baseline arm: precisions are compared
with fp32 where it was trained."""


def arm_levels(folder: CompareFolder) -> dict[str, dict[str, str]]:
    """{arm: {factor: level}} from the arm's runs (summary first, then run.json); a factor no
    run of the arm records takes :data:`FACTOR_DEFAULTS`' level, or is left out."""
    levels: dict[str, dict[str, str]] = {}
    for arm in folder.arms:
        runs = folder.runs_of(arm)
        found: dict[str, str] = {}
        for factor in FACTORS:
            values = [r.summary.get(factor) or r.config.get(factor) for r in runs]
            value = next((v for v in values if isinstance(v, str)), FACTOR_DEFAULTS.get(factor))
            if value is not None:
                found[factor] = value
        levels[arm] = found
    return levels


def _level_order(folder: CompareFolder, factor: str, levels: dict[str, dict[str, str]]) -> list:
    varied = folder.experiment.get("varied")
    given = varied.get(factor) if isinstance(varied, dict) else None
    seen = list(dict.fromkeys(lv[factor] for lv in levels.values() if factor in lv))
    if isinstance(given, list):
        return [v for v in given if v in seen] + [v for v in seen if v not in given]
    return seen


def varied_factors(folder: CompareFolder) -> list[str]:
    """The factors of :data:`FACTORS` with more than one level among the folder's arms."""
    levels = arm_levels(folder)
    return [f for f in FACTORS if len({lv.get(f) for lv in levels.values()} - {None}) > 1]


def _baseline_level(factor: str, order: Sequence[str], base_levels: dict[str, str]) -> str:
    preferred = PREFERRED_BASELINE.get(factor)
    if preferred is not None:
        return preferred if preferred in order else order[0]
    return base_levels.get(factor, order[0])


def comparison_families(
    folder: CompareFolder,
    metrics: Sequence[MetricSpec],
    compare: Any,
) -> list[dict[str, Any]]:
    """One family per group of arms that differ only in one varying factor, when at least two
    factors vary (else []): ``{"factor", "fixed": {other factor: level}, "baseline": arm,
    "arms": [arm, …] (the group's arms, baseline first), "comparisons": {arm: {metric:
    comparison dict}}}``. ``compare(spec, arm_runs, base_runs)`` returns the
    :class:`~normlab.analysis.comparison.PairedComparison` of one metric."""
    factors = varied_factors(folder)
    if len(factors) < 2:
        return []
    levels = arm_levels(folder)
    base_levels = levels.get(folder.baseline_arm, {})
    families = []
    for factor in factors:
        order = _level_order(folder, factor, levels)
        base_level = _baseline_level(factor, order, base_levels)
        groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
        for arm in folder.arms:
            others = tuple((f, levels[arm].get(f, "")) for f in FACTORS if f != factor)
            groups.setdefault(others, []).append(arm)
        for others, arms in groups.items():
            if len(arms) < 2:
                continue
            arms = sorted(arms, key=lambda a: order.index(levels[a][factor]))
            base = next((a for a in arms if levels[a][factor] == base_level), arms[0])
            base_runs = folder.runs_of(base)
            comparisons = {
                arm: {
                    spec.name: compare(spec, folder.runs_of(arm), base_runs).to_dict()
                    for spec in metrics
                }
                for arm in arms
                if arm != base
            }
            families.append(
                {
                    "factor": factor,
                    "fixed": {f: level for f, level in others if f in factors},
                    "baseline": base,
                    "arms": [base, *(a for a in arms if a != base)],
                    "comparisons": comparisons,
                }
            )
    return families
