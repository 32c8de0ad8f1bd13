"""A stand-in for a run's worker process that trains the run in a thread of the test's process.

A worker process costs a fresh interpreter that imports torch (seconds per run); a test of what
the grid does with its runs (a ladder's rungs, until-decided rounds, a user's failing script, a
damaged token cache) does not need that process boundary, which tests/faults (a killed command,
a full disk) and tests/compare/test_runner.py check with real workers.
:func:`use_in_process_workers` puts :class:`InProcessWorker` in the place of
:class:`normlab.experiment.execution.worker_process.WorkerProcess` for one test: the runner's own
loop (:func:`normlab.experiment.execution.executors.run_grid` through
:func:`normlab.experiment.execution.run_loop.train_runs`: standby, release, progress,
the crashed summary of a worker that left none) is unchanged, and each run is trained by
:func:`normlab.experiment.execution.worker.execute_run`, the worker's own body.

Runs released together train in threads at once: fine for ``--script`` runs (each script is its
own process); normlab's own runs set torch's seed and threads for the process, so a test that
trains them keeps ``--parallel 1`` (one run at a time, as the default).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from normlab.experiment.execution import executors
from normlab.experiment.execution.worker import execute_run
from normlab.experiment.training.train import RunAborted


class InProcessWorker:
    """The interface of ``WorkerProcess`` over a thread that trains the run on
    :meth:`release`."""

    def __init__(self, run_dir: Path, name: str) -> None:
        self.run_dir, self.name = Path(run_dir), name
        self._stop = threading.Event()
        self._step: int | None = None
        self._code: int | None = None
        self._thread = threading.Thread(target=self._train, name=name, daemon=True)

    def _train(self) -> None:
        def on_step(step: int) -> None:
            self._step = step

        try:
            execute_run(self.run_dir, on_step, self._stop.is_set)
            self._code = 0
        except (RunAborted, KeyboardInterrupt):  # as the worker: no summary, exit 130
            self._code = 130
        except BaseException:
            self._code = 1
            raise

    def release(self) -> None:
        if not self._thread.is_alive() and self._code is None and not self._stop.is_set():
            self._thread.start()

    def last_step(self) -> int | None:
        step, self._step = self._step, None
        return step

    def is_alive(self) -> bool:
        if self._thread.is_alive():
            return True
        # never released and not stopped: waiting in standby, as a process would be
        return self._code is None and not self._stop.is_set()

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else self._code if self._code is not None else -15

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() or self._code is not None:
            self._thread.join(timeout)

    def terminate(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> None:
        self.terminate()
        self.join(timeout)

    def close(self) -> None:
        pass


def use_in_process_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Train every run of the grids of this test with :class:`InProcessWorker`."""
    monkeypatch.setattr(executors, "WorkerProcess", InProcessWorker)
