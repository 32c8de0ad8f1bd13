"""Statistics and verdicts found wrong in review, each checked against scipy or a hand count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from normlab.analysis import analyze, compare_paired, load_compare_folder
from normlab.analysis.power import seeds_needed, settle_probability
from normlab.analysis.stats import sign_test

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


# ---- whole folders -------------------------------------------------------------------------


def _summary(arm: str, seed: int, **extra) -> dict:
    s = {
        "run_id": f"{arm}__s{seed}",
        "arm": arm,
        "seed": seed,
        "norm": arm.split("-")[0],
        "placement": "pre",
        "status": "finished",
        "final_val_bpb": 3.40 + 0.01 * seed,
        "best_val_bpb": 3.40 + 0.01 * seed,
        "final_train_loss": 2.35,
        "tokens_per_s": 30000.0 * (1 + 0.01 * seed),
        "peak_memory_bytes": 2**29,
        "n_loss_spikes": 0,
        "n_grad_spikes": 0,
    }
    s.update(extra)
    return s


def _write(root: Path, summaries: list[dict], arms: list[str], seeds: list[int]) -> Path:
    exp = {"arms": arms, "baseline_arm": arms[0], "seeds": seeds, "margin_bpb": 0.02}
    root.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps(exp))
    for s in summaries:
        run = root / "runs" / s["run_id"]
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(s))
    return root


def test_one_extra_spike_per_seed_does_not_decide_stability(tmp_path):
    """Before: rmsnorm, better by 0.05 bpb in every seed, was 'keep' because it had one more
    loss spike in each of 3 seeds (zero-variance t-interval, p = 0)."""
    runs = []
    for seed in (0, 1, 2):
        runs.append(_summary("layernorm-pre", seed))
        bpb = 3.35 + 0.01 * seed + 0.001 * seed**2
        runs.append(
            _summary("rmsnorm-pre", seed, final_val_bpb=bpb, best_val_bpb=bpb, n_loss_spikes=1)
        )
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], [0, 1, 2])
    a = analyze(load_compare_folder(folder))
    v = a["verdicts"]["rmsnorm-pre"]
    assert v["quality"] == "better"
    # The zero-width interval [+1, +1] excludes zero, so "similar" (no detectable difference)
    # would contradict it; the sign test (p = 0.25) cannot confirm it: inconclusive, not worse.
    assert v["stability"] == "inconclusive" and v["decision"] == "switch"
    assert "cannot confirm" in v["stability_text"]
    assert "no detectable difference" not in v["stability_text"]
    assert a["comparisons"]["rmsnorm-pre"]["n_loss_spikes"]["verdict"] == "inconclusive"


def test_spikes_in_every_one_of_six_seeds_decide_stability_with_the_sign_test(tmp_path):
    runs = []
    for seed in range(6):
        runs.append(_summary("layernorm-pre", seed))
        runs.append(_summary("rmsnorm-pre", seed, n_grad_spikes=1 + seed % 2))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(6)))
    a = analyze(load_compare_folder(folder))
    detail = a["verdicts"]["rmsnorm-pre"]["stability_detail"]
    assert detail["verdict"] == "worse"
    assert "more spikes in 6 of 6 paired seeds" in detail["reason"]
    assert "sign test p = 0.031" in detail["reason"]


def test_stability_reason_quotes_the_level_used(tmp_path):
    runs = []
    for seed in range(6):
        runs.append(_summary("layernorm-pre", seed))
        runs.append(_summary("rmsnorm-pre", seed, n_grad_spikes=1 + seed % 2))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(6)))
    reason = analyze(load_compare_folder(folder), alpha=0.1)["verdicts"]["rmsnorm-pre"][
        "stability_detail"
    ]["reason"]
    assert "90% CI" in reason and "95%" not in reason


# ---- decision texts ------------------------------------------------------------------------


def _equivalent_quality(seed: int, arm: str, **extra) -> dict:
    bpb = 3.40 + 0.01 * seed + (0.001 * (seed % 2) if arm != "layernorm-pre" else 0.0)
    return _summary(arm, seed, final_val_bpb=bpb, best_val_bpb=bpb, **extra)


def test_no_detectable_speed_difference_is_not_called_equivalent_speed(tmp_path):
    runs = []
    for seed, tps in enumerate([30000.0, 31000.0, 29500.0, 30500.0]):
        runs.append(_equivalent_quality(seed, "layernorm-pre", tokens_per_s=tps))
        rms = tps * (1.03 if seed % 2 else 0.98)
        runs.append(_equivalent_quality(seed, "rmsnorm-pre", tokens_per_s=rms))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], [0, 1, 2, 3])
    a = analyze(load_compare_folder(folder))
    v = a["verdicts"]["rmsnorm-pre"]
    assert v["quality"] == "equivalent" and v["throughput"] == "no detectable difference"
    assert v["decision"] == "either"
    assert "equivalent in quality and speed" not in v["reason"]
    assert "no detectable speed difference" in v["reason"]


def test_speed_that_could_not_be_measured_is_not_called_equivalent(tmp_path):
    runs = []
    for seed in range(4):
        runs.append(_equivalent_quality(seed, "layernorm-pre", tokens_per_s=None))
        runs.append(_equivalent_quality(seed, "rmsnorm-pre", tokens_per_s=None))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], [0, 1, 2, 3])
    v = analyze(load_compare_folder(folder))["verdicts"]["rmsnorm-pre"]
    assert v["quality"] == "equivalent" and v["throughput"] == "inconclusive"
    assert "speed could not be compared" in v["reason"]


def test_an_arm_whose_runs_all_crashed_is_not_told_to_run_more_seeds(tmp_path):
    runs = []
    for seed in (0, 1, 2):
        runs.append(_summary("layernorm-pre", seed))
        runs.append(_summary("rmsnorm-pre", seed))
        runs.append(_summary("dyt-pre", seed, status="crashed", error="RuntimeError: boom"))
    arms = ["layernorm-pre", "rmsnorm-pre", "dyt-pre"]
    a = analyze(load_compare_folder(_write(tmp_path / "o", runs, arms, [0, 1, 2])))
    rec = a["recommendation"]
    assert rec["choice"] == "undecided"
    assert "dyt-pre has no result (3 crashed)" in rec["headline"]
    assert "run at least 3 seeds" not in rec["headline"]


# ---- time to target: runs that never reach it ----------------------------------------------


def test_seeds_where_only_one_arm_reached_the_target_are_not_dropped(tmp_path):
    """rmsnorm reaches the target 10 % sooner in the 3 seeds where both reach it, but never
    reaches it in 3 others where layernorm does. Dropping those seeds called rmsnorm 'better'
    (p < 0.001); counting who reached the target first, it is 3 against 3."""
    runs = []
    for seed in range(6):
        reached = seed < 3
        base_t = 10.0 + 0.5 * seed
        runs.append(_summary("layernorm-pre", seed, time_to_target_s=base_t))
        arm_t = base_t * (0.9 + 0.001 * seed) if reached else None
        runs.append(_summary("rmsnorm-pre", seed, time_to_target_s=arm_t))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(6)))
    c = analyze(load_compare_folder(folder))["comparisons"]["rmsnorm-pre"]["time_to_target_s"]
    assert c["verdict"] == "inconclusive"
    assert c["test"].startswith("exact sign test")
    assert c["p_value"] == pytest.approx(1.0)
    assert "3 paired seeds where only one arm reached the target" in c["note"]
    assert c["ratio"] == pytest.approx(math.exp(np.mean(np.log([0.9, 0.901, 0.902]))))


def test_time_to_target_without_censoring_keeps_the_ratio_test(tmp_path):
    runs = []
    for seed in range(4):
        base_t = 10.0 + 0.5 * seed
        runs.append(_summary("layernorm-pre", seed, time_to_target_s=base_t))
        runs.append(_summary("rmsnorm-pre", seed, time_to_target_s=base_t * (0.9 + 0.002 * seed)))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(4)))
    c = analyze(load_compare_folder(folder))["comparisons"]["rmsnorm-pre"]["time_to_target_s"]
    assert c["verdict"] == "better" and c["test"] == "paired t-test on ln(x / y)"


def test_quality_sentence_quotes_the_power_asked_for():
    from normlab.analysis.verdicts import quality_sentence

    base = np.array([3.40, 3.42, 3.39])
    x = base + np.array([0.03, -0.01, 0.02])
    c80 = compare_paired(x, base, lower_is_better=True, margin=0.02)
    c95 = compare_paired(x, base, lower_is_better=True, margin=0.02, power=0.95)
    assert c80.verdict == c95.verdict == "inconclusive"
    assert c95.seeds_needed > c80.seeds_needed
    assert "(95% power" in quality_sentence(c95, "rms", "ln")
    assert "(80% power" in quality_sentence(c80, "rms", "ln")


def test_two_run_folders_for_one_arm_and_seed_are_refused(tmp_path):
    """A copied run folder ('rmsnorm-pre__s0.bak' with its summary.json) is the same run twice:
    counting both would weigh that seed double in the stability counts and pick one value
    silently for the pairing."""
    from normlab.analysis import CompareFolderError

    runs = [_summary(arm, seed) for seed in (0, 1) for arm in ("layernorm-pre", "rmsnorm-pre")]
    root = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], [0, 1])
    copy = root / "runs" / "rmsnorm-pre__s0.bak"
    copy.mkdir()
    (copy / "summary.json").write_text(json.dumps(_summary("rmsnorm-pre", 0, final_val_bpb=9.0)))
    match = r"rmsnorm-pre__s0 and rmsnorm-pre__s0\.bak are both arm 'rmsnorm-pre', seed 0"
    with pytest.raises(CompareFolderError, match=match):
        load_compare_folder(root)
