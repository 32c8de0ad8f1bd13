"""Export a compare folder's runs to the trackers a user watches (``normlab compare --log-to``).

Each run that produced a result (``finished`` or ``diverged``) is read back from its folder
through :mod:`normlab.run_format.folder` (so runs of normlab's own loop and of a user's script
export alike) and written, offline, to every tracker asked for, under ``OUT/trackers/<kind>/``
with the name ``<arm>__s<seed>``:

- its curves: every number of every record of ``metrics.jsonl``, named ``<type>/<key>``
  (``train/loss``, ``eval/val_loss``; nested values as ``health/<layer>/<stat>``, an anomaly as
  ``anomaly/<kind>/value``), at the record's step;
- its summary: every number of ``summary.json`` (final metrics, throughput, peak memory, …) and
  its status;
- its identity: arm, norm, placement, precision, seed, testbed, as the tracker's tags, params or
  config.

The writers are :mod:`~normlab.trackers.write_tensorboard`, :mod:`~normlab.trackers.write_mlflow`
and :mod:`~normlab.trackers.write_wandb`; each imports its library only when it is used, and
writing a run again replaces what an earlier attempt of it left (so an export cut short is not
duplicated). ``OUT/trackers/exported.json`` records what was exported (a later command on the
same folder skips it) and which exports failed (retried next time). An export that fails is
recorded and reported; it never stops the comparison.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.markup import escape

from normlab.run_format import DONE_STATUSES, FACTORS
from normlab.run_format.folder import (
    read_records,
    read_run_config,
    read_summary,
    read_trackers_record,
    run_dir,
    trackers_path,
    write_trackers_record,
)

__all__ = [
    "TRACKERS_EXTRA",
    "TRACKER_KINDS",
    "Exporter",
    "RunExport",
    "check_installed",
    "curve_points",
    "parse_kinds",
    "read_run_export",
]

TRACKER_KINDS: tuple[str, ...] = ("tensorboard", "mlflow", "wandb")
"""The trackers ``--log-to`` writes to, in this order."""
TRACKERS_EXTRA = 'pip install "normlab[trackers]"'
"""The install command of the trackers' libraries (an optional extra)."""
_LIBRARY = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
"""The module each kind needs (TensorBoard's writer is ``torch.utils.tensorboard``, which needs
the ``tensorboard`` package)."""
_WRITER = {kind: f"normlab.trackers.write_{kind}" for kind in TRACKER_KINDS}
_IDENTITY = ("run_id", "arm", *FACTORS, "seed", "testbed")
"""The fields that name a run, in the order the trackers show them."""
_LOCK_TIMEOUT_S = 600.0
"""How long an export waits for another process exporting into the same folder."""


def parse_kinds(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The trackers of ``--log-to``: ``"tensorboard,mlflow"`` (or a list) → each kind once, in
    the order given; () for None. ``ValueError`` naming ``--log-to`` for an unknown or empty
    one."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    kinds: list[str] = []
    for item in items:
        kind = item.strip().lower() if isinstance(item, str) else item
        if kind not in TRACKER_KINDS:
            raise ValueError(
                f"--log-to: unknown tracker {item!r}; expected a comma-separated list of "
                f"{', '.join(TRACKER_KINDS)}"
            )
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


def check_installed(kinds: Iterable[str]) -> None:
    """Raise ``ValueError`` naming ``--log-to`` and the extra to install when the library of one
    of ``kinds`` cannot be imported (found without importing it)."""
    for kind in kinds:
        module = _LIBRARY[kind]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(
                f"--log-to {kind}: the {module} package is not installed; install the trackers "
                f"extra: {TRACKERS_EXTRA}"
            )


@dataclass(frozen=True)
class RunExport:
    """One run as every tracker receives it: ``name`` (``<arm>__s<seed>``), ``experiment`` (the
    compare folder's name), ``identity`` (run id, arm, factors, seed, testbed), ``status``,
    ``curves`` [(step, {name: value})] in step order and ``summary`` {field: number}."""

    name: str
    experiment: str
    identity: dict[str, str | int]
    status: str
    curves: list[tuple[int, dict[str, float]]]
    summary: dict[str, float]

    @property
    def last_step(self) -> int:
        """The last step of the curves (0 when there is none): where the summary is logged."""
        return self.curves[-1][0] if self.curves else 0

    @property
    def tags(self) -> dict[str, str]:
        """Identity and status as strings (what trackers keep as tags)."""
        return {**{k: str(v) for k, v in self.identity.items()}, "status": self.status}


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a number (a bool counts 0 / 1); None otherwise. A
    non-finite number stays as it is (the run format writes them as null, read as None)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _flatten(prefix: str, value: Any, into: dict[str, float]) -> None:
    number = _number(value)
    if number is not None:
        into[prefix] = number
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            _flatten(f"{prefix}/{key}", sub, into)


def curve_points(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """The scalars of ``metrics.jsonl``'s records by step: every number of a record, named
    ``<type>/<key>`` (nested mappings add ``/<key>``; a record with a string ``kind`` is named
    ``<type>/<kind>/<key>``), merged per step (a later record's value of the same name wins) and
    sorted by step. Records without an integer step, and values that are not numbers, are left
    out."""
    by_step: dict[int, dict[str, float]] = {}
    for record in records:
        step, kind = record.get("step"), record.get("type")
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(kind, str):
            continue
        prefix = kind
        if isinstance(record.get("kind"), str):
            prefix = f"{kind}/{record['kind']}"
        values: dict[str, float] = {}
        for key, value in record.items():
            if key not in ("type", "step", "kind"):
                _flatten(f"{prefix}/{key}", value, values)
        by_step.setdefault(step, {}).update(values)
    return sorted(by_step.items())


def read_run_export(folder: Path, experiment: str) -> RunExport:
    """The :class:`RunExport` of the run in ``folder`` (its ``run.json``, ``summary.json`` and
    ``metrics.jsonl``), for the experiment named ``experiment``. ``ValueError`` naming the
    folder when it has no summary, naming the file when it is damaged."""
    summary = read_summary(folder)
    if summary is None:
        raise ValueError(f"{folder}: no readable summary.json; nothing to export")
    try:
        config = read_run_config(folder)
    except (OSError, ValueError):
        config = {}
    identity: dict[str, str | int] = {}
    for key in _IDENTITY:
        value = summary.get(key)
        value = config.get(key) if value is None else value
        if value is not None:
            identity[key] = value if isinstance(value, int) else str(value)
    identity.setdefault("run_id", folder.name)
    numbers = {k: _number(v) for k, v in summary.items() if k not in _IDENTITY}
    return RunExport(
        name=str(identity["run_id"]),
        experiment=experiment,
        identity=identity,
        status=str(summary.get("status")),
        curves=curve_points(read_records(folder)),
        summary={k: n for k, n in numbers.items() if n is not None},
    )


def _usable(record: dict[str, Any]) -> dict[str, Any]:
    """``exported.json``'s record with only what has its shape ({"exported" | "failed": {kind:
    {run: …}}}); what does not is dropped (those runs are exported again)."""
    return {
        part: {k: v for k, v in record[part].items() if isinstance(v, dict)}
        for part in ("exported", "failed")
        if isinstance(record.get(part), dict)
    }


def _writer(kind: str) -> ModuleType:
    return importlib.import_module(_WRITER[kind])


@dataclass
class Exporter:
    """Exports the runs of the compare folder ``out`` to the trackers ``kinds`` (see the module
    docstring); ``say`` prints one line (rich markup allowed). :meth:`export` never raises for a
    failed export; :meth:`close` ends what the writers keep open (W&B's service process)."""

    out: Path
    kinds: tuple[str, ...]
    say: Callable[[str], None] = print
    _used: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.kinds = parse_kinds(self.kinds)

    @property
    def experiment(self) -> str:
        """The name runs are exported under: the compare folder's name."""
        return self.out.absolute().name or "normlab"

    def export(self, run_ids: Iterable[str]) -> dict[str, list[str]]:
        """Export every run of ``run_ids`` that produced a result and is not yet exported to
        each tracker; returns {kind: run ids exported now}. A failure is recorded in
        ``exported.json`` and printed, and the next call retries that run."""
        done: dict[str, list[str]] = {kind: [] for kind in self.kinds}
        if not self.kinds:
            return done
        from filelock import FileLock, Timeout

        root = trackers_path(self.out)
        try:
            root.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(root / ".lock"), timeout=_LOCK_TIMEOUT_S)
            lock.acquire()
        except (OSError, Timeout) as err:
            self.say(f"[red]export: cannot write {escape(str(root))} ({escape(str(err))})[/]")
            return done
        try:
            record = _usable(read_trackers_record(self.out))
            for run in run_ids:
                self._export_run(run, record, done)
        finally:
            lock.release()
        return done

    def export_one(self, run: str) -> None:
        """Export the run ``run`` (:meth:`export` of one run; the hook an executor calls as
        each run ends)."""
        self.export([run])

    def _export_run(self, run: str, record: dict[str, Any], done: dict[str, list[str]]) -> None:
        folder = run_dir(self.out, run)
        exported = record.setdefault("exported", {})
        failed = record.setdefault("failed", {})
        todo = [k for k in self.kinds if run not in exported.get(k, {})]
        try:
            summary = read_summary(folder)
        except ValueError as err:  # damaged: said and recorded, never fatal
            if todo:
                self._failed(run, todo, err, record)
            return
        if not todo or summary is None or summary.get("status") not in DONE_STATUSES:
            return
        try:
            data = read_run_export(folder, self.experiment)
        except (OSError, ValueError) as err:
            self._failed(run, todo, err, record)
            return
        for kind in todo:
            started = time.perf_counter()
            try:
                self._used.add(kind)
                where = _writer(kind).write_run(data, trackers_path(self.out) / kind)
            except Exception as err:  # any library error: recorded, never fatal
                self._failed(run, [kind], err, record)
                continue
            exported.setdefault(kind, {})[run] = {
                "status": data.status,
                "where": where,
                "seconds": round(time.perf_counter() - started, 3),
            }
            failed.get(kind, {}).pop(run, None)
            done[kind].append(run)
            self._save(record)
        shown = [k for k in todo if run in done[k]]
        if shown:
            where = escape(str(trackers_path(self.out)))
            self.say(f"{escape(run)}: exported to {', '.join(shown)} ({where})")

    def _failed(
        self, run: str, kinds: list[str], err: BaseException, record: dict[str, Any]
    ) -> None:
        text = " ".join(f"{type(err).__name__}: {err}".split())[:500]
        for kind in kinds:
            record.setdefault("failed", {}).setdefault(kind, {})[run] = text
        self._save(record)
        self.say(
            f"[red]{escape(run)}: export to {', '.join(kinds)} failed ({escape(text)}); the "
            "comparison goes "
            "on, and the next compare on this folder tries again[/]"
        )

    def _save(self, record: dict[str, Any]) -> None:
        try:
            write_trackers_record(self.out, record)
        except OSError as err:
            self.say(f"[red]export: cannot record what was exported ({escape(str(err))})[/]")

    def close(self) -> None:
        """Let each writer used end its session (e.g. W&B's service process)."""
        for kind in sorted(self._used):
            try:
                _writer(kind).close()
            except Exception as err:  # closing must not fail the comparison either
                self.say(f"[red]export: closing {kind} failed ({escape(str(err))})[/]")
        self._used.clear()
