"""The ``decision_cost`` key of the top-level ``summary.json``: what a decision would cost.

For every arm whose quality question is still open, the price of a decided answer at each
training budget (tokens per parameter) that the folder's runs measured and at a standard set
read off a law of the spread against the budget (:mod:`normlab.analysis.cost_folder`, the math
in :mod:`normlab.analysis.cost`). The shape is declared once here as nested
:class:`~normlab.run_format.ladder.Key` s; :func:`check_decision_cost` validates a value against
it, naming the path of the first mismatch. docs/run-format.md describes the same keys.
"""

from __future__ import annotations

from typing import Any

from normlab.run_format.ladder import Key, check_key

__all__ = ["DECISION_COST", "DECISION_COST_KEY", "check_decision_cost"]

DECISION_COST_KEY = "decision_cost"
"""The key of the top-level summary.json that holds the prices (absent when every arm is
decided, or no open arm has two paired seeds with a cost)."""


def _n(name: str, doc: str, nullable: bool = False) -> Key:
    return Key(name, "number", doc, nullable=nullable)


_PRICE = (
    _n("budget", "tokens per parameter"),
    Key("measured", "boolean", "true: this budget's spread was measured; false: from the law"),
    _n("mean_diff", "the difference taken as true: the mean at the nearest measured budget"),
    _n("sd", "the paired spread at this budget"),
    _n("sd_low", "its range, lower end (80 %)"),
    _n("sd_high", "its range, upper end (80 %)"),
    Key(
        "seeds",
        "integer",
        "paired seeds that would likely settle it (null: > 1000)",
        (),
        None,
        True,
    ),
    Key("seeds_high", "integer", "the same at sd_high (null: > 1000)", (), None, True),
    _n("core_s", "core-seconds of those seeds, every arm trained once per seed", True),
    _n("core_s_high", "core-seconds of seeds_high", True),
    _n("flops", "floating-point operations of those seeds (6·N·D per run)", True),
    _n("flops_high", "floating-point operations of seeds_high", True),
)

_LAW = (
    _n("ref_budget", "the reference budget (the one with the most paired seeds)"),
    _n("ref_sd", "the spread the law gives there"),
    Key("ref_n", "integer", "paired seeds at the reference"),
    _n("exponent", "k of σ(b) = ref_sd · (b / ref_budget)^(−k)"),
    _n("exponent_low", "k's range, lower end (80 %)"),
    _n("exponent_high", "k's range, upper end (80 %)"),
    Key("measured", "boolean", "true: k fitted across measured budgets; false: k assumed"),
    Key("words", "string", "the law in words"),
)

_COST_MODEL = (
    Key("fit", "string", "proportional (one budget measured) or linear (c_0 + c_1·b)"),
    _n("fixed_core_s", "c_0: core-seconds of a seed that do not grow with the budget"),
    _n("core_s_per_budget", "c_1: core-seconds of a seed per token per parameter"),
    _n("flops_per_budget", "floating-point operations of a seed per token per parameter"),
    Key("budgets", "list", "the budgets of the seeds the cost was measured on", item="number"),
    Key("n_seeds", "integer", "seeds with every arm finished, timed"),
    _n("threads", "torch threads per run, as the runs recorded them (median)"),
    Key("parallel", "integer", "runs trained at once (the folder's config)"),
    Key("basis", "string", "the parameters a budget counts"),
    Key("words", "string", "the cost model in words"),
)

_ARM = (
    Key("metric", "string", "the quality metric"),
    Key("unit", "string", "its unit"),
    _n("current", "the budget the runs trained to (their main budget)", True),
    Key("n_done", "integer", "paired seeds measured at the current budget"),
    Key("budgets", "list", "the price at each budget, increasing", _PRICE),
    _n("cheapest", "the budget with the fewest core-seconds (null: none practical)", True),
    Key("law", "object", "the spread against the budget", _LAW),
    Key("cost_model", "object", "what a seed costs against the budget", _COST_MODEL),
    Key("sentence", "string", "the price at the current budget and the cheapest, in words"),
)

DECISION_COST = Key(
    DECISION_COST_KEY, "map", "{arm: the price of a decision against the baseline}", _ARM
)
"""The declaration of summary.json's ``decision_cost``."""


def check_decision_cost(value: Any) -> None:
    """Raise ValueError, naming the path (e.g. ``decision_cost['rms'].law.exponent``), unless
    ``value`` has the shape :data:`DECISION_COST` declares."""
    check_key(value, DECISION_COST)
