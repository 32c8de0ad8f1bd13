"""The final recommendation across all arms, from each arm's decision against the baseline.

- If some arms earn a ``switch``, the choice is, in this order of preference, the arm with the
  largest quality gain (most negative difference of the testbed's quality metric), else a more
  stable arm, else the fastest of the equivalent-and-faster arms.
- Else, if some arm is ``undecided``, the choice is ``"undecided"`` and the text says how many
  seeds would likely settle it and up to how many it may take (the spread of a few seeds is
  itself uncertain: :func:`normlab.analysis.power.forecast_words`), and how to add them
  (``--until-decided``), or, for an arm without any finished or diverged run (every run
  crashed), that it has no result: more seeds do not help an arm that crashes.
- Else the baseline is kept (``either`` when some arm is equivalent with no speed difference).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from normlab.analysis.comparison import PairedComparison
from normlab.analysis.power import forecast_words
from normlab.analysis.verdicts import ArmVerdict

__all__ = ["ADD_IMPORTED_SEEDS", "ADD_SEEDS", "UNDECIDED", "Recommendation", "recommend"]

UNDECIDED = "undecided"


@dataclass(frozen=True)
class Recommendation:
    """``choice`` is an arm name or ``"undecided"``; ``status`` is switch / keep / either /
    undecided; ``headline`` is one line and ``text`` the justification quoting the numbers."""

    choice: str
    status: str
    headline: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _arm_detail(v: ArmVerdict) -> str:
    """``arm (decision): justification``."""
    return f"{v.arm} ({v.decision}): {v.justification}"


def _switch_rank(v: ArmVerdict, quality: PairedComparison, speed: PairedComparison) -> tuple:
    if v.quality == "better":
        return (0, quality.mean_diff or 0.0)
    if v.stability == "better":
        return (1, quality.mean_diff or 0.0)
    return (2, -(speed.ratio or 0.0))


ADD_SEEDS = (
    "add seeds with --until-decided and the same --out (finished runs are kept; only the new "
    "seeds train; the terminal's last line gives the exact command)"
)
"""How to add seeds to a folder that normlab trained (its own runs, or ``compare --script``)."""
ADD_IMPORTED_SEEDS = (
    "train and log more seeds of every arm, then import them again into the same --out "
    "(normlab report --import)"
)
"""How to add seeds to a folder of imported runs, which normlab cannot train."""


def _how_to_settle(
    verdicts: dict[str, ArmVerdict], arms: list[str], add_seeds: str = ADD_SEEDS
) -> str:
    """What would settle the open comparisons of ``arms`` (all with a result); ``add_seeds``
    says how to add seeds."""
    if all(verdicts[a].n_pairs < 2 for a in arms):
        return (
            "fewer than two seeds have a result in both arms, so there is no interval; run at "
            "least 3 seeds per arm and this report will say how many more would settle it"
        )
    judged = [verdicts[a] for a in arms if verdicts[a].n_pairs >= 2]
    needs = [v.seeds_needed for v in judged]
    if any(n is None for n in needs):
        return "the difference is too small against the seed-to-seed noise to resolve"
    highs = [v.seeds_needed_high for v in judged]
    most = max(n for n in needs if n is not None)
    most_high = None if None in highs else max(n for n in highs if n is not None)
    words = forecast_words(most, most_high, [v.n_pairs for v in judged])
    return f"{words}: {add_seeds}"


def _undecided_headline(
    baseline: str,
    verdicts: dict[str, ArmVerdict],
    undecided: list[str],
    problems: dict[str, str],
    add_seeds: str = ADD_SEEDS,
) -> str:
    """The open arms and how to settle them (``add_seeds``: how to add seeds); the arms
    without a result and why."""
    open_arms = [a for a in undecided if a not in problems]
    parts = []
    if open_arms:
        parts.append(
            f"The evidence cannot tell {', '.join(open_arms)} from {baseline} yet; "
            f"{_how_to_settle(verdicts, open_arms, add_seeds)}"
        )
    parts.extend(
        f"The arm {a} has no result ({problems[a]}), so it cannot be compared with {baseline}"
        for a in undecided
        if a in problems
    )
    return ". ".join(parts) + "."


def recommend(
    baseline: str,
    verdicts: dict[str, ArmVerdict],
    quality: dict[str, PairedComparison],
    throughput: dict[str, PairedComparison],
    baseline_problem: str = "",
    arm_problems: dict[str, str] | None = None,
    add_seeds: str = ADD_SEEDS,
) -> Recommendation:
    """Pick the arm to use (rules in the module docstring).

    ``baseline_problem`` (e.g. "3 crashed") marks a baseline without any result: then nothing
    can be compared and the answer is ``undecided``. ``arm_problems`` does the same for other
    arms ({arm: "3 crashed"}): they stay undecided, and the text says why instead of asking
    for more seeds. ``add_seeds`` says how to add seeds (:data:`ADD_SEEDS`, or
    :data:`ADD_IMPORTED_SEEDS` for imported runs).
    """
    problems = arm_problems or {}
    if not verdicts:
        return Recommendation(
            baseline, "keep", f"Keep {baseline}.", "There is no other arm to compare against."
        )
    if baseline_problem:
        return Recommendation(
            UNDECIDED,
            "undecided",
            f"The baseline {baseline} has no result ({baseline_problem}), so no arm "
            "can be compared with it.",
            " ".join(_arm_detail(v) for v in verdicts.values()),
        )
    switches = [a for a, v in verdicts.items() if v.decision == "switch"]
    undecided = [a for a, v in verdicts.items() if v.decision == "undecided"]
    either = [a for a, v in verdicts.items() if v.decision == "either"]
    if switches:
        best = min(switches, key=lambda a: _switch_rank(verdicts[a], quality[a], throughput[a]))
        rest = [_arm_detail(o) for a, o in verdicts.items() if a != best]
        open_arms = f" ({', '.join(undecided)} still undecided)" if undecided else ""
        return Recommendation(
            best,
            "switch",
            f"Use {best} rather than {baseline}: {verdicts[best].reason}{open_arms}.",
            " ".join([_arm_detail(verdicts[best]), *rest]),
        )
    details = " ".join(_arm_detail(v) for v in verdicts.values())
    if undecided:
        return Recommendation(
            UNDECIDED,
            "undecided",
            _undecided_headline(baseline, verdicts, undecided, problems, add_seeds),
            details,
        )
    phrases = "; ".join(v.reason for v in verdicts.values())
    if either:
        return Recommendation(
            baseline,
            "either",
            f"Either: {phrases}; nothing is gained by switching from {baseline}.",
            details,
        )
    return Recommendation(baseline, "keep", f"Keep {baseline}: {phrases}.", details)
