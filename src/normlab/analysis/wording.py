"""One rule from numbers to words: every badge, column and sentence of a comparison uses it.

For one metric of an arm against the baseline (a paired comparison, as
:class:`~normlab.analysis.comparison.PairedComparison` or its dict), :func:`judge` returns the
word, in this order of rules:

1. ``not comparable``: the arm (or the baseline) failed to learn (:mod:`.learning`) and the
   metric describes the trained model (:data:`LEARNED_MODEL_METRICS`): outlier counts,
   kurtosis or quantization deltas of a model that learned nothing describe no norm.
2. ``worse`` for time to target when the arm never reached the target in a seed where the
   baseline did, and reached it in none: never reaching it is worse, not inconclusive.
3. ``inconclusive``: fewer than two pairs.
4. The effect against the smallest difference that matters (:data:`SMALLEST`, δ): relative for
   bytes, time, speed and scale-free statistics, |ratio − 1| or |d̄| / |ȳ| against δ; absolute
   for losses and counts, |d̄| against δ (for the quality metric δ is the experiment's margin).
   δ is declared with each field in :mod:`normlab.run_format` (``Comparison.smallest``).
   The interval (the t-interval, or for ratio metrics the ratio interval) is read on the same
   scale.
5. ``equivalent`` when the comparison was called equivalent (TOST inside the margin, or the same
   value in every pair), or when the whole interval lies inside ±δ (so within ±δ at level α/2
   on each side), or for an exact difference (the same in every seed) smaller than δ.
6. When the interval excludes zero (or the difference is exact): ``better`` / ``worse`` only if
   the result is statistically significant — its p-value, Holm-adjusted over the arm's metrics
   (the correction the report shows), is below α; exact differences need no test — *and*
   practically significant, |effect| ≥ δ. A significant effect whose interval fits inside ±δ
   is ``negligible`` (caught by rule 5 as ``equivalent``); one whose estimate is below δ while
   the interval reaches past it is ``unclear size``. An interval that excludes zero without a
   significant test (Holm, or the sign test for counts) is ``unconfirmed``: never "no
   detectable difference".
7. Otherwise (the interval includes zero): ``no detectable difference`` for metrics without an
   equivalence margin, ``inconclusive`` for those with one — never better or worse.

The quality metric is the one pre-specified primary endpoint: it is tested first at the full
α, so Holm is not applied to it (a fixed-sequence gate: Maurer, Hothorn & Lehmacher 1995); the
other metrics are shown with their raw and Holm-adjusted p, and only the adjusted p counts.

:func:`decision_badge` names each arm's place in the recommendation instead of an action.

:func:`ladder_words` is the rule for a size ladder's prediction at a target size: ``equivalent``
when the whole prediction interval lies within ±δ, ``better`` / ``worse`` when it excludes zero
(one sign holds at least (1 + c) / 2 of the bootstrap draws), ``not determined`` otherwise.

:data:`WORD_TONES` lists every word these give, with its tone (the report colours its badges by
it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from normlab.analysis.format import fmt_p
from normlab.run_format import (
    CRASHED,
    DIVERGED,
    FINISHED,
    TESTBED_FORMATS,
    UNFINISHED,
    Smallest,
    testbed_format,
)
from normlab.run_format.fields import DEFAULT_SMALLEST

__all__ = [
    "BAD",
    "BETTER_WORSE",
    "DECIDED",
    "GOOD",
    "LEARNED_MODEL_METRICS",
    "NEUTRAL",
    "OPEN",
    "SMALLEST",
    "WORD_TONES",
    "Judgement",
    "Smallest",
    "badge_in_analysis",
    "decision_badge",
    "interval_words",
    "judge",
    "judge_in_analysis",
    "ladder_words",
    "smallest_for",
    "tone",
]

BETTER_WORSE = ("better", "worse")
DECIDED = (*BETTER_WORSE, "equivalent")
"""The verdicts that settle a comparison (the others leave it open)."""

GOOD, BAD, OPEN, NEUTRAL = "good", "bad", "open", "neutral"
"""The tones a word can carry: it favours the arm, counts against it, leaves the question open,
or states a fact."""

WORD_TONES: dict[str, str] = {
    # what judge() says of one metric
    "better": GOOD,
    "worse": BAD,
    "equivalent": NEUTRAL,
    "inconclusive": OPEN,
    "unconfirmed": OPEN,
    "unclear size": OPEN,
    "no detectable difference": NEUTRAL,
    "not comparable": NEUTRAL,
    # what ladder_words() says of the prediction at a target size (besides better / worse /
    # equivalent)
    "not determined": OPEN,
    # its better / worse / equivalent for speed and for memory (normlab.analysis.verdicts)
    "faster": GOOD,
    "slower": BAD,
    "same speed": NEUTRAL,
    "less": GOOD,
    "more": BAD,
    "same": NEUTRAL,
    # an arm's decision against the baseline, and its badge (decision_badge)
    "switch": GOOD,
    "keep": NEUTRAL,
    "either": NEUTRAL,
    "undecided": OPEN,
    "recommended": GOOD,
    "failed": BAD,
    "less stable": BAD,
    "worse quality": BAD,
    "no gain": NEUTRAL,
    "runner-up": NEUTRAL,
    # a run's status
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


def _declared() -> tuple[dict[str, Smallest], tuple[str, ...]]:
    """δ and the trained-model flag of every compared field, as the run format declares them
    (each testbed's fields; a field both testbeds share is declared once, in
    :mod:`normlab.run_format.fields`)."""
    smallest: dict[str, Smallest] = {}
    learned: list[str] = []
    for fmt in TESTBED_FORMATS.values():
        for f in fmt.fields:
            if f.compare is None:
                continue
            if f.compare.smallest is not None:
                smallest.setdefault(f.name, f.compare.smallest)
            if f.compare.trained_model and f.name not in learned:
                learned.append(f.name)
    return smallest, tuple(learned)


SMALLEST, LEARNED_MODEL_METRICS = _declared()
"""δ per metric, and the metrics that describe what a trained model learned (quantization and
bf16 degradation, activation outliers: not comparable when either arm failed to learn), read
from the field declarations (:class:`normlab.run_format.Comparison`'s ``smallest`` and
``trained_model``): 2 % of throughput, 1 % of memory or bytes, 5 % of time and sample distance,
10 % of the activation-shape statistics, one outlier channel, half a spike per run, and the
experiment's margin for the quality metrics and quantization deltas (converted to nats, × ln 2,
for the GPT's training loss). Losses, speed, memory, spikes and time to target stay comparable
when an arm fails to learn: a failed arm's loss is worse, its speed is still its speed."""


def smallest_for(metric: str, testbed: str = "gpt") -> Smallest:
    """δ of ``metric`` as ``testbed`` declares it (a relative 5 % for a metric that declares
    none), with a training-loss margin converted by the testbed's ``train_per_quality`` (a
    relative 5 % where the testbed has no fixed conversion: the lm testbed's nats per token)."""
    fmt = testbed_format(testbed)
    spec = next(
        (f.compare.smallest for f in fmt.fields if f.name == metric and f.compare is not None),
        None,
    )
    spec = spec or SMALLEST.get(metric) or DEFAULT_SMALLEST
    if spec.in_train_unit:
        if fmt.train_per_quality is None:
            return Smallest("relative", 0.05)
        return replace(spec, margin_factor=fmt.train_per_quality)
    return spec


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
    """(effect, low, high) on the scale δ is stated on (rule 4): relative or absolute."""
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
    """``excludes zero`` / ``includes zero`` for an interval on the difference scale."""
    if low is None or high is None:
        return "no interval"
    return "excludes zero" if low > 0 or high < 0 else "includes zero"


@dataclass(frozen=True)
class _Reading:
    """What rules 5–7 read from one comparison: the effect and its interval on δ's scale
    (rule 4), δ, and how the comparison was tested."""

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
    """Rule 4's effect and interval, and rule 6's statistical significance: the raw p for the
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
    """Rule 5: ``equivalent`` by the comparison, by an exact difference below δ, or by an
    interval inside ±δ; None when none applies."""
    if r.verdict == "equivalent" and not r.exact:
        return Judgement("equivalent", "within the equivalence margin", r.significant, False)
    if r.effect is not None and r.exact and not r.practical:
        return Judgement(
            "equivalent",
            f"the same in every seed, a difference of {_size(r.effect, r.kind)}, below the "
            f"{_size(r.delta, r.kind)} that matters",
            True,
            False,
        )
    low, high = r.low, r.high
    if low is not None and high is not None and r.delta > 0 and -r.delta < low and high < r.delta:
        return Judgement(
            "equivalent",
            f"the whole interval lies within ±{_size(r.delta, r.kind)}, the smallest "
            "difference that matters",
            r.significant,
            False,
        )
    return None


def _excluding_zero(r: _Reading, alpha: float, lower_is_better: bool) -> Judgement:
    """Rule 6, for an interval that excludes zero (or an exact difference): ``unconfirmed``
    without a significant test, ``unclear size`` below δ, else ``better`` / ``worse``."""
    if not r.significant:
        why = "the exact sign test" if r.sign_tested else "the test"
        return Judgement(
            "unconfirmed",
            f"the interval excludes zero, but {why} is not significant at α = {alpha:g}"
            f"{r.holm_note}",
            False,
            r.practical,
        )
    if not r.practical and r.effect is not None:
        return Judgement(
            "unclear size",
            f"a detectable difference of {_size(r.effect, r.kind)}, below the "
            f"{_size(r.delta, r.kind)} that matters, whose interval reaches past it",
            True,
            False,
        )
    if r.sign_decided:
        word = str(r.verdict)
    else:
        sign = r.effect if r.effect is not None else (1.0 if r.verdict == "worse" else -1.0)
        word = "better" if (sign < 0) == lower_is_better else "worse"
    return Judgement(
        word, f"significant{r.holm_note} and at least the smallest that matters", True, True
    )


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
    """The word for comparison ``c`` of ``metric`` (rules in the module docstring).

    ``margin`` is the experiment's equivalence margin in the quality unit; ``smallest`` overrides
    δ; ``baseline_mean`` is the baseline's mean (for relative δ on difference metrics);
    ``p_holm`` the Holm-adjusted p-value of ``c`` (None: the raw one is used);
    ``never_reached`` marks a time to target the arm reached in no seed while the baseline did.
    """
    spec = smallest or smallest_for(metric, testbed)
    delta = spec.resolve(margin)
    if (arm_failed or baseline_failed) and not primary and metric in LEARNED_MODEL_METRICS:
        who = "the arm" if arm_failed else "the baseline"
        return Judgement("not comparable", f"{who} failed to learn", False, False)
    if never_reached:
        return Judgement("worse", "never reached the target, where the baseline did", True, True)
    r = _read(c, spec, delta, scale, baseline_mean, p_holm, alpha, primary)
    if r.n < 2 and not r.sign_decided:
        return Judgement(
            "inconclusive", _get(c, "note") or "fewer than two paired seeds", False, False
        )
    equivalent = _equivalent(r)
    if equivalent is not None:
        return equivalent
    # a censored comparison decided on order alone (n < 2) excludes zero too
    if r.exact or interval_words(r.low, r.high) == "excludes zero" or (r.sign_decided and r.n < 2):
        return _excluding_zero(r, alpha, lower_is_better)
    if r.significant and r.sign_decided:
        return Judgement(
            "unconfirmed",
            "the sign test is significant but the interval includes zero",
            True,
            r.practical,
        )
    if _get(c, "margin") is not None:
        return Judgement(
            "inconclusive",
            "the interval neither excludes zero nor fits the margin",
            False,
            r.practical,
        )
    return Judgement("no detectable difference", "the interval includes zero", False, r.practical)


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
        return "recommended"
    if failed:
        return "failed"
    if decision == "undecided":
        return "undecided"
    if stability == "worse":
        return "less stable"
    if quality == "worse":
        return "worse quality"
    if throughput == "slower":
        return "slower"
    if decision == "switch":
        return "runner-up"
    return "no gain"


def _margin_of(a: Mapping[str, Any]) -> float | None:
    for key in ("margin_bpb", "margin_val_loss"):
        if isinstance(a.get(key), (int, float)):
            return float(a[key])
    return None


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
            "equivalent",
            f"the whole prediction interval lies within ±{margin:.4g}, the smallest difference "
            "that matters",
            False,
            False,
        )
    lower = p_below >= p_above
    p = p_below if lower else p_above
    better = lower == lower_is_better
    side = "better" if better else "worse"
    if p >= (1.0 + confidence) / 2.0:
        return Judgement(side, f"{side} in {100 * p:.3g} % of the bootstrap draws", True, True)
    return Judgement(
        "not determined",
        f"{side} in {100 * p:.3g} % of the bootstrap draws, short of {50 * (1 + confidence):.3g} %",
        False,
        False,
    )
