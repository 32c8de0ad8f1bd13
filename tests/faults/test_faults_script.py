"""``normlab compare --script``: a user's script that fails in any way is recorded as such and
named in the terminal and the report; none of them yields a silent verdict.

One grid holds every fault as an arm (the script reads its behaviour from ``{norm}``): exits
non-zero, hangs past ``--run-timeout``, never calls ``finish``, logs NaN; a second grid's arms
start from different parameters at one seed (the pairing guard) and have hostile names.

The scripts are processes of their own; the command runs in this process (through Typer's
runner) and each run's worker is a thread of it (:mod:`in_process`): neither boundary is what
these tests are about, and a fresh interpreter for each cost most of their time. The report's
figures are drawn, not rendered (:mod:`report_figures`): its text is what is checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from faultlib import cli_env
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.cli import app
from report_figures import skip_rendering

SCRIPT = """
import sys, time
norm, seed, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if norm == "exits":
    sys.stderr.write("loading the data\\nValueError: no such shard: shard-7\\n")
    sys.exit(3)
if norm == "hangs":
    time.sleep(600)
import torch
from torch import nn
import normlab.track

run = normlab.track.init(norm=norm, seed=seed, run_dir=out)
open(run.run_dir / "argv.json", "w").write(__import__("json").dumps(sys.argv[1:]))
torch.manual_seed(seed + (1 if norm.startswith("b") and seed == 1 else 0))
model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))
g = torch.Generator().manual_seed(100 + seed)
x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
run.fingerprint(model, (x, y))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 6):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(step, loss=float("nan") if norm == "nan" and step == 3 else loss, tokens=32)
run.log_eval(5, val_loss=((model(x) - y) ** 2).mean())
if norm != "nofinish":
    run.finish()
"""


RUN_TIMEOUT = 30
"""Seconds: long enough for a healthy script (torch's import included) on a busy machine."""


def _compare(monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """``normlab compare ARGS`` in this process (with the environment a ``normlab`` child gets,
    which the scripts inherit), its runs' workers in threads, its report's figures not
    rendered; its output."""
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    return CliRunner().invoke(app, ["compare", *args], env=cli_env()).output


def _summaries(out: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / "summary.json").read_text()) for p in (out / "runs").iterdir()}


def test_every_failing_script_is_recorded_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    text = _compare(
        monkeypatch,
        "--script",
        f"{sys.executable} {script} {{norm}} {{seed}} {{run_dir}}",
        "--metric", "val_loss", "--margin", "0.01",
        "--norms", "ok,exits,hangs,nofinish,nan",
        "--seeds", "1", "--parallel", "3", "--threads", "1",
        "--run-timeout", str(RUN_TIMEOUT),
        "--out", str(out),
    )  # fmt: skip
    s = _summaries(out)
    assert s["ok-pre__s0"]["status"] == "finished"
    assert s["nan-pre__s0"]["status"] == "diverged" and s["nan-pre__s0"]["diverged_at"] == 3
    exits = s["exits-pre__s0"]
    assert exits["status"] == "crashed" and "exit status 3" in exits["error"]
    assert "no such shard: shard-7" in exits["error"] + exits["traceback"]
    hangs = s["hangs-pre__s0"]
    assert hangs["status"] == "crashed" and "timed out" in hangs["error"]
    assert f"--run-timeout {RUN_TIMEOUT}" in hangs["error"]
    nofinish = s["nofinish-pre__s0"]
    assert nofinish["status"] == "crashed" and "without calling finish()" in nofinish["error"]
    for run_id in ("exits-pre__s0", "hangs-pre__s0", "nofinish-pre__s0"):
        assert run_id in text  # the terminal names each run with its outcome
    assert "diverged at step 3" in text
    report = (out / "report.md").read_text()
    for words in ("exit status 3", "timed out", "without calling finish()", "diverged"):
        assert words in report, words
    # the broken arms have no result to pair: none of them gets a quality verdict
    verdicts = json.loads((out / "summary.json").read_text())["verdicts"]
    for arm in ("exits-pre", "hangs-pre", "nofinish-pre"):
        assert verdicts.get(arm, {}).get("quality") not in ("equivalent", "better", "worse")


def test_unpaired_seed_is_refused_and_hostile_names_stay_literal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    hostile_a, hostile_b = "a;touch PWNED", "b$(touch PWNED2)"
    text = _compare(
        monkeypatch,
        "--script",
        f"{sys.executable} {script} {{norm}} {{seed}} {{run_dir}}",
        "--metric", "val_loss", "--margin", "0.01",
        "--norms", f"{hostile_a},{hostile_b}",
        "--seeds", "2", "--parallel", "2", "--threads", "1",
        "--out", str(out),
    )  # fmt: skip
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    s = _summaries(out)
    run_a0 = out / "runs" / f"{hostile_a}-pre__s0"
    assert json.loads((run_a0 / "argv.json").read_text())[0] == hostile_a
    assert s[f"{hostile_a}-pre__s0"]["status"] == "finished"
    assert s[f"{hostile_b}-pre__s0"]["status"] == "finished"
    for arm in (hostile_a, hostile_b):
        refused = s[f"{arm}-pre__s1"]
        assert refused["status"] == "crashed"
        assert "pairing guard: seed 1 refused" in refused["error"]
        assert "initial values of the parameter '0.bias'" in refused["error"]
    assert "seed 1 refused" in text and "'0.bias'" in text
    report = (out / "report.md").read_text()
    assert "seed 1 refused" in report
    verdict = json.loads((out / "summary.json").read_text())["verdicts"][f"{hostile_b}-pre"]
    assert verdict["n_pairs"] == 1  # seed 0 only: the refused seed is not judged
