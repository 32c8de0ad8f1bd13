"""Norm health read back from ``health`` records: the layer × evaluation-step matrix of one
statistic, and the flag on layers whose x̂ drifts from its contract.

DESIGN §1: mean(x̂²) ≈ 1 for RMSNorm, and for LayerNorm mean(x̂) ≈ 0 and var(x̂) ≈ 1 (so
mean(x̂²) = var + mean² ≈ 1 too). A layer is flagged when, at some evaluation,

- |mean(x̂²) − 1| > ``tolerance`` (5 % by default): ε dominates mean(x²) (or σ²), so x̂ is
  shrunk towards 0 — a too-large ε for the activations' scale, or inputs collapsing; or
- ``formula_err`` > ``tolerance``: the layer's output is not g ⊙ x̂ (+ β) by its own formula
  (a bug: a forgotten root, ε outside the root, a statistic squared in 16 bits).

Layers of unknown formula (null statistics) are never flagged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from normlab.run_format import HEALTH_RECORD

__all__ = ["HEALTH_TOLERANCE", "HealthFlag", "health_flags", "health_matrix"]

HEALTH_TOLERANCE = 0.05
"""How far mean(x̂²) may sit from 1, and the output from its formula (relative), before a
layer is flagged."""

_CHECKS: tuple[tuple[str, str], ...] = (
    ("xhat_ms", "mean(x̂²) off 1"),
    ("formula_err", "output off its formula"),
)


@dataclass(frozen=True)
class HealthFlag:
    """A layer whose statistic ``stat`` broke the tolerance: first at ``first_step``, at
    ``n_steps`` evaluations in all, worst value ``worst`` (at ``worst_step``)."""

    layer: str
    stat: str
    what: str
    first_step: int
    worst_step: int
    worst: float
    n_steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for the report, e.g. ``blocks.0.norm_attn: mean(x̂²) off 1 (0.83 at step
        50, from step 0, 3 evaluations)``."""
        return (
            f"{self.layer}: {self.what} ({self.stat} = {self.worst:.3g} at step "
            f"{self.worst_step}; first at step {self.first_step}, {self.n_steps} evaluation"
            f"{'s' if self.n_steps != 1 else ''})"
        )


def _deviation(stat: str, value: float) -> float:
    return abs(value - 1.0) if stat == "xhat_ms" else abs(value)


def health_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``health`` records among a run's ``metrics.jsonl`` records, in step order."""
    found = [r for r in records if r.get("type") == HEALTH_RECORD]
    return sorted(found, key=lambda r: r.get("step", 0))


def health_flags(
    records: Iterable[Mapping[str, Any]], tolerance: float = HEALTH_TOLERANCE
) -> list[HealthFlag]:
    """The flags (see the module docstring) over a run's ``health`` records (other records are
    ignored): one per layer and statistic that broke ``tolerance`` at least once, in layer
    order of first appearance. A statistic that is null or not finite at a step is skipped
    there (a diverged run's last evaluation is judged by its stability, not here)."""
    if not tolerance > 0:
        raise ValueError(f"tolerance: expected a number > 0, got {tolerance!r}")
    hits: dict[tuple[str, str], list[tuple[int, float]]] = {}
    order: list[str] = []
    for record in health_records(records):
        step = int(record.get("step", 0))
        for layer, stats in (record.get("layers") or {}).items():
            if layer not in order:
                order.append(layer)
            for stat, _ in _CHECKS:
                value = stats.get(stat)
                judged = isinstance(value, (int, float)) and math.isfinite(value)
                if judged and _deviation(stat, value) > tolerance:
                    hits.setdefault((layer, stat), []).append((step, float(value)))
    flags = []
    for layer in order:
        for stat, what in _CHECKS:
            found = hits.get((layer, stat))
            if not found:
                continue
            worst_step, worst = max(found, key=lambda sv: _deviation(stat, sv[1]))
            flags.append(HealthFlag(layer, stat, what, found[0][0], worst_step, worst, len(found)))
    return flags


def health_matrix(
    records: Iterable[Mapping[str, Any]], stat: str = "xhat_ms"
) -> tuple[list[str], list[int], list[list[float]]]:
    """(layers, steps, values) of ``stat`` over a run's ``health`` records: ``values[i][j]`` is
    layer i's ``stat`` at step j (NaN where missing), layers in order of first appearance."""
    found = health_records(records)
    layers: list[str] = []
    for record in found:
        for layer in record.get("layers") or {}:
            if layer not in layers:
                layers.append(layer)
    steps = [int(r.get("step", 0)) for r in found]
    values = []
    for layer in layers:
        row = []
        for record in found:
            v = (record.get("layers") or {}).get(layer, {}).get(stat)
            row.append(float(v) if isinstance(v, (int, float)) else math.nan)
        values.append(row)
    return layers, steps, values
