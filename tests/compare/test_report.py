"""The report builds from the stored compare-folder fixture, and `normlab report` drives it."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from normlab.analysis import CompareFolderError, analyze, load_compare_folder
from normlab.cli import app
from normlab.report import build_report
from normlab.report.curves import load_run_curves, moving_average
from normlab.report.plots import figure_png, plot_grad_norm, plot_training_loss
from normlab.report.style import arm_colors

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
PLOTS = ("paired_comparison", "training_loss", "val_bpb", "grad_norm", "final_metrics")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    out = tmp_path_factory.mktemp("report") / "compare_run"
    shutil.copytree(FIXTURE, out)
    return out, build_report(out)


def test_writes_every_file(built):
    out, written = built
    expected = {"summary.json", "runs.csv", "report.md", "report.html"}
    expected |= {f"plots/{name}.png" for name in PLOTS}
    assert set(written) == expected
    for rel, path in written.items():
        assert path == out / rel and path.stat().st_size > 0
        if rel.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.rglob("*.tmp")), "a temporary file was left behind"


def test_summary_json_parses_and_holds_the_verdict(built):
    out, _ = built
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline_arm"] == "layernorm-pre"
    assert summary["margin_bpb"] == 0.02
    assert summary["recommendation"]["choice"] == "rmsnorm-pre"
    stats = summary["arms"]["rmsnorm-pre"]["final_val_bpb"]
    assert {"mean", "std", "n", "values"} <= set(stats) and stats["n"] == 3
    comp = summary["comparisons"]["rmsnorm-pre"]["final_val_bpb"]
    keys = {"mean_diff", "ci_low", "ci_high", "p_value", "n_pairs", "equivalent", "verdict"}
    assert keys | {"seeds_needed"} <= set(comp)


def test_runs_csv_has_one_row_per_run(built):
    out, _ = built
    with (out / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    assert {r["run_id"] for r in rows} == {
        f"{arm}__s{s}" for arm in ("layernorm-pre", "rmsnorm-pre") for s in (0, 1, 2)
    }
    assert all(r["status"] == "finished" for r in rows)
    assert float(rows[0]["final_val_bpb"]) > 0
    spikes = {r["run_id"]: int(r["n_loss_spikes"]) for r in rows}
    assert spikes["rmsnorm-pre__s1"] == 1


def test_html_is_self_contained_and_in_reading_order(built):
    out, _ = built
    html = (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recommendation"]["headline"] in html
    assert html.count("data:image/png;base64,") == len(PLOTS)
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html), "external resource found"
    assert "http://" not in html and "https://" not in html
    order = [
        html.index('class="verdict status-switch"'),
        html.index('id="setup"'),
        html.index("Parameters per arm"),
        html.index('id="plot-training_loss"'),
        html.index('id="plot-grad_norm"'),
        html.index('id="runs"'),
        html.index('id="environment"'),
    ]
    assert order == sorted(order)
    # the runs table lists every run, with its status
    runs_section = html[html.index('id="runs"') : html.index('id="environment"')]
    assert runs_section.count('<span class="badge b-good">finished</span>') == 6
    # what was held fixed, parameter counts and the environment are there
    assert "train.grad_clip" in html and "869,504" in html and "2.13.0" in html


def test_markdown_links_the_plots(built):
    out, _ = built
    md = (out / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert sorted(links) == sorted(f"plots/{name}.png" for name in PLOTS)
    assert all((out / link).is_file() for link in links)
    assert md.index("Recommendation") < md.index("## What was compared") < md.index("## Runs")


def _break_runs(out: Path) -> None:
    """Make rmsnorm-pre seed 2 diverge at step 31 and layernorm-pre seed 1 crash."""
    run = out / "runs" / "rmsnorm-pre__s2"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kept = [r for r in records if r["step"] <= 30]
    kept.append({"type": "train", "step": 31, "loss": None, "grad_norm": None, "clipped": True})
    kept.append({"type": "anomaly", "step": 31, "kind": "nonfinite_loss", "value": None, "z": None})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    summary = json.loads((run / "summary.json").read_text())
    summary.update(status="diverged", diverged_at=31, steps=31, final_val_bpb=None)
    (run / "summary.json").write_text(json.dumps(summary))
    crashed = out / "runs" / "layernorm-pre__s1" / "summary.json"
    summary = json.loads(crashed.read_text())
    summary = {k: summary[k] for k in ("run_id", "arm", "seed", "norm", "placement")}
    summary.update(status="crashed", error="RuntimeError: out of memory", traceback="...")
    crashed.write_text(json.dumps(summary))


def test_diverged_and_crashed_runs_are_reported(tmp_path):
    out = tmp_path / "broken"
    shutil.copytree(FIXTURE, out)
    _break_runs(out)
    build_report(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdicts"]["rmsnorm-pre"]["stability"] == "worse"
    assert summary["recommendation"]["choice"] == "layernorm-pre"
    html = (out / "report.html").read_text()
    assert '<tr class="diverged">' in html and '<tr class="crashed">' in html
    assert "diverged at step 31" in html
    assert "crashed: RuntimeError: out of memory" in html
    with (out / "runs.csv").open(newline="") as f:
        status = {r["run_id"]: r["status"] for r in csv.DictReader(f)}
    assert status["rmsnorm-pre__s2"] == "diverged" and status["layernorm-pre__s1"] == "crashed"


def test_cli_rebuilds_the_report(tmp_path):
    out = tmp_path / "cli"
    shutil.copytree(FIXTURE, out)
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert "Use rmsnorm-pre" in result.output
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()


def test_cli_rejects_a_folder_that_is_not_a_compare_folder(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1  # refused: the folder cannot be used
    assert "not a 'normlab compare' output folder" in result.output


def test_cli_rejects_a_folder_without_finished_runs(tmp_path):
    out = tmp_path / "empty"
    shutil.copytree(FIXTURE, out)
    for summary in (out / "runs").glob("*/summary.json"):
        summary.unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 1
    assert "holds no finished run" in result.output
    with pytest.raises(CompareFolderError, match="holds no finished run"):
        build_report(out)


def test_runs_without_per_step_metrics_still_report(tmp_path):
    out = tmp_path / "no_metrics"
    shutil.copytree(FIXTURE, out)
    for metrics in (out / "runs").glob("*/metrics.jsonl"):
        metrics.unlink()
    written = build_report(out)
    assert set(written) >= {"plots/paired_comparison.png", "plots/final_metrics.png"}
    assert "plots/training_loss.png" not in written
    assert "Some per-step curves are missing" in (out / "report.html").read_text()


# ----------------------------------------------------------------------------------------------
# Found in review: short series, diverged runs, non-finite metrics, verdict wording
# ----------------------------------------------------------------------------------------------
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
        # 5 % fewer bytes: above the 1 % that matters for bytes (analysis.smallest.SMALLEST)
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
