"""Anomaly detectors on training series: non-finite values and robust-z spikes.

A spike at step t is judged against a trailing window of the ``window`` values before t (never
including t itself), on the log scale, with a robust z-score:

    z_t = (log v_t − median(W)) / (1.4826 · MAD(W)),   MAD(W) = median(|log w − median(W)|)

where W is the log of the trailing window. 1.4826 makes the MAD a consistent estimate of the
standard deviation for normal noise. Steps before ``warmup`` are never flagged (early training
moves too fast for a trailing window to be a baseline). A step is a spike when z_t ≥
``threshold``; only upward spikes count. MAD is floored at ``min_scale`` so a flat series does
not make every wiggle infinite.

Defaults: window 50, warm-up 50 steps, threshold 6 (practitioners skip steps past 6σ), minimum
scale 0.01 in log units (a 1% change).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

MAD_TO_STD = 1.4826
DEFAULT_WINDOW = 50
DEFAULT_WARMUP = 50
DEFAULT_THRESHOLD = 6.0
DEFAULT_MIN_SCALE = 0.01


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def is_finite(value: float | None) -> bool:
    """Whether ``value`` is a finite number (``None`` is not)."""
    return value is not None and math.isfinite(value)


def first_nonfinite(values: Sequence[float | None]) -> int | None:
    """Index of the first NaN, ±inf or ``None`` in ``values``, or ``None`` if all are finite."""
    for i, v in enumerate(values):
        if not is_finite(v):
            return i
    return None


def robust_z(history: Sequence[float], value: float, min_scale: float = DEFAULT_MIN_SCALE) -> float:
    """Robust z-score of log(``value``) against the log of ``history`` (positive values).

    z = (log v − median(log h)) / max(1.4826 · MAD(log h), ``min_scale``).
    """
    if not history:
        raise ValueError("history: expected at least one past value")
    if value <= 0 or any(h <= 0 for h in history):
        raise ValueError("robust_z works on positive values (losses, gradient norms)")
    logs = [math.log(h) for h in history]
    centre = _median(logs)
    mad = _median([abs(x - centre) for x in logs])
    return (math.log(value) - centre) / max(MAD_TO_STD * mad, min_scale)


@dataclass(frozen=True)
class SpikeRule:
    """When a value counts as a spike; see the module docstring."""

    window: int = DEFAULT_WINDOW
    warmup: int = DEFAULT_WARMUP
    threshold: float = DEFAULT_THRESHOLD
    min_scale: float = DEFAULT_MIN_SCALE

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 3:
            raise ValueError(f"window: expected an int >= 3, got {self.window!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup: expected an int >= 0, got {self.warmup!r}")
        if not self.threshold > 0:
            raise ValueError(f"threshold: expected a number > 0, got {self.threshold!r}")
        if not self.min_scale > 0:
            raise ValueError(f"min_scale: expected a number > 0, got {self.min_scale!r}")


def spike_scores(
    values: Sequence[float | None], rule: SpikeRule = SpikeRule()
) -> list[float | None]:
    """The robust z-score of every element against its trailing window, or ``None`` where it is
    not judged (inside the warm-up, fewer than ``rule.window`` finite positive values before it,
    or the value itself not finite and positive)."""
    detector = SpikeDetector(rule)
    return [detector.update(v) for v in values]


def find_spikes(values: Sequence[float | None], rule: SpikeRule = SpikeRule()) -> list[int]:
    """Indices whose robust z-score reaches ``rule.threshold``."""
    return [
        i for i, z in enumerate(spike_scores(values, rule)) if z is not None and z >= rule.threshold
    ]


class SpikeDetector:
    """The online form of :func:`spike_scores`: feed one value per step, in order.

    ``update(v)`` returns the value's z-score (or ``None`` when it is not judged) and
    ``is_spike(z)`` applies the threshold. Fed the same series it gives the same scores.
    """

    def __init__(self, rule: SpikeRule = SpikeRule()) -> None:
        self.rule = rule
        self.count = 0
        self.history: deque[float] = deque(maxlen=rule.window)

    def update(self, value: float | None) -> float | None:
        r = self.rule
        finite_positive = is_finite(value) and value > 0  # type: ignore[operator]
        judged = finite_positive and self.count >= r.warmup and len(self.history) == r.window
        z = robust_z(self.history, value, r.min_scale) if judged else None  # type: ignore[arg-type]
        if finite_positive:
            self.history.append(value)  # type: ignore[arg-type]
        self.count += 1
        return z

    def is_spike(self, z: float | None) -> bool:
        return z is not None and z >= self.rule.threshold
