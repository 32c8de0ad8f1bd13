"""The state of ``compare --until-decided``: one sequential decision per arm, look after look.

Each non-baseline arm is compared with the baseline on the testbed's quality metric by the
group-sequential paired t-test of :mod:`normlab.analysis.sequential` (Lan & DeMets 1983
α-spending, O'Brien–Fleming type; Jennison & Turnbull 2000). The plan (its looks, α, margin)
is fixed before the first look. At the look after n seeds, the usable differences
d_k = arm_k − baseline_k are those of the seeds where both runs finished with a finite value;
an arm whose decision is made (better, worse, equivalent) keeps it, its later seeds are not
looked at again. The rounds stop when every arm is decided, at the last planned look (the
open arms close ``inconclusive``), or when the time budget would be exceeded by the next
round (the open arms stay ``open``; running the same command again continues).

:class:`SequentialTracker` records every look (seeds, boundaries, decision per arm) as the
JSON of ``sequential.json`` (:mod:`normlab.run_format.folder`); :func:`read_state` reads it back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from normlab._plural import counted
from normlab.analysis.comparison import PairedComparison
from normlab.analysis.sequential import Decision, SequentialPlan, decide
from normlab.analysis.wording import (
    BETTER_WORSE,
    EQUIVALENT,
    INCONCLUSIVE,
    closed,
    still_open,
)
from normlab.run_format import FINISHED
from normlab.run_format import folder as run_folder

__all__ = [
    "CITATION",
    "PROCEDURE",
    "STOP_REASONS",
    "SequentialTracker",
    "paired_differences",
    "read_state",
    "sequential_comparison",
    "stop_words",
]

PROCEDURE = (
    "group-sequential paired t-test with Lan–DeMets α-spending "
    "(O'Brien–Fleming-type boundaries on the t scale)"
)
CITATION = (
    "Lan & DeMets (1983), Biometrika 70:659–663; Jennison & Turnbull (2000), Group Sequential "
    "Methods with Applications to Clinical Trials, ch. 7 and 11"
)
STOP_REASONS = ("decided", "max-seeds", "max-time")
"""Why the rounds stopped: every arm decided, the last planned look, or the time budget."""


def stop_words(reason: str, n_seeds: int, max_time_s: float | None = None) -> str:
    """Why the rounds stopped, as a phrase."""
    if reason == "decided":
        return f"every arm was decided after {counted(n_seeds, 'seed')}"
    if reason == "max-seeds":
        return f"the most seeds planned ({n_seeds}) were reached"
    if reason == "max-time":
        budget = f" of {max_time_s:g} s" if max_time_s else ""
        done = counted(n_seeds, "seed")
        return f"the next round would not fit in the time budget{budget} ({done} done)"
    raise ValueError(f"reason must be one of {STOP_REASONS}, got {reason!r}")


def paired_differences(
    summaries: Mapping[str, Mapping[str, Any]], arm: str, baseline: str, metric: str
) -> tuple[list[int], list[float]]:
    """(seeds, d) with d_k = ``metric``(arm, seed k) − ``metric``(baseline, seed k) over the
    seeds where both runs finished with a finite value, in seed order."""

    def values(name: str) -> dict[int, float]:
        out = {}
        for s in summaries.values():
            v = s.get(metric)
            usable = s.get("arm") == name and s.get("status") == FINISHED
            if usable and v is not None and math.isfinite(float(v)):
                out[int(s["seed"])] = float(v)
        return out

    a, b = values(arm), values(baseline)
    seeds = sorted(set(a) & set(b))
    return seeds, [a[k] - b[k] for k in seeds]


class SequentialTracker:
    """The looks of one ``--until-decided`` experiment (module docstring).

    ``plan`` is the sequential plan (fixed before the first look), ``arms`` the non-baseline
    arms, ``metric`` the quality metric and ``unit`` its short unit; ``max_time_s`` is the time
    budget (None: none), kept for the record.
    """

    def __init__(
        self,
        plan: SequentialPlan,
        arms: list[str],
        baseline: str,
        metric: str,
        unit: str = "",
        max_time_s: float | None = None,
    ) -> None:
        if not arms:
            raise ValueError("arms: expected at least one arm besides the baseline")
        self.plan = plan
        self.arms = list(arms)
        self.baseline = baseline
        self.metric = metric
        self.unit = unit
        self.max_time_s = max_time_s
        self.looks: list[dict[str, Any]] = []
        self.final: dict[str, Decision] = {}
        self._history: dict[str, list[int]] = {arm: [] for arm in arms}
        self._seeds: dict[str, list[int]] = {}
        self.stopped: dict[str, Any] | None = None

    @property
    def decided(self) -> bool:
        """True when every arm has a decision (better, worse or equivalent)."""
        return all(arm in self.final and self.final[arm].decided for arm in self.arms)

    def look(
        self, n_seeds: int, summaries: Mapping[str, Mapping[str, Any]], elapsed_s: float = 0.0
    ) -> bool:
        """Look at the runs after ``n_seeds`` seeds; returns True when every arm is decided.

        An arm already decided keeps its decision. For an open arm, the m usable differences
        are decided at the boundaries of its own looks so far (:func:`decide` with ``earlier``);
        a look that adds no usable pair is recorded without a decision. At the last planned look
        an arm still open closes ``inconclusive``.
        """
        final_look = n_seeds >= self.plan.max_seeds
        record: dict[str, Any] = {"n_seeds": n_seeds, "elapsed_s": round(elapsed_s, 1), "arms": {}}
        for arm in self.arms:
            if arm in self.final and self.final[arm].decided:
                continue
            seeds, d = paired_differences(summaries, arm, self.baseline, self.metric)
            history = self._history[arm]
            if len(d) < 2 or (history and len(d) <= history[-1]):
                record["arms"][arm] = {
                    "n_pairs": len(d),
                    "verdict": still_open(final_look),
                    "reason": f"{counted(len(d), 'usable paired seed')}: no new pair to look at",
                }
                continue
            decision = decide(d, self.plan, earlier=history)
            history.append(len(d))
            if final_look and not decision.decided:
                decision = replace(
                    decision, verdict=closed(decision.verdict), stop=True, next_n=None
                )
            self.final[arm] = decision
            self._seeds[arm] = seeds
            record["arms"][arm] = {"n_pairs": len(d), "seeds": seeds, **decision.to_dict()}
        self.looks.append(record)
        return self.decided

    def stop(self, reason: str, n_seeds: int) -> None:
        """Record why the rounds stopped after ``n_seeds`` seeds (one of :data:`STOP_REASONS`)."""
        self.stopped = {
            "reason": reason,
            "n_seeds": n_seeds,
            "words": stop_words(reason, n_seeds, self.max_time_s),
        }

    def verdicts(self) -> dict[str, str]:
        """{arm: the arm's current verdict} (``open`` for an arm never looked at)."""
        return {
            arm: self.final[arm].verdict if arm in self.final else still_open(last_look=False)
            for arm in self.arms
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``sequential.json``."""
        return {
            "procedure": PROCEDURE,
            "citation": CITATION,
            "metric": self.metric,
            "unit": self.unit,
            "baseline_arm": self.baseline,
            "arms": self.arms,
            "plan": {
                "looks": list(self.plan.looks),
                "max_seeds": self.plan.max_seeds,
                "alpha": self.plan.alpha,
                "margin": self.plan.margin,
                "spending": self.plan.spending,
                "max_time_s": self.max_time_s,
            },
            "looks": self.looks,
            "final": {
                arm: {**d.to_dict(), "seeds": self._seeds[arm]} for arm, d in self.final.items()
            },
            "verdicts": self.verdicts(),
            "stopped": self.stopped,
        }


def read_state(out: Path | str) -> dict[str, Any] | None:
    """The sequential state of the compare folder ``out`` (``sequential.json``), or None
    when it has none (a compare without ``--until-decided``) or an unreadable one."""
    return run_folder.read_sequential(out)


def sequential_comparison(c: PairedComparison, decision: Mapping[str, Any]) -> PairedComparison:
    """The quality comparison ``c`` as the sequential procedure decided it (``decision``: an
    arm's entry in the state's ``final``), so that every word of the report follows the rule
    that stopped the rounds: its verdict (``open`` reads ``inconclusive``), its mean over the
    seeds of its look, and its repeated interval as the interval — the (1 − 2α) one of the
    equivalence decision, else the (1 − α) one. A fixed-sample interval of the same seeds is
    narrower: read after several looks, it would claim more than the data show."""
    verdict = closed(str(decision.get("verdict")))
    eq = verdict == EQUIVALENT and decision.get("eq_low") is not None
    low = decision.get("eq_low") if eq else decision.get("low")
    high = decision.get("eq_high") if eq else decision.get("high")
    return replace(
        c,
        n_pairs=int(decision.get("n") or c.n_pairs),
        seeds=list(decision.get("seeds") or c.seeds),
        test=f"group-sequential t, look {decision.get('look')} (repeated interval)",
        mean_diff=decision.get("mean", c.mean_diff),
        ci_low=low,
        ci_high=high,
        equivalent=verdict == EQUIVALENT,
        significant=verdict in BETTER_WORSE,
        verdict=verdict,
        seeds_needed=None if verdict != INCONCLUSIVE else c.seeds_needed,
        seeds_needed_high=None if verdict != INCONCLUSIVE else c.seeds_needed_high,
        note=str(decision.get("reason", "")),
    )
