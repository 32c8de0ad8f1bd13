"""Helpers of the fault-injection suite (tests/faults): tiny configs, the CLI as a real process,
the workers of an output folder found through /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

SRC = Path(__file__).resolve().parents[2] / "src"

TINY: dict[str, Any] = {
    "threads": 1,
    "seeds": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"steps": 3, "batch_size": 2, "eval_interval": 3, "eval_windows": 4, "warmup": 1},
    "data": {"max_bytes": 8192},
}
"""Two runs (layernorm, rmsnorm) of three steps on an 8 KB corpus."""

LONG: dict[str, Any] = {
    **TINY,
    "train": {"steps": 400, "batch_size": 2, "eval_interval": 200, "eval_windows": 4, "warmup": 1},
}
"""Runs long enough (a few seconds each) to be caught while training."""


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def make_corpus(folder: Path) -> Path:
    """A small Python-like text corpus (about 11 KB) in ``folder``."""
    path = folder / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(400)))
    return path


def cli_env() -> dict[str, str]:
    """The environment of a ``python -m normlab`` child: this tree's sources first, wide lines
    (so that a one-line message stays one line)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLUMNS"] = "400"
    env["NO_COLOR"] = "1"
    return env


def normlab_args(*args: str | bytes) -> list[str | bytes]:
    return [sys.executable, "-m", "normlab", *args]


def run_cli(*args: str | bytes, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``normlab ARGS`` to its end; stdout and stderr together in ``.stdout``."""
    return subprocess.run(
        normlab_args(*args),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=timeout,
    )


def invoke(*args: str) -> tuple[int, str]:
    """``normlab ARGS`` in this process (wide lines, no colour): its exit status and output;
    fails the test on an uncaught exception."""
    from typer.testing import CliRunner

    from normlab.cli import app

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400", "NO_COLOR": "1"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {result.exception!r}:\n{result.output}")
    return result.exit_code, result.output


STARTED: list[subprocess.Popen[str]] = []
"""Every process :func:`start_cli` started (killed after each test if still running)."""


def start_cli(*args: str | bytes) -> subprocess.Popen[str]:
    """Start ``normlab ARGS`` in its own session (a signal sent to it reaches only it)."""
    proc = subprocess.Popen(
        normlab_args(*args),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def worker_pids(out: Path) -> list[int]:
    """The pids of live worker processes (their command line runs the bootstrap on a run folder
    of ``out``), whoever their parent is now."""
    needle = str(out).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"bootstrap.py" in cmdline and needle in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def no_workers_left(out: Path, timeout: float = 15.0) -> None:
    """Assert that every worker of ``out`` is gone within ``timeout`` seconds (and kill any
    left, so that a failing test leaves nothing behind)."""
    try:
        wait_for(lambda: not worker_pids(out), timeout, f"the workers of {out} to exit")
    finally:
        for pid in worker_pids(out):
            os.kill(pid, signal.SIGKILL)


def training_started(out: Path) -> bool:
    return any(p.stat().st_size > 0 for p in (out / "runs").glob("*/metrics.jsonl"))


def assert_clean_error(text: str, *expected: str) -> None:
    """No traceback; the ``error:`` line says each of ``expected``; it is one line."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "error:" in line]
    assert lines, text
    for part in expected:
        assert any(part in line for line in lines), text


def train_steps(metrics: Path) -> list[int]:
    import json

    steps = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("type") == "train":
                steps.append(record["step"])
    return steps


def assert_runs_complete_without_duplicates(out: Path, steps: int) -> None:
    """Every run finished, and its metrics hold each training step exactly once."""
    import json

    runs = sorted((out / "runs").iterdir())
    assert runs
    for run in runs:
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        assert summary["status"] == "finished", summary
        found = train_steps(run / "metrics.jsonl")
        assert len(found) == len(set(found)), f"{run.name}: a step was recorded twice"
        assert sorted(found) == found and len(found) == steps, (run.name, found)
