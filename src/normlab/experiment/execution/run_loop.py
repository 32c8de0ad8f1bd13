"""The one loop that trains a grid's runs, whichever executor starts them.

:func:`train_runs` skips the runs that are done (finished or diverged, and trained with the
settings planned: :func:`finished_runs`), creates the folder of every other run and hands it to
the executor's :class:`Starter`, shows one progress bar over the steps to train, and as each run
ends: reads its summary (a run that left none is recorded ``crashed`` with the starter's
:class:`Crash` reason), prints one line (:func:`outcome_line`, in the words of the run's testbed
format) and calls ``on_result``. Any exit stops the runs in progress first; a system error
while training (``OSError``, ``MemoryError``) is raised as :class:`GridStopped`. So resuming,
the terminal and the report do not depend on which executor trained the grid; a
:class:`Starter` says only how a run is started, followed and collected.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from normlab._plural import counted
from normlab.experiment.execution.grid import first_difference, flatten
from normlab.run_format import DIVERGED, DONE_STATUSES, FINISHED, testbed_format
from normlab.run_format.folder import (
    create_run,
    has_run_config,
    read_run_config,
    read_summary,
)
from normlab.run_format.folder import (
    run_dir as run_folder,
)
from normlab.run_format.summary import record_crash
from normlab.run_format.testbeds import NORM_SWAP_FIELD

__all__ = [
    "DERIVED_FIELDS",
    "Crash",
    "GridStopped",
    "OnResult",
    "Started",
    "Starter",
    "done_summary",
    "finished_runs",
    "is_done",
    "outcome_line",
    "train_runs",
]

OnResult = Callable[[str], None]
"""Called with a run's id as soon as the run has ended and its summary is written (``compare
--log-to`` exports it there); it must not raise."""


def is_done(summary: dict[str, Any] | None) -> bool:
    """True when ``summary`` holds a result (finished or diverged): a re-run skips the run."""
    return summary is not None and summary.get("status") in DONE_STATUSES


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


def done_summary(folder: Path) -> dict[str, Any] | None:
    """The summary of the run in ``folder``, None when it has none (a run to train). A damaged
    ``summary.json`` is the only record of a result that cannot be read: ``ValueError`` naming
    the file and what to do, never a run to train over it (which would delete it)."""
    try:
        return read_summary(folder)
    except ValueError as err:
        raise ValueError(
            f"run {folder.name}: {err}; cannot tell whether the run is done, so it is not "
            "trained over it. Restore the file, or move it out of the run folder to train the "
            "run again. Nothing was written."
        ) from None


def finished_runs(runs: list[dict[str, Any]], out: Path) -> dict[str, dict[str, Any]]:
    """{run_id: summary} of the runs of ``runs`` that ``out`` already holds as done (finished
    or diverged). Raises ``ValueError`` if one of them was trained with other settings than
    planned, or if a run's ``summary.json`` is damaged (:func:`done_summary`); writes
    nothing."""
    done: dict[str, dict[str, Any]] = {}
    for spec in runs:
        folder = run_folder(out, spec["run_id"])
        summary = done_summary(folder)
        if is_done(summary) and has_run_config(folder):
            _check_same_run(read_run_config(folder), spec, Path(out))
            assert summary is not None  # is_done guarantees it
            done[spec["run_id"]] = summary
    return done


def outcome_line(summary: dict[str, Any], testbed: object) -> str:
    """How a run ended, for the line printed as it ends (rich markup): ``finished`` with its
    quality metric as the run's testbed format words it (:attr:`TestbedFormat.run_line`: "val
    bpb 2.549"; the word alone without a value), ``diverged at step N``, or ``crashed`` with
    its error."""
    status = summary.get("status")
    if status == FINISHED:
        fmt = testbed_format(testbed)
        value = summary.get(fmt.quality)
        if value is None:
            return "finished"
        label, digits = fmt.run_line
        return f"[green]finished[/] {label} {value:.{digits}f}"
    if status == DIVERGED:
        return f"[yellow]diverged[/] at step {summary.get('diverged_at')}"
    return f"[red]crashed[/] {escape(str(summary.get('error', '')))}"


@dataclass
class Started:
    """A run handed to a :class:`Starter`: its config and folder, the starter's own
    ``handle`` on it, when it began training (its line's seconds count from there; a starter
    may reset it) and the last step seen."""

    spec: dict[str, Any]
    folder: Path
    handle: Any
    began: float = field(default_factory=time.perf_counter)
    step: int = 0


class Crash(NamedTuple):
    """Why a run left no summary: the error and trace of the ``crashed`` summary it gets."""

    error: str
    trace: str


class Starter(Protocol):
    """What an executor tells :func:`train_runs`: how runs are started, followed and
    collected."""

    def session(self) -> AbstractContextManager[None]:
        """What holds while the grid trains (a cluster joined), entered once runs are to
        train."""
        ...

    def room(self, active: list[Started]) -> int:
        """How many more runs may start now, besides ``active``."""
        ...

    def start(self, spec: dict[str, Any], folder: Path) -> Started:
        """Start the run ``spec`` in its (created) ``folder``."""
        ...

    def wait(self, active: list[Started]) -> list[Started]:
        """Let the ``active`` runs go on for a moment; return those that have ended."""
        ...

    def last_step(self, run: Started) -> int | None:
        """The last step ``run`` reported since the previous call, or None."""
        ...

    def collect(self, run: Started) -> dict[str, Any] | Crash:
        """The ended run's summary, or why it left none."""
        ...

    def stop(self, active: list[Started]) -> None:
        """Stop every run of ``active`` (the grid is exiting)."""
        ...


def train_runs(
    runs: list[dict[str, Any]],
    out: Path,
    starter: Starter,
    console: Console | None = None,
    show_progress: bool = True,
    on_result: OnResult | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every run of ``runs`` that is not done with ``starter`` (module docstring) and
    return {run_id: summary} for the whole grid, in the order of ``runs``;
    ``on_result(run_id)`` follows each run trained here."""
    console = console or Console()
    out = Path(out)
    summaries = finished_runs(runs, out)
    todo = deque(spec for spec in runs if spec["run_id"] not in summaries)
    if summaries:
        console.print(
            f"{len(summaries)} of {counted(len(runs), 'run')} already done in {out}; skipping them"
        )
    if not todo:
        return summaries
    active: list[Started] = []
    with starter.session(), _bar(console, show_progress, list(todo)) as bar:
        try:
            while todo or active:
                while todo and starter.room(active) > 0:
                    spec = todo.popleft()
                    active.append(starter.start(spec, create_run(out, spec)))
                ended = starter.wait(active)
                for run in active:
                    bar.follow(run, starter.last_step(run))
                for run in ended:
                    active.remove(run)
                    summaries[run.spec["run_id"]] = _collected(starter, run)
                    bar.ended(run, summaries[run.spec["run_id"]])
                    if on_result is not None:
                        on_result(run.spec["run_id"])
        except BaseException as err:
            starter.stop(active)
            if isinstance(err, (OSError, MemoryError)):
                raise GridStopped(out, err) from err
            raise
    return {s["run_id"]: summaries[s["run_id"]] for s in runs}


def _collected(starter: Starter, run: Started) -> dict[str, Any]:
    """The ended run's summary; one it did not write is recorded ``crashed``."""
    summary = starter.collect(run)
    if isinstance(summary, Crash):
        summary = record_crash(run.folder, run.spec, summary.error, summary.trace)
    return summary


class _Bar:
    """The grid's progress bar: every step to train, and a line per run as it ends."""

    def __init__(self, progress: Progress, todo: list[dict[str, Any]]) -> None:
        self.progress = progress
        self.total = len(todo)
        self.n_ended = 0
        self.task: TaskID = progress.add_task(
            counted(self.total, "run"), total=sum(s["train"]["steps"] for s in todo)
        )

    def follow(self, run: Started, step: int | None) -> None:
        """Advance by the steps ``run`` trained since it was last seen."""
        if step is not None:
            self.progress.advance(self.task, step - run.step)
            run.step = step

    def ended(self, run: Started, summary: dict[str, Any]) -> None:
        """Count ``run``'s remaining steps as done and print its line."""
        self.progress.advance(self.task, run.spec["train"]["steps"] - run.step)
        self.n_ended += 1
        self.progress.update(self.task, description=f"{self.n_ended}/{counted(self.total, 'run')}")
        self.progress.console.print(
            f"{run.spec['run_id']}: {outcome_line(summary, run.spec.get('testbed'))} "
            f"({time.perf_counter() - run.began:.1f} s)"
        )


@contextmanager
def _bar(console: Console, show_progress: bool, todo: list[dict[str, Any]]) -> Iterator[_Bar]:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not show_progress) as progress:
        yield _Bar(progress, todo)


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
