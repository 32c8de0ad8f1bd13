"""The report's section "What a decision costs": for every arm whose quality question is open,
the price of a decided answer at each training budget (the analysis's ``decision_cost``,
:mod:`normlab.analysis.cost_folder`), as a table per arm and the sentence that names the
cheapest budget."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from normlab._plural import counted, noun
from normlab.analysis.cost_folder import core_hours, fmt_flops, fmt_sig, fmt_wall, wall_seconds
from normlab.analysis.power import MAX_SEEDS_FORECAST, SPREAD_CONFIDENCE, forecast_range
from normlab.report.content import Section, Table
from normlab.run_format import DECISION_COST_KEY

__all__ = ["decision_cost_section"]


def _span(price: Mapping[str, Any], key: str, fmt: Callable[[float], str]) -> str:
    """A compute cell from the plug-in seeds to the upper end: ``0.20–1.7``; one value when
    they agree; ``0.45–>4.7`` when the upper end lies beyond what a forecast looks at (the
    compute of :data:`MAX_SEEDS_FORECAST` seeds); an em dash without a practical count."""
    low, high = price[key], price[f"{key}_high"]
    if low is None:
        return "—"
    top = fmt(high) if high is not None else f">{fmt(low / price['seeds'] * MAX_SEEDS_FORECAST)}"
    return fmt(low) if top == fmt(low) else f"{fmt(low)}–{top}"


def _budget_cell(price: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    marks = [
        word
        for word, budget in (("current", record["current"]), ("cheapest", record["cheapest"]))
        if budget == price["budget"]
    ]
    return f"{price['budget']:g}" + (f" ({', '.join(marks)})" if marks else "")


def _row(price: Mapping[str, Any], record: Mapping[str, Any]) -> list[str]:
    model = record["cost_model"]
    sd = ", ".join(fmt_sig(price[k], 3) for k in ("sd_low", "sd_high"))
    return [
        _budget_cell(price, record),
        "measured" if price["measured"] else "spread law",
        f"{fmt_sig(price['sd'], 3)} [{sd}]",
        forecast_range(price["seeds"], price["seeds_high"]),
        _span(price, "core_s", core_hours),
        _span(price, "flops", fmt_flops),
        _span(price, "core_s", lambda c: fmt_wall(wall_seconds(c, model))),
    ]


def _table(record: Mapping[str, Any]) -> Table:
    pct = round(100 * SPREAD_CONFIDENCE)
    rows = [_row(p, record) for p in record["budgets"]]
    return Table(
        columns=[
            "tokens per parameter",
            "spread from",
            f"paired sd ({record['unit']}) [{pct}% range]",
            "seeds (plug-in–upper)",
            "core-hours",
            "FLOPs",
            "wall time here",
        ],
        rows=rows,
        align=["left", "left", "right", "right", "right", "right", "right"],
    )


def decision_cost_section(a: Mapping[str, Any]) -> Section | None:
    """ "What a decision costs": per open arm its sentence and its table (budget, measured or
    from the spread law, the paired sd with its range, the seeds from the plug-in count to the
    upper end, their core-hours, FLOPs and wall time here), then how the prices were made; None
    when the analysis prices no decision."""
    costs = a.get(DECISION_COST_KEY) or {}
    arms = [arm for arm in a.get("arm_order", costs) if arm in costs]
    if not arms:
        return None
    first = costs[arms[0]]
    model = first["cost_model"]
    pct = round(100 * SPREAD_CONFIDENCE)
    power = round(100 * float(a.get("power", 0.8)))
    how = (
        f"How these prices are made. A budget is training tokens per parameter ({model['basis']}). "
        "The seeds are those that would likely settle the question from scratch at that budget "
        f"({power}% power at the difference observed at the nearest measured budget), from the "
        f"plug-in spread to the top of its {pct}% range; a seed trains every arm once. "
        f"Compute: {model['words']}; FLOPs 6·N·D per run; the wall time here is core-seconds / "
        f"({model['threads']:g} {noun(1 if model['threads'] == 1 else 2, 'thread')} × "
        f"{counted(model['parallel'], 'parallel run')}). The "
        "spread at a budget that was not measured is read off the spread law: "
        + "; ".join(f"{arm}: {costs[arm]['law']['words']}" for arm in arms)
        + ". Only the spread's uncertainty is carried into the ranges."
    )
    return Section(
        anchor="decision-cost",
        title="What a decision costs",
        paragraphs=[*(str(costs[arm]["sentence"]) + "." for arm in arms), how],
        tables=[(f"{arm} against {a.get('baseline_arm')}", _table(costs[arm])) for arm in arms],
    )
