"""``normlab compare --script`` end to end with a script that needs only the standard library:
``--until-decided`` without ``--margin`` (no arm can be called equivalent) exporting to the
trackers as it goes, and ``--plan`` whose runs, trained one by one with ``--run``, still pass
the pairing guard."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from normlab.cli import app
from normlab.run_format import TRACKERS_DIR, TRACKERS_RECORD_FILE
from normlab.trackers import write_mlflow

SCRIPT = """
import json, os, sys
norm, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
unpaired = len(sys.argv) > 4 and norm == "b"
value = 2.0 + 0.01 * seed + (0.5 if norm == "b" else 0.0)
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    for step in (1, 2, 3):
        f.write(json.dumps({"type": "train", "step": step, "loss": value + 1 / step}) + "\\n")
    f.write(json.dumps({"type": "eval", "step": 3, "val_loss": value}) + "\\n")
with open(os.path.join(out, "fingerprint.json"), "w") as f:
    json.dump({"parameters": {"w": "9" if unpaired else "1"}, "batch": "B"}, f)
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"status": "finished", "final_val_loss": value, "best_val_loss": value}, f)
"""
"""Arm b's val_loss is 0.5 above arm a's at every seed; with a fifth argument, arm b records
other initial parameters than arm a (an unpaired seed)."""


def _compare(*args: str) -> Any:
    return CliRunner().invoke(app, ["compare", *args])


def _summary(out: Path, run: str) -> dict[str, Any]:
    return json.loads((out / "runs" / run / "summary.json").read_text())


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    monkeypatch.setenv("COLUMNS", "400")
    return f"{sys.executable} {path} {{norm}} {{seed}} {{run_dir}}"


def test_until_decided_without_margin_exports_as_it_goes(
    tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "mine"
    args = [
        "--script", script, "--norms", "a,b", "--metric", "val_loss", "--seeds", "2",
        "--until-decided", "--max-seeds", "3", "--threads", "1", "--parallel", "2",
        "--log-to", "tensorboard,mlflow", "--out", str(out),
    ]  # fmt: skip

    def broken(run: Any, root: Path) -> str:
        raise RuntimeError("the MLflow store is read-only")

    monkeypatch.setattr(write_mlflow, "write_run", broken)
    result = _compare(*args)
    assert result.exit_code == 0, result.output
    assert "no margin" in result.output
    assert "b-pre__s1: export to mlflow failed" in result.output
    analysis = json.loads((out / "summary.json").read_text())
    assert analysis["margin"] is None
    assert analysis["verdicts"]["b-pre"]["quality"] == "worse"
    report = (out / "report.md").read_text()
    assert "no equivalence margin was given" in report
    sequential = json.loads((out / "sequential.json").read_text())
    assert sequential["plan"]["margin"] is None
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    runs = ["a-pre__s0", "a-pre__s1", "b-pre__s0", "b-pre__s1"]
    assert sorted(record["exported"]["tensorboard"]) == runs
    assert sorted(record["failed"]["mlflow"]) == runs
    events = sorted((out / TRACKERS_DIR / "tensorboard").glob("*/events.*"))
    assert [p.parent.name for p in events] == runs
    # the same command again: nothing trains, the failed exports are made, nothing is doubled
    monkeypatch.undo()
    monkeypatch.setenv("COLUMNS", "400")
    result = _compare(*args, "--no-report")
    assert result.exit_code == 0, result.output
    assert "4 of 4 runs already done" in result.output
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    assert sorted(record["exported"]["mlflow"]) == runs and record["failed"]["mlflow"] == {}
    assert sorted((out / TRACKERS_DIR / "tensorboard").glob("*/events.*")) == events


def test_planned_runs_trained_one_by_one_pass_the_pairing_guard(
    tmp_path: Path, script: str
) -> None:
    out = tmp_path / "planned"
    result = _compare(
        "--script", f"{script} unpaired", "--norms", "a,b", "--metric", "val_loss",
        "--seeds", "1", "--threads", "1", "--log-to", "tensorboard", "--plan", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    first = _compare("--out", str(out), "--run", "a-pre__s0")
    assert first.exit_code == 0, first.output
    assert _summary(out, "a-pre__s0")["status"] == "finished"  # its seed is not complete yet
    last = _compare("--out", str(out), "--run", "b-pre__s0")
    assert last.exit_code == 3, last.output
    assert "pairing guard: seed 0 refused" in last.output
    for run in ("a-pre__s0", "b-pre__s0"):
        summary = _summary(out, run)
        assert summary["status"] == "crashed"
        assert "initial values of the parameter 'w' differ" in summary["error"]
    assert not (out / TRACKERS_DIR / "tensorboard").exists()  # a refused seed is not exported
