"""Run a grid of either kind: lock the folder, plan and check the runs, train each in its own
process, skip what is done, record what crashed. The report is not built here: the caller (the
CLI) hands :func:`train_grid` the step to run on the finished folder while it is locked.

One runner for every kind of grid (:mod:`normlab.experiment.execution.kinds`: normlab's own
runs of a testbed, or a user's script): the config names its kind, and the kind says what is
checked before anything is written, how the runs are planned, what ``experiment.json`` holds and
what is checked after training; the steps, their order, the lock, the resume and the refusals
are the same for both.

Re-running the same command with the same ``--out`` skips every run whose ``summary.json`` says
``finished`` or ``diverged`` and redoes every other run from scratch; a run whose
``summary.json`` is damaged is refused, naming the file, never trained over. Killing the
command loses at most the runs in progress.

The runs are trained by an executor (:mod:`normlab.experiment.execution.executors`: ``local``
worker processes, or Ray tasks). :func:`plan_grid` stops before training instead: it prepares
the folder (data, ``experiment.json``, each run's ``run.json``) so that :func:`run_planned` can
train any one run by its id, from any process on any host that sees the folder.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from normlab._plural import counted
from normlab.data.token_cache import is_cache_entry
from normlab.experiment.config import GridConfig
from normlab.experiment.execution.executors import Executor, LocalExecutor
from normlab.experiment.execution.kinds import GridKind, grid_kind
from normlab.experiment.execution.lock import OutputLock
from normlab.experiment.execution.run_loop import (
    done_summary,
    finished_runs,
    is_done,
    outcome_line,
)
from normlab.run_format import (
    DATA_DIR,
    DATA_INFO_FILE,
    EXPERIMENT_FILE,
    LOCK_FILE,
    LR_SWEEP_DIR,
    TOKENS_FILE,
)
from normlab.run_format.folder import (
    check_experiment_file,
    clear_run,
    create_run,
    has_experiment,
    has_run_config,
    read_experiment,
    read_run_config,
    run_dir,
    run_folders,
    runs_path,
    write_experiment,
)

__all__ = [
    "AfterTraining",
    "check_out_contents",
    "check_out_path",
    "foreign_entries",
    "plan_grid",
    "run_planned",
    "runs_not_planned",
    "train_grid",
]

_CACHE_ENTRY = re.compile(
    rf"^(?:{re.escape(DATA_INFO_FILE)}|{re.escape(TOKENS_FILE)}"
    rf"|\.(?:{re.escape(DATA_INFO_FILE)}|{re.escape(TOKENS_FILE)})\..+\.tmp)$"
)
"""The names a compare writes in ``OUT/data`` before ``experiment.json`` exists: the data cache
and, while it is being written, the temporary files of :mod:`normlab._io` (any token cache's
names and a BPE's cache folder too: :func:`normlab.data.is_cache_entry`)."""
_EXPERIMENT_TMP = re.compile(rf"^\.{re.escape(EXPERIMENT_FILE)}\..+\.tmp$")


def runs_not_planned(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """Names of the folders under ``out/runs`` that are not runs of ``runs`` (e.g. the seeds an
    earlier command ran beyond this command's ``--seeds``), sorted."""
    planned = {r["run_id"] for r in runs}
    return [p.name for p in run_folders(out) if p.name not in planned]


def check_out_path(out: Path) -> Path | None:
    """Check that ``out`` is an existing folder or can be made one, creating nothing.

    Returns the outermost folder that making ``out`` would create (``out`` itself or a missing
    parent), or ``None`` if ``out`` exists. Raises ``ValueError`` naming ``--out`` if ``out`` or
    one of its parents exists but is not a folder.
    """
    out = Path(out)
    if out.is_dir():
        return None
    if out.exists() or out.is_symlink():
        raise ValueError(
            f"out: {str(out)!r} exists and is not a folder; expected a folder for --out "
            "(a new one, or the folder of an earlier compare to resume)"
        )
    missing = out
    for parent in out.absolute().parents:
        if parent.is_dir():
            break
        if parent.exists():
            raise ValueError(
                f"out: cannot create {str(out)!r}: {str(parent)!r} is not a folder; expected "
                "--out to name a folder (new, or from an earlier compare)"
            )
        missing = parent
    return missing


def foreign_entries(out: Path) -> list[str]:
    """What in the existing folder ``out`` a compare did not write, sorted; empty if ``out`` is a
    compare folder (it holds ``experiment.json``) or holds at most what a compare writes before
    ``experiment.json``: the lock file, the data cache (see :data:`_CACHE_ENTRY`) and the
    tuning runs of ``--lr-sweep`` (``lr-sweep/``)."""
    out = Path(out)
    if has_experiment(out):
        return []
    foreign = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name):
        if entry.name == LOCK_FILE and entry.is_file():
            continue
        if entry.name == LR_SWEEP_DIR and entry.is_dir() and not entry.is_symlink():
            continue
        if _EXPERIMENT_TMP.match(entry.name):  # left by a kill while writing experiment.json
            continue
        if entry.name == DATA_DIR and entry.is_dir() and not entry.is_symlink():
            inside = [
                p.name
                for p in entry.iterdir()
                if not (_CACHE_ENTRY.match(p.name) or is_cache_entry(p.name))
            ]
            foreign += [f"{DATA_DIR}/{name}" for name in sorted(inside)]
            continue
        foreign.append(entry.name + ("/" if entry.is_dir() else ""))
    return foreign


def check_out_contents(out: Path) -> None:
    """Raise ``ValueError`` naming ``--out`` if ``out`` is an existing folder that already holds
    files a compare did not write (see :func:`foreign_entries`), so that a compare never writes
    its report, data or runs over someone else's files. A missing or empty folder, and the
    folder of an earlier compare (to resume), pass. Writes nothing."""
    out = Path(out)
    if not out.is_dir():
        return
    foreign = foreign_entries(out)
    if not foreign:
        return
    shown = ", ".join(repr(name) for name in foreign[:3])
    more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
    raise ValueError(
        f"out: {str(out)!r} is not empty and is not the folder of a normlab compare (it has no "
        f"{EXPERIMENT_FILE}); it holds {shown}{more}, which a compare could overwrite. Expected "
        "--out to name a new or empty folder, or the folder of an earlier compare to resume. "
        "Nothing was written."
    )


def _is_unused(out: Path) -> bool:
    """True while nothing but the lock and the data cache was written to ``out``."""
    return not has_experiment(out) and not runs_path(out).exists()


AfterTraining = Callable[[Path, dict[str, dict[str, Any]]], None]
"""A step run on the output folder and the runs' summaries when the grid has trained, while the
folder is still locked (the CLI builds the report there)."""


def train_grid(
    cfg: GridConfig,
    out: Path,
    console: Console | None = None,
    show_progress: bool = True,
    after_training: AfterTraining | None = None,
    executor: Executor | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the whole grid of ``cfg`` (normlab's own runs or a user's script) into ``out`` (see
    docs/run-format.md); returns {run_id: summary}. ``executor`` trains the runs (default:
    :class:`LocalExecutor`).

    ``out`` (a new or empty folder, or creatable, or the folder of an earlier compare; see
    :func:`check_out_contents`) and what the grid's kind checks first (:meth:`GridKind.check`;
    normlab's own runs: the testbed's inputs, the ``--data`` path exists and can be read, for
    the lm testbed also the tokenizer and the model source, the device, the memory and disk)
    are checked before ``out`` is created or written; the planned runs (normlab's own: the data,
    enough for one context window, and the pairing of the arms) and that the finished runs
    already in ``out`` were trained with the same settings are checked before
    ``experiment.json`` or any run is written, so a refused command leaves them as they were (a
    damaged ``experiment.json`` or a run's damaged ``summary.json`` is refused, naming the
    file: :func:`~normlab.run_format.folder.check_experiment_file`,
    :func:`~normlab.experiment.execution.run_loop.done_summary`). If
    this call created ``out`` and fails before writing ``experiment.json``, it removes the
    folder again. After training, the kind checks what it could not check before
    (:meth:`GridKind.after_training`: a script's seeds whose arms' fingerprints disagree are
    refused, their runs recorded ``crashed``).

    Holds ``out/.lock`` throughout, ``after_training(out, summaries)`` included (the caller's
    next step on the folder, e.g. its report); raises
    :class:`normlab.experiment.execution.lock.FolderLockedError` if another command holds it, and
    ``ValueError`` (naming the field or flag) for any failed check.
    """
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as (kind, runs):
        summaries = (executor or LocalExecutor()).run(
            runs, out, cfg.parallel, console, show_progress
        )
        summaries.update(kind.after_training(runs, out, console))
        if after_training is not None:
            after_training(out, summaries)
    return summaries


@contextmanager
def _prepared(
    cfg: GridConfig, out: Path, console: Console
) -> Iterator[tuple[GridKind, list[dict[str, Any]]]]:
    """Check everything that can be checked before ``out`` is written (its path and contents,
    then the kind's :meth:`GridKind.check`), take ``out``'s lock, plan the runs, refuse finished
    runs trained with other settings, say what the grid pairs, write ``experiment.json`` and
    yield the kind and the planned runs; the lock is held until the block ends. A folder this
    call created is removed again if the block fails before anything was written into it."""
    kind = grid_kind(cfg)
    created = check_out_path(out)
    check_out_contents(out)
    kind.check(out)
    check_experiment_file(out)  # a damaged record is refused, never written over
    lock = OutputLock(out)
    try:
        lock.acquire()
        runs = kind.plan(out, console)
        finished_runs(runs, out)  # refuses before experiment.json is touched
        kind.describe(runs, console)
        others = runs_not_planned(runs, out)
        if others:
            console.print(
                f"note: {runs_path(out)} also holds {counted(len(others), 'run')} that this "
                f"command does not plan ({', '.join(others)}); they are kept, but left out of the "
                "analysis and report"
            )
        write_experiment(out, kind.record(runs))
        yield kind, runs
    except BaseException:
        if created is not None and lock.held and _is_unused(out):
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        lock.release()


def plan_grid(cfg: GridConfig, out: Path, console: Console | None = None) -> list[str]:
    """Prepare ``out`` for running the grid one run at a time, from any scheduler, and return
    the ids of the runs still to train (in order).

    Checks and locks as :func:`train_grid`, prepares what the runs need (normlab's own: the
    data cache), writes ``experiment.json`` and, for every run not done, an empty run folder
    with its ``run.json`` (a done run is left as it is). Nothing is trained; each run is then
    trained by :func:`run_planned` (``normlab compare --out OUT --run RUN_ID``), and ``normlab
    report OUT`` builds the report."""
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as (_, runs):
        done = finished_runs(runs, out)
        todo = [r for r in runs if r["run_id"] not in done]
        for spec in todo:
            create_run(out, spec)
    return [r["run_id"] for r in todo]


def run_planned(out: Path, run_id: str, console: Console | None = None) -> dict[str, Any]:
    """Train the run ``run_id`` of the folder :func:`plan_grid` prepared and return its
    summary (a done run is skipped: its summary is returned as it is).

    Holds the run folder's own lock (``runs/RUN_ID/.lock``), so two commands never train the
    same run while other runs of the folder train at the same time; empties the folder but for
    its ``run.json`` (an unfinished run is redone from scratch), then trains as
    :func:`normlab.experiment.execution.launching.launch_run` (one process, or torchrun). Raises
    ``ValueError`` naming ``--out`` or ``--run`` when the folder or the run is not there,
    naming the file when ``experiment.json`` or the run's ``summary.json`` is damaged, and
    :class:`normlab.experiment.execution.lock.FolderLockedError` when another command trains it."""
    from normlab.experiment.execution.launching import launch_run

    console = console or Console()
    out = Path(out)
    if not has_experiment(out):
        raise ValueError(
            f"out: {str(out)!r} has no {EXPERIMENT_FILE}; expected the folder of "
            "`normlab compare --plan --out OUT`"
        )
    check_experiment_file(out)  # what follows the run (a script's pairing guard) reads it
    folder = run_dir(out, run_id)
    if not has_run_config(folder):
        known = read_experiment(out).get("runs", [])
        raise ValueError(
            f"run: {run_id!r} is not a planned run of {str(out)!r}; expected one of "
            f"{', '.join(known)}"
        )
    with OutputLock(folder):
        summary = done_summary(folder)
        if is_done(summary):
            assert summary is not None
            console.print(f"{run_id}: already done ({summary['status']}); skipping it")
            return summary
        clear_run(folder)
        started = time.perf_counter()
        summary = launch_run(folder)
    outcome = outcome_line(summary, read_run_config(folder).get("testbed"))
    console.print(f"{run_id}: {outcome} ({time.perf_counter() - started:.1f} s)")
    return summary
