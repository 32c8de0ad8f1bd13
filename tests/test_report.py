"""The report builds from the stored compare-folder fixture, and `normlab report` drives it."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normlab.analysis import CompareFolderError
from normlab.cli import app
from normlab.report import build_report

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
    assert result.exit_code == 2
    assert "not a 'normlab compare' output folder" in result.output


def test_cli_rejects_a_folder_without_finished_runs(tmp_path):
    out = tmp_path / "empty"
    shutil.copytree(FIXTURE, out)
    for summary in (out / "runs").glob("*/summary.json"):
        summary.unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 2
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
