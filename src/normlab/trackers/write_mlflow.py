"""Write one run to an MLflow file store (``compare --log-to mlflow``).

The store is the folder ``ROOT`` (``mlflow.tracking.MlflowClient("file:ROOT")``); the experiment
is the compare folder's name and the run is named ``<arm>__s<seed>``: its curves as metric
histories at their steps, its summary as metrics ``summary/<field>`` at the last step, its
identity (arm, norm, placement, precision, seed, testbed) as params and, with its status and
``normlab.run_id``, as tags. A run of the same id that an earlier attempt left is deleted first.

MLflow 3 keeps its file store only when ``MLFLOW_ALLOW_FILE_STORE`` is true, and sends usage
telemetry unless ``MLFLOW_DISABLE_TELEMETRY`` is: both are set for the export (nothing leaves the
machine). To browse the store: ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri
OUT/trackers/mlflow``. The library is ``mlflow-skinny`` (extra ``trackers``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from normlab.trackers.exporting import RunExport

__all__ = [
    "RUN_ID_TAG",
    "STORE_ENV",
    "close",
    "file_store_client",
    "store_environment",
    "write_run",
]

RUN_ID_TAG = "normlab.run_id"
"""The tag that holds the run's id (``<arm>__s<seed>``)."""
STORE_ENV = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}
"""What the export sets in the environment while it imports MLflow and opens the store."""
SUMMARY_PREFIX = "summary/"
_BATCH = 1000
"""MLflow's limit of metrics per ``log_batch`` call."""


@contextmanager
def store_environment() -> Iterator[None]:
    """Set :data:`STORE_ENV` inside the block (MLflow reads them when it is imported and when a
    client opens the store), and restore the environment after it."""
    saved = {k: os.environ.get(k) for k in STORE_ENV}
    os.environ.update(STORE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def file_store_client(root: Path) -> Any:
    """An ``MlflowClient`` on the file store in the folder ``root`` (created if needed); call it,
    and use the client, inside :func:`store_environment`."""
    from mlflow.tracking import MlflowClient

    Path(root).mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=Path(root).absolute().as_uri())


def write_run(run: RunExport, root: Path) -> str:
    """Write ``run`` to the file store ``root`` and return ``<experiment id>/<run id>``."""
    with store_environment():
        return _write(run, file_store_client(root))


def _write(run: RunExport, client: Any) -> str:
    from mlflow.entities import Metric, Param, RunTag

    experiment = client.get_experiment_by_name(run.experiment)
    experiment_id = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(run.experiment)
    )
    earlier = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{_quoted(run.name)}'"
    )
    for old in earlier:
        client.delete_run(old.info.run_id)
    tags = {**run.tags, RUN_ID_TAG: run.name}
    run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
    now = int(time.time() * 1000)
    metrics = [
        Metric(name, value, now, step)
        for step, values in run.curves
        for name, value in values.items()
    ]
    metrics += [Metric(SUMMARY_PREFIX + k, v, now, run.last_step) for k, v in run.summary.items()]
    params = [Param(k, str(v)) for k, v in run.identity.items()]
    client.log_batch(run_id, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
    for start in range(0, len(metrics), _BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + _BATCH])
    client.set_terminated(run_id, "FINISHED")
    return f"{experiment_id}/{run_id}"


def _quoted(text: str) -> str:
    """``text`` inside a single-quoted string of MLflow's search filter."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def close() -> None:
    """Nothing stays open between runs."""
