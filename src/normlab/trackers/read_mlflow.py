"""Read an MLflow file store (an ``mlruns/`` folder) with MLflow's own client.

Every active run of every active experiment is one run, named by its run name (``mlflow.runName``;
its id when it has none). Its params and tags are fields for ``--arm-from`` / ``--seed-from``
rules (``param:KEY``, ``tag:KEY``); each metric's whole history is read
(``MlflowClient.get_metric_history``). MLflow's status counts: ``FINISHED`` ended, ``FAILED``
and ``KILLED`` failed, ``RUNNING`` and ``SCHEDULED`` not ended.

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

from normlab.trackers.tracked import (
    ENDED,
    FAILED,
    RUNNING,
    TrackedRun,
    TrackerImportError,
    require,
    series_from_points,
)

__all__ = ["read_mlflow"]

_STATUS = {"FINISHED": ENDED, "FAILED": FAILED, "KILLED": FAILED}
"""MLflow's run statuses that say the run ended; any other (RUNNING, SCHEDULED) is not ended."""
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
_PAGE = 1000


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
        runs = []
        for found in _all_runs(client, experiments) if experiments else []:
            info, data = found.info, found.data
            name = info.run_name or data.tags.get("mlflow.runName") or info.run_id
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
            runs.append(run)
    return sorted(runs, key=lambda r: r.name)
