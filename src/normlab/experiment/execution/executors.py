"""Who trains a grid: an executor, chosen by name (``--executor``), behind one small interface.

An :class:`Executor` gets the planned runs and the output folder, trains every run that is not
done, and returns {run_id: summary} for the whole grid. Every executor trains through the same
loop (:func:`normlab.experiment.execution.run_loop.train_runs`: it skips the runs that are done
and redoes the others from scratch, records a run whose process died as ``crashed``, shows the
progress bar and prints the line per run), supplying only a
:class:`~normlab.experiment.execution.run_loop.Starter`: how a run is started, followed and
collected. So resuming and the report do not depend on which one trained the grid.

- ``local`` (:class:`LocalExecutor`): each run in its own worker process of this machine, at
  most ``parallel`` at a time, the next one set up in standby while the others train (its
  process start-up is hidden behind training, and no run's timing includes it). A run on
  several processes (``scale`` in its run.json) is started from that process with torchrun
  (:func:`normlab.experiment.execution.launching.launch_run`).
- ``ray`` (:class:`RayExecutor`): each run a Ray task needing ``threads`` × N CPUs (and N GPUs
  on CUDA) for its N processes, on the cluster at ``--ray-address`` (default: a local Ray
  instance started with this machine's CPUs). Every task writes to the same ``--out``, which
  must be a folder all the cluster's hosts share.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rich.console import Console

from normlab.experiment.config import EXECUTORS, ScaleSettings
from normlab.experiment.execution.environment import available_cpus
from normlab.experiment.execution.launching import (
    WORKER_ENV,
    launch_run,
    worker_env,
    world_size_of,
)
from normlab.experiment.execution.run_loop import (
    Crash,
    GridStopped,
    OnResult,
    Started,
    train_runs,
)
from normlab.experiment.execution.worker_process import WorkerProcess
from normlab.run_format.folder import MetricsTail, read_summary

__all__ = [
    "EXECUTORS",
    "WORKER_ENV",
    "Executor",
    "GridStopped",
    "LocalExecutor",
    "OnResult",
    "RayExecutor",
    "make_executor",
    "run_grid",
    "worker_environment",
]


@contextmanager
def worker_environment(threads: int) -> Iterator[None]:
    """Set the allocator and thread variables for processes started inside the block."""
    wanted = worker_env(threads)
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Executor(Protocol):
    """Trains a grid: :meth:`run` trains every run of ``runs`` not done in ``out`` and returns
    {run_id: summary} for all of ``runs``, in their order."""

    name: ClassVar[str]

    def run(
        self,
        runs: list[dict[str, Any]],
        out: Path,
        parallel: int,
        console: Console,
        show_progress: bool,
    ) -> dict[str, dict[str, Any]]: ...


@dataclass
class _Worker:
    process: WorkerProcess
    released: bool = False


class LocalStarter:
    """Each run in its own worker process of this machine, at most ``parallel`` training at a
    time and the next one in standby (module docstring); a run's time counts from its
    release."""

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel

    def session(self) -> AbstractContextManager[None]:
        return nullcontext()

    def room(self, active: list[Started]) -> int:
        return self.parallel + 1 - len(active)

    def start(self, spec: dict[str, Any], folder: Path) -> Started:
        with worker_environment(spec["threads"]):
            process = WorkerProcess(folder, name=f"normlab-{spec['run_id']}")
        return Started(spec, folder, _Worker(process))

    def wait(self, active: list[Started]) -> list[Started]:
        running = sum(run.handle.released for run in active)
        for run in active:
            if running >= self.parallel:
                break
            if not run.handle.released:
                run.handle.process.release()
                run.handle.released, run.began = True, time.perf_counter()
                running += 1
        time.sleep(0.05)
        return [run for run in active if not run.handle.process.is_alive()]

    def last_step(self, run: Started) -> int | None:
        return run.handle.process.last_step()

    def collect(self, run: Started) -> dict[str, Any] | Crash:
        process = run.handle.process
        process.join()
        process.close()
        try:
            summary = read_summary(run.folder)
        except ValueError as err:  # written by the run itself: its crash, naming the file
            return Crash(f"the run left a damaged summary: {err}", "")
        if summary is not None:
            return summary
        code = process.exitcode
        return Crash(
            f"the worker process exited with code {code} without a summary",
            f"exit code {code} (a negative code is the signal that ended it)",
        )

    def stop(self, active: list[Started]) -> None:
        stop_workers([run.handle.process for run in active])


def run_grid(
    runs: list[dict[str, Any]],
    out: Path,
    parallel: int = 1,
    console: Console | None = None,
    show_progress: bool = True,
    on_result: OnResult | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every run of ``runs`` that is not done, each in its own worker process
    (:class:`normlab.experiment.execution.worker_process.WorkerProcess`, bound to this process's
    lifetime; a run on several processes starts torchrun from there), at most ``parallel`` at a
    time (plus one in standby, see the module docstring), through
    :func:`normlab.experiment.execution.run_loop.train_runs`. Returns {run_id: summary} for the
    whole grid; ``on_result(run_id)`` follows each run trained here. Any exit stops every
    worker first; a system error while training (``OSError``, ``MemoryError``) is raised as
    :class:`GridStopped`."""
    return train_runs(runs, out, LocalStarter(parallel), console, show_progress, on_result)


def stop_workers(processes: list[WorkerProcess], timeout: float = 10.0) -> None:
    """Stop every worker: close their inputs and send ``SIGTERM`` to all first, then wait for
    each (``SIGKILL`` after ``timeout`` seconds), so that none outlives the grid."""
    for p in processes:
        p.terminate()
    for p in processes:
        p.stop(timeout)


class LocalExecutor:
    """Worker processes on this machine (:func:`run_grid`); ``on_result`` as there."""

    name: ClassVar[str] = "local"

    def __init__(self, on_result: OnResult | None = None) -> None:
        self.on_result = on_result

    def run(
        self,
        runs: list[dict[str, Any]],
        out: Path,
        parallel: int,
        console: Console,
        show_progress: bool,
    ) -> dict[str, dict[str, Any]]:
        return run_grid(runs, out, parallel, console, show_progress, self.on_result)


RAY_EXTRA = "pip install 'normlab[ray]'"
RAY_TASK_NAME = "normlab_run"
"""The Ray task's function name (a busy Ray worker's process title is ``ray::normlab_run``)."""


def normlab_run(run_dir: str) -> dict[str, Any]:
    """A Ray task: train the run in ``run_dir`` as a command (:func:`launch_run`) and return its
    summary. Its child processes stop when this worker dies."""
    return launch_run(Path(run_dir))


def _check_address(address: str) -> None:
    """Raise ``ValueError`` naming ``--ray-address`` unless ``host:port`` (``ray://host:port``)
    accepts a connection within a few seconds (``auto`` is left to Ray)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"--ray-address: expected host:port (or ray://host:port, or auto), got {address!r}"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5.0):
            pass
    except OSError as err:
        raise ValueError(
            f"--ray-address: cannot reach a Ray cluster at {address!r} ({err}); expected the "
            "address of a running cluster's head (ray start --head)"
        ) from None


class RayExecutor:
    """One Ray task per run, against a shared ``--out``."""

    name: ClassVar[str] = "ray"

    def __init__(self, address: str | None = None, on_result: OnResult | None = None) -> None:
        """Check that Ray can be imported and, when given, that ``address`` can be reached;
        raises ``ValueError`` naming the option otherwise. ``on_result(run_id)`` follows each
        run's end (:func:`run_grid`)."""
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError(
                f"--executor ray: Ray is not installed; install the extra: {RAY_EXTRA}"
            ) from None
        if address is not None:
            _check_address(address)
        self.address = address
        self.on_result = on_result

    def _init(self) -> bool:
        """Join the cluster (or start a local instance); True when this call started Ray."""
        import ray

        if ray.is_initialized():
            return False
        quiet = {"log_to_driver": False, "include_dashboard": False}
        if self.address is None:
            ray.init(num_cpus=available_cpus(), **quiet)
        else:
            try:
                ray.init(address=self.address, **quiet)
            except (ConnectionError, RuntimeError) as err:
                raise ValueError(
                    f"--ray-address: cannot join the Ray cluster at {self.address!r}: {err}"
                ) from None
        return True

    def run(
        self,
        runs: list[dict[str, Any]],
        out: Path,
        parallel: int,
        console: Console,
        show_progress: bool,
    ) -> dict[str, dict[str, Any]]:
        """Submit every run not done as a task (``parallel`` is the cluster's to decide: as
        many run at once as its resources allow), show progress from the runs' metrics, and
        record a run whose task failed without a summary (its worker died) as ``crashed``."""
        return train_runs(runs, out, _RayStarter(self), console, show_progress, self.on_result)


@dataclass
class _Task:
    ref: Any
    tail: MetricsTail


class _RayStarter:
    """Every run submitted at once as a Ray task needing ``threads`` × N CPUs (and N GPUs on
    CUDA) for its N processes; its progress read from its metrics file."""

    def __init__(self, executor: RayExecutor) -> None:
        self.executor = executor

    @contextmanager
    def session(self) -> Iterator[None]:
        import ray

        started_here = self.executor._init()
        try:
            yield
        finally:
            if started_here:
                ray.shutdown()

    def room(self, active: list[Started]) -> int:
        return sys.maxsize

    def start(self, spec: dict[str, Any], folder: Path) -> Started:
        import ray

        n = world_size_of(spec)
        gpus = n if str(spec["device"]).startswith("cuda") else 0
        task = ray.remote(num_cpus=spec["threads"] * n, num_gpus=gpus, max_retries=0)(normlab_run)
        ref = task.remote(str(folder.absolute()))
        return Started(spec, folder, _Task(ref, MetricsTail(folder)))

    def wait(self, active: list[Started]) -> list[Started]:
        import ray

        done, _ = ray.wait([run.handle.ref for run in active], num_returns=1, timeout=0.2)
        return [run for run in active if run.handle.ref in done]

    def last_step(self, run: Started) -> int | None:
        return run.handle.tail.poll()

    def collect(self, run: Started) -> dict[str, Any] | Crash:
        """The task's summary, else what it left on disk, else why it failed."""
        import ray

        try:
            return ray.get(run.handle.ref)
        except ray.exceptions.RayError as err:
            try:
                summary = read_summary(run.folder)
            except ValueError as damaged:
                return Crash(f"the run left a damaged summary: {damaged}", str(err))
            if summary is not None:
                return summary
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return Crash(f"the Ray task failed ({type(err).__name__}): {first}", str(err))

    def stop(self, active: list[Started]) -> None:
        import ray

        for run in active:
            ray.cancel(run.handle.ref, force=True)


def make_executor(scale: ScaleSettings, on_result: OnResult | None = None) -> Executor:
    """The executor ``scale.executor`` names (checked: ``ValueError`` naming the option), which
    calls ``on_result(run_id)`` as each run ends."""
    if scale.executor == "local":
        return LocalExecutor(on_result)
    if scale.executor == "ray":
        return RayExecutor(scale.ray_address, on_result)
    raise ValueError(f"--executor: expected one of {', '.join(EXECUTORS)}, got {scale.executor!r}")
