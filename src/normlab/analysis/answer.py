"""The answer in the terminal: the last lines of ``normlab compare`` and ``normlab report``.

From the analysis (:func:`normlab.analysis.summary.analyze`, as written to the folder's
summary.json) and, after ``--until-decided``, the sequential state
(:mod:`normlab.analysis.rounds`):

1. the recommendation in one sentence;
2. one line per arm: its verdict on the quality metric (:func:`~.wording.judge_in_analysis`),
   the mean paired difference with its interval, and its badge
   (:func:`~.wording.badge_in_analysis`); after sequential rounds the analysis holds the
   sequential decision with its repeated interval (the rule that stopped the rounds);
3. when the runs are early training (far below a compute-optimal budget of tokens per
   parameter), a note that the verdict is about how fast the models start
   (:func:`~.training_budget.budget_lines`);
4. after sequential rounds, how many seeds it took and why it stopped;
5. when the question is still open, what a decision would cost per open arm, at the current
   training budget and at the cheapest (the analysis's ``decision_cost``,
   :func:`normlab.analysis.cost_folder.decision_sentence`), and the exact command that would
   settle it (built by the caller from the flags that were given, see
   :mod:`normlab.cli.answer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from normlab._plural import counted
from normlab.analysis.format import fmt_interval, fmt_p
from normlab.analysis.training_budget import budget_lines
from normlab.analysis.wording import (
    EQUIVALENT,
    UNDECIDED,
    badge_in_analysis,
    is_decided,
    judge_in_analysis,
)
from normlab.run_format import DECISION_COST_KEY, testbed_format

__all__ = ["answer_lines", "cost_lines", "is_open"]


def is_open(a: Mapping[str, Any], state: Mapping[str, Any] | None = None) -> bool:
    """True when more seeds could still change the answer: after sequential rounds, some arm's
    sequential verdict is not decided; else the recommendation is ``undecided``."""
    if state:
        return not all(is_decided(v) for v in state.get("verdicts", {}).values())
    return a["recommendation"]["status"] == UNDECIDED


def _plain(v: float | None) -> str:
    """A difference in the terminal: ``+0.0031``, plain ASCII (the report uses U+2212)."""
    return f"{v:+.4f}"


def _arm_line(a: Mapping[str, Any], arm: str, unit: str) -> str:
    """``arm vs baseline: word — difference, interval, p, seeds [badge]``; after sequential
    rounds the comparison is the sequential one and its interval the repeated one
    (:func:`normlab.analysis.rounds.sequential_comparison`)."""
    q = a["quality_metric"]
    c = a["comparisons"][arm][q]
    word = judge_in_analysis(a, arm, q).word
    alpha = float(a.get("alpha", 0.05))
    n = c.get("n_pairs") or 0
    mean = c.get("mean_diff")
    diff = f"difference {_plain(mean)} {unit}" if mean is not None else "no paired difference"
    if str(c.get("test", "")).startswith("group-sequential"):
        pct = round(100 * (1 - (2 * alpha if c.get("verdict") == EQUIVALENT else alpha)))
        what = f"repeated {pct}% interval"
        p_text = ""
    else:
        what = f"{round(100 * (1 - alpha))}% CI"
        p = c.get("p_value")
        p_text = f", {fmt_p(p)}" if p is not None else ""
    margin = c.get("margin")
    m = f" (margin ±{margin:g})" if margin else ""
    interval = fmt_interval(c.get("ci_low"), c.get("ci_high"), _plain, label=what)
    return (
        f"  {arm} vs {a['baseline_arm']}: {word} — {diff}, {interval}{m}{p_text}, "
        f"{counted(n, 'paired seed')} [{badge_in_analysis(a, arm)}]"
    )


def answer_lines(
    a: Mapping[str, Any],
    state: Mapping[str, Any] | None = None,
    settle: str | None = None,
) -> list[str]:
    """The closing lines (module docstring). ``a`` is the analysis dict, ``state`` the
    sequential state or None, ``settle`` the command that would settle an open question (None:
    no command line)."""
    fmt = testbed_format(str(a.get("testbed") or "gpt"))
    unit = fmt.short_unit
    lines = [str(a["recommendation"]["headline"])]
    better = "lower" if fmt.metric(fmt.quality).lower_is_better else "higher"
    lines.append(
        f"Verdict per arm on {fmt.quality_name} (arm − {a['baseline_arm']}, {better} is better):"
    )
    for arm in a["arm_order"]:
        if arm == a["baseline_arm"]:
            continue
        lines.append(_arm_line(a, arm, unit))
    lines.extend(budget_lines(a))
    if state:
        plan = state["plan"]
        stopped = state.get("stopped") or {}
        looks = ", ".join(str(n) for n in plan["looks"])
        lines.append(
            f"Sequential: {state['procedure']}, looks at {looks} seeds, α = {plan['alpha']:g}; "
            f"stopped because {stopped.get('words', 'it was interrupted')}."
        )
    if is_open(a, state):
        lines += cost_lines(a)
    if is_open(a, state) and settle:
        lines.append(f"To settle it, run: {settle}")
    return lines


def cost_lines(a: Mapping[str, Any]) -> list[str]:
    """One line per arm the analysis prices a decision for (``decision_cost``), in arm order:
    its sentence."""
    costs = a.get(DECISION_COST_KEY) or {}
    return [str(costs[arm]["sentence"]) for arm in a["arm_order"] if arm in costs]
