"""Deciding with paired seeds added in rounds: a group-sequential design with α-spending.

A fixed-sample test looked at after every round of seeds is wrong more often than its α says:
with looks at 3, 5, 7 and 10 seeds, re-running the 5 % TOST at each look declares a difference
that sits exactly at the margin "equivalent" about twice as often as 5 %. This module keeps the
stated error rates under repeated looks.

Design (Lan & DeMets 1983; Jennison & Turnbull 2000, ch. 7 and 11). The seeds are paired
differences d_1, d_2, … (arm − baseline), looked at after n_1 < n_2 < … ≤ N seeds (N = the
most seeds the user will run). The information fraction of look k is τ_k = n_k / N. An
α-spending function α*(τ), increasing from α*(0) = 0 to α*(1) = a, fixes how much of a
one-sided level a may be used up by look k:

- O'Brien–Fleming type (default): α*(τ) = 2 − 2 Φ(z_{1−a/2} / √τ) — almost nothing early,
  nearly the whole a at the last look, so a design that runs to N loses little power;
- Pocock type: α*(τ) = a · ln(1 + (e − 1) τ) — spends evenly, stops earlier on large effects.

Boundaries on the t scale. At look k the statistic is T_k = d̄_k / (s_k / √n_k), the paired
t-statistic of the n_k differences so far. For Gaussian differences with mean zero, the joint
law of (T_1, …, T_K) depends on the look sizes only, not on the unknown σ (each T_k is
scale-free). The boundary c_k is the one with

    P(T_1 < c_1, …, T_{k−1} < c_{k−1}, T_k ≥ c_k) = α*(τ_k) − α*(τ_{k−1})

(|T_j| in place of T_j for a two-sided test), the exact analogue for unknown variance of the
Lan–DeMets recursion that Armitage, McPherson & Rowe (1969) solve by numerical integration for a
known one. Here the joint law is taken from 200 000 simulated null sequences drawn with a fixed
seed (so the boundaries are deterministic), which sets each spent probability to within about
±0.0005 at α = 0.05. The commonly used shortcut — z boundaries moved to the t scale by matching
tail probabilities (Jennison & Turnbull 2000, §11.3) — overshoots the error rate at the 2 to 9
degrees of freedom of a few seeds (0.029 instead of 0.025 per side with looks at 3…10 seeds),
so it is not used. Because c_k depends only on the looks up to k, the schedule may change as it
goes (a round that yields fewer usable seeds): pass the seed counts of the earlier looks.

The tests at look k, with d̄, s the mean and sd of the n_k differences, se = s / √n_k and the
margin Δ > 0 (the smallest difference that matters):

- equivalence (TOST, intersection–union, each side a one-sided sequential test at level α
  with boundaries c_k^{(α)}): (d̄ + Δ) / se ≥ c_k^{(α)} and (d̄ − Δ) / se ≤ −c_k^{(α)}, i.e.
  the repeated (1 − 2α) interval d̄ ± c_k^{(α)} se lies inside (−Δ, Δ);
- superiority (two-sided level α, boundaries c_k^{(2)} calibrated on |T|): |d̄| / se ≥ c_k^{(2)},
  i.e. the repeated (1 − α) interval d̄ ± c_k^{(2)} se excludes zero, in the direction of
  its sign.

The decision is rule 6 of :mod:`normlab.analysis.wording`
(:func:`~normlab.analysis.wording.sequential_word`): equivalence is checked first (a detectable
difference inside the margin is practically nil), then superiority (``better`` or ``worse`` by
the sign and the metric's direction); otherwise the comparison stays ``open``, and at n = N it
closes ``inconclusive``.

Error rates. Stopping for one decision can only lower the chance of the other, so
P(declare equivalent | true difference = ±Δ) ≤ α and P(declare better | true difference = 0)
≤ α/2 (≤ α for better or worse), for Gaussian paired differences: the upper one-sided test of
TOST at a true difference of exactly +Δ is the null sequential t-test, which the boundaries
calibrate. Heavy-tailed seed-to-seed noise is not covered by this guarantee. Differences that
are the same in every seed (a metric that does not vary with the seed, s = 0) are exact: the verdict
follows d̄ against 0 and Δ at once, with no test.

Seeds needed (simulated, ``tests/compare/test_sequential.py``; looks at 3, 5, 7 and 10 seeds, α
= 0.05, O'Brien–Fleming): a true difference of 0.5 / 1 / 1.5 / 2 seed-to-seed standard
deviations is called at the right sign with probability about 0.27 / 0.77 / 0.98 / 1.0, after
9.7 / 8.8 / 7.4 / 6.4 seeds on average. Pocock spending stops earlier on large effects (5.4
seeds at 2 sd) and has less power at the last look.

No futility stop is made (an arm is never dropped for looking hopeless); the caller may stop
an arm that has failed to learn for that reason instead (see :mod:`normlab.analysis.wording`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats

from normlab._plural import counted
from normlab.analysis.smallest import smallest_for
from normlab.analysis.wording import BETTER_WORSE, EQUIVALENT, is_decided, sequential_word

__all__ = [
    "DEFAULT_MAX_SEEDS",
    "LOOK_STEP",
    "SPENDING",
    "Decision",
    "SequentialPlan",
    "critical_values",
    "decide",
    "decide_all",
    "look_decisions",
    "look_schedule",
    "next_round_size",
    "plan_for",
    "spent_alpha",
]

SPENDING = ("obrien-fleming", "pocock")
"""The α-spending functions offered (module docstring)."""


DEFAULT_MAX_SEEDS = 20
"""N, the last planned look, unless ``--max-seeds`` says otherwise: looks after 3, 5, …, 19 and
20 seeds for the default 3 seeds. Chosen by simulation (docs/DESIGN.md §3,
``tests/compare/test_sequential.py::test_the_default_plan_on_the_default_question``): at the
default question's seed-to-seed spread it decides a difference of twice the margin in about
95 % of experiments, where looks 3, 5, 7 did in under half; ``--max-time`` bounds each command,
and the same command continues the same plan."""
LOOK_STEP = 2
"""Seeds added between two looks."""


def look_schedule(
    first: int = 3, max_seeds: int = DEFAULT_MAX_SEEDS, step: int = LOOK_STEP
) -> tuple[int, ...]:
    """The planned looks, fixed before the first: after ``first`` seeds (those asked for with
    ``--seeds``), every ``step`` more, and at ``max_seeds`` (``--max-seeds``):
    (3, 5, 7, 9, 10) for ``max_seeds`` = 10.

    Raises ``ValueError`` naming ``--seeds`` or ``--max-seeds`` unless
    ``max_seeds`` ≥ ``first`` ≥ 2."""
    if not (isinstance(first, int) and first >= 2):
        raise ValueError(
            f"seeds: --until-decided needs at least 2 seeds at the first look (--seeds), "
            f"got {first!r}"
        )
    if not (isinstance(step, int) and step >= 1):
        raise ValueError(f"step must be an int >= 1, got {step!r}")
    if not (isinstance(max_seeds, int) and max_seeds >= first):
        raise ValueError(
            f"max_seeds: expected --max-seeds to be an int >= the seeds of the first look "
            f"({first}), got {max_seeds!r}"
        )
    return (*range(first, max_seeds, step), max_seeds)


@dataclass(frozen=True)
class SequentialPlan:
    """The design of one sequential comparison.

    ``looks`` are the planned seed counts at which the data are examined (increasing, each
    ≥ 2); the last is the maximum number of seeds N. ``alpha`` is the error rate of each
    decision (module docstring), ``margin`` Δ the smallest difference that matters, on the
    scale of the differences (None or 0: no equivalence decision). ``lower_is_better`` gives
    the metric's direction; ``spending`` one of :data:`SPENDING`.
    """

    looks: tuple[int, ...] = field(default_factory=look_schedule)
    alpha: float = 0.05
    margin: float | None = None
    lower_is_better: bool = True
    spending: str = "obrien-fleming"

    def __post_init__(self) -> None:
        looks = tuple(int(n) for n in self.looks)
        rising = all(b > a for a, b in itertools.pairwise(looks))
        if not looks or looks[0] < 2 or not rising:
            raise ValueError(
                f"looks must be strictly increasing seed counts, each >= 2, got {self.looks!r}"
            )
        object.__setattr__(self, "looks", looks)
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha must lie in (0, 0.5), got {self.alpha!r}")
        if self.margin is not None and not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be None or a finite number >= 0, got {self.margin!r}")
        if self.spending not in SPENDING:
            raise ValueError(f"spending must be one of {SPENDING}, got {self.spending!r}")

    @property
    def max_seeds(self) -> int:
        """N, the last planned look."""
        return self.looks[-1]


@dataclass(frozen=True)
class Decision:
    """The state of one sequential comparison after a look.

    ``verdict`` is ``better`` / ``worse`` / ``equivalent`` when ``decided``, else ``open``
    (more seeds may settle it) or ``inconclusive`` (N reached). ``low``/``high`` is the repeated
    confidence interval that the decision used: the (1 − 2α) one for an equivalence decision,
    else the (1 − α) one. ``next_n`` is the seed count of the next look (None when stopped).
    """

    decided: bool
    stop: bool
    verdict: str
    reason: str
    n: int
    look: int
    mean: float | None
    low: float | None
    high: float | None
    eq_low: float | None
    eq_high: float | None
    critical: float
    critical_eq: float | None
    next_n: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def spent_alpha(tau: float | np.ndarray, level: float, spending: str) -> np.ndarray:
    """α*(τ) of the named spending function for a one-sided total ``level`` (module docstring)."""
    t = np.clip(np.asarray(tau, dtype=np.float64), 0.0, 1.0)
    if spending == "obrien-fleming":
        z = stats.norm.isf(level / 2.0)
        with np.errstate(divide="ignore"):
            out = 2.0 * stats.norm.sf(z / np.sqrt(t))
        return np.where(t > 0, out, 0.0)
    if spending == "pocock":
        return level * np.log1p((math.e - 1.0) * t)
    raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")


_CALIBRATION_DRAWS = 200_000
"""Simulated null sequences that fix the t-scale boundaries (module docstring)."""
_CALIBRATION_SEED = 20_240_613
"""The fixed seed of those draws, so boundaries are the same on every call and machine."""


@lru_cache(maxsize=256)
def _boundaries(
    history: tuple[int, ...], max_seeds: int, level: float, spending: str, two_sided: bool
) -> tuple[float, ...]:
    fracs = np.minimum(1.0, np.asarray(history, dtype=np.float64) / max_seeds)
    spent = spent_alpha(fracs, level, spending)
    rng = np.random.default_rng(_CALIBRATION_SEED)
    x = rng.standard_normal((_CALIBRATION_DRAWS, history[-1]))
    s1 = np.cumsum(x, axis=1)
    s2 = np.cumsum(np.square(x, out=x), axis=1, out=x)  # in place: a plan of many seeds is large
    alive = np.ones(_CALIBRATION_DRAWS, dtype=bool)
    bounds, prev = [], 0.0
    for n, total in zip(history, spent, strict=True):
        mean = s1[:, n - 1] / n
        var = np.maximum(s2[:, n - 1] - n * mean * mean, 0.0) / (n - 1)
        t = mean / np.sqrt(var / n)
        stat = np.abs(t) if two_sided else t
        k = math.floor((float(total) - prev) * _CALIBRATION_DRAWS)
        live = np.sort(stat[alive])[::-1]
        c = float(live[k]) if 0 < k < live.size else math.inf
        bounds.append(c)
        alive &= stat < c
        prev = float(total)
    return tuple(bounds)


def critical_values(
    history: Sequence[int],
    max_seeds: int,
    level: float,
    spending: str = "obrien-fleming",
    two_sided: bool = False,
) -> np.ndarray:
    """t-scale boundaries c_1 … c_K for looks at ``history`` seeds out of ``max_seeds``.

    c_k is set so that, for Gaussian differences with mean zero, P(no crossing before look k,
    T_k ≥ c_k) = α*(τ_k) − α*(τ_{k−1}) (with |T_k| when ``two_sided``), estimated from
    :data:`_CALIBRATION_DRAWS` simulated sequences (module docstring); ∞ where a look may not
    spend anything yet.
    """
    hist = tuple(int(n) for n in history)
    if not hist or hist[0] < 2 or any(b <= a for a, b in itertools.pairwise(hist)):
        raise ValueError(f"history must be increasing seed counts >= 2, got {history!r}")
    if not (isinstance(max_seeds, int) and max_seeds >= 2):
        raise ValueError(f"max_seeds must be an int >= 2, got {max_seeds!r}")
    if not 0.0 < level < 0.5:
        raise ValueError(f"level must lie in (0, 0.5), got {level!r}")
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}, got {spending!r}")
    return np.asarray(_boundaries(hist, max_seeds, float(level), spending, bool(two_sided)))


def _history(n: int, plan: SequentialPlan, earlier: Sequence[int] | None) -> tuple[int, ...]:
    if earlier is None:
        earlier = [m for m in plan.looks if m < n]
    hist = (*[int(m) for m in earlier], int(n))
    if any(m < 2 for m in hist) or any(b <= a for a, b in itertools.pairwise(hist)):
        raise ValueError(
            f"earlier looks must be increasing seed counts >= 2 below n = {n}, got {earlier!r}"
        )
    return hist


def look_decisions(
    d: np.ndarray, plan: SequentialPlan, earlier: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """Vectorised decisions at one look for many experiments at once.

    ``d`` is [M, n]: n paired differences for each of M experiments, all at the same look;
    ``earlier`` the seed counts of the earlier looks (default: the plan's looks below n).
    Returns arrays of length M: ``equivalent``, ``better``, ``worse`` (booleans, exclusive;
    the same as :func:`~normlab.analysis.wording.sequential_word` of each row, vectorised for
    simulations), ``significant`` (the repeated (1 − α) interval excludes zero, equivalent or
    not), ``mean``, ``half`` (half-width of the repeated (1 − α) interval), ``half_eq`` (of the
    (1 − 2α) one), and the scalars ``critical`` / ``critical_eq``.
    """
    arr = np.asarray(d, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError(f"d must be [experiments, seeds] with >= 2 seeds, got {arr.shape}")
    n = arr.shape[1]
    hist = _history(n, plan, earlier)
    c_sup = float(
        critical_values(hist, plan.max_seeds, plan.alpha, plan.spending, two_sided=True)[-1]
    )
    mean = arr.mean(axis=1)
    sd = arr.std(axis=1, ddof=1)
    se = sd / math.sqrt(n)
    exact = sd == 0.0
    half = np.where(exact, 0.0, c_sup * se)
    sig = np.where(exact, mean != 0.0, np.abs(mean) > half)
    margin = plan.margin or 0.0
    if margin > 0:
        c_eq = float(critical_values(hist, plan.max_seeds, plan.alpha, plan.spending)[-1])
        half_eq = np.where(exact, 0.0, c_eq * se)
        equivalent = (mean - half_eq > -margin) & (mean + half_eq < margin)
    else:
        c_eq = math.nan
        half_eq = np.full_like(mean, np.nan)
        equivalent = exact & (mean == 0.0)
    directed = sig & ~equivalent
    lower = mean < 0
    better = directed & (lower == plan.lower_is_better)
    worse = directed & ~better
    return {
        "equivalent": equivalent,
        "better": better,
        "worse": worse,
        "significant": sig,
        "mean": mean,
        "half": half,
        "half_eq": half_eq,
        "critical": np.float64(c_sup),
        "critical_eq": np.float64(c_eq),
    }


def plan_for(
    metric: str,
    *,
    lower_is_better: bool,
    scale: str = "difference",
    margin: float | None = None,
    baseline_mean: float | None = None,
    looks: Sequence[int] | None = None,
    alpha: float = 0.05,
    spending: str = "obrien-fleming",
    testbed: str = "gpt",
) -> SequentialPlan:
    """The plan for ``metric`` whose equivalence margin is the smallest difference that matters
    (:func:`normlab.analysis.smallest.smallest_for`), on the scale the differences are given:
    δ itself for an absolute δ; ln(1 + δ) for a relative δ on a ratio metric (the differences
    are then log ratios ln(x / y)); δ · |baseline_mean| for a relative δ on a difference metric
    (no margin without a baseline mean). ``margin`` is the experiment's margin in its quality
    unit."""
    spec = smallest_for(metric, testbed)
    delta = spec.resolve(margin)
    if spec.kind == "relative":
        if scale == "ratio":
            delta = math.log1p(delta)
        elif baseline_mean:
            delta = delta * abs(baseline_mean)
        else:
            delta = 0.0
    return SequentialPlan(
        looks=tuple(looks) if looks is not None else look_schedule(),
        alpha=alpha,
        margin=delta or None,
        lower_is_better=lower_is_better,
        spending=spending,
    )


def next_round_size(n_done: int, plan: SequentialPlan) -> int:
    """Seeds to add before the next planned look (0 when ``n_done`` ≥ N: stop)."""
    if not (isinstance(n_done, int) and n_done >= 0):
        raise ValueError(f"n_done must be an int >= 0, got {n_done!r}")
    later = [m for m in plan.looks if m > n_done]
    return later[0] - n_done if later else 0


def _g4(v: float | None) -> str:
    """An end of a repeated interval (±inf where a look may not spend anything yet)."""
    return f"{v:+.4g}"


def _before_a_look(d: np.ndarray, plan: SequentialPlan, next_n: int | None) -> Decision:
    """The state with fewer than two paired seeds: no look is made, the next is at least 2."""
    n = int(d.size)
    verdict = sequential_word(
        n_pairs=n,
        equivalent=False,
        significant=False,
        effect=None,
        lower_is_better=plan.lower_is_better,
        last_look=n >= plan.max_seeds,
    )
    return Decision(
        decided=False,
        stop=False,
        verdict=verdict,
        reason=f"{counted(n, 'paired seed')}: at least 2 are needed for a look",
        n=n,
        look=0,
        mean=float(d.mean()) if n else None,
        low=None,
        high=None,
        eq_low=None,
        eq_high=None,
        critical=math.inf,
        critical_eq=None,
        next_n=next_n if next_n is not None else 2,
    )


def _look_reason(
    verdict: str,
    plan: SequentialPlan,
    interval: tuple[float, float],
    eq_interval: tuple[float | None, float | None],
    final: bool,
) -> str:
    """Why the look gave ``verdict``: the repeated interval it read, against zero or the
    margin."""
    pct, pct_eq = round(100 * (1 - plan.alpha)), round(100 * (1 - 2 * plan.alpha))
    if verdict == EQUIVALENT:
        if not plan.margin:
            return "identical in every pair"
        low, high = eq_interval
        return (
            f"the repeated {pct_eq}% interval [{_g4(low)}, {_g4(high)}] lies inside "
            f"±{plan.margin:g}"
        )
    repeated = f"the repeated {pct}% interval [{_g4(interval[0])}, {_g4(interval[1])}]"
    if verdict in BETTER_WORSE:
        return f"{repeated} excludes zero"
    return (
        f"{repeated} includes zero"
        + (f" and does not fit inside ±{plan.margin:g}" if plan.margin else "")
        + (f" after the most seeds planned ({plan.max_seeds})" if final else "")
    )


def decide(
    differences: Sequence[float],
    plan: SequentialPlan,
    earlier: Sequence[int] | None = None,
) -> Decision:
    """The sequential decision after the look at ``len(differences)`` paired seeds.

    ``differences`` are d_k = arm − baseline on the metric's scale (log ratios for ratio
    metrics, with the margin on that scale too); ``earlier`` the seed counts of the looks
    already made (default: the plan's looks below n). The tests: module docstring; the word:
    :func:`~normlab.analysis.wording.sequential_word`.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or not np.all(np.isfinite(d)):
        raise ValueError(f"differences must be a 1-d sequence of finite numbers, got {d!r}")
    n = int(d.size)
    next_n = next((m for m in plan.looks if m > n), None)
    if n < 2:
        return _before_a_look(d, plan, next_n)
    look = len(_history(n, plan, earlier))
    r = look_decisions(d[None, :], plan, earlier)
    mean, half, half_eq = float(r["mean"][0]), float(r["half"][0]), float(r["half_eq"][0])
    final = n >= plan.max_seeds
    verdict = sequential_word(
        n_pairs=n,
        equivalent=bool(r["equivalent"][0]),
        significant=bool(r["significant"][0]),
        effect=mean,
        lower_is_better=plan.lower_is_better,
        last_look=final,
    )
    eq = (mean - half_eq, mean + half_eq) if plan.margin else (None, None)
    reason = _look_reason(verdict, plan, (mean - half, mean + half), eq, final)
    decided = is_decided(verdict)
    return Decision(
        decided=decided,
        stop=decided or final,
        verdict=verdict,
        reason=f"{reason} (look {look}, n = {n})",
        n=n,
        look=look,
        mean=mean,
        low=mean - half,
        high=mean + half,
        eq_low=eq[0],
        eq_high=eq[1],
        critical=float(r["critical"]),
        critical_eq=float(r["critical_eq"]) if plan.margin else None,
        next_n=None if decided or final else next_n,
    )


def decide_all(
    differences_by_metric: Mapping[str, Sequence[float]],
    plans: Mapping[str, SequentialPlan],
    earlier: Sequence[int] | None = None,
) -> dict[str, Decision]:
    """:func:`decide` for every metric (``plans`` holds each metric's plan, same looks)."""
    missing = sorted(set(differences_by_metric) - set(plans))
    if missing:
        raise ValueError(f"plans must hold a plan for every metric, missing {missing}")
    return {name: decide(d, plans[name], earlier) for name, d in differences_by_metric.items()}
