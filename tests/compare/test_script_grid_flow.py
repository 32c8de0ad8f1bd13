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
from normlab.trackers import write_tensorboard

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
        "--log-to", "tensorboard", "--out", str(out),
    ]  # fmt: skip
    real = write_tensorboard.write_run

    def broken(run: Any, root: Path) -> str:
        if run.name == "b-pre__s1":
            raise RuntimeError("the event file's folder is read-only")
        return real(run, root)

    monkeypatch.setattr(write_tensorboard, "write_run", broken)
    result = _compare(*args)
    assert result.exit_code == 0, result.output
    assert "no margin" in result.output
    assert "b-pre__s1: export to tensorboard failed" in result.output
    analysis = json.loads((out / "summary.json").read_text())
    assert analysis["margin"] is None
    assert analysis["verdicts"]["b-pre"]["quality"] == "worse"
    assert "no equivalence margin was given" in (out / "report.md").read_text()
    sequential = json.loads((out / "sequential.json").read_text())
    assert sequential["plan"]["margin"] is None
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    assert sorted(record["exported"]["tensorboard"]) == ["a-pre__s0", "a-pre__s1", "b-pre__s0"]
    assert list(record["failed"]["tensorboard"]) == ["b-pre__s1"]
    events = sorted((out / TRACKERS_DIR / "tensorboard").glob("*/events.*"))
    assert [p.parent.name for p in events] == ["a-pre__s0", "a-pre__s1", "b-pre__s0"]
    # the same command again: nothing trains, the failed export is made, nothing is doubled
    monkeypatch.setattr(write_tensorboard, "write_run", real)
    result = _compare(*args, "--no-report")
    assert result.exit_code == 0, result.output
    assert "4 of 4 runs already done" in result.output
    record = json.loads((out / TRACKERS_DIR / TRACKERS_RECORD_FILE).read_text())
    assert len(record["exported"]["tensorboard"]) == 4 and record["failed"]["tensorboard"] == {}
    now = sorted((out / TRACKERS_DIR / "tensorboard").glob("*/events.*"))
    assert [p for p in now if p.parent.name != "b-pre__s1"] == events and len(now) == 4


def test_the_executor_hook_follows_each_run(tmp_path: Path, script: str) -> None:
    """What exports normlab's own runs as each ends: the executor calls the hook once a run's
    summary is written."""
    from normlab.experiment.config import ScriptConfig
    from normlab.experiment.execution.executors import run_grid
    from normlab.experiment.execution.lock import OutputLock
    from normlab.experiment.execution.script_grid import plan_script_runs

    cfg = ScriptConfig(command=script, metric="val_loss", norms=["a", "b"], seeds=1)
    (spec, _) = plan_script_runs(cfg, threads=1)
    seen: list[tuple[str, str]] = []

    def hook(run: str) -> None:
        seen.append((run, _summary(tmp_path, run)["status"]))

    with OutputLock(tmp_path):  # a worker trains only while its grid holds the folder
        summaries = run_grid([spec], tmp_path, show_progress=False, on_result=hook)
    assert seen == [("a-pre__s0", "finished")], summaries["a-pre__s0"]["error"]
    assert summaries["a-pre__s0"]["status"] == "finished"


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
