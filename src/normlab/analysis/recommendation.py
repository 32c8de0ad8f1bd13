"""The final recommendation across all arms, and its sentences.

The choice and its status (switch / keep / either / undecided) are rule 8 of
:mod:`normlab.analysis.wording` (:func:`~normlab.analysis.wording.recommendation`): an arm
that earns a ``switch`` — the largest quality gain first, then a more stable arm, then the
fastest of the equivalent-and-faster arms; else ``undecided`` when some arm is; else the
baseline (``either`` when some arm is equivalent with no speed difference). This module says
it: the headline and the arms' justifications; for an undecided answer, how many seeds would
likely settle it and up to how many it may take (the spread of a few seeds is itself
uncertain: :func:`normlab.analysis.power.forecast_words`), and how to add them
(``--until-decided``), or, for an arm without any finished or diverged run (every run
crashed), that it has no result: more seeds do not help an arm that crashes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from normlab.analysis.comparison import PairedComparison
from normlab.analysis.power import forecast_words
from normlab.analysis.verdicts import ArmVerdict
from normlab.analysis.wording import EITHER, SWITCH, UNDECIDED, recommendation

__all__ = ["ADD_IMPORTED_SEEDS", "ADD_SEEDS", "Recommendation", "recommend"]


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
    """The arm to use (rule 8 of :mod:`normlab.analysis.wording`) and its sentences.

    ``baseline_problem`` (e.g. "3 crashed") marks a baseline without any result: then nothing
    can be compared and the answer is ``undecided``. ``arm_problems`` does the same for other
    arms ({arm: "3 crashed"}): they stay undecided, and the text says why instead of asking
    for more seeds. ``add_seeds`` says how to add seeds (:data:`ADD_SEEDS`, or
    :data:`ADD_IMPORTED_SEEDS` for imported runs).
    """
    problems = arm_problems or {}
    choice, status = recommendation(
        baseline,
        verdicts,
        lambda arm: quality[arm].mean_diff,
        lambda arm: throughput[arm].ratio,
        baseline_has_result=not baseline_problem,
    )
    details = " ".join(_arm_detail(v) for v in verdicts.values())
    if not verdicts:
        return Recommendation(
            choice, status, f"Keep {baseline}.", "There is no other arm to compare against."
        )
    if status == SWITCH:
        rest = [_arm_detail(o) for a, o in verdicts.items() if a != choice]
        undecided = [a for a, v in verdicts.items() if v.decision == UNDECIDED]
        open_arms = f" ({', '.join(undecided)} still undecided)" if undecided else ""
        return Recommendation(
            choice,
            status,
            f"Use {choice} rather than {baseline}: {verdicts[choice].reason}{open_arms}.",
            " ".join([_arm_detail(verdicts[choice]), *rest]),
        )
    return Recommendation(
        choice,
        status,
        _headline(baseline, verdicts, status, baseline_problem, problems, add_seeds),
        details,
    )


def _headline(
    baseline: str,
    verdicts: dict[str, ArmVerdict],
    status: str,
    baseline_problem: str,
    problems: dict[str, str],
    add_seeds: str,
) -> str:
    """The headline of a recommendation that switches to no arm."""
    if baseline_problem:
        return (
            f"The baseline {baseline} has no result ({baseline_problem}), so no arm can be "
            "compared with it."
        )
    if status == UNDECIDED:
        undecided = [a for a, v in verdicts.items() if v.decision == UNDECIDED]
        return _undecided_headline(baseline, verdicts, undecided, problems, add_seeds)
    phrases = "; ".join(v.reason for v in verdicts.values())
    if status == EITHER:
        return f"Either: {phrases}; nothing is gained by switching from {baseline}."
    return f"Keep {baseline}: {phrases}."
