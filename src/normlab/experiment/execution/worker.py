"""One run in its own process: train, write ``summary.json``, record a crash as a result.

:func:`serve_run` is the body of a worker process started by the runner through
:mod:`normlab.experiment.execution.bootstrap`.
:func:`execute_run` is the same work in the calling process (used by tests and debugging).
:func:`rank_main` (``python -m normlab.experiment.execution.rank_entry RUN_DIR``) is the entry
point of a
run started as a command: one plain process (a Ray task's child), or each rank under torchrun.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.experiment.execution.launching import SUPERVISOR_ENV, launch_run, world_size_of
from normlab.experiment.execution.lock import is_locked
from normlab.experiment.execution.script_run import run_script
from normlab.experiment.training.train import RunAborted, train_run
from normlab.run_format.folder import read_run_config
from normlab.run_format.summary import crashed_summary, finish_run

__all__ = ["execute_run", "rank_main", "serve_run"]


def execute_run(
    run_dir: Path,
    on_step: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    wait_for_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Train the run in ``run_dir`` (from its ``run.json``) and write its ``summary.json``: with
    normlab's loop, or, for a run with a ``script`` section, by running the user's script
    (:func:`normlab.experiment.execution.script_run.run_script`).

    The callbacks go to :func:`normlab.experiment.training.train.train_run`.

    Any exception becomes a ``"crashed"`` summary with the traceback; only :class:`RunAborted`
    and ``KeyboardInterrupt`` leave the run without a summary (unfinished, redone on a re-run).
    """
    run_dir = Path(run_dir)
    spec = read_run_config(run_dir)
    try:
        for module in spec.get("imports", []):
            importlib.import_module(module)
        train = run_script if "script" in spec else train_run  # a user's script, or ours
        summary = train(spec, run_dir, on_step, should_stop, wait_for_start)
    except RunAborted:
        raise
    except Exception as err:
        summary = crashed_summary(spec, f"{type(err).__name__}: {err}", traceback.format_exc())
    return finish_run(run_dir, summary)


def serve_run(run_dir: str, parent: int, progress_fd: int) -> int:
    """Worker process body (after :mod:`normlab.experiment.execution.bootstrap` bound it to
    ``parent``):
    set the run up, wait for the runner's ``go`` line on standard input, train, writing each
    finished step as ``"N\\n"`` to the file descriptor ``progress_fd``. Returns the exit status.

    The worker stops (exit 130, no summary, so a re-run redoes the run) as soon as its parent is
    gone (``getppid()`` changed, or standard input closed: the runner's end of the pipe dies with
    it), and before training it refuses unless the output folder's lock is held (its owner, the
    parent, still running): a worker never trains into a folder that no command owns."""
    gone = threading.Event()
    go = threading.Event()

    def listen() -> None:
        # os.read on the descriptor, not sys.stdin: a daemon thread blocked inside a buffered
        # reader holds its lock, and the interpreter then aborts at exit ("could not acquire
        # lock for <stdin> at interpreter shutdown")
        pending = b""
        with contextlib.suppress(OSError):  # no standard input at all: as if it closed
            while chunk := os.read(0, 64):
                pending += chunk
                if b"go" in pending.split(b"\n"):
                    go.set()
        gone.set()  # end of input: the parent closed the pipe or died
        go.set()

    threading.Thread(target=listen, name="normlab-go", daemon=True).start()
    os.set_blocking(progress_fd, False)

    def orphaned() -> bool:
        return gone.is_set() or os.getppid() != parent

    def on_step(step: int) -> None:
        # the runner is behind (pipe full): progress is advisory, drop this one
        with contextlib.suppress(BlockingIOError):
            os.write(progress_fd, f"{step}\n".encode())

    def wait_for_start() -> None:
        while not go.wait(0.5):
            if orphaned():
                raise RunAborted("the grid's process is gone")
        if orphaned():
            raise RunAborted("the grid's process is gone")
        out = Path(run_dir).parent.parent
        if not is_locked(out):
            raise RunAborted(f"no command holds the lock of {str(out)!r}; not training")

    try:
        if world_size_of(read_run_config(run_dir)) > 1:  # one run on several processes
            wait_for_start()
            launch_run(Path(run_dir), on_step, orphaned)
        else:
            execute_run(Path(run_dir), on_step, orphaned, wait_for_start)
    except (RunAborted, KeyboardInterrupt):
        return 130
    except (OSError, MemoryError) as err:  # e.g. a full disk while writing the summary
        reason = err.strerror if isinstance(err, OSError) and err.strerror else repr(err)
        where = f" ({err.filename!r})" if isinstance(err, OSError) and err.filename else ""
        sys.stderr.write(f"normlab: run {Path(run_dir).name}: {reason}{where}\n")
        return 1
    return 0


def _supervisor_gone() -> Callable[[], bool]:
    """A check that the supervising process (:data:`SUPERVISOR_ENV`) has ended: when it is this
    process's parent, that the parent changed (exact, even before the dead parent is reaped);
    otherwise (a torchrun rank, whose parent is torchrun's agent) that it no longer exists or is
    a zombie. Never true without the variable."""
    raw = os.environ.get(SUPERVISOR_ENV, "")
    pid = int(raw) if raw.isdigit() else 0
    parent = os.getppid()

    def gone() -> bool:
        if pid <= 0:
            return False
        if pid == parent:
            return os.getppid() != parent
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2 :].startswith("Z")

    return gone


def _rank_main(argv: list[str]) -> int:
    """Train the run whose folder is ``argv[0]``. One process (no torchrun environment): as
    :func:`execute_run` (a failure becomes a ``crashed`` summary). Under torchrun: every rank
    trains its shard and rank 0 writes ``summary.json``; an exception propagates, so that
    torchrun records the rank's error and stops the others (the launcher writes the crashed
    summary)."""
    if len(argv) != 1:
        print("usage: python -m normlab.experiment.execution.rank_entry RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    gone = _supervisor_gone()
    if "WORLD_SIZE" not in os.environ:
        try:
            execute_run(run_dir, should_stop=gone)
        except (RunAborted, KeyboardInterrupt):
            return 130
        return 0
    from normlab.distributed import exit_rank, teardown

    spec = read_run_config(run_dir)
    for module in spec.get("imports", []):
        importlib.import_module(module)
    try:
        summary = train_run(spec, run_dir, should_stop=gone)
        if summary:  # rank 0
            finish_run(run_dir, summary)
    finally:
        teardown()
    exit_rank()  # done and on disk: skip the interpreter's shutdown (see exit_rank)


def rank_main(argv: list[str] | None = None) -> int:
    """``python -m normlab.experiment.execution.rank_entry RUN_DIR``; under torchrun wrapped in
    :func:`torch.distributed.elastic.multiprocessing.errors.record`, so a failing rank's
    traceback reaches the launcher."""
    from torch.distributed.elastic.multiprocessing.errors import record

    args = list(sys.argv[1:] if argv is None else argv)
    return record(_rank_main)(args)
