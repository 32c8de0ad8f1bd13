"""Report edge cases found in review: short or non-finite curves, labels that follow α."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from normlab.analysis import analyze, load_compare_folder
from normlab.report import build_report
from normlab.report.curves import load_run_curves, moving_average
from normlab.report.plots import figure_png, plot_grad_norm, plot_training_loss
from normlab.report.style import arm_colors

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
ARMS = ("layernorm-pre", "rmsnorm-pre")
GOOD = {
    "final_val_bpb": 3.5,
    "best_val_bpb": 3.5,
    "final_train_loss": 2.4,
    "tokens_per_s": 30000.0,
    "peak_memory_bytes": 2**29,
    "n_loss_spikes": 0,
    "n_grad_spikes": 0,
}


def _train(steps: range, loss: float = 3.0) -> list[dict]:
    return [
        {"type": "train", "step": i, "loss": loss - 1e-3 * i, "grad_norm": 1.0 + 1e-3 * i}
        for i in steps
    ]


def _folder(root: Path, runs: list[tuple[str, int, dict, list[dict]]], seeds: list[int]) -> Path:
    root.mkdir(parents=True)
    exp = {"arms": list(ARMS), "baseline_arm": ARMS[0], "seeds": seeds, "margin_bpb": 0.02}
    (root / "experiment.json").write_text(json.dumps(exp))
    for arm, seed, summary, records in runs:
        run = root / "runs" / f"{arm}__s{seed}"
        run.mkdir(parents=True)
        ident = {"run_id": run.name, "arm": arm, "seed": seed}
        (run / "run.json").write_text(json.dumps(ident))
        (run / "summary.json").write_text(json.dumps({**ident, "status": "finished", **summary}))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


# ---- moving average and curves --------------------------------------------------------------


def test_moving_average_keeps_the_length_of_a_series_shorter_than_the_window():
    values = np.array([3.0, 2.0, np.nan])
    out = moving_average(values, 7)
    assert out.shape == values.shape
    assert out[0] == pytest.approx(2.5) and out[1] == pytest.approx(2.5) and np.isnan(out[2])
    assert moving_average(np.array([4.0]), 9).tolist() == [4.0]


def test_moving_average_is_the_centred_mean_of_the_finite_values():
    values = np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0])
    out = moving_average(values, 3)
    expected = [1.5, 1.5, np.nan, 4.5, 5.0, 5.5]
    np.testing.assert_allclose(out, expected)


def test_report_builds_when_a_run_diverges_long_before_the_others_end(tmp_path):
    """The smoothing window follows the longest run (600 steps: 7); a run that diverged at step
    3 has fewer points than the window and must still be drawn, not crash the report."""
    long = _train(range(1, 601))
    diverged = [*_train(range(1, 3)), {"type": "train", "step": 3, "loss": None}]
    runs = [
        (ARMS[0], 0, GOOD, long),
        (ARMS[1], 0, {"status": "diverged", "diverged_at": 3}, diverged),
        (ARMS[0], 1, GOOD, long),
        (ARMS[1], 1, GOOD, long),
    ]
    out = _folder(tmp_path / "o", runs, [0, 1])
    written = build_report(out)
    assert "plots/training_loss.png" in written and "plots/grad_norm.png" in written


def test_non_finite_numbers_in_metrics_become_nan(tmp_path):
    out = tmp_path / "o"
    shutil.copytree(FIXTURE, out)
    path = out / "runs" / "rmsnorm-pre__s1" / "metrics.jsonl"
    text = path.read_text().replace('"loss": 4.', '"loss": Infinity, "x": 4.', 1)
    path.write_text(text.replace('"grad_norm": 2.', '"grad_norm": -Infinity, "y": 2.', 1))
    folder = load_compare_folder(out)
    run = next(r for r in folder.runs if r.run_id == "rmsnorm-pre__s1")
    curves = load_run_curves(run)
    assert not np.isinf(curves.train_loss).any() and np.isnan(curves.train_loss).sum() == 1
    assert not np.isinf(curves.grad_norm).any() and np.isnan(curves.grad_norm).sum() == 1
    by_arm = {arm: [load_run_curves(r) for r in folder.runs_of(arm)] for arm in folder.arms}
    colors = arm_colors(folder.arms)
    assert figure_png(plot_training_loss(by_arm, colors))[:4] == b"\x89PNG"
    assert figure_png(plot_grad_norm(by_arm, colors, 1.0))[:4] == b"\x89PNG"


# ---- labels follow the analysis ------------------------------------------------------------


def test_report_method_quotes_the_level_used(tmp_path):
    from normlab.report.content import build_content

    out = tmp_path / "o"
    shutil.copytree(FIXTURE, out)
    folder = load_compare_folder(out)
    a = analyze(folder, alpha=0.10)
    content = build_content(folder, a, None, [])
    method = " ".join(content.method)
    assert "90% interval of the difference excludes zero" in method
    assert "95%" not in method
    assert content.verdict_table.columns[1] == "Δ final val bpb [90% CI]"
    assert content.stats_table.columns[4] == "vs baseline: Δ or ratio [90% CI]"
    assert math.isclose(a["alpha"], 0.10)


def test_an_arm_that_never_reached_the_target_still_shows_its_verdict(tmp_path):
    """Six seeds: the baseline reaches the target loss in each, rmsnorm in none. The sign test
    calls rmsnorm slower (6 of 6, p = 0.031); the metrics table must show that row even though
    rmsnorm has no time to average."""
    from normlab.report.content import build_content

    runs = []
    for seed in range(6):
        runs.append((ARMS[0], seed, {**GOOD, "time_to_target_s": 10.0 + seed}, []))
        runs.append((ARMS[1], seed, {**GOOD, "time_to_target_s": None}, []))
    folder = load_compare_folder(_folder(tmp_path / "o", runs, list(range(6))))
    a = analyze(folder)
    assert a["comparisons"][ARMS[1]]["time_to_target_s"]["verdict"] == "worse"
    table = build_content(folder, a, None, []).stats_table
    rows = [r for r in table.rows if r[1] == ARMS[1]]
    target = [r for r in rows if r[-1] == "worse"]
    assert len(target) == 1 and target[0][2] == "—" and target[0][3] == "0"
    # the same p adjusted over the arm's 8 tested metrics (the others are all p = 1 here)
    assert target[0][5] == "sign test p = 0.031 (Holm = 0.250)"


def test_a_metric_the_same_in_every_seed_reads_exact_not_p_zero(tmp_path):
    """Bytes saved for the backward do not vary with the seed: the table shows the exact ratio
    without a p-value, and Holm's adjustment of the arm's other metrics does not count it."""
    from normlab.report.content import build_content

    runs = []
    for seed in range(3):
        base = {**GOOD, "final_val_bpb": 3.5 + 0.01 * seed, "saved_activation_bytes": 2_000_000}
        # 5 % fewer bytes: above the 1 % that matters for bytes (wording.SMALLEST)
        arm = {**base, "final_val_bpb": 3.49 + 0.013 * seed, "saved_activation_bytes": 1_900_000}
        runs.append((ARMS[0], seed, base, []))
        runs.append((ARMS[1], seed, arm, []))
    folder = load_compare_folder(_folder(tmp_path / "o", runs, [0, 1, 2]))
    a = analyze(folder)
    saved = a["comparisons"][ARMS[1]]["saved_activation_bytes"]
    assert saved["verdict"] == "better" and saved["p_value"] is None and saved["p_holm"] is None
    assert saved["ratio"] == pytest.approx(0.95)
    table = build_content(folder, a, None, []).stats_table
    row = next(r for r in table.rows if r[1] == ARMS[1] and r[-1] == "better")
    assert row[5] == "exact (same in every seed)"
