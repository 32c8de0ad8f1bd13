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

The answer is only as good as σ, which three to five seeds estimate poorly (its relative
standard error is about 1 / √(2(n − 1))), so treat it as an order of magnitude.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["seeds_needed", "settle_probability"]


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
    max_n: int = 1000,
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
