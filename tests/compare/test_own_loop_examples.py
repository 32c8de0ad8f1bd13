"""The own-loop examples run as docs/own-loop.md says: each under ``normlab compare --script``, two
arms of one seed, a couple of steps. Both arms finish with the metric compare judges, and the
pairing guard accepts the seed (the examples' arms start alike everywhere but the norms).

The examples' full budgets are timed in docs/results.md, not here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.cli import app
from normlab.run_format import FINISHED
from normlab.run_format.folder import read_fingerprint, read_summary, run_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "own_loop"


@pytest.mark.parametrize("example", ["plain_loop.py", "hf_trainer.py", "lightning_module.py"])
def test_an_own_loop_example_is_judged_by_compare(
    example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    monkeypatch.chdir(tmp_path)  # nothing the example writes lands outside its run folder
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    script = f"{sys.executable} {EXAMPLES / example} --norm {{norm}} --seed {{seed}}"
    script += " --out {run_dir} --steps 2"
    result = CliRunner().invoke(
        app,
        [
            "compare", "--script", script, "--norms", "layernorm,rmsnorm", "--seeds", "1",
            "--metric", "val_loss", "--margin", "0.1", "--run-timeout", "120", "--no-report",
            "--out", str(out),
        ],
        env={**env, "COLUMNS": "400", "NO_COLOR": "1"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    prints = []
    for arm in ("layernorm-pre", "rmsnorm-pre"):
        folder = run_dir(out, f"{arm}__s0")
        summary = read_summary(folder)
        assert summary is not None and summary["status"] == FINISHED, summary
        assert summary["final_val_loss"] > 0
        prints.append(read_fingerprint(folder))
    assert prints[0] is not None and prints[0] == prints[1]  # the same start in both arms
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
