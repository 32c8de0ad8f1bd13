"""One run in its own process: train, write ``summary.json``, record a crash as a result.

:func:`worker_main` is the target of a ``spawn`` process started by the runner.
:func:`execute_run` is the same work in the calling process (used by tests and debugging).
:func:`rank_main` (``python -m normlab.experiment.rank_entry RUN_DIR``) is the entry point of a
run started as a command: one plain process (a Ray task's child), or each rank under torchrun.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab._io import write_json_atomic
from normlab.experiment.train import RunAborted, train_run
from normlab.run_format import (
    CRASHED,
    DONE_STATUSES,
    RUN_FILE,
    SUMMARY_FILE,
    testbed_format,
)

__all__ = [
    "DONE_STATUSES",
    "RUN_FILE",
    "SUMMARY_FIELDS",
    "SUMMARY_FILE",
    "crashed_summary",
    "execute_run",
    "rank_main",
    "read_spec",
    "summary_fields",
    "worker_main",
]

SUMMARY_FIELDS: tuple[str, ...] = testbed_format("gpt").summary_fields
"""The fields of a GPT run's summary; a DiT run's has its own validation fields instead of
``final_val_loss``, ``final_val_bpb``, ``best_val_bpb`` (see :func:`summary_fields`)."""


def summary_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The fields of the summary of the run ``spec``, in order (its testbed's
    :attr:`normlab.run_format.TestbedFormat.summary_fields`). Raises ``ValueError`` when
    ``spec`` names an unknown testbed."""
    return testbed_format(spec.get("testbed")).summary_fields


def crashed_summary(spec: dict[str, Any], error: str, trace: str) -> dict[str, Any]:
    """The summary of a run that raised: identity from ``spec``, metrics null, the error kept."""
    try:
        fields = summary_fields(spec)
    except ValueError:  # a run.json naming an unknown testbed still gets a crashed summary
        fields = SUMMARY_FIELDS
    summary: dict[str, Any] = dict.fromkeys(fields)
    for key in ("run_id", "arm", "seed", "norm", "placement", "n_params", "n_norm_params"):
        summary[key] = spec.get(key)
    summary.update(
        status=CRASHED,
        device=spec.get("device"),
        threads=spec.get("threads"),
        data_fingerprint=spec.get("data", {}).get("fingerprint"),
        target_val_loss=spec.get("train", {}).get("target_val_loss"),
        error=error,
        traceback=trace,
    )
    return summary


def read_spec(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / RUN_FILE).read_text(encoding="utf-8"))


def execute_run(
    run_dir: Path,
    on_step: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    wait_for_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Train the run in ``run_dir`` (from its ``run.json``) and write its ``summary.json``.

    The callbacks go to :func:`normlab.experiment.train.train_run`.

    Any exception becomes a ``"crashed"`` summary with the traceback; only :class:`RunAborted`
    and ``KeyboardInterrupt`` leave the run without a summary (unfinished, redone on a re-run).
    """
    run_dir = Path(run_dir)
    spec = read_spec(run_dir)
    try:
        for module in spec.get("imports", []):
            importlib.import_module(module)
        summary = train_run(spec, run_dir, on_step, should_stop, wait_for_start)
    except RunAborted:
        raise
    except Exception as err:
        summary = crashed_summary(spec, f"{type(err).__name__}: {err}", traceback.format_exc())
    write_json_atomic(run_dir / SUMMARY_FILE, summary)
    return summary


def worker_main(run_dir: str, progress: Any, go: Any) -> None:
    """Process entry point: set the run up, wait until the ``go`` event is set, train, reporting
    ``("step", n)`` on the ``progress`` queue. Stops if the parent process goes away (the worker
    would otherwise train on, unsupervised)."""
    parent = os.getppid()

    def orphaned() -> bool:
        return os.getppid() != parent

    def on_step(step: int) -> None:
        progress.put(("step", step))

    def wait_for_start() -> None:
        while not go.wait(0.5):
            if orphaned():
                raise RunAborted("the grid's process is gone")

    try:
        execute_run(Path(run_dir), on_step, orphaned, wait_for_start)
    except (RunAborted, KeyboardInterrupt):
        sys.exit(130)


SUPERVISOR_ENV = "NORMLAB_SUPERVISOR_PID"
"""The process that waits for a run started as a command; the run stops (unfinished) when it is
gone, as a worker whose grid process is gone does."""


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
        print("usage: python -m normlab.experiment.rank_entry RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    gone = _supervisor_gone()
    if "WORLD_SIZE" not in os.environ:
        try:
            execute_run(run_dir, should_stop=gone)
        except (RunAborted, KeyboardInterrupt):
            return 130
        return 0
    from normlab.distributed import teardown

    spec = read_spec(run_dir)
    for module in spec.get("imports", []):
        importlib.import_module(module)
    try:
        summary = train_run(spec, run_dir, should_stop=gone)
        if summary:  # rank 0
            write_json_atomic(run_dir / SUMMARY_FILE, summary)
    finally:
        teardown()
    return 0


def rank_main(argv: list[str] | None = None) -> int:
    """``python -m normlab.experiment.rank_entry RUN_DIR``; under torchrun wrapped in
    :func:`torch.distributed.elastic.multiprocessing.errors.record`, so a failing rank's
    traceback reaches the launcher."""
    from torch.distributed.elastic.multiprocessing.errors import record

    args = list(sys.argv[1:] if argv is None else argv)
    return record(_rank_main)(args)
