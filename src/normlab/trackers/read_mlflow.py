"""Read an MLflow file store (an ``mlruns/`` folder) with MLflow's own client.

Every active run of every active experiment is one run, named by its run name (``mlflow.runName``;
its id when it has none). Its params and tags are fields for ``--arm-from`` / ``--seed-from``
rules (``param:KEY``, ``tag:KEY``); each metric's whole history is read
(``MlflowClient.get_metric_history``). MLflow's status counts: ``FINISHED`` ended, ``FAILED``
and ``KILLED`` failed, ``RUNNING`` and ``SCHEDULED`` not ended.

MLflow appends each logged value to the metric's file as one line (``timestamp value step``); a
run killed while writing leaves a last line cut short, which MLflow's client reads as a shorter
number (or at step 0), or refuses for the whole store. So the metric files of every run are
checked first: a run with one that is empty or whose last line has no line end has that file as
its :class:`~normlab.trackers.tracked.Damage` (with the step of its last whole line) and its
values are not read; its name, params and tags are read from its folder, and the other runs one
by one (``MlflowClient.get_run``).

MLflow 3 keeps its file store in maintenance mode and refuses to open one unless
``MLFLOW_ALLOW_FILE_STORE`` is true; the reader sets it while it reads (and restores it), since
the store is only read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from normlab.trackers.tracked import (
    ENDED,
    FAILED,
    RUNNING,
    Damage,
    TrackedRun,
    TrackerImportError,
    ends_mid_line,
    require,
    series_from_points,
)

__all__ = ["read_mlflow"]

_STATUS = {"FINISHED": ENDED, "FAILED": FAILED, "KILLED": FAILED}
"""MLflow's run statuses that say the run ended; any other (RUNNING, SCHEDULED) is not ended."""
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
_PAGE = 1000
_RUN_NAME_TAG = "mlflow.runName"
_ACTIVE = "active"


@contextmanager
def _file_store_allowed() -> Iterator[None]:
    saved = os.environ.get(_ALLOW_FILE_STORE)
    os.environ[_ALLOW_FILE_STORE] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_ALLOW_FILE_STORE, None)
        else:
            os.environ[_ALLOW_FILE_STORE] = saved


def _is_file_store(path: Path) -> bool:
    """True when ``path`` holds an experiment folder (``<id>/meta.yaml``): opening any other
    folder as a store would make MLflow write its default experiment into it."""
    return path.is_dir() and any((d / "meta.yaml").is_file() for d in path.iterdir() if d.is_dir())


def _all_runs(client: Any, experiment_ids: list[str]) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs(experiment_ids, max_results=_PAGE, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _step(line: bytes) -> int | None:
    """The step of a metric file's line (``timestamp value [step …]``: 0 when it has none)."""
    parts = line.split()
    try:
        return int(parts[2]) if len(parts) >= 3 else 0 if len(parts) == 2 else None
    except ValueError:
        return None


def _metric_damage(folder: Path) -> Damage | None:
    """The first metric file of the run ``folder`` (in name order) that is empty or whose last
    line has no line end, with the step of its last whole line; None when every one is whole."""
    metrics = folder / "metrics"
    for file in sorted(p for p in metrics.rglob("*") if p.is_file()) if metrics.is_dir() else []:
        if file.stat().st_size == 0:
            return Damage(str(file), "is empty (cut before its first line was written)")
        if ends_mid_line(file):
            whole = file.read_bytes().splitlines()[:-1]
            steps = [s for s in map(_step, whole) if s is not None]
            problem = "ends mid-line: its last line has no line end (cut while it was written)"
            return Damage(str(file), problem, max(steps, default=None))
    return None


def _run_folders(path: Path, experiment_id: str) -> list[Path]:
    """The run folders of an experiment of the file store ``path``: its sub-folders that hold
    a ``meta.yaml`` and a ``metrics`` folder."""
    folder = path / experiment_id
    subs = sorted(d for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
    return [d for d in subs if (d / "meta.yaml").is_file() and (d / "metrics").is_dir()]


def _folder_fields(folder: Path, kind: str) -> dict[str, str]:
    """The params (``kind`` "params") or tags ("tags") of a run folder, one file each (a key
    with ``/`` in sub-folders)."""
    root = folder / kind
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    return {f.relative_to(root).as_posix(): f.read_text(encoding="utf-8") for f in files}


def _damaged_run(folder: Path, damage: Damage) -> TrackedRun | None:
    """A run whose metric file is damaged, read from its folder: its name, params and tags, no
    values (None for a deleted run)."""
    meta = yaml.safe_load((folder / "meta.yaml").read_text(encoding="utf-8")) or {}
    if meta.get("lifecycle_stage", _ACTIVE) != _ACTIVE:
        return None
    params, tags = _folder_fields(folder, "params"), _folder_fields(folder, "tags")
    name = meta.get("run_name") or tags.get(_RUN_NAME_TAG) or folder.name
    fields = {f"param:{k}": v for k, v in params.items()}
    fields.update({f"tag:{k}": v for k, v in tags.items()})
    return TrackedRun(name=str(name), fields=fields, damage=damage)


def _tracked(client: Any, found: Any) -> TrackedRun:
    """The :class:`TrackedRun` of an MLflow run whose files are whole, every metric's history
    read."""
    info, data = found.info, found.data
    name = info.run_name or data.tags.get(_RUN_NAME_TAG) or info.run_id
    fields = {f"param:{k}": str(v) for k, v in data.params.items()}
    fields.update({f"tag:{k}": str(v) for k, v in data.tags.items()})
    run = TrackedRun(name=name, fields=fields)
    run.status = _STATUS.get(info.status, RUNNING)
    if run.status != ENDED:
        run.status_note = f"MLflow recorded the run as {info.status}"
    for key in sorted(data.metrics):
        history = client.get_metric_history(info.run_id, key)
        ordered = sorted(history, key=lambda m: m.timestamp)  # logged order per step
        run.series[key] = series_from_points((m.step, m.value) for m in ordered)
    return run


def read_mlflow(path: Path) -> list[TrackedRun]:
    """The runs of the MLflow file store ``path``, sorted by name."""
    if not _is_file_store(path):
        raise TrackerImportError(
            f"--import: {str(path)!r} holds no MLflow experiment (no <id>/meta.yaml in it); "
            "expected the mlruns folder of an MLflow file store"
        )
    tracking = require("mlflow.tracking", "mlflow")
    with _file_store_allowed():
        client = tracking.MlflowClient(tracking_uri=path.resolve().as_uri())
        experiments = [e.experiment_id for e in client.search_experiments()]
        folders = [f for e in experiments for f in _run_folders(path, e)]
        damaged = {f.name: (f, d) for f in folders if (d := _metric_damage(f)) is not None}
        if not damaged:
            found = list(_all_runs(client, experiments)) if experiments else []
        else:  # MLflow's search would read the damaged files: every other run on its own
            found = [client.get_run(f.name) for f in folders if f.name not in damaged]
            found = [r for r in found if r.info.lifecycle_stage == _ACTIVE]
        runs = [_tracked(client, r) for r in found]
        cut = (_damaged_run(f, d) for f, d in damaged.values())
        runs += [r for r in cut if r is not None]
    return sorted(runs, key=lambda r: r.name)
