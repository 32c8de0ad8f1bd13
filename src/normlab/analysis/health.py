"""Norm health read back from ``health`` records: the layer × evaluation-step matrix of one
statistic, and the flag on layers whose x̂ drifts from its contract.

DESIGN §1: mean(x̂²) ≈ 1 for RMSNorm, and for LayerNorm mean(x̂) ≈ 0 and var(x̂) ≈ 1 (so
mean(x̂²) = var + mean² ≈ 1 too). A layer is flagged when, at some evaluation,

- |mean(x̂²) − 1| > ``tolerance`` (5 % by default), mean(x̂²) being that of the x̂ the layer
  returned (``out_xhat_ms``) where recorded, else of x̂ recomputed from its input
  (``xhat_ms``): ε dominates mean(x²) (or σ²), so x̂ is shrunk towards 0 — a too-large ε for
  the activations' scale, or inputs collapsing —, or the layer computes x̂ wrongly (a
  forgotten root gives ≈ 1 / mean(x²)); or
- ``formula_err`` > ``tolerance``: the layer's output is not g ⊙ x̂ (+ β) by its own formula
  (a bug: a forgotten root, ε outside the root, a statistic squared in 16 bits).

Why 5 %: both statistics are computed in float32 from the layer's input and output, so the
only rounding that reaches them is that of the layer's own arithmetic in its dtype. One
rounding to bfloat16 (8 significant bits, unit roundoff u = 2⁻⁸) moves each y² by at most
2u ≈ 0.8 % and formula_err by at most u ≈ 0.4 % (float16: u = 2⁻¹¹; float32: u = 2⁻²⁴), so a
correct layer that rounds x̂, then g ⊙ x̂, in bfloat16 stays within about 1.6 %, well inside
5 %. What the tolerance admits is ε: with
m = mean(x²), mean(x̂²) ≈ m / (m + ε) leaves 1 by more than 5 % once m < 19 ε.

Layers of unknown formula (null statistics) are never flagged. Records written before
``xhat_mean_rms`` and ``out_xhat_ms`` existed are read with the fallbacks of
:func:`health_value`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from normlab.run_format import HEALTH_RECORD

__all__ = [
    "CHECKED_XHAT_MS",
    "HEALTH_TOLERANCE",
    "HealthFlag",
    "health_flags",
    "health_matrix",
    "health_value",
    "xhat_ms_off",
]

HEALTH_TOLERANCE = 0.05
"""How far mean(x̂²) may sit from 1, and the output from its formula (relative), before a
layer is flagged (the module docstring says why 5 %)."""

CHECKED_XHAT_MS = "out_xhat_ms"
"""The statistic the mean(x̂²) check reads (through :func:`health_value`, so it falls back to
the recomputed ``xhat_ms`` where a layer or an older record has none)."""

_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("xhat_ms", CHECKED_XHAT_MS, "mean(x̂²) off 1"),
    ("formula_err", "formula_err", "output off its formula"),
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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def health_value(stats: Mapping[str, Any], stat: str) -> float | None:
    """``stat`` of one layer's entry in a ``health`` record as a float, None where missing;
    two statistics fall back to what the older fields give:

    - ``out_xhat_ms`` (mean(x̂²) of the returned x̂; null for conditional norms) → ``xhat_ms``
      (mean(x̂²) recomputed from the input), the same number for a layer that keeps its formula;
    - ``xhat_mean_rms`` → √max(``xhat_ms`` − ``xhat_var``, 0): mean(x̂²) over all values is the
      mean over tokens of var_t(x̂) + m_t², so the difference is mean_t m_t² (as recomputed, up
      to the float32 rounding of the two means, ≈ 10⁻³ after the root)."""
    value = _number(stats.get(stat))
    if value is not None:
        return value
    if stat == CHECKED_XHAT_MS:
        return _number(stats.get("xhat_ms"))
    if stat == "xhat_mean_rms":
        ms, var = _number(stats.get("xhat_ms")), _number(stats.get("xhat_var"))
        if ms is not None and var is not None and math.isfinite(ms - var):
            return math.sqrt(max(ms - var, 0.0))
    return None


def xhat_ms_off(value: float | None, tolerance: float = HEALTH_TOLERANCE) -> bool:
    """Whether a mean(x̂²) breaks the check: finite and more than ``tolerance`` from 1."""
    return value is not None and math.isfinite(value) and abs(value - 1.0) > tolerance


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
            for stat, source, _ in _CHECKS:
                value = health_value(stats, source)
                judged = value is not None and math.isfinite(value)
                if judged and _deviation(stat, value) > tolerance:
                    hits.setdefault((layer, stat), []).append((step, value))
    flags = []
    for layer in order:
        for stat, _, what in _CHECKS:
            found = hits.get((layer, stat))
            if not found:
                continue
            worst_step, worst = max(found, key=lambda sv: _deviation(stat, sv[1]))
            flags.append(HealthFlag(layer, stat, what, found[0][0], worst_step, worst, len(found)))
    return flags


def health_matrix(
    records: Iterable[Mapping[str, Any]], stat: str = "xhat_ms", kind: str | None = None
) -> tuple[list[str], list[int], list[list[float]]]:
    """(layers, steps, values) of ``stat`` over a run's ``health`` records: ``values[i][j]`` is
    layer i's ``stat`` at step j (:func:`health_value`; NaN where missing, and with ``kind``
    for layers of another ``kind``), layers in order of first appearance."""
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
            stats = (record.get("layers") or {}).get(layer) or {}
            v = health_value(stats, stat) if kind is None or stats.get("kind") == kind else None
            row.append(math.nan if v is None else v)
        values.append(row)
    return layers, steps, values
