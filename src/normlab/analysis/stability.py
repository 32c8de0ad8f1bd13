"""Stability of an arm: divergences and loss / gradient spikes, judged against the baseline.

Rules: a diverged run is a result, not missing data. An arm whose share of diverged runs
(diverged / (finished + diverged)) exceeds the baseline's is ``worse``, a smaller share is
``better`` — any excess counts, since a divergence at this scale is rare and costly; the
counts are reported so the reader can weigh them. With equal shares, the paired difference in
spikes per run (loss + gradient spikes, seed by seed) decides when the exact two-sided sign test
rejects "more and fewer spikes are equally likely" at level α (spike counts are small integers:
one extra spike in each of three seeds has probability 1/4 by chance, which a zero-width
t-interval would call certain). A spike interval that excludes zero while the sign test cannot
confirm it (three seeds cannot reach p < 0.05) gives ``inconclusive``, never "no detectable
difference"; otherwise the verdict is ``similar``.

Failing to learn is instability too: before any of the above, an arm whose runs mostly diverged,
did not learn or stalled while the baseline's did not (:func:`normlab.analysis.learning.arm_failed`)
is ``worse`` with ``failed`` set, and the reverse makes it ``better``.
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
from normlab.analysis.wording import interval_words
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
    more = spikes.verdict == "worse"
    k = sign.n_pos if more else sign.n_neg
    return (
        f"{lead}; {'more' if more else 'fewer'} spikes in {k} of "
        f"{counted(sign.n, 'paired seed')} (exact sign test {fmt_p(spikes.p_value)}; mean "
        f"{spikes.mean_diff:+.2f} per run, {_spikes_interval(spikes)})"
    )


def stability_verdict(
    arm_runs: list[RunResult], base_runs: list[RunResult], alpha: float = 0.05
) -> StabilityVerdict:
    """Judge ``arm_runs`` against ``base_runs`` by the rules in the module docstring."""
    arm, base = arm_stability(arm_runs), arm_stability(base_runs)
    arm_learn = [run_learning(r) for r in arm_runs if r.done]
    base_learn = [run_learning(r) for r in base_runs if r.done]
    failed, base_failed = arm_failed(arm_learn, base_learn), arm_failed(base_learn, arm_learn)
    a_share, b_share = arm.diverged_share, base.diverged_share
    arm_by_seed = {r.seed: r for r in arm_runs if r.status in DONE_STATUSES}
    base_by_seed = {r.seed: r for r in base_runs if r.status in DONE_STATUSES}
    paired = sorted(set(arm_by_seed) & set(base_by_seed))
    x = [_spikes(arm_by_seed[s]) for s in paired]
    y = [_spikes(base_by_seed[s]) for s in paired]
    spikes = compare_paired(x, y, seeds=paired, lower_is_better=True, alpha=alpha, discrete=True)
    stats = dict(
        spikes_mean_diff=spikes.mean_diff,
        spikes_ci_low=spikes.ci_low,
        spikes_ci_high=spikes.ci_high,
        n_pairs=spikes.n_pairs,
        failed=failed,
        baseline_failed=base_failed,
    )
    if a_share is None or b_share is None:
        return StabilityVerdict(
            "inconclusive", "one of the arms has no finished or diverged run", **stats
        )
    if failed != base_failed:
        learn = (
            f"failed to learn ({_failure_words(arm_learn)}; baseline: {_failure_words(base_learn)})"
            if failed
            else f"the baseline failed to learn ({_failure_words(base_learn)}; this arm: "
            f"{_failure_words(arm_learn)})"
        )
        return StabilityVerdict("worse" if failed else "better", learn, **stats)
    div = (
        f"{arm.n_diverged} of {counted(arm.n_done, 'run')} diverged (baseline: "
        f"{base.n_diverged} of {base.n_done})"
    )
    if a_share > b_share:
        return StabilityVerdict("worse", div, **stats)
    if a_share < b_share:
        return StabilityVerdict("better", div, **stats)
    lead = "no run diverged in either arm" if arm.n_diverged == 0 else div
    if spikes.verdict in ("better", "worse"):
        reason = _spikes_reason(lead, spikes, [a - b for a, b in zip(x, y, strict=True)])
        return StabilityVerdict(spikes.verdict, reason, **stats)
    if interval_words(spikes.ci_low, spikes.ci_high) == "excludes zero":
        sign = sign_test([a - b for a, b in zip(x, y, strict=True)])
        fewer = (spikes.mean_diff or 0.0) < 0
        k = sign.n_neg if fewer else sign.n_pos
        return StabilityVerdict(
            "inconclusive",
            f"{lead}; {'fewer' if fewer else 'more'} spikes in {k} of "
            f"{counted(sign.n, 'paired seed')} (mean {spikes.mean_diff:+.2f} per run, "
            f"{_spikes_interval(spikes)}, which excludes zero), but the exact sign test "
            f"({fmt_p(spikes.p_value)}) cannot confirm it with {counted(sign.n, 'seed')}",
            **stats,
        )
    return StabilityVerdict("similar", f"{lead}; no detectable difference in spikes", **stats)
