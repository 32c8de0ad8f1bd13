"""Runs and trackers: judge runs a tracker already holds, and show normlab's runs in a tracker.

Import (``normlab report --import KIND:PATH``): runs recorded by TensorBoard, MLflow, W&B (offline)
or plain CSV / JSON Lines become a compare folder in the run format, so that the paired analysis
and the report read them like normlab's own. Export (``normlab compare --log-to KIND,…``): each of
normlab's runs, its curves and its summary, written to a tracker's offline store under its arm
and seed. Each tracker's library is an optional extra (``pip install "normlab[trackers]"``),
imported only when it is used.
"""

from normlab.trackers.importing import import_runs
from normlab.trackers.tracked import TrackerImportError

__all__: list[str] = [
    "TrackerImportError",
    "exporting",
    "import_runs",
    "write_mlflow",
    "write_tensorboard",
    "write_wandb",
]
