"""Stability of an arm: divergences and loss / gradient spikes, counted against the baseline.

What is counted: a diverged run is a result, not missing data, so each arm's share of diverged
runs is diverged / (finished + diverged); the paired difference in spikes per run (loss +
gradient spikes, seed by seed) is tested with the exact two-sided sign test at level α (spike
counts are small integers: one extra spike in each of three seeds has probability 1/4 by
chance, which a zero-width t-interval would call certain); and whether each arm failed to
learn — its runs mostly diverged, did not learn or stalled while the other arm's did not
(:func:`normlab.analysis.learning.arm_failed`).

The word these give is rule 5 of :mod:`normlab.analysis.wording`
(:func:`~normlab.analysis.wording.stability_word`): failing to learn first, then any excess of
diverged runs (a divergence at this scale is rare and costly; the counts are reported so the
reader can weigh them), then the spikes' sign test; a spike interval that excludes zero while
the sign test cannot confirm it (three seeds cannot reach p < 0.05) is ``inconclusive``, never
"no detectable difference"; otherwise ``similar``. This module writes the sentence that says
why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from normlab._plural import counted
from normlab.analysis.comparison import PairedComparison, compare_paired
from normlab.analysis.format import fmt_interval, fmt_p
from normlab.analysis.learning import RunLearning, arm_failed, run_learning
from normlab.analysis.runs import RunResult
from normlab.analysis.stats import sign_test
from normlab.analysis.wording import WORSE, stability_word
from normlab.run_format import DONE_STATUSES

__all__ = ["ArmStability", "StabilityVerdict", "arm_stability", "stability_verdict"]


@dataclass(frozen=True)
class ArmStability:
    """Run outcomes and spike counts of one arm."""

    n_runs: int
    n_done: int
    n_finished: int
    n_diverged: int
    n_crashed: int
    n_unfinished: int
    diverged_at: dict[int, int | None]
    n_loss_spikes: int
    n_grad_spikes: int
    n_clipped: int
    n_not_learning: int = 0
    n_stalled: int = 0

    @property
    def diverged_share(self) -> float | None:
        """diverged / (finished + diverged), or None without a done run."""
        return self.n_diverged / self.n_done if self.n_done else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (seed keys as strings)."""
        d = asdict(self)
        d["diverged_at"] = {str(k): v for k, v in self.diverged_at.items()}
        d["diverged_share"] = self.diverged_share
        return d


@dataclass(frozen=True)
class StabilityVerdict:
    """``better`` / ``worse`` / ``similar`` / ``inconclusive`` against the baseline."""

    verdict: str
    reason: str
    spikes_mean_diff: float | None
    spikes_ci_low: float | None
    spikes_ci_high: float | None
    n_pairs: int
    failed: bool = False
    """The arm failed to learn (most runs diverged, did not learn or stalled; the baseline's
    did not)."""
    baseline_failed: bool = False
    """The same of the baseline against the arm."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _count(run: RunResult, key: str) -> int:
    v = run.value(key)
    return int(v) if v is not None else 0


def arm_stability(runs: list[RunResult]) -> ArmStability:
    """Count outcomes, failures to learn and spikes over ``runs`` (all of one arm)."""
    done = [r for r in runs if r.done]
    learning = [run_learning(r).outcome for r in done]
    diverged = {
        r.seed: (int(r.summary["diverged_at"]) if r.value("diverged_at") is not None else None)
        for r in runs
        if r.status == "diverged"
    }
    return ArmStability(
        n_runs=len(runs),
        n_done=len(done),
        n_finished=sum(r.status == "finished" for r in runs),
        n_diverged=len(diverged),
        n_crashed=sum(r.status == "crashed" for r in runs),
        n_unfinished=sum(r.status == "unfinished" for r in runs),
        diverged_at=diverged,
        n_loss_spikes=sum(_count(r, "n_loss_spikes") for r in done),
        n_grad_spikes=sum(_count(r, "n_grad_spikes") for r in done),
        n_clipped=sum(_count(r, "n_clipped") for r in done),
        n_not_learning=learning.count("not learning"),
        n_stalled=learning.count("stalled"),
    )


def _spikes(run: RunResult) -> float:
    return float(_count(run, "n_loss_spikes") + _count(run, "n_grad_spikes"))


def _failure_words(outcomes: list[RunLearning]) -> str:
    """``2 of 3 runs stalled, 1 did not learn`` for the failed runs among ``outcomes``."""
    n = len(outcomes)
    parts = [
        f"{sum(o.outcome == key for o in outcomes)} {word}"
        for key, word in (
            ("stalled", "stalled"),
            ("not learning", "did not learn"),
            ("diverged", "diverged"),
        )
        if any(o.outcome == key for o in outcomes)
    ]
    if not parts:
        return "the one run learned" if n == 1 else f"all {counted(n, 'run')} learned"
    return f"of {counted(n, 'run')}, {', '.join(parts)}"


def _spikes_interval(spikes: PairedComparison) -> str:
    """The spike difference's interval, ``95% CI +0.33 to +2.00``."""
    label = f"{round(100 * spikes.confidence)}% CI"
    return fmt_interval(spikes.ci_low, spikes.ci_high, _two_places, label=label, to=True)


def _two_places(v: float | None) -> str:
    return f"{v:+.2f}"


def _spikes_reason(lead: str, spikes: PairedComparison, diffs: list[float]) -> str:
    """``lead``; more / fewer spikes in k of n paired seeds, the sign test and the interval."""
    sign = sign_test(diffs)
    more = spikes.verdict == WORSE
    k = sign.n_pos if more else sign.n_neg
    return (
        f"{lead}; {'more' if more else 'fewer'} spikes in {k} of "
        f"{counted(sign.n, 'paired seed')} (exact sign test {fmt_p(spikes.p_value)}; mean "
        f"{spikes.mean_diff:+.2f} per run, {_spikes_interval(spikes)})"
    )


def _learning_reason(failed: bool, arm: list[RunLearning], base: list[RunLearning]) -> str:
    """Why one of the two arms failed to learn: each arm's failed runs."""
    if failed:
        return f"failed to learn ({_failure_words(arm)}; baseline: {_failure_words(base)})"
    return f"the baseline failed to learn ({_failure_words(base)}; this arm: {_failure_words(arm)})"


def _unconfirmed_reason(lead: str, spikes: PairedComparison, diffs: list[float]) -> str:
    """``lead``; the spike interval that excludes zero, and the sign test that cannot confirm
    it."""
    sign = sign_test(diffs)
    fewer = (spikes.mean_diff or 0.0) < 0
    k = sign.n_neg if fewer else sign.n_pos
    return (
        f"{lead}; {'fewer' if fewer else 'more'} spikes in {k} of "
        f"{counted(sign.n, 'paired seed')} (mean {spikes.mean_diff:+.2f} per run, "
        f"{_spikes_interval(spikes)}, which excludes zero), but the exact sign test "
        f"({fmt_p(spikes.p_value)}) cannot confirm it with {counted(sign.n, 'seed')}"
    )


def _reason(
    rule: str,
    arm: ArmStability,
    base: ArmStability,
    learning: tuple[bool, list[RunLearning], list[RunLearning]],
    spikes: PairedComparison,
    diffs: list[float],
) -> str:
    """The sentence for the stability word that ``rule`` of
    :data:`~normlab.analysis.wording.STABILITY_RULES` gave."""
    if rule == "no result":
        return "one of the arms has no finished or diverged run"
    if rule == "learning":
        return _learning_reason(*learning)
    div = (
        f"{arm.n_diverged} of {counted(arm.n_done, 'run')} diverged (baseline: "
        f"{base.n_diverged} of {base.n_done})"
    )
    lead = "no run diverged in either arm" if arm.n_diverged == 0 else div
    if rule == "divergence":
        return div
    if rule == "spikes":
        return _spikes_reason(lead, spikes, diffs)
    if rule == "unconfirmed":
        return _unconfirmed_reason(lead, spikes, diffs)
    return f"{lead}; no detectable difference in spikes"


def _paired_spikes(
    arm_runs: list[RunResult], base_runs: list[RunResult], alpha: float
) -> tuple[PairedComparison, list[float]]:
    """The sign-test comparison of spikes per run, paired by seed over the finished or
    diverged runs, and the per-seed differences (arm − baseline)."""
    arm_by_seed = {r.seed: r for r in arm_runs if r.status in DONE_STATUSES}
    base_by_seed = {r.seed: r for r in base_runs if r.status in DONE_STATUSES}
    paired = sorted(set(arm_by_seed) & set(base_by_seed))
    x = [_spikes(arm_by_seed[s]) for s in paired]
    y = [_spikes(base_by_seed[s]) for s in paired]
    spikes = compare_paired(x, y, seeds=paired, lower_is_better=True, alpha=alpha, discrete=True)
    return spikes, [a - b for a, b in zip(x, y, strict=True)]


def stability_verdict(
    arm_runs: list[RunResult], base_runs: list[RunResult], alpha: float = 0.05
) -> StabilityVerdict:
    """The stability word of ``arm_runs`` against ``base_runs`` (rule 5 of
    :mod:`normlab.analysis.wording`; the counts it reads: module docstring) and the sentence
    that says why."""
    arm, base = arm_stability(arm_runs), arm_stability(base_runs)
    arm_learn = [run_learning(r) for r in arm_runs if r.done]
    base_learn = [run_learning(r) for r in base_runs if r.done]
    failed, base_failed = arm_failed(arm_learn, base_learn), arm_failed(base_learn, arm_learn)
    spikes, diffs = _paired_spikes(arm_runs, base_runs, alpha)
    word, rule = stability_word(
        arm_share=arm.diverged_share,
        baseline_share=base.diverged_share,
        failed=failed,
        baseline_failed=base_failed,
        spikes_verdict=spikes.verdict,
        spikes_low=spikes.ci_low,
        spikes_high=spikes.ci_high,
    )
    return StabilityVerdict(
        word,
        _reason(rule, arm, base, (failed, arm_learn, base_learn), spikes, diffs),
        spikes_mean_diff=spikes.mean_diff,
        spikes_ci_low=spikes.ci_low,
        spikes_ci_high=spikes.ci_high,
        n_pairs=spikes.n_pairs,
        failed=failed,
        baseline_failed=base_failed,
    )
