"""What a decided answer costs at each training budget: the seeds it needs × the compute of a seed.

A paired comparison trained to a budget of b tokens per parameter has paired spread σ_b (the
standard deviation of the per-seed differences of the quality metric). The paired seeds that
would likely settle it, n_b, follow from :func:`normlab.analysis.power.seeds_needed` (for a true
difference near 0 they grow as σ_b², since equivalence within ±Δ needs the interval's half-width
t·σ_b/√n below Δ); one seed trains every arm once and costs c_b. The price of a decision at b is

    P(b) = n_b · c_b,

in core-seconds measured on this machine and in floating-point operations, which hold on any
machine (C = 6·N·D per run, N parameters and D tokens: the standard estimate of a transformer's
training compute, Kaplan et al. 2020, Hoffmann et al. 2022). Training longer costs more per
seed but may need fewer seeds: whether it pays is a question of how fast σ_b falls. The budget
with the smallest P is the cheapest way to a decision.

The spread at a budget that was not measured comes from a power law in the budget,

    σ(b) = σ_ref · (b / b_ref)^(−k),

fitted by weighted least squares of log s on log b over the measured budgets (weights ν = n − 1,
since var(log s) ≈ 1 / (2ν) for Gaussian differences), or, with one measured budget, with the
exponent of :data:`PRIOR_EXPONENT`, taken from normlab's own study of the default GPT (see its
source below). c_b is fitted as c_0 + c_1·b on the measured budgets (the fixed part is set-up,
evaluation and post-training; with one budget it is taken as proportional).

Every count comes with a range: at a measured budget from the chi-square interval of σ_b
(:func:`normlab.analysis.power.sd_interval`, 80 %), elsewhere from that interval at the reference
budget widened by the exponent's own interval. Only σ's uncertainty is carried; the difference
taken as true is the mean observed at the nearest measured budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from normlab.analysis.power import SPREAD_CONFIDENCE, sd_interval, seeds_needed

__all__ = [
    "PRIOR_EXPONENT",
    "BudgetSpread",
    "DecisionPrice",
    "SeedCost",
    "SpreadLaw",
    "cheapest",
    "fit_seed_cost",
    "fit_spread_law",
    "price_decisions",
    "train_flops",
]

PRIOR_EXPONENT = (0.63, 0.22, 1.05)
"""The exponent k of σ(b) ∝ b^(−k) used when only one budget was measured: (value, low, high),
the fit and its 80 % interval over the budgets of 3 and 10 tokens per parameter in normlab's
budget study of the default GPT (LayerNorm vs RMSNorm, warm-up–stable–decay; docs/studies.md,
"Budgets and the sources of noise": paired sd 0.0345 with 11 seeds at 3, 0.0160 with 6 at 10).
Between 1 and 3 tokens per parameter the spread hardly fell (0.0367 at 1): there the arms
differ by how fast they start; the prior serves to carry a measured budget to longer ones,
where the spread fell faster than an average of independent stretches of data would (k = ½).
Measured on one testbed: the range is wide on purpose, and a folder that measures two budgets
fits its own."""


def train_flops(n_params: float, tokens: float) -> float:
    """The training compute of one run, C = 6·N·D floating-point operations (forward 2ND,
    backward 4ND; attention's share left out)."""
    if not (n_params > 0 and tokens >= 0):
        raise ValueError(f"expected n_params > 0 and tokens >= 0, got {n_params!r}, {tokens!r}")
    return 6.0 * float(n_params) * float(tokens)


@dataclass(frozen=True)
class BudgetSpread:
    """The paired differences measured at one budget (tokens per parameter): their number,
    mean and standard deviation."""

    budget: float
    n_seeds: int
    mean_diff: float
    sd_diff: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"budget: expected tokens per parameter > 0, got {self.budget!r}")
        if not (isinstance(self.n_seeds, int) and self.n_seeds >= 2):
            raise ValueError(f"n_seeds: expected an int >= 2, got {self.n_seeds!r}")
        if not (math.isfinite(self.sd_diff) and self.sd_diff >= 0):
            raise ValueError(f"sd_diff: expected a finite number >= 0, got {self.sd_diff!r}")
        if not math.isfinite(self.mean_diff):
            raise ValueError(f"mean_diff: expected a finite number, got {self.mean_diff!r}")


@dataclass(frozen=True)
class SeedCost:
    """What one seed (every arm trained once) costs at budget b: core-seconds
    ``fixed_core_s + core_s_per_budget · b`` and floating-point operations
    ``flops_per_budget · b``."""

    fixed_core_s: float
    core_s_per_budget: float
    flops_per_budget: float

    def core_s(self, budget: float) -> float:
        return self.fixed_core_s + self.core_s_per_budget * budget

    def flops(self, budget: float) -> float:
        return self.flops_per_budget * budget


def fit_seed_cost(points: Sequence[tuple[float, float, float]]) -> SeedCost:
    """The :class:`SeedCost` of measured seeds ``(budget, core_s, flops)``: core-seconds by least
    squares on the budget when two or more budgets were measured (a negative intercept or slope
    falls back to proportional), else proportional; FLOPs proportional (their mean per unit of
    budget)."""
    if not points:
        raise ValueError("points: expected at least one measured seed (budget, core_s, flops)")
    b = np.array([p[0] for p in points], dtype=np.float64)
    s = np.array([p[1] for p in points], dtype=np.float64)
    f = np.array([p[2] for p in points], dtype=np.float64)
    if np.any(b <= 0) or not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"points: expected budgets > 0 and core-seconds >= 0, got {points!r}")
    flops_per_budget = float(np.mean(f / b))
    proportional = SeedCost(0.0, float(np.mean(s / b)), flops_per_budget)
    if len(np.unique(b)) < 2:
        return proportional
    slope, intercept = np.polyfit(b, s, 1)
    if slope <= 0 or intercept < 0:
        return proportional
    return SeedCost(float(intercept), float(slope), flops_per_budget)


@dataclass(frozen=True)
class SpreadLaw:
    """σ(b) = ``ref_sd`` · (b / ``ref_budget``)^(−``exponent``), with the exponent's interval
    [``exponent_low``, ``exponent_high``]; ``measured`` tells a fit from the prior."""

    ref_budget: float
    ref_sd: float
    ref_n: int
    exponent: float
    exponent_low: float
    exponent_high: float
    measured: bool

    def sd(self, budget: float, exponent: float | None = None) -> float:
        k = self.exponent if exponent is None else exponent
        return self.ref_sd * (budget / self.ref_budget) ** (-k)

    def sd_range(self, budget: float, confidence: float = SPREAD_CONFIDENCE) -> tuple[float, float]:
        """The smallest and largest σ(b) over σ_ref's chi-square interval and the exponent's."""
        low, high = sd_interval(self.ref_sd, self.ref_n, confidence)
        values = [
            SpreadLaw(self.ref_budget, ref, self.ref_n, k, k, k, self.measured).sd(budget)
            for ref in (low, high)
            for k in (self.exponent_low, self.exponent_high)
        ]
        return min(values), max(values)


def fit_spread_law(
    spreads: Sequence[BudgetSpread], prior: tuple[float, float, float] = PRIOR_EXPONENT
) -> SpreadLaw:
    """The :class:`SpreadLaw` of the measured budgets (module docstring). The reference is the
    budget with the most seeds (the largest budget among ties). With one budget, or spreads that
    do not determine a slope, the exponent is ``prior`` (value, low, high); with two or more
    budgets, the weighted least-squares slope with its ± 1.28 standard errors (80 %), the
    residual scatter included when three or more budgets allow it."""
    if not spreads:
        raise ValueError("spreads: expected at least one measured budget")
    usable = [s for s in spreads if s.sd_diff > 0]
    ref = max(spreads, key=lambda s: (s.n_seeds, s.budget))
    budgets = {s.budget for s in usable}
    if len(budgets) < 2:
        return SpreadLaw(ref.budget, ref.sd_diff, ref.n_seeds, *prior, measured=False)
    x = np.log([s.budget for s in usable])
    y = np.log([s.sd_diff for s in usable])
    w = np.array([s.n_seeds - 1 for s in usable], dtype=np.float64)
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - xm) ** 2))
    slope = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
    var_slope = 1.0 / (2.0 * sxx)  # var(log s_i) ≈ 1 / (2 ν_i), ν_i the weights
    if len(usable) >= 3:
        resid = y - (ym + slope * (x - xm))
        scatter = float(np.sum(w * resid**2) / (len(usable) - 2)) / sxx
        var_slope = max(var_slope, scatter)
    half = 1.2816 * math.sqrt(var_slope)
    k = -slope
    ref_sd = float(math.exp(ym + slope * (math.log(ref.budget) - xm)))
    return SpreadLaw(ref.budget, ref_sd, ref.n_seeds, k, k - half, k + half, measured=True)


@dataclass(frozen=True)
class DecisionPrice:
    """What a decision costs at one budget: the paired spread there (``sd``, with its range),
    the seeds that would likely settle it (at ``sd``, and at the range's top), and their
    compute; ``measured`` when this budget's spread was measured, not read off the law.
    A seed count of None means more than any practical number."""

    budget: float
    measured: bool
    mean_diff: float
    sd: float
    sd_low: float
    sd_high: float
    seeds: int | None
    seeds_high: int | None
    core_s: float | None
    core_s_high: float | None
    flops: float | None
    flops_high: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _nearest(spreads: Sequence[BudgetSpread], budget: float) -> BudgetSpread:
    return min(spreads, key=lambda s: (abs(math.log(s.budget / budget)), -s.n_seeds))


def _price(
    budget: float,
    sd: tuple[float, float, float],
    mean_diff: float,
    measured: bool,
    cost: SeedCost,
    margin: float,
    alpha: float,
    power: float,
) -> DecisionPrice:
    point, low, high = sd

    def needed(s: float) -> int | None:
        if s <= 0:
            return 2
        return seeds_needed(mean_diff, s, margin, alpha=alpha, power=power)

    n, n_high = needed(point), needed(high)
    core = cost.core_s(budget)
    flops = cost.flops(budget)
    return DecisionPrice(
        budget=budget,
        measured=measured,
        mean_diff=mean_diff,
        sd=point,
        sd_low=low,
        sd_high=high,
        seeds=n,
        seeds_high=n_high,
        core_s=None if n is None else n * core,
        core_s_high=None if n_high is None else n_high * core,
        flops=None if n is None else n * flops,
        flops_high=None if n_high is None else n_high * flops,
    )


def price_decisions(
    spreads: Sequence[BudgetSpread],
    cost: SeedCost,
    budgets: Sequence[float],
    margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    law: SpreadLaw | None = None,
) -> list[DecisionPrice]:
    """The price of a decision at each of ``budgets`` (sorted, each once): at a measured budget
    from its own spread and chi-square range, elsewhere from ``law`` (default: fitted on
    ``spreads``) with :meth:`SpreadLaw.sd_range`; the difference taken as true is the mean at
    the nearest measured budget."""
    if not spreads:
        raise ValueError("spreads: expected at least one measured budget")
    law = law or fit_spread_law(spreads)
    by_budget = {s.budget: s for s in spreads}
    prices = []
    for b in sorted(set(budgets)):
        if not (math.isfinite(b) and b > 0):
            raise ValueError(f"budgets: expected tokens per parameter > 0, got {b!r}")
        s = by_budget.get(b)
        if s is not None:
            low, high = sd_interval(s.sd_diff, s.n_seeds)
            sd = (s.sd_diff, low, high)
        else:
            sd = (law.sd(b), *law.sd_range(b))
        mean = _nearest(spreads, b).mean_diff
        prices.append(_price(b, sd, mean, s is not None, cost, margin, alpha, power))
    return prices


def cheapest(prices: Sequence[DecisionPrice]) -> DecisionPrice | None:
    """The price with the fewest core-seconds at its plug-in seed count (the smaller budget
    among ties); None when no budget has a practical seed count."""
    priced = [p for p in prices if p.core_s is not None]
    if not priced:
        return None
    return min(priced, key=lambda p: (p.core_s, p.budget))
