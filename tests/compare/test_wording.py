"""The rule from numbers to words (analysis.wording) on hand-made summaries: every case users
found contradicting the numbers beside it, and the report built from a folder with a failed arm."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from normlab.analysis import analyze, compare_paired, load_compare_folder
from normlab.analysis.learning import RunLearning, arm_failed, classify_losses
from normlab.analysis.smallest import smallest_for
from normlab.analysis.wording import (
    Smallest,
    decision_badge,
    judge,
    judge_in_analysis,
)

BASE = "layernorm-pre"


# ---- practical significance -----------------------------------------------------------------


def test_bytes_identical_in_every_seed_and_tiny_are_not_worse():
    """2,304 bytes more in 20 million (0.011 %), the same in every seed: exact, but far below
    the 1 % that matters for bytes: equivalent, not a red 'worse'."""
    base = [20_000_000.0] * 3
    arm = [20_002_304.0] * 3
    c = compare_paired(arm, base, lower_is_better=True, scale="ratio")
    assert c.verdict == "worse"  # the raw comparison still records the exact sign
    j = judge(c, "saved_activation_bytes", lower_is_better=True, scale="ratio")
    assert j.word == "equivalent" and not j.practical
    assert "same in every seed" in j.reason and "0.0115 %" in j.reason


def test_bytes_identical_in_every_seed_and_large_are_worse():
    c = compare_paired([21_000_000.0] * 3, [20_000_000.0] * 3, lower_is_better=True, scale="ratio")
    assert judge(c, "saved_activation_bytes", lower_is_better=True, scale="ratio").word == "worse"


def test_significant_speedup_below_two_percent_is_not_faster():
    base = np.array([30_000.0, 30_100.0, 29_900.0, 30_050.0, 29_950.0])
    c = compare_paired(base * 1.005, base, lower_is_better=False, scale="ratio")
    assert c.verdict == "better"
    j = judge(c, "tokens_per_s", lower_is_better=False, scale="ratio")
    assert j.word == "equivalent" and j.word not in ("better", "worse")


def test_detectable_but_maybe_unimportant_reads_unclear_size():
    """Estimate below δ, interval reaching past it: neither better nor equivalent."""
    d = np.array([-0.004, -0.012, -0.006, -0.010])
    c = compare_paired(3.4 + d, np.full(4, 3.4), lower_is_better=True)
    assert c.verdict == "better"
    j = judge(c, "x", lower_is_better=True, smallest=Smallest("absolute", 0.01))
    assert j.word == "unclear size" and j.significant and not j.practical


def test_loss_difference_above_the_margin_is_better():
    d = np.array([-0.05, -0.052, -0.049, -0.051])
    c = compare_paired(3.4 + d, np.full(4, 3.4), lower_is_better=True, margin=0.02)
    j = judge(c, "final_val_bpb", lower_is_better=True, margin=0.02, primary=True)
    assert j.word == "better" and j.practical


def test_smallest_difference_per_metric():
    assert smallest_for("peak_memory_bytes").kind == "relative"
    assert smallest_for("final_val_bpb").resolve(0.02) == pytest.approx(0.02)
    assert smallest_for("final_train_loss").resolve(0.02) == pytest.approx(0.02 * math.log(2))
    assert smallest_for("final_train_loss", "dit").resolve(0.002) == pytest.approx(0.002)
    assert smallest_for("outlier_channels").resolve(None) == 1.0


# ---- multiplicity ---------------------------------------------------------------------------


def test_raw_p_that_does_not_survive_holm_is_not_worse():
    """DiT outlier count: p = 0.006 raw, Holm-adjusted 0.094: 'unconfirmed', not red 'worse'."""
    c = {
        "n_pairs": 5,
        "test": "paired t-test on x − y",
        "mean_diff": 4.0,
        "ci_low": 1.9,
        "ci_high": 6.1,
        "p_value": 0.006,
        "margin": None,
        "verdict": "worse",
    }
    j = judge(c, "outlier_channels", lower_is_better=True, p_holm=0.094)
    assert j.word == "unconfirmed" and not j.significant
    assert "Holm-adjusted p = 0.094" in j.reason
    assert judge(c, "outlier_channels", lower_is_better=True, p_holm=0.03).word == "worse"


def test_primary_quality_metric_uses_its_own_test():
    c = {
        "n_pairs": 4,
        "test": "paired t-test on x − y",
        "mean_diff": -0.05,
        "ci_low": -0.06,
        "ci_high": -0.04,
        "p_value": 0.001,
        "margin": 0.02,
        "verdict": "better",
    }
    j = judge(c, "final_val_bpb", lower_is_better=True, margin=0.02, p_holm=0.2, primary=True)
    assert j.word == "better"


# ---- intervals and words --------------------------------------------------------------------


def test_interval_excluding_zero_is_never_no_detectable_difference():
    """Post-LN gradient spikes: mean −2.67, 95 % CI [−4.10, −1.23], sign test p = 0.25."""
    c = compare_paired([1.0, 0.0, 2.0], [4.0, 3.0, 4.0], lower_is_better=True, discrete=True)
    assert c.ci_high < 0 and c.verdict == "inconclusive"
    j = judge(c, "n_grad_spikes", lower_is_better=True)
    assert j.word == "unconfirmed"
    assert "excludes zero" in j.reason and "sign test" in j.reason


def test_interval_including_zero_is_never_a_difference():
    """A sign test significant on many small wins while the t-interval spans zero."""
    c = {
        "n_pairs": 8,
        "test": "exact sign test on x − y",
        "mean_diff": -0.5,
        "ci_low": -1.6,
        "ci_high": 0.6,
        "p_value": 0.008,
        "margin": None,
        "verdict": "better",
    }
    j = judge(c, "n_loss_spikes", lower_is_better=True)
    assert j.word not in ("better", "worse")
    c2 = compare_paired([3.9, 2.9, 3.6], [3.40, 3.40, 3.40], lower_is_better=True, margin=None)
    assert judge(c2, "final_sample_sw2", lower_is_better=True).word == "no detectable difference"


def test_fewer_than_two_pairs_is_inconclusive():
    c = compare_paired([1.0], [2.0], lower_is_better=True)
    assert judge(c, "act_kurtosis_max", lower_is_better=True).word == "inconclusive"


# ---- failed arms ----------------------------------------------------------------------------


def test_failed_arm_secondary_metrics_are_not_comparable_never_better():
    """DyT stuck at the unigram level: lower kurtosis and max|x|/RMS describe a model that
    learned nothing."""
    c = compare_paired([3.1, 3.0, 3.2], [40.0, 38.0, 45.0], lower_is_better=True)
    assert c.verdict == "better"
    for metric in ("act_kurtosis_max", "act_max_over_rms", "outlier_channels", "ptq_w8a8_delta"):
        j = judge(c, metric, lower_is_better=True, arm_failed=True)
        assert j.word == "not comparable" and "failed to learn" in j.reason
    assert judge(c, "act_kurtosis_max", lower_is_better=True, baseline_failed=True).word == (
        "not comparable"
    )


def test_never_reaching_the_target_is_worse_not_inconclusive():
    c = {"n_pairs": 0, "test": "paired t-test on ln(x / y)", "verdict": "inconclusive"}
    j = judge(
        c,
        "time_to_target_s",
        lower_is_better=True,
        scale="ratio",
        never_reached=True,
        arm_failed=True,
    )
    assert j.word == "worse" and "never reached" in j.reason


def test_learning_outcomes_from_curves():
    steps = np.arange(1, 501)
    healthy = 5.5 * np.exp(-steps / 80) + 2.4 - 0.3 * steps / 500
    stalled = np.where(steps < 50, 5.5 - 2.0 * steps / 50, 3.47)
    flat = np.full(500, 5.5) - 0.001 * steps / 500
    assert classify_losses(healthy).outcome == "learned"
    assert classify_losses(stalled).outcome == "stalled"
    assert classify_losses(flat).outcome == "not learning"
    assert classify_losses(stalled, reference=3.47).outcome == "not learning"
    assert classify_losses([1.0, 2.0]).outcome == "unknown"
    with pytest.raises(ValueError, match="min_drop"):
        classify_losses(healthy, min_drop=2.0)
    learned = [RunLearning("learned", 5.5, 3.0, 2.4)] * 3
    stalls = [RunLearning("stalled", 5.5, 3.47, 3.47)] * 3
    assert arm_failed(stalls, learned) and not arm_failed(learned, stalls)
    assert not arm_failed(stalls, stalls)  # both flat: the task converges early
    one_diverged = [RunLearning("diverged", None, None, None), *learned[:2]]
    assert not arm_failed(one_diverged, learned)


# ---- badges ---------------------------------------------------------------------------------


def test_badges_name_the_recommendation_not_an_action():
    assert decision_badge("rms", "rms", "switch") == "recommended"
    assert decision_badge(BASE, BASE, "keep") == "recommended"
    assert decision_badge("dyt", "rms", "keep", failed=True) == "failed"
    assert decision_badge("post", BASE, "keep", stability="worse") == "less stable"
    assert decision_badge("x", BASE, "keep", quality="worse") == "worse quality"
    assert decision_badge("y", BASE, "keep", quality="equivalent", throughput="slower") == "slower"
    assert decision_badge("z", "undecided", "undecided") == "undecided"
    assert decision_badge("w", BASE, "either", quality="equivalent") == "no gain"
    assert decision_badge("v", "rms", "switch", quality="better") == "runner-up"
    words = {
        decision_badge("a", "b", d, quality=q, stability=s, throughput=t, failed=f)
        for d in ("switch", "keep", "either", "undecided")
        for q in ("better", "worse", "equivalent", "inconclusive")
        for s in ("better", "worse", "similar")
        for t in ("faster", "slower", "same speed")
        for f in (False, True)
    }
    assert not words & {"keep", "switch", "either"}


# ---- end to end: a folder with a stalled arm and a failed one --------------------------------


def _summary(arm: str, seed: int, bpb: float, **extra) -> dict:
    s = {
        "run_id": f"{arm}__s{seed}",
        "arm": arm,
        "seed": seed,
        "norm": arm.split("-")[0],
        "placement": arm.split("-")[1],
        "status": "finished",
        "diverged_at": None,
        "steps": 200,
        "n_params": 1000,
        "n_norm_params": 100,
        "final_val_bpb": bpb,
        "best_val_bpb": bpb,
        "final_train_loss": bpb * 0.69,
        "tokens_per_s": 30_000.0 * (1 + 0.003 * seed),
        "peak_memory_bytes": 2**29,
        "saved_activation_bytes": 20_000_000,
        "n_loss_spikes": 0,
        "n_grad_spikes": 0,
        "n_clipped": 0,
        "time_to_target_s": 10.0 + seed,
        "act_kurtosis_max": 40.0 + seed,
        "act_max_over_rms": 30.0 + seed,
    }
    s.update(extra)
    return s


def _write(root: Path, runs: list[tuple[dict, np.ndarray]], seeds: list[int]) -> Path:
    arms = list(dict.fromkeys(s["arm"] for s, _ in runs))
    exp = {"arms": arms, "baseline_arm": BASE, "seeds": seeds, "margin_bpb": 0.02}
    root.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps(exp))
    for s, losses in runs:
        run = root / "runs" / s["run_id"]
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({k: s[k] for k in ("run_id", "arm", "seed")}))
        (run / "summary.json").write_text(json.dumps(s))
        lines = [
            json.dumps({"type": "train", "step": i + 1, "loss": float(v)})
            for i, v in enumerate(losses)
        ]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_report_words_for_a_failed_arm(tmp_path):
    from normlab.report.content import build_content

    steps = np.arange(1, 201)
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(3):
        noise = 0.01 * rng.standard_normal(200)
        good = 5.5 * np.exp(-steps / 30) + 2.3 - 0.2 * steps / 200 + noise
        stuck = np.where(steps < 20, 5.5 - 2.0 * steps / 20, 3.47) + noise
        runs.append((_summary(BASE, seed, 3.40 + 0.01 * seed), good))
        runs.append(
            (
                _summary(
                    "rmsnorm-pre",
                    seed,
                    3.401 + 0.01 * seed,
                    tokens_per_s=33_000.0 * (1 + 0.003 * seed),
                ),
                good,
            )
        )
        dyt = _summary(
            "dyt-pre",
            seed,
            5.0 + 0.001 * seed,
            time_to_target_s=None,
            act_kurtosis_max=3.1 + 0.01 * seed,
            act_max_over_rms=4.0 + 0.1 * seed,
            saved_activation_bytes=20_002_304,
        )
        runs.append((dyt, stuck))
    folder = load_compare_folder(_write(tmp_path / "o", runs, [0, 1, 2]))
    a = analyze(folder)
    v = a["verdicts"]["dyt-pre"]
    assert v["stability"] == "worse" and v["stability_detail"]["failed"]
    assert "failed to learn" in v["reason"] and "3 stalled" in v["stability_text"]
    for metric in ("act_kurtosis_max", "act_max_over_rms"):
        assert judge_in_analysis(a, "dyt-pre", metric).word == "not comparable"
    assert judge_in_analysis(a, "dyt-pre", "time_to_target_s").word == "worse"
    # a failed arm's loss and speed are still its own: compared, not hidden
    assert judge_in_analysis(a, "dyt-pre", "best_val_bpb").word == "worse"
    assert judge_in_analysis(a, "dyt-pre", "tokens_per_s").word != "not comparable"
    assert judge_in_analysis(a, "rmsnorm-pre", "saved_activation_bytes").word == "equivalent"

    content = build_content(folder, a, None, [])
    stats_words = {(r[1], r[-1]) for r in content.stats_table.rows}
    assert ("dyt-pre", "better") not in stats_words
    assert ("dyt-pre", "not comparable") in stats_words
    badges = {row[0]: row[-1] for row in content.verdict_table.rows}
    assert badges["dyt-pre"] == "failed"
    assert badges["rmsnorm-pre"] == "recommended"
    assert {d for _, d, _ in content.arm_details} <= {"recommended", "failed"}


# ---- one vocabulary: the words and the colours of the report's badges ------------------------


def test_every_word_the_analysis_gives_has_its_tone_and_the_report_colours_by_it(tmp_path):
    """Each word a verdict, decision, badge or run status can be carries one declared tone, and
    the HTML report's badge class is that tone: a word added to the analysis without a tone
    would show as a grey fact, so every word met in real reports is listed here."""
    from normlab.analysis.wording import BAD, GOOD, NEUTRAL, OPEN, WORD_TONES, tone
    from normlab.report.html import _badge

    judged = {
        "better", "worse", "equivalent", "inconclusive", "unconfirmed", "unclear size",
        "no detectable difference", "not comparable",
    }  # fmt: skip
    badges = {"recommended", "failed", "undecided", "less stable", "worse quality", "slower"}
    badges |= {"runner-up", "no gain"}
    speed_memory = {"faster", "slower", "same speed", "less", "more", "same"}
    decisions = {"switch", "keep", "either", "undecided"}
    stability_and_looks = {"similar", "open", "not determined"}
    statuses = {"finished", "diverged", "crashed", "unfinished"}
    for word in judged | badges | speed_memory | decisions | stability_and_looks | statuses:
        assert word in WORD_TONES, word
        assert f'class="badge b-{tone(word)}"' in _badge(word.upper())
    assert set(WORD_TONES.values()) == {GOOD, BAD, OPEN, NEUTRAL}
    assert tone("Better") == GOOD and tone(" crashed ") == BAD and tone("unfinished") == OPEN
    assert tone("runner-up") == NEUTRAL and tone("a sentence") == NEUTRAL
    a = analyze(load_compare_folder(Path(__file__).parent / "fixtures" / "compare_run"))
    for arm in a["verdicts"]:
        v = a["verdicts"][arm]
        for word in (v["quality"], v["throughput"], v["memory"], v["decision"], v["stability"]):
            assert word in WORD_TONES, word


# ---- the rules of analysis.wording, one by one -----------------------------------------------


def test_a_paired_verdict_is_equivalent_first_then_the_sign_of_a_significant_difference():
    from normlab.analysis.wording import paired_verdict

    def verdict(equivalent: bool, significant: bool, effect: float | None, lower: bool) -> str:
        return paired_verdict(
            equivalent=equivalent, significant=significant, effect=effect, lower_is_better=lower
        )

    assert verdict(True, True, -1.0, True) == "equivalent"
    assert verdict(False, True, -1.0, True) == "better"
    assert verdict(False, True, -1.0, False) == "worse"
    assert verdict(False, True, 2.0, False) == "better"
    assert verdict(False, False, -1.0, True) == "inconclusive"
    assert verdict(False, True, None, True) == "inconclusive"


def test_the_decision_takes_the_first_rule_that_applies():
    from normlab.analysis.wording import arm_decision

    def decision(**words) -> str:
        base = {"quality": "better", "speed": "faster", "stability": "similar", "failed": False}
        return arm_decision("a", "b", "validation bpb", **{**base, **words})[0]

    assert decision(failed=True, stability="worse") == "keep"
    assert decision(stability="worse") == "keep"  # better quality does not make up for it
    assert decision(quality="worse", stability="better") == "keep"
    assert decision() == "switch"
    assert decision(quality="inconclusive", stability="better") == "switch"
    assert decision(quality="equivalent") == "switch"
    assert decision(quality="equivalent", speed="slower") == "keep"
    for speed in ("same speed", "inconclusive", "no detectable difference"):
        assert decision(quality="equivalent", speed=speed) == "either"
    assert decision(quality="unclear size") == "undecided"
    assert arm_decision(
        "a", "b", "bpb", quality="equivalent", speed="inconclusive", stability="", failed=False
    )[1] == ("a is equivalent in quality; its speed could not be compared")


def test_stability_reads_learning_then_divergence_then_spikes():
    from normlab.analysis.wording import stability_word

    def word(**kw) -> tuple[str, str]:
        base = dict(
            arm_share=0.0,
            baseline_share=0.0,
            failed=False,
            baseline_failed=False,
            spikes_verdict="inconclusive",
            spikes_low=-1.0,
            spikes_high=1.0,
        )
        return stability_word(**{**base, **kw})

    assert word(arm_share=None) == ("inconclusive", "no result")
    assert word(failed=True, arm_share=0.0, baseline_share=0.5) == ("worse", "learning")
    assert word(baseline_failed=True) == ("better", "learning")
    assert word(arm_share=1 / 3, spikes_verdict="better") == ("worse", "divergence")
    assert word(baseline_share=1 / 3) == ("better", "divergence")
    assert word(spikes_verdict="worse") == ("worse", "spikes")
    assert word(spikes_low=0.3, spikes_high=2.0) == ("inconclusive", "unconfirmed")
    assert word() == ("similar", "similar")


def test_a_sequential_look_stays_open_until_the_last_look():
    from normlab.analysis.wording import closed, sequential_word, still_open

    def word(n: int = 5, eq: bool = False, sig: bool = False, last: bool = False) -> str:
        return sequential_word(
            n_pairs=n,
            equivalent=eq,
            significant=sig,
            effect=0.01,
            lower_is_better=True,
            last_look=last,
        )

    assert word(n=1, eq=True, last=True) == "open"  # no look under two pairs
    assert word(eq=True, sig=True) == "equivalent"
    assert word(sig=True) == "worse"
    assert word() == "open" and word(last=True) == "inconclusive"
    assert still_open(False) == "open" and still_open(True) == "inconclusive"
    assert closed("open") == "inconclusive" and closed("better") == "better"


def test_the_recommendation_ranks_switches_by_quality_then_stability_then_speed():
    from types import SimpleNamespace

    from normlab.analysis.wording import recommendation

    def arm(decision: str, quality: str = "equivalent", stability: str = "similar"):
        return SimpleNamespace(decision=decision, quality=quality, stability=stability)

    gains = {"q": -0.05, "q2": -0.08, "s": -0.1, "f": 0.0, "f2": 0.0}
    speeds = {"q": 1.0, "q2": 1.0, "s": 1.0, "f": 1.1, "f2": 1.3}
    arms = {
        "f": arm("switch"),
        "f2": arm("switch"),
        "s": arm("switch", "inconclusive", "better"),
        "q": arm("switch", "better"),
        "q2": arm("switch", "better"),
    }

    def choose(names: list[str], **kw) -> tuple[str, str]:
        chosen = {n: arms[n] for n in names}
        return recommendation("b", chosen, gains.get, speeds.get, **kw)

    assert choose(["f", "s", "q", "q2"]) == ("q2", "switch")  # the largest quality gain
    assert choose(["f", "f2", "s"]) == ("s", "switch")  # then more stable
    assert choose(["f", "f2"]) == ("f2", "switch")  # then the fastest
    assert choose(["q"], baseline_has_result=False) == ("undecided", "undecided")
    assert recommendation("b", {}, gains.get, speeds.get) == ("b", "keep")
    mixed = {"u": arm("undecided"), "e": arm("either"), "k": arm("keep")}
    assert recommendation("b", mixed, gains.get, speeds.get) == ("undecided", "undecided")
    mixed.pop("u")
    assert recommendation("b", mixed, gains.get, speeds.get) == ("b", "either")
    mixed.pop("e")
    assert recommendation("b", mixed, gains.get, speeds.get) == ("b", "keep")


def test_a_script_or_import_margin_reaches_the_arm_line(tmp_path: Path) -> None:
    """An imported (or ``--script``) comparison keeps its margin under ``margin``, not a
    testbed's own key: the arm's line (judge_in_analysis) must judge the quality metric with
    it, as the verdict does, so the two never disagree (a difference of +0.002 that excludes
    zero but lies well inside ±0.02 is "equivalent" in both, not "worse" in one)."""
    from typer.testing import CliRunner

    from normlab.cli import app

    rows = [
        {"run": f"{arm}_s{seed}", "step": 5, "metric": "val_loss",
         "value": 2.0 + 0.01 * seed + (0.002 + 0.0001 * seed if arm == "rms" else 0.0)}
        for arm in ("ln", "rms")
        for seed in range(3)
    ]  # fmt: skip
    source = tmp_path / "runs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "imported"
    result = CliRunner().invoke(app, [
        "report", "--import", f"jsonl:{source}", "--arm-from", r"^(.+)_s\d+$",
        "--seed-from", r"_s(\d+)$", "--metric", "val_loss", "--margin", "0.02",
        "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    a = analyze(load_compare_folder(out))
    quality = a["quality_metric"]
    assert a["verdicts"]["rms"]["quality"] == "equivalent"
    assert judge_in_analysis(a, "rms", quality).word == "equivalent"
