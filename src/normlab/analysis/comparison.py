"""One paired comparison of an arm against the baseline on one metric: its numbers and verdict.

For differences d_k = x_k − y_k (arm minus baseline) or log ratios d_k = ln(x_k / y_k), at
level α (0.05 by default), :func:`compare_paired` computes:

- ``equivalent``: TOST rejects non-equivalence, i.e. the (1 − 2α) interval lies inside
  (−Δ, +Δ) — or every pair is identical (all d_k = 0) for metrics without a margin;
- ``significant``: the (1 − α) t-interval excludes zero (its sign and the metric's direction
  say which way);
- for a comparison that is neither, ``seeds_needed`` and its upper end ``seeds_needed_high``
  from :func:`normlab.analysis.power.forecast_seeds` (the upper end at the top of the spread's
  confidence interval);
- with fewer than two pairs, no interval and neither.

The verdict is rule 1 of :mod:`normlab.analysis.wording` (:func:`~.wording.paired_verdict`):
equivalence is looked at first — a difference that is statistically detectable but smaller
than the margin is practically nil, so the verdict says ``equivalent`` with ``significant``
set to record it — then the sign of a significant difference, else ``inconclusive``.

A metric that does not vary with the seed (the bytes a forward saves for the backward) gives
the same nonzero difference in every pair. That difference is exact: it counts as significant
(unless equivalent), the test is :data:`EXACT_TEST` and there is no p-value, where a t-test
would report p = 0 from a zero-width interval.

Small integer counts (``discrete=True``: spikes per run) are tested with the exact sign test
(:func:`normlab.analysis.stats.sign_test`) instead of the t-test: equal counts in every pair
make the t-interval zero-wide (p = 0) although, with three seeds, that pattern comes up by
chance one time in four. The direction is that of the majority sign; the t-interval of the
mean difference is still reported, as a scale. No seed count is estimated for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from normlab.analysis.power import forecast_seeds
from normlab.analysis.stats import TInterval, log_ratio_interval, sign_test, t_interval, tost
from normlab.analysis.wording import INCONCLUSIVE, paired_verdict

__all__ = ["EXACT_TEST", "PairedComparison", "compare_paired", "decide_by_sign_test"]

EXACT_TEST = "exact: the same difference in every pair"
"""The ``test`` of a comparison whose paired differences are all equal and nonzero."""


@dataclass(frozen=True)
class PairedComparison:
    """Statistics and verdict of an arm against the baseline on one metric.

    ``mean_diff``, ``ci_low`` and ``ci_high`` are always on the metric's own scale (x − y).
    For ratio metrics, ``ratio`` and its interval come from the log-ratio t-interval, and the
    test, ``p_value`` and verdict are those of the log ratios (``test`` names which).
    """

    n_pairs: int
    seeds: list[int]
    test: str
    confidence: float
    mean_diff: float | None
    sd_diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    margin: float | None
    tost_p: float | None
    tost_low: float | None
    tost_high: float | None
    equivalent: bool
    significant: bool
    verdict: str
    seeds_needed: int | None
    ratio: float | None = None
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    note: str = ""
    power: float = 0.8
    """The power that ``seeds_needed`` aims for."""
    seeds_needed_high: int | None = None
    """The seeds needed if the spread is at the top of its confidence interval
    (:func:`normlab.analysis.power.forecast_seeds`); None with ``seeds_needed``, or beyond
    the most a forecast looks at."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _significance(
    d: np.ndarray, interval: TInterval, discrete: bool, alpha: float
) -> tuple[bool, float | None, float]:
    """(significant, p-value, signed effect) of the test.

    t-test: significant when the (1 − α) interval excludes zero; the effect is d̄.
    Sign test (``discrete``): significant when p < α; the effect is n₊ − n₋.
    """
    if discrete:
        sign = sign_test(d)
        assert sign.p_value is not None
        return sign.p_value < alpha, sign.p_value, float(sign.n_pos - sign.n_neg)
    assert interval.low is not None and interval.high is not None and interval.mean is not None
    return interval.low > 0 or interval.high < 0, interval.p_value, interval.mean


def _check_arguments(scale: str, discrete: bool, margin: float | None, alpha: float) -> None:
    if scale not in ("difference", "ratio"):
        raise ValueError(f"scale must be 'difference' or 'ratio', got {scale!r}")
    if discrete and scale != "difference":
        raise ValueError(f"discrete counts are compared on the difference scale, got {scale!r}")
    if margin is not None and not (math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be None or a finite number >= 0, got {margin!r}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def _paired_arrays(
    x: Sequence[float], y: Sequence[float], seeds: Sequence[int] | None
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``x`` and ``y`` as float64 arrays of one pair per seed, and the seeds (0, 1, … unless
    given)."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError(
            f"x and y must be paired 1-d samples of equal length, got shapes {xa.shape} "
            f"and {ya.shape}"
        )
    seed_list = list(range(xa.size)) if seeds is None else [int(s) for s in seeds]
    if len(seed_list) != xa.size:
        raise ValueError(f"seeds must have one entry per pair ({xa.size}), got {seed_list}")
    return xa, ya, seed_list


def _describe_pairs(
    xa: np.ndarray,
    ya: np.ndarray,
    scale: str,
    discrete: bool,
    margin: float | None,
    confidence: float,
) -> tuple[TInterval, dict[str, Any]]:
    """(the interval the test reads, the fields every outcome shares): the raw difference's
    interval, and for ratio metrics the log-ratio interval, which is then tested instead (and
    no margin applies)."""
    raw = t_interval(xa - ya, confidence)
    ratio = ratio_low = ratio_high = None
    if scale == "ratio":
        rint = log_ratio_interval(xa, ya, confidence)
        test_int, test = rint.log, "paired t-test on ln(x / y)"
        ratio, ratio_low, ratio_high = rint.ratio, rint.low, rint.high
        eq_margin = None
    else:
        test_int, eq_margin = raw, margin
        test = "exact sign test on x − y" if discrete else "paired t-test on x − y"
    common = dict(
        n_pairs=raw.n,
        test=test,
        confidence=confidence,
        mean_diff=raw.mean,
        sd_diff=raw.sd,
        ci_low=raw.low,
        ci_high=raw.high,
        margin=eq_margin,
        ratio=ratio,
        ratio_ci_low=ratio_low,
        ratio_ci_high=ratio_high,
    )
    return test_int, common


def _too_few_pairs(common: dict[str, Any], p_value: float | None) -> PairedComparison:
    """Fewer than two pairs: no interval, neither equivalent nor significant."""
    note = (
        "no seed has a value in both arms"
        if common["n_pairs"] == 0
        else "only one seed has a usable result in both arms, which gives no interval "
        "and no estimate of seed-to-seed variation; at least 3 paired seeds are needed"
    )
    return PairedComparison(
        **common,
        p_value=p_value,
        tost_p=None,
        tost_low=None,
        tost_high=None,
        equivalent=False,
        significant=False,
        verdict=paired_verdict(
            equivalent=False, significant=False, effect=None, lower_is_better=True
        ),
        seeds_needed=None,
        note=note,
    )


def _equivalence(d: np.ndarray, margin: float | None, alpha: float) -> dict[str, Any]:
    """TOST on ``d`` within ±``margin`` (no test without a positive margin)."""
    if margin is not None and margin > 0:
        eq = tost(d, margin, alpha)
        return dict(tost_p=eq.p_value, tost_low=eq.low, tost_high=eq.high, equivalent=eq.equivalent)
    return dict(tost_p=None, tost_low=None, tost_high=None, equivalent=False)


def compare_paired(
    x: Sequence[float],
    y: Sequence[float],
    *,
    seeds: Sequence[int] | None = None,
    lower_is_better: bool,
    margin: float | None = None,
    scale: str = "difference",
    alpha: float = 0.05,
    power: float = 0.8,
    discrete: bool = False,
) -> PairedComparison:
    """Compare paired samples ``x`` (arm) and ``y`` (baseline) and give a verdict.

    ``margin`` is the equivalence margin Δ on the difference scale (None: no equivalence test).
    ``scale="ratio"`` tests ln(x / y) and needs positive values; Δ is then unused.
    ``discrete=True`` (small integer counts) decides by the exact sign test on x − y.
    See the module docstring for the verdict rules.
    """
    _check_arguments(scale, discrete, margin, alpha)
    xa, ya, seed_list = _paired_arrays(x, y, seeds)
    test_int, common = _describe_pairs(xa, ya, scale, discrete, margin, 1.0 - alpha)
    common.update(seeds=seed_list, power=power)
    if common["n_pairs"] < 2:
        return _too_few_pairs(common, test_int.p_value)

    mean, sd = test_int.mean, test_int.sd
    assert mean is not None and sd is not None
    significant, p_value, effect = _significance(xa - ya, test_int, discrete, alpha)
    eq = _equivalence(xa - ya, common["margin"], alpha)
    note = ""
    if sd == 0.0:
        if mean == 0.0:
            eq["equivalent"] = True
            note = "identical values in every pair"
        elif discrete:
            note = "every pair differs by the same count: the sign test decides, not the interval"
        else:
            # A deterministic metric (bytes saved for backward, parameter counts): the difference
            # is known exactly, so no test applies and no p-value is given.
            significant, p_value, effect = True, None, mean
            common["test"] = EXACT_TEST
            note = "the same difference in every pair: the metric does not vary with the seed"
    verdict = paired_verdict(
        equivalent=eq["equivalent"],
        significant=significant,
        effect=effect,
        lower_is_better=lower_is_better,
    )
    needed = needed_high = None
    if verdict == INCONCLUSIVE and not discrete:
        forecast = forecast_seeds(
            mean, sd, common["margin"] or 0.0, common["n_pairs"], alpha=alpha, power=power
        )
        needed, needed_high = forecast.point, forecast.high
        if needed is None:
            note = "more than 1000 seeds would be needed: the difference is far below the noise"
    return PairedComparison(
        **common,
        **eq,
        p_value=p_value,
        significant=significant,
        verdict=verdict,
        seeds_needed=needed,
        seeds_needed_high=needed_high,
        note=note,
    )


def decide_by_sign_test(
    c: PairedComparison,
    signs: Sequence[float],
    *,
    lower_is_better: bool,
    alpha: float = 0.05,
    test: str,
    note: str,
) -> PairedComparison:
    """``c`` with its test, p-value and verdict replaced by the exact sign test on ``signs``.

    For pairs whose order is known but not their difference (a run that never reached a target
    was slower than one that did): ``signs`` holds sign(x_k − y_k) for every usable pair,
    p = :func:`~normlab.analysis.stats.sign_test`; significant when p < α, in the direction of
    the majority sign (the verdict: :func:`~normlab.analysis.wording.paired_verdict`). The
    interval and ratio of ``c`` are kept as they are.
    """
    sign = sign_test(np.sign(np.asarray(signs, dtype=np.float64)))
    significant = sign.p_value is not None and sign.p_value < alpha
    effect = float(sign.n_pos - sign.n_neg)
    return replace(
        c,
        test=test,
        p_value=sign.p_value,
        tost_p=None,
        tost_low=None,
        tost_high=None,
        equivalent=False,
        significant=significant,
        verdict=paired_verdict(
            equivalent=False,
            significant=significant,
            effect=effect,
            lower_is_better=lower_is_better,
        ),
        seeds_needed=None,
        seeds_needed_high=None,
        note=note,
    )
