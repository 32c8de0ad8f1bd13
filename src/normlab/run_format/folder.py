"""The one reader and writer of the files of ``normlab compare``'s output folder.

Every module that reads or writes a run's folder (``runs/<run_id>/``) or the folder-level
records calls these functions, by the names that :mod:`normlab.run_format.files` declares:

- a run folder: :func:`create_run` (empty it, write ``run.json``), :func:`read_run_config`,
  :func:`write_summary` (called by :mod:`normlab.run_format.summary` alone, which every module
  that ends a run calls) / :func:`read_summary`, :func:`append_record`
  and :func:`read_records` (``metrics.jsonl``; :func:`write_records` writes it whole, for an
  import), :class:`MetricsTail` (the last step logged, read as the file grows),
  :func:`write_images` (``samples.npy`` and ``reference.npy``) and the paths of those files for
  readers that open them themselves; a script's run
  (:mod:`normlab.run_format.script`): :func:`write_run_config` (a standalone script's own
  ``run.json``), :func:`write_fingerprint` / :func:`read_fingerprint`, :func:`script_log_path`
  and :func:`read_log_tail`;
- the output folder: :func:`write_experiment` / :func:`read_experiment` /
  :func:`check_experiment_file`,
  :func:`write_sequential`, :func:`write_command` / :func:`read_command`,
  :func:`read_analysis`, :func:`run_folders`; the trackers' stores of ``compare --log-to``:
  :func:`trackers_path` and :func:`write_trackers_record` / :func:`read_trackers_record`;
- a ladder folder (``compare --ladder``): :func:`write_ladder_plan` / :func:`read_ladder_plan`
  (``ladder.json``), :func:`write_ladder_analysis` / :func:`read_ladder_analysis` (its
  summary.json: the fit and prediction, with the plan), :func:`rung_path` (each rung's compare
  folder) and :func:`ladder_run_id` / :func:`split_ladder_run_id` (``<key>=<value>/<run_id>``);
- a learning-rate sweep (``compare --lr-sweep``): :func:`sweep_path` (each rate's compare
  folder of tuning runs).

Every file is written to a temporary name and renamed into place (:mod:`normlab._io`), except
``metrics.jsonl``, which is appended one whole line at a time (:func:`write_records` writes it
whole, atomically).

A damaged file is never read as an absent one: every reader returns None (or raises
``OSError``) only when the file is not there, and raises ``ValueError`` naming the file when it
is there but cannot be read as what it should hold, so that no command takes a damaged record
for a missing one and writes over it (the one exception, :func:`read_trackers_record`, says
why).
"""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from normlab._io import (
    append_jsonl,
    json_text,
    read_json_object,
    read_jsonl,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from normlab.run_format.experiment_record import check_experiment
from normlab.run_format.fields import RUN_STATUSES
from normlab.run_format.files import (
    ANALYSIS_FILE,
    COMMAND_FILE,
    EXPERIMENT_FILE,
    LADDER_FILE,
    LOCK_FILE,
    LR_SWEEP_DIR,
    METRICS_FILE,
    REFERENCE_FILE,
    RUN_FILE,
    RUNS_DIR,
    SAMPLES_FILE,
    SEQUENTIAL_FILE,
    SUMMARY_FILE,
    TRACKERS_DIR,
    TRACKERS_RECORD_FILE,
    run_dir,
)
from normlab.run_format.ladder import LADDER_KEY, check_ladder
from normlab.run_format.records import TRAIN_RECORD
from normlab.run_format.script import FINGERPRINT_FILE, SCRIPT_LOG_FILE

__all__ = [
    "MetricsTail",
    "append_record",
    "check_experiment_file",
    "clear_run",
    "create_run",
    "has_experiment",
    "has_run_config",
    "has_summary",
    "metrics_path",
    "read_analysis",
    "read_command",
    "read_experiment",
    "read_fingerprint",
    "read_ladder_analysis",
    "read_log_tail",
    "read_records",
    "read_run_config",
    "read_summary",
    "read_trackers_record",
    "reference_path",
    "run_dir",
    "run_folders",
    "runs_path",
    "samples_path",
    "script_log_path",
    "summary_path",
    "sweep_path",
    "trackers_path",
    "tuning_folders",
    "write_command",
    "write_experiment",
    "write_fingerprint",
    "write_images",
    "write_ladder_analysis",
    "write_records",
    "write_run_config",
    "write_sequential",
    "write_summary",
    "write_trackers_record",
]


# -- paths -------------------------------------------------------------------------------------


def runs_path(out: Path | str) -> Path:
    """The folder of every run: ``out/runs``."""
    return Path(out) / RUNS_DIR


def run_folders(out: Path | str) -> list[Path]:
    """The folders under ``out/runs``, sorted by name ([] when there is none)."""
    runs = runs_path(out)
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def summary_path(run: Path | str) -> Path:
    """The run folder's ``summary.json`` (it may not exist)."""
    return Path(run) / SUMMARY_FILE


def metrics_path(run: Path | str) -> Path:
    """The run folder's ``metrics.jsonl`` (it may not exist)."""
    return Path(run) / METRICS_FILE


def samples_path(run: Path | str) -> Path:
    """The run folder's ``samples.npy``: the first images a finished DiT run generated."""
    return Path(run) / SAMPLES_FILE


def reference_path(run: Path | str) -> Path:
    """The run folder's ``reference.npy``: validation images with the samples' labels."""
    return Path(run) / REFERENCE_FILE


# -- a run's folder ----------------------------------------------------------------------------


def create_run(out: Path | str, spec: dict[str, Any]) -> Path:
    """Empty the folder of the run ``spec["run_id"]`` (an unfinished run is redone from scratch)
    and write its ``run.json``; returns the folder."""
    folder = run_dir(out, spec["run_id"])
    shutil.rmtree(folder, ignore_errors=True)
    write_json_atomic(folder / RUN_FILE, spec)
    return folder


def write_run_config(run: Path | str, spec: dict[str, Any]) -> Path:
    """Write ``spec`` as the run folder's ``run.json`` atomically (the folder is created if
    needed; nothing else in it is touched)."""
    return write_json_atomic(Path(run) / RUN_FILE, spec)


def write_fingerprint(run: Path | str, fingerprint: dict[str, Any]) -> Path:
    """Write the run's ``fingerprint.json`` atomically: ``{"parameters": {name: digest},
    "batch": digest}``."""
    return write_json_atomic(Path(run) / FINGERPRINT_FILE, fingerprint)


def read_fingerprint(run: Path | str) -> dict[str, Any] | None:
    """The run's ``fingerprint.json``, or None when it has none; ``ValueError`` naming the file
    when it is damaged (not JSON, or not an object)."""
    path = Path(run) / FINGERPRINT_FILE
    return read_json_object(path) if path.is_file() else None


def script_log_path(run: Path | str) -> Path:
    """The run folder's ``script.log``: a script's standard output and error, which the process
    that starts the script opens and appends to."""
    return Path(run) / SCRIPT_LOG_FILE


def read_log_tail(run: Path | str, max_chars: int = 2000) -> str:
    """The last ``max_chars`` characters of the run's ``script.log`` ("" when there is none),
    decoded as UTF-8 with undecodable bytes replaced."""
    path = script_log_path(run)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4 * max_chars))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return text[-max_chars:]


def clear_run(run: Path | str) -> None:
    """Remove everything in the run folder but its ``run.json`` and its lock: the run is then
    trained afresh from its config."""
    for entry in Path(run).iterdir():
        if entry.name in (RUN_FILE, LOCK_FILE):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def has_run_config(run: Path | str) -> bool:
    """True when the run folder holds a ``run.json``."""
    return (Path(run) / RUN_FILE).is_file()


def read_run_config(run: Path | str) -> dict[str, Any]:
    """The run's ``run.json``; ``ValueError`` naming the file if it is not a JSON object,
    ``OSError`` if it cannot be read."""
    return read_json_object(Path(run) / RUN_FILE)


def has_summary(run: Path | str) -> bool:
    """True when the run folder holds a ``summary.json``."""
    return summary_path(run).is_file()


def write_summary(run: Path | str, summary: dict[str, Any]) -> Path:
    """Write the run's ``summary.json`` atomically (non-finite numbers as null). Only
    :mod:`normlab.run_format.summary` calls it (:func:`~normlab.run_format.summary.finish_run`,
    :func:`~normlab.run_format.summary.record_crash`)."""
    return write_json_atomic(summary_path(run), summary)


def read_summary(run: Path | str) -> dict[str, Any] | None:
    """The run's ``summary.json``, or None when it has none (a run not trained, or cut short
    before it ended); ``ValueError`` naming the file when it is damaged: not JSON, not an
    object, or a ``status`` that is not a run status. Every reader, the training side's that
    skips the runs done as much as the report's, refuses a damaged summary rather than take it
    for a run to redo: the file is the only record of the run's result."""
    path = summary_path(run)
    if not path.is_file():
        return None
    summary = read_json_object(path)
    status = summary.get("status")
    if status not in RUN_STATUSES:
        raise ValueError(
            f"{str(path)!r}: 'status' must be one of {list(RUN_STATUSES)}, got {status!r}"
        )
    return summary


def append_record(run: Path | str, record: dict[str, Any]) -> None:
    """Append one record to the run's ``metrics.jsonl`` as one whole line."""
    append_jsonl(metrics_path(run), record)


def write_records(run: Path | str, records: Iterable[dict[str, Any]]) -> Path:
    """Write the run's whole ``metrics.jsonl`` at once, atomically, one record per line (runs
    whose records are all known, as in an import; non-finite numbers as null)."""
    text = "".join(json_text(record, indent=None) for record in records)
    return write_text_atomic(metrics_path(run), text)


def read_records(run: Path | str, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of the run's ``metrics.jsonl`` (of type ``kind`` only, when given), in file
    order; an unterminated last line is skipped (:func:`normlab._io.read_jsonl`)."""
    records = read_jsonl(metrics_path(run))
    return records if kind is None else [r for r in records if r.get("type") == kind]


class MetricsTail:
    """The last training step logged in a run's ``metrics.jsonl``, read as the file grows."""

    def __init__(self, run: Path | str) -> None:
        self.path = metrics_path(run)
        self.offset = 0
        self.step = 0

    def poll(self) -> int:
        """Read what was appended since the last call; return the last ``train`` step."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.step
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == TRAIN_RECORD:
                self.step = max(self.step, int(record["step"]))
        return self.step


def write_images(run: Path | str, samples: np.ndarray, reference: np.ndarray) -> None:
    """Write a DiT run's ``samples.npy`` and ``reference.npy``, each as float32, atomically."""
    _write_npy(samples_path(run), samples)
    _write_npy(reference_path(run), reference)


def _write_npy(path: Path, images: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(images, dtype=np.float32))
    write_bytes_atomic(path, buf.getvalue())


# -- the output folder -------------------------------------------------------------------------


def has_experiment(out: Path | str) -> bool:
    """True when ``out`` holds an ``experiment.json`` (it is a compare folder)."""
    return (Path(out) / EXPERIMENT_FILE).is_file()


def write_experiment(out: Path | str, record: dict[str, Any]) -> Path:
    """Write ``out/experiment.json`` atomically."""
    return write_json_atomic(Path(out) / EXPERIMENT_FILE, record)


def read_experiment(out: Path | str) -> dict[str, Any]:
    """``out/experiment.json``; ``ValueError`` naming the file if it is not a JSON object."""
    return read_json_object(Path(out) / EXPERIMENT_FILE)


def check_experiment_file(out: Path | str) -> None:
    """Raise ``ValueError`` naming ``out/experiment.json`` when ``out`` holds one that is
    damaged: not UTF-8 JSON, not an object, or not in experiment.json's shape
    (:func:`normlab.run_format.experiment_record.check_experiment`); nothing when there is
    none. What a command that writes into a compare folder calls before it writes, so that it
    never writes over a damaged record it could not read."""
    path = Path(out) / EXPERIMENT_FILE
    if path.is_file():
        check_experiment(read_json_object(path), repr(str(path)))


def write_sequential(out: Path | str, state: dict[str, Any]) -> Path:
    """Write the sequential procedure's state to ``out/sequential.json`` atomically."""
    return write_json_atomic(Path(out) / SEQUENTIAL_FILE, state)


def read_sequential(out: Path | str) -> dict[str, Any] | None:
    """``out/sequential.json``, or None when there is none (a compare without
    ``--until-decided``); ``ValueError`` naming the file when it is damaged (not JSON, or not
    an object): its decisions replace the fixed-sample verdicts, so it is never left out
    silently."""
    path = Path(out) / SEQUENTIAL_FILE
    return read_json_object(path) if path.is_file() else None


def clear_sequential(out: Path | str) -> None:
    """Remove ``out/sequential.json`` if present (a fixed-seed compare no longer follows it)."""
    (Path(out) / SEQUENTIAL_FILE).unlink(missing_ok=True)


def write_command(out: Path | str, args: Iterable[str]) -> Path:
    """Record the flags of the compare that wrote ``out`` in ``out/command.json``."""
    return write_json_atomic(Path(out) / COMMAND_FILE, {"args": list(args)})


def read_command(out: Path | str) -> dict[str, Any]:
    """``out/command.json``; ``OSError`` or ``ValueError`` when absent or damaged."""
    return read_json_object(Path(out) / COMMAND_FILE)


def write_analysis(out: Path | str, analysis: dict[str, Any]) -> Path:
    """Write the report's analysis of every run to ``out/summary.json`` atomically."""
    return write_json_atomic(Path(out) / ANALYSIS_FILE, analysis)


def read_analysis(out: Path | str) -> dict[str, Any]:
    """The report's analysis of every run, ``out/summary.json``; ``OSError`` or ``ValueError``
    when absent or damaged."""
    return read_json_object(Path(out) / ANALYSIS_FILE)


def trackers_path(out: Path | str) -> Path:
    """The folder of the trackers' offline stores (``compare --log-to``): ``out/trackers``."""
    return Path(out) / TRACKERS_DIR


def write_trackers_record(out: Path | str, record: dict[str, Any]) -> Path:
    """Write the record of what was exported to the trackers, ``out/trackers/exported.json``,
    atomically."""
    return write_json_atomic(trackers_path(out) / TRACKERS_RECORD_FILE, record)


def read_trackers_record(out: Path | str) -> dict[str, Any]:
    """``out/trackers/exported.json``, or {} when there is none or it cannot be read as a JSON
    object (every run is then exported again, which replaces what an earlier export of it
    left)."""
    try:
        record = json.loads((trackers_path(out) / TRACKERS_RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def has_ladder_plan(out: Path | str) -> bool:
    """True when ``out`` holds a ``ladder.json`` (it is a ladder folder)."""
    return (Path(out) / LADDER_FILE).is_file()


def write_ladder_plan(out: Path | str, record: dict[str, Any]) -> Path:
    """Write ``out/ladder.json`` atomically."""
    return write_json_atomic(Path(out) / LADDER_FILE, record)


def read_ladder_plan(out: Path | str) -> dict[str, Any]:
    """``out/ladder.json``; ``ValueError`` naming the file if it is not a JSON object."""
    return read_json_object(Path(out) / LADDER_FILE)


def write_ladder_analysis(out: Path | str, ladder: dict[str, Any], plan: dict[str, Any]) -> Path:
    """Write the ladder folder's analysis, ``out/summary.json`` = {``ladder``: ``ladder``
    (checked against :data:`normlab.run_format.LADDER_SHAPE`), ``plan``: ladder.json's
    ``plan``}, atomically."""
    check_ladder(ladder)
    return write_json_atomic(Path(out) / ANALYSIS_FILE, {LADDER_KEY: ladder, "plan": plan})


def read_ladder_analysis(out: Path | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ``ladder`` value, the ``plan``) of the ladder folder's summary.json;
    ``OSError`` when absent, ``ValueError`` when damaged or not a ladder's analysis."""
    analysis = read_json_object(Path(out) / ANALYSIS_FILE)
    ladder, plan = analysis.get(LADDER_KEY), analysis.get("plan")
    if not isinstance(plan, dict):
        raise ValueError(f"{Path(out) / ANALYSIS_FILE}: expected a ladder's analysis with its plan")
    check_ladder(ladder)
    return ladder, plan


def rung_path(out: Path | str, setting: str) -> Path:
    """The compare folder of the rung ``setting`` (``d_model=64``) of the ladder folder ``out``."""
    return Path(out) / setting


def ladder_run_id(setting: str, run: str) -> str:
    """A ladder's id of a rung's run: ``<setting>/<run_id>`` (``d_model=64/layernorm-pre__s0``)."""
    return f"{setting}/{run}"


def sweep_path(out: Path | str, rate: float, setting: str | None = None) -> Path:
    """The compare folder of the tuning runs at ``rate`` of a learning-rate sweep in ``out``:
    ``out/lr-sweep/lr=<rate>/``, or for the rung ``setting`` of a ladder folder
    ``out/lr-sweep/<setting>/lr=<rate>/``; the rate is written as Python's shortest repr of the
    float (``0.003``, ``1e-05``), so distinct rates have distinct folders."""
    folder = Path(out) / LR_SWEEP_DIR
    if setting is not None:
        folder = folder / setting
    return folder / f"{_RATE_PREFIX}{float(rate)!r}"


_RATE_PREFIX = "lr="
"""How a tuning folder's name (:func:`sweep_path`) begins; the rate follows."""


def tuning_folders(out: Path | str, setting: str | None = None) -> dict[float, Path]:
    """The tuning folders of a learning-rate sweep found in ``out`` (:func:`sweep_path`):
    {rate: folder}, in increasing rate; {} without any. A folder ``lr=<x>`` whose ``x`` is not a
    positive finite number is not one."""
    folder = Path(out) / LR_SWEEP_DIR
    if setting is not None:
        folder = folder / setting
    found = {}
    for path in folder.glob(f"{_RATE_PREFIX}*") if folder.is_dir() else ():
        try:
            rate = float(path.name.removeprefix(_RATE_PREFIX))
        except ValueError:
            continue
        if path.is_dir() and math.isfinite(rate) and rate > 0:
            found[rate] = path
    return dict(sorted(found.items()))


def split_ladder_run_id(run: str) -> tuple[str, str] | None:
    """``d_model=64/layernorm-pre__s0`` → (``d_model=64``, ``layernorm-pre__s0``); None for a
    plain run id (no ``/``)."""
    setting, sep, rest = run.partition("/")
    if not sep or "=" not in setting or not rest or "/" in rest:
        return None
    return setting, rest
