"""What a decision would cost, read from a compare folder: the spreads, the cost of a seed, the
prices (the math is :mod:`normlab.analysis.cost`'s; this module reads the runs and says it).

**Budgets.** A run's budget is its training tokens per parameter, b = D / P. P, the parameters a
budget counts, is one number per folder: D / ``tokens_per_param`` of the baseline arm's finished
runs when their summaries record it, else the baseline arm's ``n_params`` (all its parameters).
Every arm of a seed is measured on the baseline's P, so the arms of a budget train the same
tokens. A run measures its main budget (its ``tokens``) and, with ``train.branches``, each
cooldown branched off it (summary.json's ``branches``: {steps: {the quality metric, ``tokens``,
…}}), each equal to a separate run of that budget. Budgets are rounded to 3 significant
digits.

**Spreads.** For an arm and a budget, the paired differences d_k = arm − baseline of the
quality metric over the seeds where both runs measured it (finished: the run, or the branch);
a budget with ≥ 2 paired seeds gives a :class:`~normlab.analysis.cost.BudgetSpread`.

**Cost of a seed.** At the main budget, over the seeds whose every arm finished with its timing:
core-seconds Σ_arms ``wall_s`` · ``threads`` (training and its evaluations; a run's branches
are left out of its ``wall_s``, as they are of a run of that budget) and FLOPs Σ_arms 6·N·D
(:func:`~normlab.analysis.cost.train_flops`, each arm's own N). A branch's ``train_s`` is only
its cooldown, not a run's cost, so the cost at another budget is modelled
(:func:`~normlab.analysis.cost.fit_seed_cost`: proportional to the budget from one measured
budget, a line from several). The wall time here is core-seconds / (threads · parallel), with
the threads the runs recorded and the folder's ``parallel``.

**Prices.** For every arm whose quality verdict is not decided, the price of a decision
(:func:`~normlab.analysis.cost.price_decisions`, margin the folder's, none: superiority only) at
each measured budget and each of :data:`STANDARD_BUDGETS` (those within 10 % of a measured
budget left out), the spread at an unmeasured one read off the spread law
(:func:`~normlab.analysis.cost.fit_spread_law`: fitted when ≥ 2 budgets were measured, else
the prior exponent, said "assumed"), and the cheapest (:func:`~normlab.analysis.cost.cheapest`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from normlab._plural import counted, noun
from normlab.analysis.cost import (
    BudgetSpread,
    SeedCost,
    SpreadLaw,
    cheapest,
    fit_seed_cost,
    fit_spread_law,
    price_decisions,
    train_flops,
)
from normlab.analysis.power import MAX_SEEDS_FORECAST, SPREAD_CONFIDENCE
from normlab.analysis.runs import CompareFolder, RunResult
from normlab.analysis.training_budget import EARLY_TRAINING_TOKENS_PER_PARAM
from normlab.run_format import (
    BRANCHES_FIELD,
    DECISION_COST_KEY,
    FINISHED,
    check_decision_cost,
    testbed_format,
)
from normlab.run_format.budget import TOKENS_PER_PARAM_FIELD

__all__ = [
    "STANDARD_BUDGETS",
    "budget_spreads",
    "budget_words",
    "core_hours",
    "decision_cost",
    "decision_sentence",
    "fmt_core_hours",
    "fmt_flops",
    "fmt_sig",
    "fmt_wall",
    "params_counted",
    "seed_cost",
    "seeds_words",
    "settle_budget",
    "wall_seconds",
]

STANDARD_BUDGETS = (1.0, 3.0, 10.0, 20.0)
"""Tokens per parameter every price is also given at: from early training to about the
compute-optimal budget (≈ 20 per parameter, Hoffmann et al. 2022)."""
NEAR = 1.1
"""A standard budget within this factor of a measured one is left out (the measured one
stands for it)."""


def _round(b: float) -> float:
    """``b`` to 3 significant digits."""
    return float(f"{b:.3g}")


def _positive(run: RunResult, *fields: str) -> tuple[float, ...] | None:
    """The values of ``fields`` in ``run``'s summary when every one is a number > 0, else
    None."""
    values = [run.value(f) for f in fields]
    return tuple(v for v in values if v) if all(v and v > 0 for v in values) else None


def params_counted(folder: CompareFolder) -> tuple[float, str] | None:
    """(P, how it was counted): the parameters a budget counts (module docstring), or None when
    the baseline arm has no parameter count."""
    base = folder.runs_of(folder.baseline_arm)
    pairs = [_positive(r, "tokens", TOKENS_PER_PARAM_FIELD) for r in base if r.status == FINISHED]
    ratios = [tokens / tpp for tokens, tpp in filter(None, pairs)]
    if ratios:
        return statistics.median(ratios), "the parameters the runs' tokens_per_param counts"
    counts = [n[0] for r in base if (n := _positive(r, "n_params"))]
    if not counts:
        return None
    return counts[0], f"all {counts[0]:,.0f} parameters of the baseline arm"


def _measured(run: RunResult, quality: str, params: float) -> dict[float, float]:
    """{budget: the quality metric} of one run: its main budget when it finished, and each
    branch that finished."""
    out: dict[float, float] = {}
    tokens, value = run.value("tokens"), run.value(quality)
    if run.status == FINISHED and tokens and value is not None:
        out[_round(tokens / params)] = value
    branches = run.summary.get(BRANCHES_FIELD)
    for entry in branches.values() if isinstance(branches, dict) else ():
        if not isinstance(entry, dict) or entry.get("status") != FINISHED:
            continue
        t, v = entry.get(quality), entry.get("tokens")
        if _finite(t) and _finite(v) and v > 0:
            out[_round(v / params)] = float(t)
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def budget_spreads(folder: CompareFolder, arm: str, params: float) -> list[BudgetSpread]:
    """The :class:`BudgetSpread` of ``arm`` against the baseline at every budget with ≥ 2
    paired seeds (module docstring), by increasing budget."""
    quality = testbed_format(folder.testbed).quality
    base = {r.seed: _measured(r, quality, params) for r in folder.runs_of(folder.baseline_arm)}
    diffs: dict[float, list[float]] = {}
    for run in folder.runs_of(arm):
        ref = base.get(run.seed, {})
        for budget, value in _measured(run, quality, params).items():
            if budget in ref:
                diffs.setdefault(budget, []).append(value - ref[budget])
    return [
        BudgetSpread(b, len(d), statistics.fmean(d), statistics.stdev(d))
        for b, d in sorted(diffs.items())
        if len(d) >= 2
    ]


def _seed_points(folder: CompareFolder, params: float) -> list[tuple[float, float, float]]:
    """(budget, core-seconds, FLOPs) of every seed whose every arm finished with ``tokens``,
    ``n_params``, ``wall_s`` and ``threads`` (module docstring)."""
    fields = ("tokens", "n_params", "wall_s", "threads")
    points = []
    for seed in sorted({r.seed for r in folder.runs}):
        runs = {r.arm: r for r in folder.runs if r.seed == seed and r.status == FINISHED}
        values = {arm: _positive(r, *fields) for arm, r in runs.items()}
        if any(values.get(arm) is None for arm in folder.arms):
            continue
        core = sum(wall * threads for _, _, wall, threads in values.values())
        flops = sum(train_flops(n, tokens) for tokens, n, _, _ in values.values())
        tokens = values[folder.baseline_arm][0]
        points.append((_round(tokens / params), core, flops))
    return points


def seed_cost(
    folder: CompareFolder, params: tuple[float, str]
) -> tuple[SeedCost, dict[str, Any]] | None:
    """The cost of a seed against the budget and its record (``cost_model``), or None without
    a seed to measure it on."""
    points = _seed_points(folder, params[0])
    if not points:
        return None
    cost = fit_seed_cost(points)
    threads = statistics.median(r.value("threads") for r in folder.runs if r.value("threads"))
    parallel = (folder.experiment.get("config") or {}).get("parallel", 1)
    budgets = sorted({p[0] for p in points})
    linear = cost.fixed_core_s > 0
    words = (
        f"a seed's core-seconds as {cost.fixed_core_s:.3g} + {cost.core_s_per_budget:.3g} per "
        f"token per parameter, fitted on {counted(len(budgets), 'budget')}"
        if linear
        else f"a seed's core-seconds taken as proportional to the budget "
        f"({cost.core_s_per_budget:.3g} per token per parameter), measured at "
        f"{_budgets_words(budgets)} only"
    )
    record = {
        "fit": "linear" if linear else "proportional",
        "fixed_core_s": cost.fixed_core_s,
        "core_s_per_budget": cost.core_s_per_budget,
        "flops_per_budget": cost.flops_per_budget,
        "budgets": budgets,
        "n_seeds": len(points),
        "threads": float(threads),
        "parallel": int(parallel) if isinstance(parallel, int) and parallel >= 1 else 1,
        "basis": params[1],
        "words": f"{words}, on {counted(len(points), 'seed')} with every arm finished",
    }
    return cost, record


def _budgets_words(budgets: Sequence[float]) -> str:
    """``2.87 tokens per parameter``, ``1, 3 tokens per parameter``."""
    if len(budgets) == 1:
        return budget_words(budgets[0])
    return f"{', '.join(f'{b:.3g}' for b in budgets)} tokens per parameter"


def _minus(x: float) -> str:
    """``x`` to 2 significant digits with U+2212 for a minus sign."""
    return f"{x:.2g}".replace("-", "\u2212")


def _law_record(law: SpreadLaw, n_budgets: int) -> dict[str, Any]:
    k, low, high = law.exponent, law.exponent_low, law.exponent_high
    pct = round(100 * SPREAD_CONFIDENCE)
    shape = f"σ(b) ∝ b^({_minus(-k)})"
    ks = f"k {_minus(low)} to {_minus(high)}"
    if law.measured:
        words = f"{shape}, fitted on {counted(n_budgets, 'measured budget')} ({ks}, {pct} %)"
    else:
        why = (
            "one budget was measured"
            if n_budgets < 2
            else f"the {counted(n_budgets, 'measured budget')} give no slope (a spread of 0)"
        )
        words = (
            f"{shape} assumed ({ks}): {why}, so how the spread falls with the budget is not "
            "measured here"
        )
    return {**asdict(law), "words": words}


def _budgets(spreads: Sequence[BudgetSpread]) -> list[float]:
    """The measured budgets and the standard ones not within :data:`NEAR` of one."""
    measured = [s.budget for s in spreads]
    extra = [b for b in STANDARD_BUDGETS if all(max(b / m, m / b) > NEAR for m in measured)]
    return sorted({*measured, *extra})


def _current(folder: CompareFolder, params: float) -> float | None:
    """The main budget of the baseline's finished runs (the most common one)."""
    runs = folder.runs_of(folder.baseline_arm)
    tokens = [t[0] for r in runs if r.status == FINISHED and (t := _positive(r, "tokens"))]
    return statistics.mode(_round(t / params) for t in tokens) if tokens else None


def wall_seconds(core_s: float, cost_model: Mapping[str, Any]) -> float:
    """The wall time here of ``core_s`` core-seconds: core_s / (threads · parallel), with the
    runs' threads and the folder's parallel runs (``cost_model``'s)."""
    return core_s / (float(cost_model["threads"]) * int(cost_model["parallel"]))


def fmt_sig(x: float, digits: int = 2) -> str:
    """``x`` to ``digits`` significant digits, without an exponent: 190, 1.9, 0.034 (below
    10⁻⁴ with one: 2.8e-07)."""
    if x == 0 or not math.isfinite(x) or abs(x) < 1e-4:
        return f"{x:.{digits}g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{round(x, decimals):.{decimals}f}"


def fmt_flops(flops: float | None) -> str:
    """Floating-point operations as ``3.2e15`` (an em dash when None)."""
    if flops is None:
        return "—"
    mantissa, _, exponent = f"{flops:.1e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def fmt_wall(seconds: float | None) -> str:
    """A wall time in the unit that reads best: ``40 s``, ``12 min``, ``1.9 h``, ``3.5 days``."""
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{fmt_sig(seconds / 3600)} h"
    return f"{fmt_sig(seconds / 86400)} days"


def core_hours(core_s: float | None) -> str:
    """Core-seconds as core-hours, the number alone, 2 significant digits (an em dash when
    None)."""
    return "—" if core_s is None else fmt_sig(core_s / 3600)


def fmt_core_hours(core_s: float | None) -> str:
    """Core-seconds as ``1.9 core-hours`` (an em dash when None)."""
    return "—" if core_s is None else f"{core_hours(core_s)} core-hours"


def budget_words(budget: float) -> str:
    """``2.87 tokens per parameter`` (``1 token per parameter``)."""
    return f"{budget:.3g} {noun(1 if budget == 1 else 2, 'token')} per parameter"


def seeds_words(price: Mapping[str, Any]) -> str:
    """A price's seeds: ``about 45 seeds (up to 160)``; ``no practical number of seeds (more
    than 1000)`` when even the plug-in count is beyond what a forecast looks at."""
    n, high = price["seeds"], price["seeds_high"]
    if n is None:
        return f"no practical number of seeds (more than {MAX_SEEDS_FORECAST})"
    top = f"more than {MAX_SEEDS_FORECAST}" if high is None else str(high)
    return f"about {counted(n, 'seed')}" + ("" if high == n else f" (up to {top})")


def _cost_words(price: Mapping[str, Any], cost_model: Mapping[str, Any]) -> str:
    wall = fmt_wall(wall_seconds(price["core_s"], cost_model))
    return f"{fmt_core_hours(price['core_s'])}, ~{wall} here"


def _source_words(price: Mapping[str, Any], law: Mapping[str, Any]) -> str:
    if price["measured"]:
        return " (measured)"
    return " (read off the spread law" + ("" if law["measured"] else ", its exponent assumed") + ")"


def decision_sentence(arm: str, record: Mapping[str, Any]) -> str:
    """The price of a decision on ``arm`` in one sentence: at the current budget, then the
    cheapest budget measured or forecast and what it costs, and whether continuing at the
    current budget, whose seeds are already done, costs less than starting over there."""
    prices = {p["budget"]: p for p in record["budgets"]}
    cur, best = prices.get(record["current"]), prices.get(record["cheapest"])
    model = record["cost_model"]
    if cur is None:
        head = f"A decision on {arm} has no price at its current budget (fewer than 2 paired seeds)"
    else:
        head = f"A decision on {arm} costs {seeds_words(cur)} at {budget_words(cur['budget'])}"
        head += f": {_cost_words(cur, model)}" if cur["seeds"] is not None else ""
    if best is None:
        return f"{head}; no budget measured or forecast has a practical number of seeds"
    if best is cur:
        others = _budgets_words([b for b in prices if b != cur["budget"]])
        head += f"; no other budget measured or forecast ({others}) is cheaper"
        return head + _trained_words(prices, best, record)
    tail = (
        f"; the cheapest measured or forecast: {budget_words(best['budget'])}"
        f"{_source_words(best, record['law'])}, {seeds_words(best)}, {_cost_words(best, model)}"
    )
    more = _remaining_core_s(cur, record["n_done"], model)
    if more is not None and more <= best["core_s"]:
        tail += (
            f"; continuing at {cur['budget']:g} reuses the {counted(record['n_done'], 'seed')} "
            f"done and costs less ({fmt_core_hours(more)} more)"
        )
    return head + tail + _trained_words(prices, best, record)


def _trained_words(
    prices: Mapping[float, Mapping[str, Any]],
    best: Mapping[str, Any],
    record: Mapping[str, Any],
) -> str:
    """When the cheapest budget is early training (below
    :data:`~normlab.analysis.training_budget.EARLY_TRAINING_TOKENS_PER_PARAM` tokens per
    parameter, where an answer is about how fast the models start), the cheapest at or beyond
    it, with its price; else nothing."""
    if best["budget"] >= EARLY_TRAINING_TOKENS_PER_PARAM:
        return ""
    trained = [p for b, p in prices.items()
               if b >= EARLY_TRAINING_TOKENS_PER_PARAM and p["core_s"] is not None]  # fmt: skip
    if not trained:
        return ""
    p = min(trained, key=lambda x: (x["core_s"], x["budget"]))
    return (
        f"; beyond early training (at least {EARLY_TRAINING_TOKENS_PER_PARAM:g} tokens per "
        f"parameter) the cheapest is {budget_words(p['budget'])}{_source_words(p, record['law'])}"
        f", {seeds_words(p)}, {_cost_words(p, record['cost_model'])}"
    )


def _seed_core_s(budget: float, cost_model: Mapping[str, Any]) -> float:
    return cost_model["fixed_core_s"] + cost_model["core_s_per_budget"] * budget


def _remaining_core_s(
    cur: Mapping[str, Any] | None, n_done: int, cost_model: Mapping[str, Any]
) -> float | None:
    """The core-seconds still to spend at the current budget: its price less the seeds done
    (at least one more seed), None without a practical price there."""
    if cur is None or cur["seeds"] is None:
        return None
    return max(cur["seeds"] - n_done, 1) * _seed_core_s(cur["budget"], cost_model)


def settle_budget(records: Mapping[str, Mapping[str, Any]]) -> tuple[float, int, float] | None:
    """(budget, most seeds, wall seconds here) of the budget to settle every open arm at when
    it is not the current one: the budget whose price (the largest over the arms: every seed
    trains every arm) is the smallest, taken only when it is below what the current budget
    still costs with its seeds done reused; the most seeds are the largest upper end
    (``seeds_high``, else ``seeds``) over the arms there. None: stay at the current budget."""
    if not records:
        return None
    first = next(iter(records.values()))
    model, current = first["cost_model"], first["current"]
    by_arm = [{p["budget"]: p for p in r["budgets"]} for r in records.values()]
    common = set.intersection(*(set(b) for b in by_arm))
    priced = {b: [arm[b] for arm in by_arm] for b in common}
    priced = {b: ps for b, ps in priced.items() if all(p["core_s"] is not None for p in ps)}
    if not priced:
        return None
    cost = {b: max(p["core_s"] for p in ps) for b, ps in priced.items()}
    best = min(cost, key=lambda b: (cost[b], b))
    stay = math.inf
    if current in priced:
        n_done = min(int(r["n_done"]) for r in records.values())
        seeds = max(p["seeds"] for p in priced[current])
        stay = max(seeds - n_done, 1) * _seed_core_s(current, model)
    if best == current or cost[best] >= stay:
        return None
    most = max(p["seeds_high"] or p["seeds"] for p in priced[best])
    return best, most, wall_seconds(most * _seed_core_s(best, model), model)


def _arm_record(
    folder: CompareFolder,
    arm: str,
    params: float,
    cost: tuple[SeedCost, dict[str, Any]],
    margin: float,
    alpha: float,
    power: float,
) -> dict[str, Any] | None:
    """The ``decision_cost`` entry of ``arm`` (module docstring); None without a budget of ≥ 2
    paired seeds."""
    spreads = budget_spreads(folder, arm, params)
    if not spreads:
        return None
    law = fit_spread_law(spreads)
    prices = price_decisions(
        spreads, cost[0], _budgets(spreads), margin, alpha=alpha, power=power, law=law
    )
    best = cheapest(prices)
    current = _current(folder, params)
    fmt = testbed_format(folder.testbed)
    record: dict[str, Any] = {
        "metric": fmt.quality,
        "unit": fmt.short_unit,
        "current": current,
        "n_done": next((s.n_seeds for s in spreads if s.budget == current), 0),
        "budgets": [p.to_dict() for p in prices],
        "cheapest": None if best is None else best.budget,
        "law": _law_record(law, len(spreads)),
        "cost_model": cost[1],
    }
    record["sentence"] = decision_sentence(arm, record)
    return record


def decision_cost(
    folder: CompareFolder, open_arms: Sequence[str], alpha: float = 0.05, power: float = 0.8
) -> dict[str, Any]:
    """{``decision_cost``: {arm: its entry}} for the arms of ``open_arms`` that can be priced
    (module docstring; the shape is :data:`normlab.run_format.DECISION_COST`), or {} when none
    can: every arm decided, no parameter count, no seed with every arm finished and timed, or
    no budget with 2 paired seeds."""
    params = params_counted(folder) if open_arms else None
    cost = seed_cost(folder, params) if params is not None else None
    if params is None or cost is None:
        return {}
    spec = testbed_format(folder.testbed).metric(testbed_format(folder.testbed).quality)
    factor = spec.margin_factor if spec.margin_factor is not None else 1.0
    margin = 0.0 if folder.margin is None else folder.margin * factor
    records = {}
    for arm in open_arms:
        record = _arm_record(folder, arm, params[0], cost, margin, alpha, power)
        if record is not None:
            records[arm] = record
    if not records:
        return {}
    check_decision_cost(records)
    return {DECISION_COST_KEY: records}
