"""Run a grid: lock the folder, cache the data, plan and check the runs, train each in its own
process, skip what is done, record what crashed. The report is not built here: the caller (the
CLI) hands :func:`run_experiment` the step to run on the finished folder while it is locked.

Re-running the same command with the same ``--out`` skips every run whose ``summary.json`` says
``finished`` or ``diverged`` and redoes every other run from scratch. Killing the command loses
at most the runs in progress.

While ``parallel`` runs train, the next run's worker is already started in standby: it imports,
maps the data, builds and checks its model, then waits for the signal to train. Process start-up
is thus hidden behind training (on a spare core), and no run's timing includes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

from normlab._io import write_json_atomic
from normlab.data.token_cache import is_cache_entry
from normlab.experiment.config import ExperimentConfig
from normlab.experiment.environment import default_threads, environment, resolve_device
from normlab.experiment.grid import (
    FACTOR_NAMES,
    PRECISION_FACTOR,
    first_difference,
    flatten,
    plan_runs,
)
from normlab.experiment.lock import OutputLock
from normlab.experiment.sizes import check_experiment_sizes
from normlab.experiment.testbeds import TESTBEDS
from normlab.experiment.worker import crashed_summary, read_spec
from normlab.experiment.worker_process import WorkerProcess
from normlab.run_format import (
    DATA_DIR,
    DATA_INFO_FILE,
    DONE_STATUSES,
    EXPERIMENT_FILE,
    FINISHED,
    LOCK_FILE,
    RUN_FILE,
    RUNS_DIR,
    SUMMARY_FILE,
    TOKENS_FILE,
    testbed_format,
)
from normlab.run_format.testbeds import NORM_SWAP_FIELD

_CACHE_ENTRY = re.compile(
    rf"^(?:{re.escape(DATA_INFO_FILE)}|{re.escape(TOKENS_FILE)}"
    rf"|\.(?:{re.escape(DATA_INFO_FILE)}|{re.escape(TOKENS_FILE)})\..+\.tmp)$"
)
"""The names a compare writes in ``OUT/data`` before ``experiment.json`` exists: the data cache
and, while it is being written, the temporary files of :mod:`normlab._io` (any token cache's
names and a BPE's cache folder too: :func:`normlab.data.is_cache_entry`)."""
_EXPERIMENT_TMP = re.compile(rf"^\.{re.escape(EXPERIMENT_FILE)}\..+\.tmp$")
WORKER_ENV = {
    # glibc: never return large blocks to the OS with mmap/munmap or trimming, so big tensors
    # are not page-faulted in afresh on every step.
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
}


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json``, or ``None`` if it has none (or an unreadable one, or one
    that is not a JSON object)."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def is_done(summary: dict[str, Any] | None) -> bool:
    return summary is not None and summary.get("status") in DONE_STATUSES


def experiment_record(
    cfg: ExperimentConfig,
    runs: list[dict[str, Any]],
    data_info: dict[str, Any],
    env: dict[str, Any],
) -> dict[str, Any]:
    """The content of ``experiment.json`` (see docs/run-format.md)."""
    values = {
        "norm": list(cfg.norms),
        "placement": list(cfg.placements),
        "precision": list(cfg.precisions),
    }
    varied = {f: v for f, v in values.items() if len(v) > 1} or {"norm": values["norm"]}
    first = runs[0]
    fixed = {f: v[0] for f, v in values.items() if f not in varied}
    keys = (
        "testbed", "model", "dit", "shapes", "lm", "train", "anomaly", "device", "threads", "data"
    )
    fixed.update(flatten({k: first[k] for k in keys if k in first}))
    margin_key = testbed_format(cfg.testbed).margin_key
    return {
        "testbed": cfg.testbed,
        "arms": cfg.arm_names(),
        "baseline_arm": cfg.baseline_arm(),
        "seeds": cfg.seed_list(),
        margin_key: cfg.margin(),
        "target_val_loss": cfg.train.target_val_loss,
        "varied": varied,
        "fixed": fixed,
        "config": cfg.dump(),
        "environment": env,
        "data": data_info,
        "runs": [r["run_id"] for r in runs],
        "parameter_counts": {
            r["arm"]: {"n_params": r["n_params"], "n_norm_params": r["n_norm_params"]} for r in runs
        },
        **norm_swaps(runs),
    }


def studied_factors(cfg: ExperimentConfig) -> list[str]:
    """The factors the arms may differ in: norm and placement, and precision when several are
    given."""
    return [*FACTOR_NAMES, *([PRECISION_FACTOR] if len(cfg.precisions) > 1 else [])]


def norm_swaps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"norm_swaps": {arm: record}}`` when the runs carry a per-arm ``norm_swap`` record
    (the lm testbed: which of the model's norm modules hold the arm's norm, which were held),
    else {}."""
    records = {r["arm"]: r[NORM_SWAP_FIELD] for r in runs if NORM_SWAP_FIELD in r}
    return {"norm_swaps": records} if records else {}


@contextmanager
def worker_environment(threads: int) -> Iterator[None]:
    """Set the allocator and thread variables for processes started inside the block."""
    wanted = {**WORKER_ENV, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
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
    # a setting first, before what follows from it (the initial digest, counts, norm record)
    diff = first_difference(done_spec, planned, DERIVED_FIELDS) or first_difference(
        done_spec, planned
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
        run_dir = Path(out) / RUNS_DIR / spec["run_id"]
        summary = read_summary(run_dir)
        if is_done(summary) and (run_dir / RUN_FILE).exists():
            _check_same_run(read_spec(run_dir), spec, Path(out))
            assert summary is not None  # is_done guarantees it
            done[spec["run_id"]] = summary
    return done


def runs_not_planned(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """Names of the folders under ``out/runs`` that are not runs of ``runs`` (e.g. the seeds an
    earlier command ran beyond this command's ``--seeds``), sorted."""
    runs_dir = Path(out) / RUNS_DIR
    if not runs_dir.is_dir():
        return []
    planned = {r["run_id"] for r in runs}
    return sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and p.name not in planned)


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
    ``experiment.json``: the lock file and the data cache (see :data:`_CACHE_ENTRY`)."""
    out = Path(out)
    if (out / EXPERIMENT_FILE).is_file():
        return []
    foreign = []
    for entry in sorted(out.iterdir(), key=lambda p: p.name):
        if entry.name == LOCK_FILE and entry.is_file():
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
    return not (out / EXPERIMENT_FILE).exists() and not (out / RUNS_DIR).exists()


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


def run_grid(
    runs: list[dict[str, Any]],
    out: Path,
    parallel: int = 1,
    console: Console | None = None,
    show_progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Train every run of ``runs`` that is not done, each in its own worker process
    (:class:`normlab.experiment.worker_process.WorkerProcess`, bound to this process's
    lifetime), at most ``parallel`` at a time (plus one in standby, see the module docstring).
    Returns {run_id: summary} for the whole grid. Any exit stops every worker first; a system
    error while training (``OSError``, ``MemoryError``) is raised as :class:`GridStopped`."""
    console = console or Console()
    out = Path(out)
    summaries = finished_runs(runs, out)
    todo = deque(spec for spec in runs if spec["run_id"] not in summaries)
    if summaries:
        console.print(f"{len(summaries)} of {len(runs)} runs already done in {out}; skipping them")
    if not todo:
        return summaries

    active: list[_Active] = []
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    total_steps = sum(s["train"]["steps"] for s in todo)
    n_todo = len(todo)
    with Progress(*columns, console=console, disable=not show_progress) as progress:
        task = progress.add_task(f"{n_todo} runs", total=total_steps)

        def start(spec: dict[str, Any]) -> None:
            run_dir = out / RUNS_DIR / spec["run_id"]
            shutil.rmtree(run_dir, ignore_errors=True)  # unfinished: redo from scratch
            write_json_atomic(run_dir / RUN_FILE, spec)
            with worker_environment(spec["threads"]):
                process = WorkerProcess(run_dir, name=f"normlab-{spec['run_id']}")
            active.append(_Active(spec, run_dir, process))

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
                summary = crashed_summary(
                    a.spec,
                    f"the worker process exited with code {code} without a summary",
                    f"exit code {code} (a negative code is the signal that ended it)",
                )
                write_json_atomic(a.run_dir / SUMMARY_FILE, summary)
            summaries[a.spec["run_id"]] = summary
            finished_here = len(summaries) - (len(runs) - n_todo)
            progress.update(task, description=f"{finished_here}/{n_todo} runs")
            progress.console.print(
                f"{a.spec['run_id']}: {_outcome(summary)} ({time.perf_counter() - a.started:.1f} s)"
            )

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


AfterTraining = Callable[[Path, dict[str, dict[str, Any]]], None]
"""A step run on the output folder and the runs' summaries when the grid has trained, while the
folder is still locked (the CLI builds the report there)."""


def run_experiment(
    cfg: ExperimentConfig,
    out: Path,
    console: Console | None = None,
    show_progress: bool = True,
    after_training: AfterTraining | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the whole experiment into ``out`` (see docs/run-format.md); returns {run_id:
    summary}.

    ``out`` (a new or empty folder, or creatable, or the folder of an earlier compare; see
    :func:`check_out_contents`), the testbed's inputs (:meth:`Testbed.check_inputs`: the
    ``--data`` path exists and can be read; for the lm testbed also the tokenizer and the model
    source) and the device are checked before ``out`` is created or written; the data (enough
    for one context window), the pairing of the arms, and that the finished runs already in
    ``out`` were trained with the same settings are checked before ``experiment.json`` or any
    run is written, so a refused command leaves them as they were. If this call created ``out``
    and fails before writing ``experiment.json``, it removes the folder again.

    Holds ``out/.lock`` throughout, ``after_training(out, summaries)`` included (the caller's
    next step on the folder, e.g. its report); raises
    :class:`normlab.experiment.lock.FolderLockedError` if another command holds it, and
    ``ValueError`` (naming the field or flag) for any failed check.
    """
    console = console or Console()
    out = Path(out)
    created = check_out_path(out)
    check_out_contents(out)
    TESTBEDS[cfg.testbed].check_inputs(cfg)
    device = resolve_device(cfg.device)
    check_experiment_sizes(cfg, out)  # memory and disk, before anything is allocated
    threads = cfg.threads or default_threads()
    lock = OutputLock(out)
    try:
        lock.acquire()
        summaries = _run_locked(cfg, out, device, threads, console, show_progress)
        if after_training is not None:
            after_training(out, summaries)
    except BaseException:
        if created is not None and lock.held and _is_unused(out):
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        lock.release()
    return summaries


def _run_locked(
    cfg: ExperimentConfig,
    out: Path,
    device: str,
    threads: int,
    console: Console,
    show_progress: bool,
) -> dict[str, dict[str, Any]]:
    """Prepare the data, plan and check the runs, write ``experiment.json``, train the grid."""
    data_info = prepare_data(cfg, out / DATA_DIR, console)
    runs = plan_runs(cfg, device, threads, data_info)
    finished_runs(runs, out)  # refuses before experiment.json is touched
    seen = set()
    for r in runs:
        if r["arm"] not in seen:
            seen.add(r["arm"])
            console.print(
                f"arm {r['arm']}: {r['n_params']:,} parameters ({r['n_norm_params']:,} in norms)"
            )
    console.print(paired_description(cfg, runs, device, threads))
    others = runs_not_planned(runs, out)
    if others:
        console.print(
            f"note: {out / RUNS_DIR} also holds {len(others)} runs that this command does not "
            f"plan ({', '.join(others)}); they are kept, but left out of the analysis and report"
        )
    write_json_atomic(
        out / EXPERIMENT_FILE,
        experiment_record(cfg, runs, data_info, environment(device, threads)),
    )
    return run_grid(runs, out, cfg.parallel, console, show_progress)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def paired_description(
    cfg: ExperimentConfig, runs: list[dict[str, Any]], device: str, threads: int
) -> str:
    """The line that says what the grid varies and what it costs: only the factors with more
    than one value differ (the norm, the placement, or both), each count with its plural."""
    values = {
        "norm": list(cfg.norms),
        "placement": list(cfg.placements),
        PRECISION_FACTOR: list(cfg.precisions),
    }
    factors = [*FACTOR_NAMES, PRECISION_FACTOR]
    varied = [f for f in factors if len(values.get(f, [])) > 1] or ["norm"]
    fixed = [
        f"{f} {values[f][0]}"
        for f in factors
        if f not in varied and values.get(f) and (f, values[f]) != (PRECISION_FACTOR, ["fp32"])
    ]  # float32, the default precision, goes without saying
    fixed_text = f" ({', '.join(fixed)} for all)" if fixed else ""
    steps = runs[0]["train"]["steps"]
    seeds = len({r["seed"] for r in runs})
    return (
        f"paired: shared parameters equal across arms for every seed; only the "
        f"{' and '.join(varied)} differ{'s' if len(varied) == 1 else ''}{fixed_text}. "
        f"{_plural(len(runs), 'run')} ({_plural(seeds, 'seed')}) × {_plural(steps, 'step')} "
        f"on {device} with {_plural(threads, 'thread')}"
    )


def prepare_data(cfg: ExperimentConfig, data_dir: Path, console: Console) -> dict[str, Any]:
    """Prepare the testbed's data in ``data_dir`` (:meth:`Testbed.prepare_data`: the GPT's token
    cache, the description of the DiT's shapes, the lm's tokenizer and token cache), say what it
    is, and check that it fits; returns ``data.json``'s content."""
    return TESTBEDS[cfg.testbed].prepare_data(cfg, data_dir, console)
