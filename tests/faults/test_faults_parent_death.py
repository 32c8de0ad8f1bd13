"""Issue 17, item 1: a compare killed at any phase leaves no worker behind, and an immediate
rerun finishes every run with each step recorded once; SIGTERM is handled like Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faultlib import (
    LONG,
    SRC,
    assert_runs_complete_without_duplicates,
    no_workers_left,
    run_cli,
    start_cli,
    training_started,
    wait_for,
    worker_pids,
    write_config,
)

from normlab.experiment.execution import bootstrap
from normlab.experiment.execution.lock import OutputLock, is_locked

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")


def _kill(proc: subprocess.Popen[str], sig: int) -> str:
    os.kill(proc.pid, sig)
    output, _ = proc.communicate(timeout=60)
    return output


def test_a_worker_whose_parent_is_already_gone_exits_before_importing_anything(
    tmp_path: Path,
) -> None:
    # the pid passed is not the parent's: as if the parent died before the worker's first line
    script = SRC / "normlab" / "experiment" / "execution" / "bootstrap.py"
    result = subprocess.run(
        [sys.executable, str(script), str(os.getpid() + 1_000_000), str(tmp_path), "1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == bootstrap.EXIT_ORPHANED, result.stderr


def test_is_locked_tells_whether_a_command_owns_the_folder(tmp_path: Path) -> None:
    assert not is_locked(tmp_path)
    with OutputLock(tmp_path):
        assert is_locked(tmp_path)
    assert not is_locked(tmp_path)
    assert not is_locked(tmp_path / "gone")  # no folder: nobody owns it


def test_kill_9_at_every_phase_leaves_no_worker_and_a_rerun_records_each_step_once(
    tmp_path: Path, corpus: Path
) -> None:
    config = write_config(tmp_path / "long.yaml", LONG)
    out = tmp_path / "out"
    args = ("compare", "--config", str(config), "--data", str(corpus), "--out", str(out))
    args += ("--no-report",)  # the runs are the subject; a report would only add its figures

    # 1. while preparing (the lock is taken, no worker yet)
    proc = start_cli(*args)
    wait_for(lambda: (out / ".lock").exists(), 120, "the lock")
    _kill(proc, signal.SIGKILL)
    no_workers_left(out)

    # 2. during a worker's start-up (its imports), before it trains
    proc = start_cli(*args)
    wait_for(lambda: bool(worker_pids(out)), 120, "a worker to start")
    _kill(proc, signal.SIGKILL)
    no_workers_left(out)

    # 3. while training (a run has written metrics; the next worker waits in standby)
    proc = start_cli(*args)
    wait_for(lambda: training_started(out) or proc.poll() is not None, 180, "training")
    assert proc.poll() is None, "the compare ended before it could be killed while training"
    _kill(proc, signal.SIGKILL)
    no_workers_left(out)

    # an immediate rerun resumes: every run finished, no step recorded twice
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout
    assert_runs_complete_without_duplicates(out, LONG["train"]["steps"])


def test_sigterm_exits_143_with_a_message_and_stops_the_workers(
    tmp_path: Path, corpus: Path
) -> None:
    config = write_config(tmp_path / "long.yaml", LONG)
    out = tmp_path / "out"
    proc = start_cli("compare", "--config", str(config), "--data", str(corpus), "--out", str(out))
    wait_for(lambda: bool(worker_pids(out)), 120, "a worker to start")
    output = _kill(proc, signal.SIGTERM)
    assert proc.returncode == 143, output
    assert "Traceback" not in output, output
    assert "terminated: finished runs are kept in" in output, output
    no_workers_left(out, timeout=5)
