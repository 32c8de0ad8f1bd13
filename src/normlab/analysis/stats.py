"""Paired statistics across seeds: t-intervals, two one-sided tests (TOST), log-ratio intervals,
and the exact sign test for small integer counts.

Every function works on paired samples: seed k of the arm against seed k of the baseline, so the
quantity under test is the per-seed difference d_k = x_k − y_k (or the log ratio ln(x_k / y_k)).
Sharing initial values and data order across arms makes the d_k far less variable than the
x_k themselves; that is the whole point of the paired design.

Notation: n pairs, d̄ = mean(d), s = sd(d) with n − 1 in the denominator, se = s / √n, and
t_{q, ν} the q-quantile of Student's t with ν = n − 1 degrees of freedom.

Degenerate cases are answered, not raised: fewer than two pairs give no interval (the fields are
None), and zero variance of the differences (s = 0) gives a zero-width interval at d̄ with
p = 0 when d̄ ≠ 0 and p = 1 when d̄ = 0, the limits of the t-test as s → 0. That limit suits
continuous metrics, where equal differences in every pair mean a deterministic offset; it does
not suit small integer counts (spikes), where d = [1, 1, 1] happens by chance one time in four:
those use :func:`sign_test`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "RatioInterval",
    "SampleSummary",
    "SignTest",
    "TInterval",
    "TostResult",
    "describe",
    "holm_adjust",
    "log_ratio_interval",
    "paired_t_interval",
    "sign_test",
    "t_interval",
    "tost",
    "tost_paired",
]


@dataclass(frozen=True)
class SampleSummary:
    """Mean and sample standard deviation (n − 1 denominator) of the finite values."""

    n: int
    mean: float | None
    std: float | None


@dataclass(frozen=True)
class TInterval:
    """A two-sided t-interval for a mean and the two-sided test of ``mean = 0``."""

    n: int
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None
    p_value: float | None
    confidence: float


@dataclass(frozen=True)
class TostResult:
    """Two one-sided tests of equivalence within ±margin, and the matching (1 − 2α) interval."""

    n: int
    mean: float | None
    margin: float
    alpha: float
    p_lower: float | None
    p_upper: float | None
    p_value: float | None
    equivalent: bool
    low: float | None
    high: float | None


@dataclass(frozen=True)
class RatioInterval:
    """A geometric-mean ratio x / y with its interval, from a t-interval of ln(x_k / y_k)."""

    n: int
    ratio: float | None
    low: float | None
    high: float | None
    p_value: float | None
    confidence: float
    log: TInterval


@dataclass(frozen=True)
class SignTest:
    """The exact two-sided sign test of "positive and negative differences are equally likely".

    ``n`` differences, of which ``n_pos`` > 0 and ``n_neg`` < 0 (ties are dropped).
    """

    n: int
    n_pos: int
    n_neg: int
    p_value: float | None


def _as_array(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a sequence of numbers, got {values!r}") from err
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must hold finite numbers only, got {arr.tolist()}")
    return arr


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def _paired(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> np.ndarray:
    xa, ya = _as_array(x, "x"), _as_array(y, "y")
    if xa.shape != ya.shape:
        raise ValueError(
            f"x and y must be paired (same length), got lengths {xa.size} and {ya.size}"
        )
    return xa - ya


def describe(values: Sequence[float | None]) -> SampleSummary:
    """Mean and sample standard deviation s = sqrt(Σ(v − v̄)² / (n − 1)) of the finite values.

    ``None`` and non-finite entries are skipped; std is None for fewer than two values.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(finite)
    if n == 0:
        return SampleSummary(0, None, None)
    arr = np.asarray(finite)
    std = float(arr.std(ddof=1)) if n >= 2 else None
    return SampleSummary(n, float(arr.mean()), std)


def t_interval(d: Sequence[float] | np.ndarray, confidence: float = 0.95) -> TInterval:
    """t-interval for the mean of ``d`` and the two-sided one-sample t-test of mean 0.

    interval = d̄ ± t_{(1+c)/2, n−1} · s / √n,   t = d̄ / (s / √n),   p = 2 · (1 − T_{n−1}(|t|)).
    """
    _check_confidence(confidence)
    arr = _as_array(d, "d")
    n = int(arr.size)
    if n == 0:
        return TInterval(0, None, None, None, None, None, confidence)
    mean = float(arr.mean())
    if n == 1:
        return TInterval(1, mean, None, None, None, None, confidence)
    sd = float(arr.std(ddof=1))
    if sd == 0.0:
        return TInterval(n, mean, 0.0, mean, mean, 0.0 if mean != 0.0 else 1.0, confidence)
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * se
    p = float(2.0 * stats.t.sf(abs(mean / se), n - 1))
    return TInterval(n, mean, sd, mean - half, mean + half, p, confidence)


def sign_test(d: Sequence[float] | np.ndarray) -> SignTest:
    """Exact two-sided sign test on the non-zero values of ``d`` (ties d_k = 0 are dropped).

    m = n₊ + n₋,  k = max(n₊, n₋),  p = min(1, 2 · Σ_{j=k}^{m} C(m, j) / 2^m)
    (``scipy.stats.binomtest(n₊, m, 0.5)``); p = 1 when every d_k = 0, None when d is empty.
    It needs no variance, so it stays valid for small integer counts with equal differences:
    n pairs all of one sign give p = 2^(1 − n), below 0.05 from n = 6 on.
    """
    arr = _as_array(d, "d")
    n_pos, n_neg = int(np.sum(arr > 0)), int(np.sum(arr < 0))
    if arr.size == 0:
        return SignTest(0, 0, 0, None)
    m, k = n_pos + n_neg, max(n_pos, n_neg)
    p = 1.0 if m == 0 else min(1.0, 2.0 * float(stats.binom.sf(k - 1, m, 0.5)))
    return SignTest(int(arr.size), n_pos, n_neg, p)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the order given.

    With the m p-values sorted ascending, p₍₁₎ ≤ … ≤ p₍ₘ₎, the adjusted value of the i-th is
    p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1) · p₍ⱼ₎). Rejecting every hypothesis with p̃ < α keeps
    the chance of any false rejection among the m at most α, whatever their dependence.
    """
    ps = [float(p) for p in p_values]
    if any(not (0.0 <= p <= 1.0) for p in ps):
        raise ValueError(f"p_values: expected numbers in [0, 1], got {ps}")
    m = len(ps)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda k: ps[k])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def paired_t_interval(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> TInterval:
    """Paired t-interval of mean(x − y); the test is ``scipy.stats.ttest_rel(x, y)``.

    d_k = x_k − y_k;  interval = d̄ ± t_{(1+c)/2, n−1} · s_d / √n.
    """
    return t_interval(_paired(x, y), confidence)


def tost(d: Sequence[float] | np.ndarray, margin: float, alpha: float = 0.05) -> TostResult:
    """Two one-sided t-tests (TOST) that the mean of ``d`` lies inside (−margin, +margin).

    H₀: μ ≤ −Δ or μ ≥ +Δ   against   H₁: −Δ < μ < +Δ, with Δ = margin.
      t_lower = (d̄ + Δ) / se,  p_lower = 1 − T_{n−1}(t_lower)   (tests μ > −Δ)
      t_upper = (d̄ − Δ) / se,  p_upper = T_{n−1}(t_upper)       (tests μ < +Δ)
      p = max(p_lower, p_upper); equivalent when p < α.
    This is the same as the (1 − 2α) interval d̄ ± t_{1−α, n−1} · se lying inside (−Δ, +Δ), which
    is returned as ``low`` / ``high``. Fewer than two values never show equivalence.
    """
    _check_alpha(alpha)
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    arr = _as_array(d, "d")
    n = int(arr.size)
    mean = float(arr.mean()) if n else None
    if n < 2:
        return TostResult(n, mean, float(margin), alpha, None, None, None, False, None, None)
    sd = float(arr.std(ddof=1))
    assert mean is not None
    if sd == 0.0:
        inside = -margin < mean < margin
        p_lo = 0.0 if mean > -margin else 1.0
        p_hi = 0.0 if mean < margin else 1.0
        return TostResult(
            n, mean, float(margin), alpha, p_lo, p_hi, max(p_lo, p_hi), inside, mean, mean
        )
    se = sd / math.sqrt(n)
    p_lower = float(stats.t.sf((mean + margin) / se, n - 1))
    p_upper = float(stats.t.cdf((mean - margin) / se, n - 1))
    p = max(p_lower, p_upper)
    half = float(stats.t.ppf(1.0 - alpha, n - 1)) * se
    return TostResult(
        n, mean, float(margin), alpha, p_lower, p_upper, p, p < alpha, mean - half, mean + half
    )


def tost_paired(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    margin: float,
    alpha: float = 0.05,
) -> TostResult:
    """TOST on the paired differences d_k = x_k − y_k (see :func:`tost`)."""
    return tost(_paired(x, y), margin, alpha)


def log_ratio_interval(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> RatioInterval:
    """Geometric-mean ratio of paired positive values with a t-interval on the log scale.

    r_k = ln(x_k / y_k);  ratio = exp(r̄);  interval = exp(r̄ ± t_{(1+c)/2, n−1} · s_r / √n).
    The p-value tests ratio = 1 (r̄ = 0). Ratios suit throughput and memory, whose seed-to-seed
    noise is multiplicative, and read directly as "1.08× as fast".
    """
    xa, ya = _as_array(x, "x"), _as_array(y, "y")
    if xa.shape != ya.shape:
        raise ValueError(
            f"x and y must be paired (same length), got lengths {xa.size} and {ya.size}"
        )
    if np.any(xa <= 0) or np.any(ya <= 0):
        raise ValueError(
            f"log ratios need positive values, got x={xa.tolist()} and y={ya.tolist()}"
        )
    log = t_interval(np.log(xa) - np.log(ya), confidence)

    def _exp(v: float | None) -> float | None:
        return None if v is None else math.exp(v)

    return RatioInterval(
        log.n, _exp(log.mean), _exp(log.low), _exp(log.high), log.p_value, confidence, log
    )
