"""Verdict logic of normlab.analysis on constructed cases, and loading compare folders."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from normlab.analysis import (
    EXACT_TEST,
    CompareFolderError,
    analyze,
    compare_paired,
    load_compare_folder,
)

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
BASE = np.array([3.402, 3.431, 3.388, 3.415, 3.420])


# ---- one paired comparison ----------------------------------------------------------------


def test_clearly_better():
    c = compare_paired(
        BASE - 0.08 + np.array([0.002, -0.001, 0.0, 0.001, -0.002]),
        BASE,
        lower_is_better=True,
        margin=0.02,
    )
    assert c.verdict == "better" and c.significant and not c.equivalent
    assert c.ci_high < 0 and c.seeds_needed is None


def test_clearly_worse():
    c = compare_paired(
        BASE + 0.08 + np.array([0.002, -0.001, 0.0, 0.001, -0.002]),
        BASE,
        lower_is_better=True,
        margin=0.02,
    )
    assert c.verdict == "worse" and c.ci_low > 0


def test_higher_is_better_direction():
    c = compare_paired(
        [110.0, 112.0, 111.0], [100.0, 101.0, 100.5], lower_is_better=False, scale="ratio"
    )
    assert c.verdict == "better" and c.ratio == pytest.approx(1.1, abs=0.01)
    assert c.ratio_ci_low > 1.0 and c.test.startswith("paired t-test on ln")


def test_equivalent_inside_the_margin():
    c = compare_paired(
        BASE + np.array([0.001, -0.002, 0.002, 0.0, -0.001]),
        BASE,
        lower_is_better=True,
        margin=0.02,
    )
    assert c.verdict == "equivalent" and c.equivalent and not c.significant
    assert c.tost_low > -0.02 and c.tost_high < 0.02 and c.tost_p < 0.05


def test_small_but_detectable_difference_inside_the_margin_is_equivalent():
    c = compare_paired(
        BASE + 0.005 + np.array([0.0005, -0.0005, 0.0, 0.0003, -0.0003]),
        BASE,
        lower_is_better=True,
        margin=0.02,
    )
    assert c.verdict == "equivalent" and c.significant


def test_inconclusive_says_how_many_seeds():
    c = compare_paired(
        BASE[:3] + np.array([0.03, -0.01, 0.02]), BASE[:3], lower_is_better=True, margin=0.02
    )
    assert c.verdict == "inconclusive"
    assert c.seeds_needed is not None and c.seeds_needed > 3


def test_single_seed_is_inconclusive_without_an_interval():
    c = compare_paired([3.30], [3.40], lower_is_better=True, margin=0.02)
    assert c.verdict == "inconclusive" and c.n_pairs == 1
    assert c.ci_low is None and c.seeds_needed is None and "only one seed" in c.note


def test_zero_variance_differences():
    same = compare_paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], lower_is_better=True)
    assert same.verdict == "equivalent" and "identical" in same.note
    shifted = compare_paired([1.5, 2.5, 3.5], [1.0, 2.0, 3.0], lower_is_better=True, margin=0.02)
    assert shifted.verdict == "worse" and shifted.ci_low == shifted.ci_high == pytest.approx(0.5)
    # The difference is exact: no t-test p = 0 from a zero-width interval.
    assert shifted.test == EXACT_TEST and shifted.p_value is None and shifted.significant


def test_a_metric_that_does_not_vary_with_the_seed_is_compared_exactly():
    """Bytes saved for the backward are the same in every seed: the ratio is exact, its sign
    decides, and there is no p-value for Holm's adjustment to count."""
    arm, base = [20_590_596.0] * 3, [20_627_460.0] * 3
    c = compare_paired(arm, base, lower_is_better=True, scale="ratio")
    assert c.verdict == "better" and c.test == EXACT_TEST and c.p_value is None
    assert c.ratio == pytest.approx(20_590_596 / 20_627_460)
    worse = compare_paired(base, arm, lower_is_better=True, scale="ratio")
    assert worse.verdict == "worse" and worse.test == EXACT_TEST
    # Within an equivalence margin, an exact difference is still "equivalent".
    small = compare_paired([1.01] * 3, [1.0] * 3, lower_is_better=True, margin=0.02)
    assert small.verdict == "equivalent"
    # One seed that differs brings the t-test back.
    noisy = compare_paired([1.5, 2.5, 3.6], [1.0, 2.0, 3.0], lower_is_better=True)
    assert noisy.test != EXACT_TEST and noisy.p_value is not None


def test_no_pairs():
    c = compare_paired([], [], lower_is_better=True, margin=0.02)
    assert c.verdict == "inconclusive" and c.n_pairs == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="scale"):
        compare_paired([1.0], [1.0], lower_is_better=True, scale="log")
    with pytest.raises(ValueError, match="paired"):
        compare_paired([1.0, 2.0], [1.0], lower_is_better=True)
    with pytest.raises(ValueError, match="margin"):
        compare_paired([1.0, 2.0], [1.0, 2.0], lower_is_better=True, margin=-1.0)


# ---- whole folders ------------------------------------------------------------------------


def _summary(arm: str, seed: int, bpb: float | None, tps: float, status: str = "finished", **extra):
    norm = arm.split("-")[0]
    s = {
        "run_id": f"{arm}__s{seed}",
        "arm": arm,
        "seed": seed,
        "norm": norm,
        "placement": "pre",
        "status": status,
        "diverged_at": None,
        "steps": 100,
        "n_params": 1000 + (200 if norm == "layernorm" else 100),
        "n_norm_params": 200 if norm == "layernorm" else 100,
        "final_val_bpb": bpb,
        "best_val_bpb": bpb,
        "final_train_loss": None if bpb is None else bpb * 0.69,
        "tokens_per_s": tps,
        "peak_memory_bytes": 2**29,
        "n_loss_spikes": 0,
        "n_grad_spikes": 0,
        "n_clipped": 0,
    }
    s.update(extra)
    return s


def _write_folder(root: Path, summaries: list[dict], seeds: list[int]) -> Path:
    arms = list(dict.fromkeys(s["arm"] for s in summaries))
    arms.sort(key=lambda a: a != "layernorm-pre")
    exp = {"arms": arms, "baseline_arm": "layernorm-pre", "seeds": seeds, "margin_bpb": 0.02}
    root.mkdir(parents=True, exist_ok=True)
    (root / "experiment.json").write_text(json.dumps(exp))
    for s in summaries:
        run = root / "runs" / s["run_id"]
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({k: s[k] for k in ("run_id", "arm", "seed")}))
        if s["status"] != "unfinished":
            (run / "summary.json").write_text(json.dumps(s))
    return root


def _pairs(bpb_ln, bpb_rms, tps_ln=30000.0, tps_rms=32000.0):
    out = []
    for seed, (a, b) in enumerate(zip(bpb_ln, bpb_rms, strict=True)):
        out.append(_summary("layernorm-pre", seed, a, tps_ln * (1 + 0.003 * seed)))
        out.append(_summary("rmsnorm-pre", seed, b, tps_rms * (1 + 0.004 * seed)))
    return out


def test_equivalent_and_faster_chooses_rmsnorm(tmp_path):
    ln = [3.40, 3.42, 3.39, 3.41]
    rms = [3.401, 3.419, 3.392, 3.409]
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", _pairs(ln, rms), [0, 1, 2, 3])))
    assert a["verdicts"]["rmsnorm-pre"]["quality"] == "equivalent"
    assert a["verdicts"]["rmsnorm-pre"]["throughput"] == "faster"
    assert a["recommendation"]["choice"] == "rmsnorm-pre"
    assert a["recommendation"]["status"] == "switch"
    assert "TOST" in a["recommendation"]["text"]


def test_worse_quality_keeps_layernorm(tmp_path):
    ln = [3.40, 3.42, 3.39, 3.41]
    rms = [3.46, 3.475, 3.452, 3.468]
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", _pairs(ln, rms), [0, 1, 2, 3])))
    assert a["verdicts"]["rmsnorm-pre"]["quality"] == "worse"
    assert a["recommendation"]["choice"] == "layernorm-pre"
    assert a["recommendation"]["status"] == "keep"


def test_equivalent_and_slower_keeps_layernorm(tmp_path):
    ln = [3.40, 3.42, 3.39, 3.41]
    rms = [3.401, 3.419, 3.392, 3.409]
    folder = _write_folder(tmp_path / "o", _pairs(ln, rms, 30000.0, 27000.0), [0, 1, 2, 3])
    a = analyze(load_compare_folder(folder))
    assert a["verdicts"]["rmsnorm-pre"]["throughput"] == "slower"
    assert a["recommendation"]["status"] == "keep"


def test_inconclusive_asks_for_more_seeds(tmp_path):
    ln = [3.40, 3.42, 3.39]
    rms = [3.43, 3.41, 3.41]
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", _pairs(ln, rms), [0, 1, 2])))
    v = a["verdicts"]["rmsnorm-pre"]
    assert v["quality"] == "inconclusive" and v["seeds_needed"] > 3
    assert a["recommendation"]["choice"] == "undecided"
    assert f"about {v['seeds_needed']} seeds per arm" in a["recommendation"]["headline"]


def test_single_seed_is_undecided(tmp_path):
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", _pairs([3.4], [3.3]), [0])))
    assert a["verdicts"]["rmsnorm-pre"]["quality"] == "inconclusive"
    assert a["recommendation"]["choice"] == "undecided"
    assert "run at least 3 seeds per arm" in a["recommendation"]["headline"]


def test_diverged_arm_is_less_stable_and_loses(tmp_path):
    ln = [3.40, 3.42, 3.39]
    rms = [3.401, 3.419, 3.392]
    runs = _pairs(ln, rms)
    runs[-1] = _summary(
        "rmsnorm-pre", 2, None, 32000.0, status="diverged", diverged_at=57, n_loss_spikes=3
    )
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", runs, [0, 1, 2])))
    v = a["verdicts"]["rmsnorm-pre"]
    assert v["stability"] == "worse" and v["decision"] == "keep"
    assert a["recommendation"]["choice"] == "layernorm-pre"
    assert "less stable" in a["recommendation"]["headline"]
    assert "1 of 3 runs diverged" in a["recommendation"]["text"]
    assert a["arm_info"]["rmsnorm-pre"]["stability"]["diverged_at"] == {"2": 57}
    # the diverged run counts for spikes, not for quality
    assert a["arms"]["rmsnorm-pre"]["final_val_bpb"]["n"] == 2
    assert a["arms"]["rmsnorm-pre"]["n_loss_spikes"]["n"] == 3
    assert {"run_id": "rmsnorm-pre__s2", "reason": "diverged at step 57"}.items() <= next(
        r for r in a["runs"] if r["run_id"] == "rmsnorm-pre__s2"
    ).items()


def test_crashed_and_missing_runs_are_excluded_and_reported(tmp_path):
    ln = [3.40, 3.42, 3.39, 3.41]
    rms = [3.401, 3.419, 3.392, 3.409]
    runs = _pairs(ln, rms)
    runs[3] = _summary("rmsnorm-pre", 1, None, 0.0, status="crashed", error="RuntimeError: boom")
    runs[5] = _summary("rmsnorm-pre", 2, None, 0.0, status="unfinished")
    del runs[7]  # rmsnorm-pre seed 3 never started
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", runs, [0, 1, 2, 3])))
    excluded = {r["run_id"]: r["reason"] for r in a["excluded"]}
    assert excluded["rmsnorm-pre__s1"] == "crashed: RuntimeError: boom"
    assert excluded["rmsnorm-pre__s2"].startswith("unfinished")
    assert a["arm_info"]["rmsnorm-pre"]["seeds_missing"] == [1, 2, 3]
    assert a["comparisons"]["rmsnorm-pre"]["final_val_bpb"]["n_pairs"] == 1
    assert a["comparisons"]["rmsnorm-pre"]["final_val_bpb"]["seeds"] == [0]
    assert a["recommendation"]["choice"] == "undecided"
    json.dumps(a, allow_nan=False)  # the summary is strict JSON


def test_fixture_recommends_rmsnorm():
    a = analyze(load_compare_folder(FIXTURE))
    assert a["recommendation"]["choice"] == "rmsnorm-pre"
    assert a["arms"]["layernorm-pre"]["final_val_bpb"]["n"] == 3
    assert (
        a["arm_info"]["layernorm-pre"]["n_norm_params"]
        == 2 * a["arm_info"]["rmsnorm-pre"]["n_norm_params"]
    )


def test_not_a_compare_folder(tmp_path):
    with pytest.raises(CompareFolderError, match=r"no experiment\.json"):
        load_compare_folder(tmp_path)
    with pytest.raises(CompareFolderError, match="existing folder"):
        load_compare_folder(tmp_path / "nope")
    with pytest.raises(TypeError, match="out_dir"):
        load_compare_folder(42)  # type: ignore[arg-type]


def test_folder_without_finished_runs(tmp_path):
    out = tmp_path / "o"
    shutil.copytree(FIXTURE, out)
    for summary in (out / "runs").glob("*/summary.json"):
        summary.unlink()
    with pytest.raises(CompareFolderError, match="holds no finished run"):
        load_compare_folder(out)


def test_bad_experiment_json(tmp_path):
    (tmp_path / "experiment.json").write_text(json.dumps({"arms": ["a"], "baseline_arm": "b"}))
    with pytest.raises(CompareFolderError, match="'baseline_arm' must be one of"):
        load_compare_folder(tmp_path)
    (tmp_path / "experiment.json").write_text("[1, 2]")
    with pytest.raises(CompareFolderError, match="JSON object"):
        load_compare_folder(tmp_path)


def test_baseline_without_results_is_undecided(tmp_path):
    runs = _pairs([3.40, 3.42, 3.39], [3.401, 3.419, 3.392])
    runs = [
        {**r, "status": "crashed", "error": "boom"} if r["arm"] == "layernorm-pre" else r
        for r in runs
    ]
    a = analyze(load_compare_folder(_write_folder(tmp_path / "o", runs, [0, 1, 2])))
    assert a["recommendation"]["choice"] == "undecided"
    assert "baseline layernorm-pre has no result (3 crashed" in a["recommendation"]["headline"]


def test_arm_without_runs_and_stray_folders(tmp_path):
    root = _write_folder(
        tmp_path / "o", _pairs([3.40, 3.42, 3.39], [3.401, 3.419, 3.392]), [0, 1, 2]
    )
    exp = json.loads((root / "experiment.json").read_text())
    exp["arms"].append("dyt-pre")
    (root / "experiment.json").write_text(json.dumps(exp))
    (root / "runs" / "notes").mkdir()  # not a run: ignored
    a = analyze(load_compare_folder(root))
    assert a["verdicts"]["dyt-pre"]["decision"] == "undecided"
    assert a["arm_info"]["dyt-pre"]["seeds_missing"] == [0, 1, 2]
    assert a["recommendation"]["choice"] == "rmsnorm-pre"
    assert "dyt-pre still undecided" in a["recommendation"]["headline"]


# ----------------------------------------------------------------------------------------------
# Found in review, checked against scipy or a hand count
# ----------------------------------------------------------------------------------------------
# ---- whole folders -------------------------------------------------------------------------
def _review_summary(arm: str, seed: int, **extra) -> dict:
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
        runs.append(_review_summary("layernorm-pre", seed))
        bpb = 3.35 + 0.01 * seed + 0.001 * seed**2
        runs.append(
            _review_summary(
                "rmsnorm-pre", seed, final_val_bpb=bpb, best_val_bpb=bpb, n_loss_spikes=1
            )
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
        runs.append(_review_summary("layernorm-pre", seed))
        runs.append(_review_summary("rmsnorm-pre", seed, n_grad_spikes=1 + seed % 2))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(6)))
    a = analyze(load_compare_folder(folder))
    detail = a["verdicts"]["rmsnorm-pre"]["stability_detail"]
    assert detail["verdict"] == "worse"
    assert "more spikes in 6 of 6 paired seeds" in detail["reason"]
    assert "sign test p = 0.031" in detail["reason"]


def test_stability_reason_quotes_the_level_used(tmp_path):
    runs = []
    for seed in range(6):
        runs.append(_review_summary("layernorm-pre", seed))
        runs.append(_review_summary("rmsnorm-pre", seed, n_grad_spikes=1 + seed % 2))
    folder = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], list(range(6)))
    reason = analyze(load_compare_folder(folder), alpha=0.1)["verdicts"]["rmsnorm-pre"][
        "stability_detail"
    ]["reason"]
    assert "90% CI" in reason and "95%" not in reason


# ---- decision texts ------------------------------------------------------------------------
def _equivalent_quality(seed: int, arm: str, **extra) -> dict:
    bpb = 3.40 + 0.01 * seed + (0.001 * (seed % 2) if arm != "layernorm-pre" else 0.0)
    return _review_summary(arm, seed, final_val_bpb=bpb, best_val_bpb=bpb, **extra)


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
        runs.append(_review_summary("layernorm-pre", seed))
        runs.append(_review_summary("rmsnorm-pre", seed))
        runs.append(_review_summary("dyt-pre", seed, status="crashed", error="RuntimeError: boom"))
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
        runs.append(_review_summary("layernorm-pre", seed, time_to_target_s=base_t))
        arm_t = base_t * (0.9 + 0.001 * seed) if reached else None
        runs.append(_review_summary("rmsnorm-pre", seed, time_to_target_s=arm_t))
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
        runs.append(_review_summary("layernorm-pre", seed, time_to_target_s=base_t))
        runs.append(
            _review_summary("rmsnorm-pre", seed, time_to_target_s=base_t * (0.9 + 0.002 * seed))
        )
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

    runs = [
        _review_summary(arm, seed) for seed in (0, 1) for arm in ("layernorm-pre", "rmsnorm-pre")
    ]
    root = _write(tmp_path / "o", runs, ["layernorm-pre", "rmsnorm-pre"], [0, 1])
    copy = root / "runs" / "rmsnorm-pre__s0.bak"
    copy.mkdir()
    (copy / "summary.json").write_text(
        json.dumps(_review_summary("rmsnorm-pre", 0, final_val_bpb=9.0))
    )
    match = r"rmsnorm-pre__s0 and rmsnorm-pre__s0\.bak are both arm 'rmsnorm-pre', seed 0"
    with pytest.raises(CompareFolderError, match=match):
        load_compare_folder(root)
