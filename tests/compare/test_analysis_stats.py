"""The statistics of normlab.analysis against scipy on known cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from normlab.analysis import analyze, compare_paired, load_compare_folder
from normlab.analysis.power import (
    SPREAD_CONFIDENCE,
    forecast_range,
    forecast_seeds,
    forecast_words,
    sd_interval,
    seeds_needed,
    settle_probability,
)
from normlab.analysis.stats import (
    describe,
    holm_adjust,
    log_ratio_interval,
    paired_t_interval,
    sign_test,
    t_interval,
    tost,
    tost_paired,
)

X = np.array([3.412, 3.398, 3.431, 3.405, 3.420])
Y = np.array([3.409, 3.401, 3.422, 3.399, 3.418])


def test_paired_t_interval_matches_ttest_rel():
    res = paired_t_interval(X, Y, confidence=0.95)
    ref = stats.ttest_rel(X, Y)
    ci = ref.confidence_interval(0.95)
    assert res.n == 5
    assert res.mean == pytest.approx(float(np.mean(X - Y)), abs=1e-15)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert res.low == pytest.approx(ci.low, rel=1e-10)
    assert res.high == pytest.approx(ci.high, rel=1e-10)


def test_t_interval_formula_with_t_ppf():
    d = X - Y
    half = stats.t.ppf(0.95, 4) * d.std(ddof=1) / math.sqrt(5)
    res = t_interval(d, confidence=0.90)
    assert res.low == pytest.approx(d.mean() - half, rel=1e-12)
    assert res.high == pytest.approx(d.mean() + half, rel=1e-12)
    assert res.sd == pytest.approx(d.std(ddof=1), rel=1e-12)


def test_tost_is_two_one_sided_t_tests():
    d = X - Y
    margin = 0.01
    res = tost(d, margin, alpha=0.05)
    p_lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    assert res.p_lower == pytest.approx(p_lower, rel=1e-10)
    assert res.p_upper == pytest.approx(p_upper, rel=1e-10)
    assert res.p_value == pytest.approx(max(p_lower, p_upper), rel=1e-10)
    assert res.equivalent == (max(p_lower, p_upper) < 0.05)
    # the decision equals "the 90% interval lies inside the margin"
    ci90 = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert res.low == pytest.approx(ci90.low, rel=1e-10)
    assert res.high == pytest.approx(ci90.high, rel=1e-10)
    assert res.equivalent == (-margin < ci90.low and ci90.high < margin)


def test_tost_paired_matches_ttest_rel_shifted():
    margin = 0.02
    res = tost_paired(X, Y, margin)
    p_lower = stats.ttest_rel(X + margin, Y, alternative="greater").pvalue
    p_upper = stats.ttest_rel(X - margin, Y, alternative="less").pvalue
    assert res.p_value == pytest.approx(max(p_lower, p_upper), rel=1e-9)
    assert res.equivalent


def test_tost_rejects_equivalence_for_a_wide_interval():
    d = np.array([0.03, -0.02, 0.025, -0.01])
    assert not tost(d, 0.02).equivalent


def test_log_ratio_interval_is_ttest_rel_on_logs():
    x = np.array([33100.0, 32650.0, 33900.0, 32800.0])
    y = np.array([30800.0, 30900.0, 31500.0, 30600.0])
    res = log_ratio_interval(x, y, confidence=0.95)
    ref = stats.ttest_rel(np.log(x), np.log(y))
    ci = ref.confidence_interval(0.95)
    assert res.ratio == pytest.approx(math.exp(np.mean(np.log(x / y))), rel=1e-12)
    assert res.low == pytest.approx(math.exp(ci.low), rel=1e-10)
    assert res.high == pytest.approx(math.exp(ci.high), rel=1e-10)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-9)


def test_describe_uses_the_sample_sd_and_skips_missing():
    d = describe([1.0, 2.0, None, float("nan"), 4.0])
    assert d.n == 3
    assert d.mean == pytest.approx(7 / 3)
    assert d.std == pytest.approx(np.std([1.0, 2.0, 4.0], ddof=1))
    assert describe([5.0]).std is None
    assert describe([]).mean is None


def test_single_pair_gives_no_interval():
    res = paired_t_interval([3.4], [3.3])
    assert res.n == 1 and res.mean == pytest.approx(0.1)
    assert res.low is None and res.high is None and res.p_value is None and res.sd is None
    assert not tost([0.001], 0.02).equivalent


def test_zero_variance_of_differences():
    same = t_interval([0.01, 0.01, 0.01])
    assert same.sd == 0.0 and same.low == same.high == pytest.approx(0.01) and same.p_value == 0
    zero = t_interval([0.0, 0.0, 0.0])
    assert zero.p_value == 1.0
    eq = tost([0.005, 0.005, 0.005], 0.02)
    assert eq.equivalent and eq.p_value == 0.0
    assert not tost([0.03, 0.03], 0.02).equivalent


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: paired_t_interval([1.0, 2.0], [1.0]), "x and y must be paired"),
        (lambda: t_interval([1.0, float("nan")]), "finite"),
        (lambda: t_interval([1.0, 2.0], confidence=1.5), "confidence"),
        (lambda: tost([1.0, 2.0], -0.1), "margin"),
        (lambda: tost([1.0, 2.0], 0.1, alpha=0.7), "alpha"),
        (lambda: log_ratio_interval([1.0, -2.0], [1.0, 1.0]), "positive"),
    ],
)
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_non_numeric_input_raises_type_error():
    with pytest.raises(TypeError, match="d must be a sequence of numbers"):
        t_interval(["a", "b"])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-10, 10, allow_nan=False, allow_subnormal=False),
            st.floats(-10, 10, allow_nan=False, allow_subnormal=False),
        ),
        min_size=3,
        max_size=12,
    )
)
def test_paired_interval_agrees_with_scipy_on_random_samples(pairs):
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    d = x - y
    if d.std(ddof=1) < 1e-6 * max(1.0, abs(d.mean())):
        return  # scipy's own result is unstable for near-constant differences
    res = paired_t_interval(x, y)
    ref = stats.ttest_rel(x, y)
    ci = ref.confidence_interval(0.95)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-6, abs=1e-12)
    assert res.low == pytest.approx(ci.low, rel=1e-8, abs=1e-10)
    assert res.high == pytest.approx(ci.high, rel=1e-8, abs=1e-10)


# ---- seeds needed -------------------------------------------------------------------------


def test_superiority_power_matches_the_textbook_sample_size():
    # one-sample / paired t, effect size 0.5, two-sided alpha 0.05, power 0.8: n = 34
    assert seeds_needed(0.5, 1.0, margin=0.0) == 34
    assert (
        settle_probability(34, 0.5, 1.0, 0.0)[0] >= 0.8 > settle_probability(33, 0.5, 1.0, 0.0)[0]
    )


def test_superiority_power_matches_simulation():
    rng = np.random.default_rng(0)
    n, delta, sigma, sims = 8, 0.6, 1.0, 20000
    d = rng.normal(delta, sigma, size=(sims, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    rate = np.mean(np.abs(t) > stats.t.ppf(0.975, n - 1))
    assert settle_probability(n, delta, sigma, 0.0)[0] == pytest.approx(rate, abs=0.015)


def test_equivalence_bound_is_conservative_against_simulation():
    rng = np.random.default_rng(1)
    delta, sigma, margin = 0.0, 0.01, 0.01
    n = seeds_needed(delta, sigma, margin)
    assert n is not None
    d = rng.normal(delta, sigma, size=(20000, n))
    se = d.std(1, ddof=1) / math.sqrt(n)
    half = stats.t.ppf(0.95, n - 1) * se
    settled = (d.mean(1) - half > -margin) & (d.mean(1) + half < margin)
    assert settled.mean() >= 0.8 - 0.01
    assert settle_probability(n, delta, sigma, margin)[0] <= settled.mean() + 0.01


def test_seeds_needed_grows_with_noise_and_respects_the_floor():
    low = seeds_needed(0.01, 0.01, 0.02)
    high = seeds_needed(0.01, 0.03, 0.02)
    assert low is not None and high is not None and high > low
    assert seeds_needed(1.0, 0.01, 0.0, n_done=5) == 6
    assert seeds_needed(0.0, 1.0, 0.0) is None  # nothing to detect, no margin to meet
    with pytest.raises(ValueError, match="sd_diff"):
        seeds_needed(0.1, 0.0, 0.02)


# ---- the seeds forecast carries the uncertainty of the spread it is made from ----------------

SIGMA, MARGIN = 0.045, 0.02
"""The default question: the paired sd of LayerNorm vs RMSNorm at the default budget over 16
seeds (docs/studies.md), and the default margin in bits per byte."""


def test_the_spread_interval_covers_the_true_sd_as_often_as_it_says():
    rng = np.random.default_rng(5)
    sds = (SIGMA * rng.standard_normal((10_000, 3))).std(axis=1, ddof=1)
    bounds = np.array([sd_interval(float(s), 3) for s in sds])
    covered = (bounds[:, 0] <= SIGMA) & (bounds[:, 1] >= SIGMA)
    assert covered.mean() == pytest.approx(SPREAD_CONFIDENCE, abs=0.02)
    assert (bounds[:, 1] >= SIGMA).mean() == pytest.approx(0.9, abs=0.02)
    low, high = sd_interval(1.0, 3)  # χ²₂ quantiles 0.2107 and 4.605
    assert low == pytest.approx(math.sqrt(2 / stats.chi2.ppf(0.9, 2)), rel=1e-12)
    assert high == pytest.approx(math.sqrt(2 / stats.chi2.ppf(0.1, 2)), rel=1e-12)
    with pytest.raises(ValueError, match="n must"):
        sd_interval(1.0, 1)


def test_a_forecast_from_three_seeds_brackets_the_seeds_needed_at_the_true_spread():
    """Three paired seeds drawn with the default question's spread (true difference 0): the
    forecast's range holds the seeds needed at the true sd (for the same observed difference)
    in about 80 % of experiments and its upper end reaches it in about 90 %; the plug-in count
    alone, what the terminal said before ("about 7 seeds per arm"), reaches it in about 37 %
    (P(χ²₂ ≥ 2) = 1/e): it is not an estimate of how many seeds to plan for."""
    rng = np.random.default_rng(23)
    inside = reached = point_reached = 0
    draws = 150
    big = 10**9  # "more than the forecast looks at" counts as larger than any count
    for _ in range(draws):
        d = SIGMA * rng.standard_normal(3)
        mean, sd = float(d.mean()), float(d.std(ddof=1))
        f = forecast_seeds(mean, sd, MARGIN, 3)
        truth = seeds_needed(mean, SIGMA, MARGIN, n_done=3) or big
        point, low, high = (n or big for n in (f.point, f.low, f.high))
        inside += low <= truth <= high
        reached += truth <= high
        point_reached += truth <= point
    assert inside / draws >= 0.7, inside
    assert reached / draws >= 0.8, reached
    assert point_reached / draws <= 0.5, point_reached


def test_the_forecast_says_its_range_and_the_default_run_gets_about_45():
    """The default run's own numbers (difference −0.0006 bpb, 95 % CI −0.037 to +0.036 over 3
    seeds, so s ≈ 0.0147): about 7 seeds at that spread, and up to about 45, where the 16-seed
    study measured sd 0.045 and about 45 seeds."""
    f = forecast_seeds(-0.0006, 0.0147, MARGIN, 3)
    assert f.point == 7 and f.low is not None and 4 <= f.low <= f.point
    assert f.high is not None and 35 <= f.high <= 60
    words = forecast_words(f.point, f.high, 3)
    assert words.startswith("about 7 seeds per arm (4 more) would likely settle it")
    assert f"up to {f.high} if that spread is as large as its 80% interval allows" in words
    assert forecast_words(5, 5, 3) == "about 5 seeds per arm (2 more) would likely settle it"
    assert "up to more than 1000" in forecast_words(7, None, 3)
    assert forecast_range(7, 46) == "7–46" and forecast_range(None, None) == "—"
    assert forecast_range(5, 5) == "5" and forecast_range(7, None) == "7–>1000"


def test_holm_adjust_worked_example() -> None:
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → max so far 0.06
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjust([]) == []
    assert holm_adjust([0.2, 0.7]) == pytest.approx([0.4, 0.7])
    with pytest.raises(ValueError, match="p_values"):
        holm_adjust([0.1, 1.5])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12))
def test_holm_adjust_matches_its_definition(ps: list[float]) -> None:
    """p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎), computed the slow way; never below p,
    never above Bonferroni's m·p, and in the same order as p."""
    m = len(ps)
    order = sorted(range(m), key=lambda k: ps[k])
    slow = [0.0] * m
    for rank, i in enumerate(order):
        slow[i] = max(min(1.0, (m - j) * ps[order[j]]) for j in range(rank + 1))
    adjusted = holm_adjust(ps)
    assert adjusted == pytest.approx(slow)
    for p, a in zip(ps, adjusted, strict=True):
        assert p <= a + 1e-15 and a <= min(1.0, m * p) + 1e-15
    for i in range(m):
        for j in range(m):
            if ps[i] < ps[j]:
                assert adjusted[i] <= adjusted[j] + 1e-15


def test_every_comparison_carries_its_holm_adjusted_p() -> None:

    folder = load_compare_folder(Path(__file__).parent / "fixtures" / "compare_run")
    comps = analyze(folder)["comparisons"]
    for arm_comps in comps.values():
        tested = {n: c["p_value"] for n, c in arm_comps.items() if c["p_value"] is not None}
        assert len(tested) >= 5
        expected = dict(zip(tested, holm_adjust(list(tested.values())), strict=True))
        for name, c in arm_comps.items():
            assert c["p_holm"] == (pytest.approx(expected[name]) if name in expected else None)


# ----------------------------------------------------------------------------------------------
# Found in review, checked against scipy or a hand count
# ----------------------------------------------------------------------------------------------
# ---- seeds needed: noncentral-t tails -----------------------------------------------------
def test_settle_probability_is_finite_far_in_the_tails():
    """SciPy's nct.cdf(−12.7, 1, 269) is NaN; the power must still be ~1 at n = 2 for a
    difference of 190 standard deviations, and seeds_needed must not skip n = 2."""
    p = settle_probability(np.arange(2, 6), 0.019, 1e-4, 0.0)
    assert np.all(np.isfinite(p)) and np.all(p > 0.999)
    assert seeds_needed(0.019, 1e-4, 0.0) == 2
    p_eq = settle_probability(np.arange(2, 6), 0.019, 1e-4, 0.02)
    assert np.all(np.isfinite(p_eq)) and np.all(p_eq > 0.999)


def test_settle_probability_matches_the_cdf_form_where_scipy_is_accurate():
    n, delta, sigma, margin, alpha = np.arange(3, 12), 0.004, 0.01, 0.02, 0.05
    df, se = n - 1.0, sigma / np.sqrt(n)
    c2, c1 = stats.t.ppf(1 - alpha / 2, df), stats.t.ppf(1 - alpha, df)
    p_sup = stats.nct.sf(c2, df, delta / se) + stats.nct.cdf(-c2, df, delta / se)
    miss = stats.nct.cdf(c1, df, (delta + margin) / se) + stats.nct.sf(
        -c1, df, (delta - margin) / se
    )
    expected = np.maximum(p_sup, np.clip(1 - miss, 0, 1))
    np.testing.assert_allclose(settle_probability(n, delta, sigma, margin), expected, rtol=1e-9)


# ---- counts: the exact sign test -----------------------------------------------------------
@pytest.mark.parametrize(
    "d",
    [[1, 1, 1], [2, 1, 1, 0], [1, -1, 2, 3, 1, 1, 0, 4], [0, 0, 0], [-3, -1, -2, -1, -1, -2]],
)
def test_sign_test_matches_scipy_binomtest(d):
    res = sign_test(d)
    nonzero = [v for v in d if v != 0]
    pos = sum(v > 0 for v in nonzero)
    assert (res.n, res.n_pos, res.n_neg) == (len(d), pos, len(nonzero) - pos)
    expected = stats.binomtest(pos, len(nonzero), 0.5).pvalue if nonzero else 1.0
    assert res.p_value == pytest.approx(expected, rel=1e-12)


def test_sign_test_textbook_values():
    assert sign_test([1, 1, 1]).p_value == pytest.approx(0.25)  # 2 · (1/2)^3
    assert sign_test([1] * 6).p_value == pytest.approx(2 / 64)
    assert sign_test([]).p_value is None


def test_equal_spike_differences_are_not_a_certain_difference():
    """Three seeds, one spike more each: under 'no difference' that pattern has probability
    1/4 (sign test). The t-test's zero-variance limit called it p = 0, while [2, 1, 1], more
    spikes still, was not significant: the verdict fell as the evidence grew."""
    equal = compare_paired([1, 1, 1], [0, 0, 0], lower_is_better=True, discrete=True)
    more = compare_paired([2, 1, 1], [0, 0, 0], lower_is_better=True, discrete=True)
    assert equal.verdict == more.verdict == "inconclusive"
    assert equal.p_value == pytest.approx(0.25) and not equal.significant
    assert equal.test.startswith("exact sign test")
    six = compare_paired([1] * 6, [0] * 6, lower_is_better=True, discrete=True)
    assert six.verdict == "worse" and six.p_value == pytest.approx(1 / 32)
    fewer = compare_paired([0] * 6, [2, 1, 1, 3, 1, 1], lower_is_better=True, discrete=True)
    assert fewer.verdict == "better"
    same = compare_paired([2, 0, 1], [2, 0, 1], lower_is_better=True, discrete=True)
    assert same.verdict == "equivalent"


def test_discrete_direction_follows_the_sign_test_not_the_mean():
    # six of seven seeds have one spike fewer; one seed has 40 more: the mean is positive
    c = compare_paired([0] * 6 + [40], [1] * 6 + [0], lower_is_better=True, discrete=True)
    assert c.mean_diff > 0
    assert c.p_value == pytest.approx(stats.binomtest(1, 7, 0.5).pvalue)
    assert c.verdict == "inconclusive"  # p = 0.125
    c = compare_paired([0] * 8 + [40], [1] * 8 + [0], lower_is_better=True, discrete=True)
    assert c.mean_diff > 0 and c.p_value < 0.05 and c.verdict == "better"


def test_discrete_ratio_is_refused():
    with pytest.raises(ValueError, match="discrete"):
        compare_paired([1, 2], [1, 2], lower_is_better=True, scale="ratio", discrete=True)
