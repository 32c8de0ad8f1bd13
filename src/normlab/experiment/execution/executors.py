"""Who trains a grid: an executor, chosen by name (``--executor``), behind one small interface.

An :class:`Executor` gets the planned runs and the output folder, trains every run that is not
done, and returns {run_id: summary} for the whole grid; every executor skips the runs that are
done (finished or diverged) and redoes the others from scratch, records a run whose process died
as ``crashed``, shows the same progress bar and prints the same line per run, so resuming and
the report do not depend on which one trained the grid.

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
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from normlab.experiment.config import EXECUTORS, ScaleSettings
from normlab.experiment.execution.environment import available_cpus
from normlab.experiment.execution.grid import first_difference, flatten
from normlab.experiment.execution.launching import (
    WORKER_ENV,
    launch_run,
    worker_env,
    world_size_of,
)
from normlab.experiment.execution.worker_process import WorkerProcess
from normlab.run_format import DONE_STATUSES, FINISHED
from normlab.run_format.folder import (
    MetricsTail,
    create_run,
    has_run_config,
    read_run_config,
    read_summary,
    run_dir,
)
from normlab.run_format.summary import record_crash
from normlab.run_format.testbeds import NORM_SWAP_FIELD

__all__ = [
    "EXECUTORS",
    "WORKER_ENV",
    "Executor",
    "GridStopped",
    "LocalExecutor",
    "OnResult",
    "RayExecutor",
    "finished_runs",
    "is_done",
    "make_executor",
    "run_grid",
    "worker_environment",
]


def is_done(summary: dict[str, Any] | None) -> bool:
    return summary is not None and summary.get("status") in DONE_STATUSES


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


@dataclass
class _Active:
    spec: dict[str, Any]
    run_dir: Path
    process: WorkerProcess
    released: bool = False
    started: float = field(default_factory=time.perf_counter)
    step: int = 0


DERIVED_FIELDS = ("init_digest", "n_params", "n_norm_params", NORM_SWAP_FIELD)
"""Fields of a run config that follow from its settings (the model built from them)."""


def _check_same_run(done_spec: dict[str, Any], planned: dict[str, Any], out: Path) -> None:
    """Raise ``ValueError`` if a finished run on disk was trained with other settings than the
    run this command plans under the same id (its results would be mixed into a new
    experiment)."""
    how = [k for k in {**flatten(done_spec), **flatten(planned)} if k.startswith("scale.")]
    # how it ran is not what it ran; a setting first, before what follows from it (the initial
    # digest, the parameter counts, the norm record)
    diff = first_difference(done_spec, planned, [*how, *DERIVED_FIELDS]) or first_difference(
        done_spec, planned, how
    )
    if diff is None:
        return
    key, done_value, planned_value = diff
    raise ValueError(
        f"out: {str(out)!r} already holds the finished run {planned['run_id']!r}, trained with "
        f"{key} = {done_value}; this command asks for {key} = {planned_value}. Use another "
        "--out, or delete the folder. Its experiment.json and runs are left as they were."
    )


def finished_runs(runs: list[dict[str, Any]], out: Path) -> dict[str, dict[str, Any]]:
    """{run_id: summary} of the runs of ``runs`` that ``out`` already holds as done (finished
    or diverged). Raises ``ValueError`` if one of them was trained with other settings than
    planned; writes nothing."""
    done: dict[str, dict[str, Any]] = {}
    for spec in runs:
        folder = run_dir(out, spec["run_id"])
        summary = read_summary(folder)
        if is_done(summary) and has_run_config(folder):
            _check_same_run(read_run_config(folder), spec, Path(out))
            assert summary is not None  # is_done guarantees it
            done[spec["run_id"]] = summary
    return done


def _outcome(summary: dict[str, Any]) -> str:
    status = summary.get("status")
    if status == FINISHED:
        if "final_val_bpb" in summary:  # the GPT testbed
            bpb = summary.get("final_val_bpb")
            return f"[green]finished[/] val bpb {bpb:.3f}" if bpb is not None else "finished"
        loss = summary.get("final_val_loss")
        return f"[green]finished[/] val loss {loss:.4f}" if loss is not None else "finished"
    if status == "diverged":
        return f"[yellow]diverged[/] at step {summary.get('diverged_at')}"
    return f"[red]crashed[/] {escape(str(summary.get('error', '')))}"


OnResult = Callable[[str], None]
"""Called with a run's id as soon as the run has ended and its summary is written (``compare
--log-to`` exports it there); it must not raise."""


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
    lifetime; a run on several processes starts torchrun from there), at most ``parallel`` at a time
    (plus one in standby, see the module docstring). Returns {run_id: summary} for the whole
    grid; ``on_result(run_id)`` follows each run trained here. Any exit stops every worker
    first; a system error while training (``OSError``, ``MemoryError``) is raised as
    :class:`GridStopped`."""
    console = console or Console()
    out = Path(out)
    summaries = finished_runs(runs, out)
    todo = deque(spec for spec in runs if spec["run_id"] not in summaries)
    if summaries:
        console.print(f"{len(summaries)} of {len(runs)} runs already done in {out}; skipping them")
    if not todo:
        return summaries

    active: list[_Active] = []
    total_steps = sum(s["train"]["steps"] for s in todo)
    n_todo = len(todo)
    with _progress(console, show_progress) as progress:
        task = progress.add_task(f"{n_todo} runs", total=total_steps)

        def start(spec: dict[str, Any]) -> None:
            folder = create_run(out, spec)
            with worker_environment(spec["threads"]):
                process = WorkerProcess(folder, name=f"normlab-{spec['run_id']}")
            active.append(_Active(spec, folder, process))

        def release_waiting() -> None:
            running = sum(a.released for a in active)
            for a in active:
                if running >= parallel:
                    return
                if not a.released:
                    a.process.release()
                    a.released, a.started = True, time.perf_counter()
                    running += 1

        def drain(a: _Active) -> None:
            step = a.process.last_step()
            if step is not None:
                progress.advance(task, step - a.step)
                a.step = step

        def finish(a: _Active) -> None:
            a.process.join()
            drain(a)
            a.process.close()
            progress.advance(task, a.spec["train"]["steps"] - a.step)
            summary = read_summary(a.run_dir)
            if summary is None:
                code = a.process.exitcode
                summary = record_crash(
                    a.run_dir,
                    a.spec,
                    f"the worker process exited with code {code} without a summary",
                    f"exit code {code} (a negative code is the signal that ended it)",
                )
            summaries[a.spec["run_id"]] = summary
            finished_here = len(summaries) - (len(runs) - n_todo)
            progress.update(task, description=f"{finished_here}/{n_todo} runs")
            progress.console.print(
                f"{a.spec['run_id']}: {_outcome(summary)} ({time.perf_counter() - a.started:.1f} s)"
            )
            if on_result is not None:
                on_result(a.spec["run_id"])

        try:
            while todo or active:
                release_waiting()
                while todo and len(active) < parallel + 1:
                    start(todo.popleft())
                release_waiting()
                for a in list(active):
                    drain(a)
                    if not a.process.is_alive():
                        finish(a)
                        active.remove(a)
                time.sleep(0.05)
        except BaseException as err:
            stop_workers([a.process for a in active])
            if isinstance(err, (OSError, MemoryError)):
                raise GridStopped(out, err) from err
            raise
    return {s["run_id"]: summaries[s["run_id"]] for s in runs}


class GridStopped(RuntimeError):
    """The grid stopped on a system error while training (a full disk, no memory, no more
    processes): the runs that finished are kept, the others are redone by the same command."""

    def __init__(self, out: Path, cause: BaseException) -> None:
        if isinstance(cause, OSError):
            reason = cause.strerror or str(cause)
            if cause.filename is not None:
                reason += f" ({str(cause.filename)!r})"
        else:
            reason = f"{type(cause).__name__}: {cause}".rstrip(": ")
        super().__init__(
            f"training stopped: {reason}; the finished runs are kept in {str(out)!r}. Fix the "
            "cause (e.g. free disk space), then run the same command again to resume"
        )


def stop_workers(processes: list[WorkerProcess], timeout: float = 10.0) -> None:
    """Stop every worker: close their inputs and send ``SIGTERM`` to all first, then wait for
    each (``SIGKILL`` after ``timeout`` seconds), so that none outlives the grid."""
    for p in processes:
        p.terminate()
    for p in processes:
        p.stop(timeout)


def _progress(console: Console, show_progress: bool) -> Progress:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, disable=not show_progress)


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
        import ray

        out = Path(out)
        summaries = finished_runs(runs, out)
        todo = [spec for spec in runs if spec["run_id"] not in summaries]
        if summaries:
            console.print(
                f"{len(summaries)} of {len(runs)} runs already done in {out}; skipping them"
            )
        if not todo:
            return summaries
        started_here = self._init()
        pending: dict[Any, tuple[dict[str, Any], Path, MetricsTail, float]] = {}
        try:
            with _progress(console, show_progress) as progress:
                bar = progress.add_task(
                    f"{len(todo)} runs", total=sum(s["train"]["steps"] for s in todo)
                )
                steps: dict[str, int] = {}
                for spec in todo:
                    folder = create_run(out, spec)
                    n = world_size_of(spec)
                    gpus = n if str(spec["device"]).startswith("cuda") else 0
                    task = ray.remote(num_cpus=spec["threads"] * n, num_gpus=gpus, max_retries=0)(
                        normlab_run
                    )
                    ref = task.remote(str(folder.absolute()))
                    pending[ref] = (spec, folder, MetricsTail(folder), time.perf_counter())
                    steps[spec["run_id"]] = 0
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
                    for spec, _, tail, _ in pending.values():
                        step = tail.poll()
                        progress.advance(bar, step - steps[spec["run_id"]])
                        steps[spec["run_id"]] = step
                    for ref in done:
                        spec, folder, tail, begun = pending.pop(ref)
                        summary = self._result(ref, spec, folder)
                        progress.advance(bar, spec["train"]["steps"] - steps[spec["run_id"]])
                        summaries[spec["run_id"]] = summary
                        finished_here = len(todo) - len(pending)
                        progress.update(bar, description=f"{finished_here}/{len(todo)} runs")
                        progress.console.print(
                            f"{spec['run_id']}: {_outcome(summary)} "
                            f"({time.perf_counter() - begun:.1f} s)"
                        )
                        if self.on_result is not None:
                            self.on_result(spec["run_id"])
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            if started_here:
                ray.shutdown()
        return {s["run_id"]: summaries[s["run_id"]] for s in runs}

    @staticmethod
    def _result(ref: Any, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
        """The run's summary: the task's, else what it left on disk, else a crashed one."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayError as err:
            summary = read_summary(folder)
            if summary is not None:
                return summary
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return record_crash(
                folder, spec, f"the Ray task failed ({type(err).__name__}): {first}", str(err)
            )


def make_executor(scale: ScaleSettings, on_result: OnResult | None = None) -> Executor:
    """The executor ``scale.executor`` names (checked: ``ValueError`` naming the option), which
    calls ``on_result(run_id)`` as each run ends."""
    if scale.executor == "local":
        return LocalExecutor(on_result)
    if scale.executor == "ray":
        return RayExecutor(scale.ray_address, on_result)
    raise ValueError(f"--executor: expected one of {', '.join(EXECUTORS)}, got {scale.executor!r}")
