"""Run a grid: lock the folder, cache the data, plan and check the runs, train each in its own
process, skip what is done, record what crashed. The report is not built here: the caller (the
CLI) hands :func:`run_experiment` the step to run on the finished folder while it is locked.

Re-running the same command with the same ``--out`` skips every run whose ``summary.json`` says
``finished`` or ``diverged`` and redoes every other run from scratch. Killing the command loses
at most the runs in progress.

The runs are trained by an executor (:mod:`normlab.experiment.execution.executors`: ``local`` worker
processes, or Ray tasks). :func:`plan_experiment` stops before training instead: it prepares the
folder (data, ``experiment.json``, each run's ``run.json``) so that :func:`run_planned` can
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

from normlab.data.token_cache import is_cache_entry
from normlab.distributed.wrap import DEFAULT_PRECISION
from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.environment import default_threads, environment, resolve_device
from normlab.experiment.execution.executors import (
    Executor,
    LocalExecutor,
    _outcome,
    finished_runs,
    is_done,
)
from normlab.experiment.execution.grid import flatten, plan_runs
from normlab.experiment.execution.lock import OutputLock
from normlab.experiment.execution.sizes import check_experiment_sizes
from normlab.experiment.testbeds import TESTBEDS
from normlab.run_format import (
    DATA_DIR,
    DATA_INFO_FILE,
    EXPERIMENT_FILE,
    FACTORS,
    LOCK_FILE,
    LR_SWEEP_DIR,
    TOKENS_FILE,
    testbed_format,
)
from normlab.run_format.folder import (
    clear_run,
    create_run,
    has_experiment,
    has_run_config,
    read_experiment,
    read_summary,
    run_dir,
    run_folders,
    runs_path,
    write_experiment,
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
        "testbed",
        "model",
        "dit",
        "shapes",
        "lm",
        "train",
        "anomaly",
        "device",
        "threads",
        "data",
    )
    fixed.update(flatten({k: first[k] for k in keys if k in first}))
    rates: dict[str, Any] = {}
    if cfg.train.arm_lr:  # each arm at its own rate: not a fixed setting
        fixed.pop("train.lr", None)
        rates = {"learning_rates": {a: cfg.arm_lr(a) for a in cfg.arm_names()}}
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
        **rates,
    }


def studied_factors(cfg: ExperimentConfig) -> list[str]:
    """The factors the arms may differ in: norm and placement, and precision when several are
    given."""
    return [f for f in FACTORS if f != "precision" or len(cfg.precisions) > 1]


def norm_swaps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"norm_swaps": {arm: record}}`` when the runs carry a per-arm ``norm_swap`` record
    (the lm testbed: which of the model's norm modules hold the arm's norm, which were held),
    else {}."""
    records = {r["arm"]: r[NORM_SWAP_FIELD] for r in runs if NORM_SWAP_FIELD in r}
    return {"norm_swaps": records} if records else {}


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


def run_experiment(
    cfg: ExperimentConfig,
    out: Path,
    console: Console | None = None,
    show_progress: bool = True,
    after_training: AfterTraining | None = None,
    executor: Executor | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the whole experiment into ``out`` (see docs/run-format.md); returns {run_id:
    summary}. ``executor`` trains the runs (default: :class:`LocalExecutor`).

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
    :class:`normlab.experiment.execution.lock.FolderLockedError` if another command holds it, and
    ``ValueError`` (naming the field or flag) for any failed check.
    """
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as runs:
        summaries = (executor or LocalExecutor()).run(
            runs, out, cfg.parallel, console, show_progress
        )
        if after_training is not None:
            after_training(out, summaries)
    return summaries


@contextmanager
def _prepared(cfg: ExperimentConfig, out: Path, console: Console) -> Iterator[list[dict[str, Any]]]:
    """Check everything that can be checked before ``out`` is written (its path and contents,
    the testbed's inputs, the device, the sizes), take ``out``'s lock, prepare the data and
    ``experiment.json`` (:func:`_prepare_locked`) and yield the planned runs; the lock is held
    until the block ends. A folder this call created is removed again if the block fails
    before anything was written into it."""
    created = check_out_path(out)
    check_out_contents(out)
    TESTBEDS[cfg.testbed].check_inputs(cfg)
    device = resolve_device(cfg.device)
    check_experiment_sizes(cfg, out)  # memory and disk, before anything is allocated
    threads = cfg.threads or default_threads()
    lock = OutputLock(out)
    try:
        lock.acquire()
        yield _prepare_locked(cfg, out, device, threads, console)
    except BaseException:
        if created is not None and lock.held and _is_unused(out):
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        lock.release()


def _prepare_locked(
    cfg: ExperimentConfig,
    out: Path,
    device: str,
    threads: int,
    console: Console,
) -> list[dict[str, Any]]:
    """Prepare the data, plan and check the runs, write ``experiment.json``; returns the runs."""
    data_info = prepare_data(cfg, out / DATA_DIR, console)
    runs = plan_runs(cfg, device, threads, data_info)
    if cfg.scale.world_size > 1:
        for r in runs:  # how each run is started (torchrun); not part of what it computes
            r["scale"] = cfg.scale.launch_spec()
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
            f"note: {runs_path(out)} also holds {len(others)} runs that this command does not "
            f"plan ({', '.join(others)}); they are kept, but left out of the analysis and report"
        )
    write_experiment(out, experiment_record(cfg, runs, data_info, environment(device, threads)))
    return runs


def plan_experiment(cfg: ExperimentConfig, out: Path, console: Console | None = None) -> list[str]:
    """Prepare ``out`` for running the grid one run at a time, from any scheduler, and return
    the ids of the runs still to train (in order).

    Checks and locks as :func:`run_experiment`, prepares the data cache, writes
    ``experiment.json`` and, for every run not done, an empty run folder with its ``run.json``
    (a done run is left as it is). Nothing is trained; each run is then trained by
    :func:`run_planned` (``normlab compare --out OUT --run RUN_ID``), and ``normlab report
    OUT`` builds the report."""
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as runs:
        done = finished_runs(runs, out)
        todo = [r for r in runs if r["run_id"] not in done]
        for spec in todo:
            create_run(out, spec)
    return [r["run_id"] for r in todo]


def run_planned(out: Path, run_id: str, console: Console | None = None) -> dict[str, Any]:
    """Train the run ``run_id`` of the folder :func:`plan_experiment` prepared and return its
    summary (a done run is skipped: its summary is returned as it is).

    Holds the run folder's own lock (``runs/RUN_ID/.lock``), so two commands never train the
    same run while other runs of the folder train at the same time; empties the folder but for
    its ``run.json`` (an unfinished run is redone from scratch), then trains as
    :func:`normlab.experiment.execution.launching.launch_run` (one process, or torchrun). Raises
    ``ValueError`` naming ``--out`` or ``--run`` when the folder or the run is not there, and
    :class:`normlab.experiment.execution.lock.FolderLockedError` when another command trains it."""
    from normlab.experiment.execution.launching import launch_run

    console = console or Console()
    out = Path(out)
    if not has_experiment(out):
        raise ValueError(
            f"out: {str(out)!r} has no {EXPERIMENT_FILE}; expected the folder of "
            "`normlab compare --plan --out OUT`"
        )
    folder = run_dir(out, run_id)
    if not has_run_config(folder):
        known = read_experiment(out).get("runs", [])
        raise ValueError(
            f"run: {run_id!r} is not a planned run of {str(out)!r}; expected one of "
            f"{', '.join(known)}"
        )
    with OutputLock(folder):
        summary = read_summary(folder)
        if is_done(summary):
            assert summary is not None
            console.print(f"{run_id}: already done ({summary['status']}); skipping it")
            return summary
        clear_run(folder)
        started = time.perf_counter()
        summary = launch_run(folder)
    console.print(f"{run_id}: {_outcome(summary)} ({time.perf_counter() - started:.1f} s)")
    return summary


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def paired_description(
    cfg: ExperimentConfig, runs: list[dict[str, Any]], device: str, threads: int
) -> str:
    """The line that says what the grid varies and what it costs: only the factors with more
    than one value differ (the norm, the placement, or both), and each arm's own learning rate
    when the config gives per-arm rates, each count with its plural."""
    values = {
        "norm": list(cfg.norms),
        "placement": list(cfg.placements),
        "precision": list(cfg.precisions),
    }
    factors = FACTORS
    varied = [f for f in factors if len(values.get(f, [])) > 1] or ["norm"]
    fixed = [
        f"{f} {values[f][0]}"
        for f in factors
        if f not in varied
        and values.get(f)
        and (f, values[f]) != ("precision", [DEFAULT_PRECISION])
    ]  # float32, the default precision, goes without saying
    fixed_text = f" ({', '.join(fixed)} for all)" if fixed else ""
    if cfg.train.arm_lr:
        shown = ", ".join(f"{a} {cfg.arm_lr(a):g}" for a in cfg.arm_names())
        fixed_text += f", each arm at its own peak learning rate ({shown})"
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
