"""Every word a comparison ends in, decided here: the one rule from numbers to words.

The other modules of :mod:`normlab.analysis` compute the numbers (paired differences,
intervals, tests, sequential boundaries, shares of diverged runs) and assemble the sentences;
every word they show — of one comparison, of an arm's quality, speed, memory and stability, of a
sequential look, of the decision, the recommendation, the badge and a ladder's prediction — is
returned by a function of this module. The rules, in the order a comparison meets them:

**1. One paired comparison** (:func:`paired_verdict`, for
:func:`normlab.analysis.comparison.compare_paired`): ``equivalent`` when the comparison was
found equivalent (TOST inside the margin, or the same value in every pair), else ``better`` /
``worse`` when its test is significant (:func:`direction` reads the sign), else
``inconclusive`` (fewer than two pairs are neither).

**2. One metric against the smallest difference that matters** (:func:`judge`, the word of
every badge and column), first rule that applies:

a. ``not comparable``: the arm (or the baseline) failed to learn (:mod:`.learning`) and the
   metric describes the trained model (:data:`~.smallest.LEARNED_MODEL_METRICS`): outlier
   counts, kurtosis or quantization deltas of a model that learned nothing describe no norm.
b. ``worse`` for time to target when the arm never reached the target in a seed where the
   baseline did, and reached it in none: never reaching it is worse, not inconclusive.
c. ``inconclusive``: fewer than two pairs.
d. The effect against the smallest difference that matters (δ, :mod:`.smallest`): relative for
   bytes, time, speed and scale-free statistics, |ratio − 1| or |d̄| / |ȳ| against δ; absolute
   for losses and counts, |d̄| against δ (for the quality metric δ is the experiment's margin).
   The interval (the t-interval, or for ratio metrics the ratio interval) is read on the same
   scale.
e. ``equivalent`` when the comparison was called equivalent, or when the whole interval lies
   inside ±δ (so within ±δ at level α/2 on each side), or for an exact difference (the same in
   every seed) smaller than δ.
f. When the interval excludes zero (or the difference is exact): ``better`` / ``worse`` only if
   the result is statistically significant — its p-value, Holm-adjusted over the arm's metrics
   (the correction the report shows), is below α; exact differences need no test — *and*
   practically significant, |effect| ≥ δ. A significant effect whose interval fits inside ±δ
   is caught by e as ``equivalent``; one whose estimate is below δ while the interval reaches
   past it is ``unclear size``. An interval that excludes zero without a significant test
   (Holm, or the sign test for counts) is ``unconfirmed``: never "no detectable difference".
g. Otherwise (the interval includes zero): ``no detectable difference`` for metrics without an
   equivalence margin, ``inconclusive`` for those with one — never better or worse.

   The quality metric is the one pre-specified primary endpoint: it is tested first at the
   full α, so Holm is not applied to it (a fixed-sequence gate: Maurer, Hothorn & Lehmacher
   1995); the other metrics are shown with their raw and Holm-adjusted p, and only the adjusted
   p counts.

**3. Speed and memory** (:func:`speed_word`, :func:`memory_word`): :func:`judge`'s word of the
throughput or peak-memory ratio, said ``faster`` / ``slower`` / ``same speed`` and ``less`` /
``more`` / ``same``; ``inconclusive`` with fewer than two pairs.

**4. Quality of an arm** (:func:`quality_word`): the comparison's verdict, except that a
``better`` or ``worse`` below the margin whose interval reaches past it (2f) is ``unclear
size``, which leaves the arm undecided.

**5. Stability** (:func:`stability_word`): ``inconclusive`` when an arm has no finished or
diverged run; ``worse`` / ``better`` when exactly one of the two failed to learn; else by the
share of diverged runs (any excess is ``worse``); else by the spike counts' sign test
(``better`` / ``worse``); ``inconclusive`` when their interval excludes zero but the sign test
cannot confirm it; else ``similar``.

**6. Sequential looks** (:func:`sequential_word`, :func:`still_open`, :func:`closed`): fewer
than two pairs stay ``open``; ``equivalent`` when the repeated (1 − 2α) interval lies inside
the margin; ``better`` / ``worse`` when the repeated (1 − α) interval excludes zero; else
``open``, and ``inconclusive`` at the last planned look. A decided arm keeps its word; once no
seed can come, anything undecided reads ``inconclusive``.

**7. The decision against the baseline** (:func:`arm_decision`), first that applies: the arm
failed to learn → ``keep``; less stable → ``keep``; worse quality → ``keep``; better quality →
``switch``; more stable and quality not worse → ``switch``; equivalent quality and faster →
``switch``, slower → ``keep``, otherwise ``either`` (nothing is gained by switching; the
reason says whether the speed was the same or could not be told apart: a speed test that fails
to reject is not evidence of equal speed); else ``undecided``.

**8. The recommendation** (:func:`recommendation`), first that applies: no other arm →
``keep`` the baseline; a baseline without any result → ``undecided``; some arm earns a
``switch`` → ``switch`` to the one with the largest quality gain, else a more stable one, else
the fastest; some arm ``undecided`` → ``undecided``; some arm ``either`` → ``either``; else
``keep`` the baseline.

**9. The badge** (:func:`decision_badge`) names each arm's place in the recommendation:
``recommended``, else why it lost — ``failed``, ``undecided``, ``less stable``, ``worse
quality``, ``slower``, ``runner-up`` (it earns a switch, another arm was chosen) or ``no
gain``.

**10. A ladder's prediction** at a target size (:func:`ladder_words`): ``equivalent`` when the
whole prediction interval lies within ±δ, ``better`` / ``worse`` when one sign holds at least
(1 + c) / 2 of the bootstrap draws, ``not determined`` otherwise.

:data:`WORD_TONES` lists every word these give, with its tone (the report colours its badges by
it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from normlab.analysis.format import NO_INTERVAL, fmt_p
from normlab.analysis.smallest import LEARNED_MODEL_METRICS, Smallest, smallest_for
from normlab.run_format import CRASHED, DIVERGED, FINISHED, UNFINISHED, testbed_format

__all__ = [
    "BAD",
    "BETTER",
    "BETTER_WORSE",
    "DECIDED",
    "EITHER",
    "EQUIVALENT",
    "GOOD",
    "INCONCLUSIVE",
    "KEEP",
    "NEUTRAL",
    "OPEN",
    "STABILITY_RULES",
    "STILL_OPEN",
    "SWITCH",
    "UNCLEAR_SIZE",
    "UNDECIDED",
    "WORD_TONES",
    "WORSE",
    "Judgement",
    "Smallest",
    "arm_decision",
    "badge_in_analysis",
    "closed",
    "decision_badge",
    "direction",
    "interval_words",
    "is_decided",
    "judge",
    "judge_in_analysis",
    "ladder_words",
    "memory_word",
    "paired_verdict",
    "quality_word",
    "recommendation",
    "sequential_word",
    "speed_word",
    "stability_word",
    "still_open",
    "tone",
]

# ---- the words ------------------------------------------------------------------------------

BETTER, WORSE, EQUIVALENT = "better", "worse", "equivalent"
INCONCLUSIVE, UNCONFIRMED, UNCLEAR_SIZE = "inconclusive", "unconfirmed", "unclear size"
NO_DETECTABLE_DIFFERENCE, NOT_COMPARABLE = "no detectable difference", "not comparable"
NOT_DETERMINED, STILL_OPEN, SIMILAR = "not determined", "open", "similar"
FASTER, SLOWER, SAME_SPEED = "faster", "slower", "same speed"
LESS, MORE, SAME = "less", "more", "same"
SWITCH, KEEP, EITHER, UNDECIDED = "switch", "keep", "either", "undecided"
RECOMMENDED, FAILED, LESS_STABLE = "recommended", "failed", "less stable"
WORSE_QUALITY, NO_GAIN, RUNNER_UP = "worse quality", "no gain", "runner-up"
EXCLUDES_ZERO, INCLUDES_ZERO = "excludes zero", "includes zero"

BETTER_WORSE = (BETTER, WORSE)
DECIDED = (*BETTER_WORSE, EQUIVALENT)
"""The verdicts that settle a comparison (the others leave it open)."""

GOOD, BAD, OPEN, NEUTRAL = "good", "bad", "open", "neutral"
"""The tones a word can carry: it favours the arm, counts against it, leaves the question open,
or states a fact."""

WORD_TONES: dict[str, str] = {
    # one comparison (rule 1), one metric (rule 2), an arm's quality (rule 4)
    BETTER: GOOD,
    WORSE: BAD,
    EQUIVALENT: NEUTRAL,
    INCONCLUSIVE: OPEN,
    UNCONFIRMED: OPEN,
    UNCLEAR_SIZE: OPEN,
    NO_DETECTABLE_DIFFERENCE: NEUTRAL,
    NOT_COMPARABLE: NEUTRAL,
    # a ladder's prediction (rule 10), besides better / worse / equivalent
    NOT_DETERMINED: OPEN,
    # speed and memory (rule 3)
    FASTER: GOOD,
    SLOWER: BAD,
    SAME_SPEED: NEUTRAL,
    LESS: GOOD,
    MORE: BAD,
    SAME: NEUTRAL,
    # stability (rule 5), besides better / worse / inconclusive
    SIMILAR: NEUTRAL,
    # a sequential look (rule 6), besides the decided words and inconclusive
    STILL_OPEN: OPEN,
    # an arm's decision against the baseline (rule 7), the recommendation (rule 8), the badge
    SWITCH: GOOD,
    KEEP: NEUTRAL,
    EITHER: NEUTRAL,
    UNDECIDED: OPEN,
    RECOMMENDED: GOOD,
    FAILED: BAD,
    LESS_STABLE: BAD,
    WORSE_QUALITY: BAD,
    NO_GAIN: NEUTRAL,
    RUNNER_UP: NEUTRAL,
    # a run's status (decided by the run itself)
    FINISHED: GOOD,
    DIVERGED: BAD,
    CRASHED: BAD,
    UNFINISHED: OPEN,
}
"""Every word of a verdict, decision, badge or run status, with its tone: the one list the
report's badges are coloured by."""


def tone(word: str) -> str:
    """The tone of ``word`` in :data:`WORD_TONES` (case and surrounding spaces ignored);
    :data:`NEUTRAL` for any other text."""
    return WORD_TONES.get(word.strip().lower(), NEUTRAL)


def is_decided(word: str) -> bool:
    """Whether ``word`` settles a comparison (one of :data:`DECIDED`)."""
    return word in DECIDED


# ---- 1. one paired comparison ---------------------------------------------------------------


def direction(effect: float, lower_is_better: bool) -> str:
    """``better`` when the effect's sign favours the arm (negative where lower is better,
    positive where higher is), else ``worse``."""
    return BETTER if (effect < 0) == lower_is_better else WORSE


def paired_verdict(
    *, equivalent: bool, significant: bool, effect: float | None, lower_is_better: bool
) -> str:
    """Rule 1: ``equivalent``, else ``better`` / ``worse`` by the sign of ``effect`` when the
    test is ``significant``, else ``inconclusive``."""
    if equivalent:
        return EQUIVALENT
    if significant and effect is not None:
        return direction(effect, lower_is_better)
    return INCONCLUSIVE


# ---- 2. one metric against the smallest difference that matters -----------------------------


@dataclass(frozen=True)
class Judgement:
    """The word for one comparison and the phrase that justifies it."""

    word: str
    reason: str
    significant: bool
    practical: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _get(c: Any, key: str) -> Any:
    return c.get(key) if isinstance(c, Mapping) else getattr(c, key, None)


def _effect(
    c: Any, scale: str, kind: str, baseline_mean: float | None
) -> tuple[float | None, float | None, float | None]:
    """(effect, low, high) on the scale δ is stated on (rule 2d): relative or absolute."""
    if scale == "ratio":
        r, lo, hi = _get(c, "ratio"), _get(c, "ratio_ci_low"), _get(c, "ratio_ci_high")
        if r is None:
            return None, None, None
        if kind == "relative":
            return r - 1.0, (lo - 1.0 if lo is not None else None), (hi - 1.0 if hi else None)
        base = baseline_mean or 0.0
        return (
            (r - 1.0) * base,
            (lo - 1.0) * base if lo is not None else None,
            (hi - 1.0) * base if hi is not None else None,
        )
    m, lo, hi = _get(c, "mean_diff"), _get(c, "ci_low"), _get(c, "ci_high")
    if m is None:
        return None, None, None
    if kind == "relative":
        base = abs(baseline_mean) if baseline_mean else 0.0
        if base == 0.0:
            return m, lo, hi
        return m / base, (lo / base if lo is not None else None), (hi / base if hi else None)
    return m, lo, hi


def _pct(v: float) -> str:
    return f"{100 * v:.3g} %"


def _size(v: float, kind: str) -> str:
    return _pct(abs(v)) if kind == "relative" else f"{abs(v):.4g}"


def interval_words(low: float | None, high: float | None) -> str:
    """``excludes zero`` / ``includes zero`` for an interval on the difference scale,
    ``no interval`` without one."""
    if low is None or high is None:
        return NO_INTERVAL
    return EXCLUDES_ZERO if low > 0 or high < 0 else INCLUDES_ZERO


@dataclass(frozen=True)
class _Reading:
    """What rules 2e–2g read from one comparison: the effect and its interval on δ's scale
    (rule 2d), δ, and how the comparison was tested."""

    verdict: str | None
    effect: float | None
    low: float | None
    high: float | None
    delta: float
    kind: str
    n: int
    exact: bool
    sign_tested: bool
    significant: bool
    holm_note: str

    @property
    def practical(self) -> bool:
        """|effect| ≥ δ."""
        return self.effect is not None and abs(self.effect) >= self.delta

    @property
    def sign_decided(self) -> bool:
        """Decided better or worse by the exact sign test."""
        return self.sign_tested and self.verdict in BETTER_WORSE


def _read(
    c: Any,
    spec: Smallest,
    delta: float,
    scale: str,
    baseline_mean: float | None,
    p_holm: float | None,
    alpha: float,
    primary: bool,
) -> _Reading:
    """Rule 2d's effect and interval, and rule 2f's statistical significance: the raw p for the
    primary metric, else Holm's; an exact difference needs no test; a sign test that did not
    decide is not significant."""
    verdict = _get(c, "verdict")
    test = str(_get(c, "test") or "")
    sign_tested = test.startswith("exact sign test")
    effect, low, high = _effect(c, scale, spec.kind, baseline_mean)
    exact = test.startswith("exact:")
    p = _get(c, "p_value")
    p_used = p if (primary or p_holm is None) else p_holm
    significant = exact or (p_used is not None and p_used < alpha)
    if sign_tested and verdict not in BETTER_WORSE:
        significant = False
    return _Reading(
        verdict=verdict,
        effect=effect,
        low=low,
        high=high,
        delta=delta,
        kind=spec.kind,
        n=_get(c, "n_pairs") or 0,
        exact=exact,
        sign_tested=sign_tested,
        significant=significant,
        holm_note="" if primary or p_holm is None else f" (Holm-adjusted {fmt_p(p_holm)})",
    )


def _equivalent(r: _Reading) -> Judgement | None:
    """Rule 2e: ``equivalent`` by the comparison, by an exact difference below δ, or by an
    interval inside ±δ; None when none applies."""
    if r.verdict == EQUIVALENT and not r.exact:
        return Judgement(EQUIVALENT, "within the equivalence margin", r.significant, False)
    if r.effect is not None and r.exact and not r.practical:
        return Judgement(
            EQUIVALENT,
            f"the same in every seed, a difference of {_size(r.effect, r.kind)}, below the "
            f"{_size(r.delta, r.kind)} that matters",
            True,
            False,
        )
    low, high = r.low, r.high
    if low is not None and high is not None and r.delta > 0 and -r.delta < low and high < r.delta:
        return Judgement(
            EQUIVALENT,
            f"the whole interval lies within ±{_size(r.delta, r.kind)}, the smallest "
            "difference that matters",
            r.significant,
            False,
        )
    return None


def _excluding_zero(r: _Reading, alpha: float, lower_is_better: bool) -> Judgement:
    """Rule 2f, for an interval that excludes zero (or an exact difference): ``unconfirmed``
    without a significant test, ``unclear size`` below δ, else ``better`` / ``worse``."""
    if not r.significant:
        why = "the exact sign test" if r.sign_tested else "the test"
        return Judgement(
            UNCONFIRMED,
            f"the interval excludes zero, but {why} is not significant at α = {alpha:g}"
            f"{r.holm_note}",
            False,
            r.practical,
        )
    if not r.practical and r.effect is not None:
        return Judgement(
            UNCLEAR_SIZE,
            f"a detectable difference of {_size(r.effect, r.kind)}, below the "
            f"{_size(r.delta, r.kind)} that matters, whose interval reaches past it",
            True,
            False,
        )
    if r.sign_decided:
        word = str(r.verdict)
    else:
        sign = r.effect if r.effect is not None else (1.0 if r.verdict == WORSE else -1.0)
        word = direction(sign, lower_is_better)
    return Judgement(
        word, f"significant{r.holm_note} and at least the smallest that matters", True, True
    )


def _open_interval(r: _Reading, has_margin: bool) -> Judgement:
    """Rule 2g, for an interval that includes zero: ``unconfirmed`` when the sign test alone
    decided, ``inconclusive`` with a margin, else ``no detectable difference``."""
    if r.significant and r.sign_decided:
        return Judgement(
            UNCONFIRMED,
            "the sign test is significant but the interval includes zero",
            True,
            r.practical,
        )
    if has_margin:
        return Judgement(
            INCONCLUSIVE,
            "the interval neither excludes zero nor fits the margin",
            False,
            r.practical,
        )
    return Judgement(NO_DETECTABLE_DIFFERENCE, "the interval includes zero", False, r.practical)


def judge(
    c: Any,
    metric: str,
    *,
    lower_is_better: bool,
    scale: str = "difference",
    margin: float | None = None,
    smallest: Smallest | None = None,
    baseline_mean: float | None = None,
    p_holm: float | None = None,
    alpha: float = 0.05,
    primary: bool = False,
    arm_failed: bool = False,
    baseline_failed: bool = False,
    never_reached: bool = False,
    testbed: str = "gpt",
) -> Judgement:
    """The word for comparison ``c`` of ``metric`` (rule 2 in the module docstring).

    ``margin`` is the experiment's equivalence margin in the quality unit; ``smallest`` overrides
    δ; ``baseline_mean`` is the baseline's mean (for relative δ on difference metrics);
    ``p_holm`` the Holm-adjusted p-value of ``c`` (None: the raw one is used);
    ``never_reached`` marks a time to target the arm reached in no seed while the baseline did.
    """
    spec = smallest or smallest_for(metric, testbed)
    delta = spec.resolve(margin)
    if (arm_failed or baseline_failed) and not primary and metric in LEARNED_MODEL_METRICS:
        who = "the arm" if arm_failed else "the baseline"
        return Judgement(NOT_COMPARABLE, f"{who} failed to learn", False, False)
    if never_reached:
        return Judgement(WORSE, "never reached the target, where the baseline did", True, True)
    r = _read(c, spec, delta, scale, baseline_mean, p_holm, alpha, primary)
    if r.n < 2 and not r.sign_decided:
        return Judgement(
            INCONCLUSIVE, _get(c, "note") or "fewer than two paired seeds", False, False
        )
    equivalent = _equivalent(r)
    if equivalent is not None:
        return equivalent
    # a censored comparison decided on order alone (n < 2) excludes zero too
    if r.exact or interval_words(r.low, r.high) == EXCLUDES_ZERO or (r.sign_decided and r.n < 2):
        return _excluding_zero(r, alpha, lower_is_better)
    return _open_interval(r, _get(c, "margin") is not None)


def _margin_of(a: Mapping[str, Any]) -> float | None:
    """The experiment's equivalence margin, under its testbed's key (``margin_bpb``,
    ``margin_val_loss``, a script's or an import's ``margin``); None without one."""
    try:
        key = testbed_format(a.get("testbed")).margin_key
    except ValueError:
        return None
    value = a.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def judge_in_analysis(a: Mapping[str, Any], arm: str, metric: str) -> Judgement:
    """:func:`judge` for ``metric`` of ``arm`` in the analysis dict of
    :func:`normlab.analysis.summary.analyze` (its Holm p, failure flags, baseline mean, and
    whether the arm never reached the target)."""
    c = a["comparisons"][arm][metric]
    info = a["metrics"][metric]
    base = a["baseline_arm"]
    stab = a["verdicts"].get(arm, {}).get("stability_detail", {})
    arm_vals, base_vals = a["arms"][arm][metric], a["arms"][base][metric]
    done = a.get("arm_info", {}).get(arm, {}).get("seeds_done", [])
    never = (
        metric == "time_to_target_s" and bool(done) and arm_vals["n"] == 0 and base_vals["n"] > 0
    )
    return judge(
        c,
        metric,
        lower_is_better=bool(info["lower_is_better"]),
        scale=info.get("scale", "difference"),
        margin=_margin_of(a),
        baseline_mean=base_vals.get("mean"),
        p_holm=c.get("p_holm"),
        alpha=float(a.get("alpha", 0.05)),
        primary=metric == a.get("quality_metric"),
        arm_failed=bool(stab.get("failed")),
        baseline_failed=bool(stab.get("baseline_failed")),
        never_reached=never,
        testbed=str(a.get("testbed") or "gpt"),
    )


# ---- 3. speed and memory --------------------------------------------------------------------

_SPEED_WORDS = {BETTER: FASTER, WORSE: SLOWER, EQUIVALENT: SAME_SPEED}
_MEMORY_WORDS = {BETTER: LESS, WORSE: MORE, EQUIVALENT: SAME}


def _ratio_word(c: Any, metric: str, lower_is_better: bool, words: Mapping[str, str]) -> str:
    """:func:`judge`'s word of the ratio comparison ``c`` in ``words`` (the others as they
    are); ``inconclusive`` with fewer than two pairs."""
    if (_get(c, "n_pairs") or 0) < 2:
        return INCONCLUSIVE
    word = judge(c, metric, lower_is_better=lower_is_better, scale="ratio", primary=True).word
    return words.get(word, word)


def speed_word(c: Any) -> str:
    """Rule 3 for the throughput comparison ``c``: ``faster``, ``slower``, ``same speed``, or
    :func:`judge`'s word where it is none of better, worse, equivalent."""
    return _ratio_word(c, "tokens_per_s", False, _SPEED_WORDS)


def memory_word(c: Any) -> str:
    """Rule 3 for the peak-memory comparison ``c``: ``less``, ``more``, ``same``, or
    :func:`judge`'s word where it is none of better, worse, equivalent."""
    return _ratio_word(c, "peak_memory_bytes", True, _MEMORY_WORDS)


# ---- 4. quality of an arm -------------------------------------------------------------------


def quality_word(c: Any) -> str:
    """Rule 4: the verdict of the quality comparison ``c`` (rule 1, or the sequential
    decision), except a ``better`` / ``worse`` that :func:`judge` calls ``unclear size``
    against the comparison's margin."""
    verdict = str(_get(c, "verdict"))
    if verdict in BETTER_WORSE:
        margin = Smallest("absolute", _get(c, "margin") or 0.0)
        judged = judge(c, "quality", lower_is_better=True, smallest=margin, primary=True)
        if judged.word == UNCLEAR_SIZE:
            return UNCLEAR_SIZE
    return verdict


# ---- 5. stability ---------------------------------------------------------------------------

STABILITY_RULES = ("no result", "learning", "divergence", "spikes", "unconfirmed", "similar")
"""Which rule of 5 gave a stability word (:func:`stability_word`), for the sentence that says
why."""


def stability_word(
    *,
    arm_share: float | None,
    baseline_share: float | None,
    failed: bool,
    baseline_failed: bool,
    spikes_verdict: str,
    spikes_low: float | None,
    spikes_high: float | None,
) -> tuple[str, str]:
    """Rule 5: (word, the rule of :data:`STABILITY_RULES` that gave it), from the shares of
    diverged runs (None: no finished or diverged run), whether each arm failed to learn, and
    the spike counts' comparison (its sign-test verdict and interval)."""
    if arm_share is None or baseline_share is None:
        return INCONCLUSIVE, "no result"
    if failed != baseline_failed:
        return (WORSE if failed else BETTER), "learning"
    if arm_share != baseline_share:
        return (WORSE if arm_share > baseline_share else BETTER), "divergence"
    if spikes_verdict in BETTER_WORSE:
        return spikes_verdict, "spikes"
    if interval_words(spikes_low, spikes_high) == EXCLUDES_ZERO:
        return INCONCLUSIVE, "unconfirmed"
    return SIMILAR, "similar"


# ---- 6. sequential looks --------------------------------------------------------------------


def still_open(last_look: bool) -> str:
    """An undecided arm's word at a look: ``open`` (more seeds may settle it), or
    ``inconclusive`` at the last planned look."""
    return INCONCLUSIVE if last_look else STILL_OPEN


def closed(word: str) -> str:
    """The word once no more seeds will come: a decided word stays, anything else
    (``open``) reads ``inconclusive``."""
    return word if is_decided(word) else INCONCLUSIVE


def sequential_word(
    *,
    n_pairs: int,
    equivalent: bool,
    significant: bool,
    effect: float | None,
    lower_is_better: bool,
    last_look: bool,
) -> str:
    """Rule 6 at one look: ``open`` under two pairs; ``equivalent`` (the repeated (1 − 2α)
    interval inside the margin), ``better`` / ``worse`` (the repeated (1 − α) interval
    excludes zero: ``significant``), else :func:`still_open`."""
    if n_pairs < 2:
        return STILL_OPEN
    if equivalent:
        return EQUIVALENT
    if significant and effect is not None:
        return direction(effect, lower_is_better)
    return still_open(last_look)


# ---- 7. the decision against the baseline ---------------------------------------------------


def _equivalent_quality_decision(arm: str, speed: str) -> tuple[str, str]:
    """Rule 7 for an arm of equivalent quality: (decision, reason) by its speed word."""
    if speed == FASTER:
        return SWITCH, f"{arm} is equivalent in quality and faster"
    if speed == SLOWER:
        return KEEP, f"{arm} is equivalent in quality but slower"
    if speed == SAME_SPEED:
        return EITHER, f"{arm} is equivalent in quality and speed"
    if speed == INCONCLUSIVE:
        return EITHER, f"{arm} is equivalent in quality; its speed could not be compared"
    return EITHER, f"{arm} is equivalent in quality, with no detectable speed difference"


def arm_decision(
    arm: str,
    baseline: str,
    what: str,
    *,
    quality: str,
    speed: str,
    stability: str,
    failed: bool,
) -> tuple[str, str]:
    """Rule 7: (decision, reason) of ``arm`` against ``baseline`` from its quality word
    (rule 4), speed word (rule 3), stability word (rule 5) and whether it failed to learn;
    ``what`` names the quality metric in the reason."""
    if failed:
        return KEEP, f"{arm} failed to learn"
    if stability == WORSE:
        return KEEP, f"{arm} is less stable"
    if quality == WORSE:
        return KEEP, f"{arm} gives worse {what}"
    if quality == BETTER:
        return SWITCH, f"{arm} gives better {what}"
    if stability == BETTER:
        return SWITCH, f"{arm} is more stable and its quality is not worse"
    if quality == EQUIVALENT:
        return _equivalent_quality_decision(arm, speed)
    return UNDECIDED, f"{arm} cannot be told apart from {baseline} yet"


# ---- 8. the recommendation ------------------------------------------------------------------


def _switch_rank(
    v: Any, quality_diff: float | None, speed_ratio: float | None
) -> tuple[int, float]:
    """Rule 8's order among the arms that earn a switch: better quality first (the largest
    gain), then more stable, then the fastest."""
    if v.quality == BETTER:
        return (0, quality_diff or 0.0)
    if v.stability == BETTER:
        return (1, quality_diff or 0.0)
    return (2, -(speed_ratio or 0.0))


def recommendation(
    baseline: str,
    verdicts: Mapping[str, Any],
    quality_diff: Callable[[str], float | None],
    speed_ratio: Callable[[str], float | None],
    *,
    baseline_has_result: bool = True,
) -> tuple[str, str]:
    """Rule 8: (choice, status) — the arm to use (an arm, the baseline or ``undecided``) and
    ``switch`` / ``keep`` / ``either`` / ``undecided``. ``verdicts`` holds each other arm's
    words (``decision``, ``quality``, ``stability``: an
    :class:`~normlab.analysis.verdicts.ArmVerdict`); ``quality_diff(arm)`` and
    ``speed_ratio(arm)`` give the numbers that rank the arms earning a switch."""
    if not verdicts:
        return baseline, KEEP
    if not baseline_has_result:
        return UNDECIDED, UNDECIDED
    decisions = [v.decision for v in verdicts.values()]
    if SWITCH in decisions:
        switches = [a for a, v in verdicts.items() if v.decision == SWITCH]
        best = min(
            switches, key=lambda a: _switch_rank(verdicts[a], quality_diff(a), speed_ratio(a))
        )
        return best, SWITCH
    if UNDECIDED in decisions:
        return UNDECIDED, UNDECIDED
    return baseline, EITHER if EITHER in decisions else KEEP


# ---- 9. the badge ---------------------------------------------------------------------------


def decision_badge(
    arm: str,
    recommended: str,
    decision: str,
    *,
    quality: str = "",
    stability: str = "",
    throughput: str = "",
    failed: bool = False,
) -> str:
    """The badge of ``arm`` in the recommendation: ``recommended`` for the chosen arm, else why
    it lost — ``failed``, ``less stable``, ``worse quality``, ``slower``, ``undecided`` or
    ``no gain`` (equivalent, nothing gained by switching), or ``runner-up`` (it beats the
    baseline, but another arm was chosen). ``decision`` is the arm's decision
    against the baseline (switch / keep / either / undecided)."""
    if arm == recommended:
        return RECOMMENDED
    if failed:
        return FAILED
    if decision == UNDECIDED:
        return UNDECIDED
    if stability == WORSE:
        return LESS_STABLE
    if quality == WORSE:
        return WORSE_QUALITY
    if throughput == SLOWER:
        return SLOWER
    if decision == SWITCH:
        return RUNNER_UP
    return NO_GAIN


def badge_in_analysis(a: Mapping[str, Any], arm: str) -> str:
    """:func:`decision_badge` of ``arm`` in the analysis dict of
    :func:`normlab.analysis.summary.analyze`."""
    v = a["verdicts"][arm]
    return decision_badge(
        arm,
        a["recommendation"]["choice"],
        v["decision"],
        quality=v["quality"],
        stability=v["stability"],
        throughput=v["throughput"],
        failed=bool(v.get("stability_detail", {}).get("failed")),
    )


# ---- 10. a ladder's prediction --------------------------------------------------------------


def ladder_words(
    p_above: float,
    p_below: float,
    *,
    low: float,
    high: float,
    lower_is_better: bool,
    confidence: float = 0.95,
    margin: float | None = None,
) -> Judgement:
    """The word for a ladder's prediction of the difference d (arm − baseline) at the target
    size, from the fractions of bootstrap draws above (``p_above``) and below (``p_below``)
    zero and the prediction interval [``low``, ``high``] at ``confidence`` c:

    1. ``equivalent`` when δ = ``margin`` > 0 and −δ < low and high < δ;
    2. ``better`` / ``worse`` when one sign holds at least (1 + c) / 2 of the draws (so the
       percentile interval excludes zero), the direction read with ``lower_is_better``;
    3. ``not determined`` otherwise.

    The reason states the probability of the likelier sign.
    """
    if margin is not None and margin > 0 and -margin < low and high < margin:
        return Judgement(
            EQUIVALENT,
            f"the whole prediction interval lies within ±{margin:.4g}, the smallest difference "
            "that matters",
            False,
            False,
        )
    lower = p_below >= p_above
    p = p_below if lower else p_above
    side = direction(-1.0 if lower else 1.0, lower_is_better)
    if p >= (1.0 + confidence) / 2.0:
        return Judgement(side, f"{side} in {100 * p:.3g} % of the bootstrap draws", True, True)
    return Judgement(
        NOT_DETERMINED,
        f"{side} in {100 * p:.3g} % of the bootstrap draws, short of {50 * (1 + confidence):.3g} %",
        False,
        False,
    )
