"""Per-arm verdicts against the baseline, the decision they lead to, and their sentences.

Each candidate arm A is compared with the baseline B on quality (the testbed's final validation
metric: bits per byte for the GPT, flow-matching loss for the DiT; see
:mod:`normlab.analysis.comparison`), throughput and peak memory (paired log ratios), and
stability (:mod:`normlab.analysis.stability`). The words — quality (rule 4 of
:mod:`normlab.analysis.wording`), speed and memory (rule 3) — and the decision (rule 7: keep,
switch, either or undecided, first rule that applies) are the wording module's; this module
gathers them into an :class:`ArmVerdict` and writes the sentences that quote the numbers
behind them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from normlab._plural import counted
from normlab.analysis.comparison import EXACT_TEST, PairedComparison
from normlab.analysis.format import fmt_interval, fmt_p, fmt_ratio, fmt_signed
from normlab.analysis.power import forecast_words
from normlab.analysis.stability import StabilityVerdict
from normlab.analysis.wording import (
    BETTER_WORSE,
    EQUIVALENT,
    UNCLEAR_SIZE,
    arm_decision,
    memory_word,
    quality_word,
    speed_word,
)

__all__ = ["ArmVerdict", "arm_verdict", "quality_sentence", "speed_sentence"]


@dataclass(frozen=True)
class ArmVerdict:
    """Verdicts of one arm against the baseline and the resulting decision."""

    arm: str
    baseline_arm: str
    quality: str
    quality_text: str
    seeds_needed: int | None
    seeds_needed_high: int | None
    """The seeds that would likely settle the quality question, and the most it may take
    (:func:`normlab.analysis.power.forecast_seeds`); None once it is settled."""
    n_pairs: int
    throughput: str
    throughput_text: str
    memory: str
    memory_text: str
    stability: str
    stability_text: str
    decision: str
    reason: str
    justification: str
    """``reason`` is a short phrase for the decision; ``justification`` quotes the numbers."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def quality_sentence(
    c: PairedComparison,
    arm: str,
    baseline: str,
    what: str = "validation bpb",
    unit: str = "bpb",
) -> str:
    """One sentence on the final-quality comparison, quoting the numbers behind the verdict.

    ``what`` names the metric ("validation bpb", "validation loss") and ``unit`` suffixes its
    numbers ("bpb", "MSE")."""
    pct = round(100 * c.confidence)
    ci = fmt_interval(c.ci_low, c.ci_high, label=f"{pct}% CI", to=True)
    seeds = f"n = {counted(c.n_pairs, 'paired seed')}"
    diff = f"difference {fmt_signed(c.mean_diff)} {unit} ({arm} − {baseline}; {ci}, {seeds})"
    margin = f"±{c.margin:g} {unit}" if c.margin is not None else "no margin"
    if c.n_pairs < 2:
        return f"Quality cannot be judged: {c.note}."
    if c.verdict == EQUIVALENT and c.tost_low is not None:
        tost_pct = round(100 * (1 - 2 * (1 - c.confidence)))
        extra = (
            f"; the difference is detectable ({ci}) but smaller than the margin"
            if c.significant
            else ""
        )
        tost = fmt_interval(c.tost_low, c.tost_high, label=f"{tost_pct}% CI", to=True)
        return (
            f"Final {what} is equivalent within {margin}: difference "
            f"{fmt_signed(c.mean_diff)} {unit} ({arm} − {baseline}), whose {tost} lies inside "
            f"the margin (TOST {fmt_p(c.tost_p)}, {seeds}){extra}."
        )
    if c.verdict == EQUIVALENT:
        return f"Final {what} is identical in every pair: {diff}."
    if c.verdict == UNCLEAR_SIZE:
        return (
            f"Final {what} differs detectably but by less than the margin: {diff}, "
            f"{fmt_p(c.p_value)}; the interval reaches past {margin}, so whether the difference "
            "matters is still open."
        )
    if c.verdict in BETTER_WORSE:
        word = "lower (better)" if c.verdict == "better" else "higher (worse)"
        evidence = "the same in every pair" if c.test == EXACT_TEST else fmt_p(c.p_value)
        return f"Final {what} is {word}: {diff}, {evidence}."
    if c.seeds_needed is None:
        need = "no practical number of seeds would settle it at this noise level"
    else:
        need = (
            f"{forecast_words(c.seeds_needed, c.seeds_needed_high, c.n_pairs)} "
            f"({round(100 * c.power)}% power, taking the observed difference as the truth)"
        )
    return (
        f"Final {what} cannot be told apart yet: {diff} neither excludes zero nor fits "
        f"inside {margin}; {need}."
    )


def _ratio_interval(c: PairedComparison) -> str:
    """The ratio's interval, ``95% CI 1.021× to 1.094×``."""
    label = f"{round(100 * c.confidence)}% CI"
    return fmt_interval(c.ratio_ci_low, c.ratio_ci_high, fmt_ratio, label=label, to=True)


def speed_sentence(c: PairedComparison, word: str | None = None) -> str:
    """One sentence on the throughput ratio with its interval (``word``: the speed word of
    :func:`~normlab.analysis.wording.speed_word`, computed when not given)."""
    if c.n_pairs < 2 or c.ratio is None:
        if c.ratio is not None:
            return (
                f"Throughput {fmt_ratio(c.ratio)} the baseline's from a single pair (no interval)."
            )
        return "Throughput cannot be compared (no paired seed)."
    word = word or speed_word(c)
    return f"Throughput {fmt_ratio(c.ratio)} the baseline's ({_ratio_interval(c)}): {word}."


def _memory_sentence(c: PairedComparison, word: str) -> str:
    if c.ratio is None:
        return "Peak memory cannot be compared (no paired seed)."
    if c.n_pairs < 2:
        return f"Peak memory {fmt_ratio(c.ratio)} the baseline's from a single pair (no interval)."
    return f"Peak memory {fmt_ratio(c.ratio)} the baseline's ({_ratio_interval(c)}): {word}."


def arm_verdict(
    arm: str,
    baseline: str,
    quality: PairedComparison,
    throughput: PairedComparison,
    memory: PairedComparison,
    stability: StabilityVerdict,
    what: str = "validation bpb",
    unit: str = "bpb",
) -> ArmVerdict:
    """Combine the comparisons of ``arm`` into its words and decision (rules 3, 4 and 7 of
    :mod:`normlab.analysis.wording`) with their sentences.

    ``what`` and ``unit`` name the quality metric and its unit (see :func:`quality_sentence`)."""
    speed = speed_word(throughput)
    quality = replace(quality, verdict=quality_word(quality))
    q_text = quality_sentence(quality, arm, baseline, what, unit)
    s_text = speed_sentence(throughput, speed)
    stab_text = f"Stability: {stability.reason}."
    decision, reason = arm_decision(
        arm,
        baseline,
        what,
        quality=quality.verdict,
        speed=speed,
        stability=stability.verdict,
        failed=stability.failed,
    )
    mem_word = memory_word(memory)
    return ArmVerdict(
        arm=arm,
        baseline_arm=baseline,
        quality=quality.verdict,
        quality_text=q_text,
        seeds_needed=quality.seeds_needed,
        seeds_needed_high=quality.seeds_needed_high,
        n_pairs=quality.n_pairs,
        throughput=speed,
        throughput_text=s_text,
        memory=mem_word,
        memory_text=_memory_sentence(memory, mem_word),
        stability=stability.verdict,
        stability_text=stab_text,
        decision=decision,
        reason=reason,
        justification=f"{q_text} {s_text} {stab_text}",
    )
