"""Train one run as a command and wait for it: a plain child process, or N ranks under torchrun.

:func:`launch_run` is what every executor calls for a run it does not train in a ``spawn``
worker of its own: the local executor for a run on several processes, a Ray task, and
``normlab compare --run``. The run's ``scale`` record (``run.json``) says how many processes;
``python -m normlab.experiment.execution.rank_entry RUN_DIR`` is started once (one process) or
under torchrun (:func:`normlab.distributed.launch`; DDP, or FSDP2). Progress is read from the run's
``metrics.jsonl`` as rank 0 writes it. A run whose command fails without a summary (a crashed
rank, a killed process) gets a ``crashed`` summary naming the failed rank and its error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.distributed import LaunchResult, Layout, launch
from normlab.experiment.training.train import RunAborted
from normlab.run_format.folder import MetricsTail, read_run_config, read_summary
from normlab.run_format.summary import record_crash

__all__ = [
    "SUPERVISOR_ENV",
    "WORKER_ENV",
    "WORKER_MODULE",
    "launch_run",
    "launched_worker_main",
    "layout_of",
    "worker_env",
    "world_size_of",
]

WORKER_MODULE = "normlab.experiment.execution.rank_entry"
TORCHRUN_DIR = "torchrun"
"""torchrun's logs of a run on several processes, in its run folder."""
POLL_S = 0.2

SUPERVISOR_ENV = "NORMLAB_SUPERVISOR_PID"
"""The process that waits for a run started as a command; the run stops (unfinished) when it is
gone, as a worker whose grid process is gone does."""

WORKER_ENV = {
    # glibc: never return large blocks to the OS with mmap/munmap or trimming, so big tensors
    # are not page-faulted in afresh on every step.
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
}


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a run's process(es): :data:`WORKER_ENV` and ``threads`` OpenMP / MKL
    threads."""
    return {**WORKER_ENV, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def layout_of(spec: dict[str, Any]) -> Layout:
    """The torchrun layout of the run config ``spec`` (its ``scale`` record; one process when
    it has none)."""
    launch_rec = spec.get("scale") or {}
    return Layout(
        int(launch_rec.get("nproc_per_node", 1)),
        int(launch_rec.get("nnodes", 1)),
        int(os.environ.get("NORMLAB_NODE_RANK", "0")),
        launch_rec.get("rdzv_endpoint"),
        bool(launch_rec.get("fsdp", False)),
    )


def world_size_of(spec: dict[str, Any]) -> int:
    """N = processes of the run ``spec`` (1 without a ``scale`` record)."""
    launch_rec = spec.get("scale") or {}
    return int(launch_rec.get("nproc_per_node", 1)) * int(launch_rec.get("nnodes", 1))


def launch_run(
    run_dir: Path,
    on_step: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Train the run in ``run_dir`` (its ``run.json``) in child process(es), wait, and return
    its summary, writing a ``crashed`` one when the command left none.

    ``on_step(step)`` gets rank 0's progress; ``should_stop()`` is polled and raises
    :class:`RunAborted` (the children stop by themselves once this process is gone, see
    :data:`SUPERVISOR_ENV`). ``timeout_s`` bounds a torchrun
    launch.
    """
    run_dir = Path(run_dir)
    spec = read_run_config(run_dir)
    layout = layout_of(spec)
    env = {**worker_env(int(spec["threads"])), SUPERVISOR_ENV: str(os.getpid())}
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            if layout.world_size == 1:
                cmd = [sys.executable, "-m", WORKER_MODULE, str(run_dir)]
                proc = subprocess.run(cmd, env={**os.environ, **env}, check=False)
                outcome["returncode"] = proc.returncode
            else:
                outcome["result"] = launch(
                    WORKER_MODULE,
                    [str(run_dir)],
                    layout,
                    log_dir=run_dir / TORCHRUN_DIR,
                    env=env,
                    timeout_s=timeout_s,
                )
        except BaseException as err:  # reported as the run's crash
            outcome["error"] = err

    thread = threading.Thread(target=target, name=f"launch-{spec['run_id']}", daemon=True)
    thread.start()
    tail = MetricsTail(run_dir)
    while thread.is_alive():
        thread.join(POLL_S)
        if on_step is not None:
            on_step(tail.poll())
        if should_stop is not None and should_stop():
            raise RunAborted("the grid's process is gone")
    if on_step is not None:
        on_step(tail.poll())
    try:
        summary = read_summary(run_dir)
    except ValueError as err:  # written by the run itself: its crash, naming the file
        return record_crash(run_dir, spec, f"the run left a damaged summary: {err}", "")
    if summary is not None:
        return summary
    return record_crash(run_dir, spec, *_failure(outcome, layout))


def _failure(outcome: dict[str, Any], layout: Layout) -> tuple[str, str]:
    """(error, trace) of a command that left no summary."""
    if "error" in outcome:
        err = outcome["error"]
        return f"{type(err).__name__}: {err}", repr(err)
    result: LaunchResult | None = outcome.get("result")
    if result is None:
        code = outcome.get("returncode")
        return (
            f"the run's process exited with code {code} without a summary",
            f"exit code {code} (a negative code is the signal that ended it)",
        )
    lines = result.error.strip().splitlines()
    last = lines[-1] if lines else f"torchrun exited with code {result.returncode}"
    rank = "a rank" if result.failed_rank is None else f"rank {result.failed_rank}"
    timed = " (timed out)" if result.timed_out else ""
    return (
        f"{rank} of {layout.world_size} failed{timed}: {last}",
        f"{result.error}\n(torchrun logs in {result.log_dir})",
    )


def launched_worker_main(run_dir: str, progress: Any, go: Any) -> None:
    """The local executor's process for a run on several processes: wait for ``go``, then
    :func:`launch_run`, reporting ``("step", n)`` on ``progress``; stops when the grid's process
    is gone."""
    parent = os.getppid()

    def orphaned() -> bool:
        return os.getppid() != parent

    while not go.wait(0.5):
        if orphaned():
            sys.exit(130)
    last = [0]

    def on_step(step: int) -> None:
        if step != last[0]:
            last[0] = step
            progress.put(("step", step))

    try:
        launch_run(Path(run_dir), on_step, orphaned)
    except (RunAborted, KeyboardInterrupt):
        sys.exit(130)
