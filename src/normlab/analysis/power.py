"""How many seeds would likely settle an open comparison: a plug-in power calculation.

The observed mean paired difference δ = d̄ and its standard deviation σ = s_d are taken as the
truth. With n pairs, se = σ / √n and ν = n − 1, the comparison is settled when either

- superiority: the (1 − α) t-interval excludes zero. With T ~ noncentral t(ν, λ = δ / se):
  P_sup(n) = P(T > t_{1−α/2, ν}) + P(T < −t_{1−α/2, ν})   (exact);
- equivalence: both one-sided tests of TOST reject at level α. With
  T_l ~ nct(ν, (δ + Δ) / se) and T_u ~ nct(ν, (δ − Δ) / se), the Bonferroni bound
  P_eq(n) ≥ 1 − P(T_l ≤ t_{1−α, ν}) − P(T_u ≥ −t_{1−α, ν}) is used (clipped at 0; it slightly
  understates the power, so the seed count errs on the high side).

Every tail is evaluated as a survival function, using P(T ≤ x; ν, λ) = P(T ≥ −x; ν, −λ):
SciPy's noncentral-t ``cdf`` returns NaN far in the tails (e.g. x = −12.7, ν = 1, λ = 269),
where ``sf`` stays accurate.

P_settle(n) ≥ max(P_sup(n), P_eq(n)), and ``seeds_needed`` is the smallest n with that bound at
or above the requested power (0.8 by default). A count from the bare plug-in rule "the interval
half-width t·σ/√n just clears zero or fits the margin" would settle the question only about
half of the time; asking for 80 % power is what makes the count *likely* to settle it.

The answer is only as good as σ, which three to five seeds estimate poorly: with ν = n − 1,
ν s² / σ² ~ χ²_ν, so after 3 seeds the true σ lies anywhere from 0.66 s to 3.1 s (80 %
interval), and the seeds needed grow about as σ². :func:`forecast_seeds` therefore gives a
range: the seeds needed at the two ends of the γ = 80 % chi-square interval for σ,

    σ_low = s √(ν / χ²_{ν, (1+γ)/2}),   σ_high = s √(ν / χ²_{ν, (1−γ)/2}),

beside the plug-in count at s. The plug-in count alone falls short of the count at the true σ
more often than not (s² is right on average, but its median lies below σ²); the upper end, the
seeds needed at a 90 % upper confidence bound for σ, falls short about one time in ten. Only σ's
uncertainty is carried: the observed difference stays the plug-in value in all three counts.
:func:`forecast_words` is the one phrase every sentence, the recommendation and the settling
command's ``--max-seeds`` (the upper end) follow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from normlab._plural import counted

__all__ = [
    "SPREAD_CONFIDENCE",
    "SeedsForecast",
    "forecast_range",
    "forecast_seeds",
    "forecast_words",
    "sd_interval",
    "seeds_needed",
    "settle_probability",
]

SPREAD_CONFIDENCE = 0.8
"""γ, the two-sided confidence of the interval for σ that the forecast's range comes from (its
upper end is a 90 % upper confidence bound)."""
MAX_SEEDS_FORECAST = 1000
"""The largest seed count a forecast looks at; beyond it the count is None ("more than")."""


def _check(mean_diff: float, sd_diff: float, margin: float, alpha: float) -> None:
    if not math.isfinite(mean_diff):
        raise ValueError(f"mean_diff must be finite, got {mean_diff!r}")
    if not (math.isfinite(sd_diff) and sd_diff > 0):
        raise ValueError(f"sd_diff must be a finite number > 0, got {sd_diff!r}")
    if not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def settle_probability(
    n: int | np.ndarray, mean_diff: float, sd_diff: float, margin: float, alpha: float = 0.05
) -> np.ndarray:
    """Lower bound max(P_sup(n), P_eq(n)) on the chance that n paired seeds settle the question.

    See the module docstring for the formulas. ``n`` may be an int or an array of ints ≥ 2.
    """
    _check(mean_diff, sd_diff, margin, alpha)
    ns = np.atleast_1d(np.asarray(n, dtype=np.float64))
    if np.any(ns < 2):
        raise ValueError(f"n must be at least 2, got {n!r}")
    df = ns - 1.0
    se = sd_diff / np.sqrt(ns)
    c_two = stats.t.ppf(1.0 - alpha / 2.0, df)
    nc = mean_diff / se
    p_sup = stats.nct.sf(c_two, df, nc) + stats.nct.sf(c_two, df, -nc)  # P(T > c) + P(T < −c)
    if margin > 0:
        c_one = stats.t.ppf(1.0 - alpha, df)
        miss_lower = stats.nct.sf(-c_one, df, -(mean_diff + margin) / se)  # P(T_l ≤ c_one)
        miss_upper = stats.nct.sf(-c_one, df, (mean_diff - margin) / se)  # P(T_u ≥ −c_one)
        p_eq = np.clip(1.0 - miss_lower - miss_upper, 0.0, 1.0)
    else:
        p_eq = np.zeros_like(p_sup)
    return np.maximum(p_sup, p_eq)


def seeds_needed(
    mean_diff: float,
    sd_diff: float,
    margin: float,
    n_done: int = 0,
    alpha: float = 0.05,
    power: float = 0.8,
    max_n: int = MAX_SEEDS_FORECAST,
) -> int | None:
    """Smallest total number of paired seeds n with settle_probability(n) ≥ ``power``.

    Never less than ``n_done + 1``: the question is open at the current count, so at least one
    more seed is needed whatever the plug-in says. Returns None when even ``max_n`` seeds would
    not reach the requested power (a difference far too small to resolve at this noise level).
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")
    if not (isinstance(n_done, int) and n_done >= 0):
        raise ValueError(f"n_done must be an int >= 0, got {n_done!r}")
    if not (isinstance(max_n, int) and max_n >= 2):
        raise ValueError(f"max_n must be an int >= 2, got {max_n!r}")
    ns = np.arange(2, max_n + 1)
    prob = settle_probability(ns, mean_diff, sd_diff, margin, alpha)
    hits = np.flatnonzero(prob >= power)
    if hits.size == 0:
        return None
    return max(int(ns[hits[0]]), n_done + 1)


def sd_interval(sd: float, n: int, confidence: float = SPREAD_CONFIDENCE) -> tuple[float, float]:
    """The two-sided ``confidence`` interval for σ from the sample sd s of n Gaussian values:
    [s √(ν / χ²_{ν, (1+γ)/2}), s √(ν / χ²_{ν, (1−γ)/2})] with ν = n − 1 (module docstring)."""
    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    nu = n - 1
    tail = (1.0 - confidence) / 2.0
    low = sd * math.sqrt(nu / float(stats.chi2.isf(tail, nu)))
    high = sd * math.sqrt(nu / float(stats.chi2.ppf(tail, nu)))
    return low, high


@dataclass(frozen=True)
class SeedsForecast:
    """How many paired seeds would likely settle an open comparison, with the range that the
    spread of ``n_done`` seeds allows: ``point`` at the observed sd, ``low`` and ``high`` at the
    ends of its ``confidence`` interval (None: more than :data:`MAX_SEEDS_FORECAST`)."""

    n_done: int
    point: int | None
    low: int | None
    high: int | None
    confidence: float = SPREAD_CONFIDENCE
    power: float = 0.8

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def forecast_seeds(
    mean_diff: float,
    sd_diff: float,
    margin: float,
    n_done: int,
    alpha: float = 0.05,
    power: float = 0.8,
    confidence: float = SPREAD_CONFIDENCE,
) -> SeedsForecast:
    """:func:`seeds_needed` at the observed sd and at both ends of its chi-square interval
    (:func:`sd_interval`), the difference taken as observed (module docstring)."""
    sd_low, sd_high = sd_interval(sd_diff, n_done, confidence)

    def needed(sd: float) -> int | None:
        return seeds_needed(mean_diff, sd, margin, n_done=n_done, alpha=alpha, power=power)

    return SeedsForecast(
        n_done=n_done,
        point=needed(sd_diff),
        low=needed(sd_low),
        high=needed(sd_high),
        confidence=confidence,
        power=power,
    )


def _count(n: int | None) -> str:
    return f"more than {MAX_SEEDS_FORECAST}" if n is None else str(n)


def forecast_words(
    point: int | None,
    high: int | None,
    n_done: Sequence[int] | int,
    confidence: float = SPREAD_CONFIDENCE,
) -> str:
    """The seeds that would likely settle it, said with their uncertainty: "about 7 seeds per
    arm (4 more) would likely settle it at the spread of these 3 seeds, and up to 46 if that
    spread is as large as its 80% interval allows". ``n_done`` is the seeds done (one count, or
    one per open arm: the smallest is said), ``point`` and ``high`` the forecast's plug-in count
    and upper end (the largest over the open arms); "no practical number of seeds" when even
    the plug-in count exceeds :data:`MAX_SEEDS_FORECAST`."""
    done = n_done if isinstance(n_done, int) else min(n_done)
    if point is None:
        return f"no practical number of seeds (more than {MAX_SEEDS_FORECAST}) would settle it"
    more = f" ({point - done} more)" if isinstance(n_done, int) else ""
    head = f"about {counted(point, 'seed')} per arm{more} would likely settle it"
    if high == point:
        return head
    return (
        f"{head} at the spread of these {counted(done, 'seed')}, and up to {_count(high)} if that "
        f"spread is as large as its {round(100 * confidence)}% interval allows"
    )


def forecast_range(point: int | None, high: int | None) -> str:
    """The forecast as a table cell: "7–46" (plug-in count to upper end), "7" when they agree,
    "7–>1000" beyond the most a forecast looks at, "—" without a forecast."""
    if point is None:
        return "—"
    if high == point:
        return str(point)
    return f"{point}–{high if high is not None else f'>{MAX_SEEDS_FORECAST}'}"
