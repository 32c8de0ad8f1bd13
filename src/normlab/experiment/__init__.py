"""The controlled comparison: config → grid of paired runs → a worker per run → metrics on disk.

See docs/DESIGN.md §3 and docs/run-format.md for the data flow and the output folder.
"""

from normlab.experiment.anomaly import (
    SpikeDetector,
    SpikeRule,
    find_spikes,
    first_nonfinite,
    robust_z,
    spike_scores,
)
from normlab.experiment.config import (
    ConfigError,
    ExperimentConfig,
    arm_name,
    load_config_file,
    merge_overrides,
    validate_config,
)
from normlab.experiment.grid import check_only_factors_differ, plan_runs
from normlab.experiment.lock import FolderLockedError, OutputLock
from normlab.experiment.runner import run_experiment, run_grid
from normlab.experiment.train import train_run
from normlab.experiment.worker import execute_run
from normlab.run_format import run_id

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "FolderLockedError",
    "OutputLock",
    "SpikeDetector",
    "SpikeRule",
    "arm_name",
    "check_only_factors_differ",
    "execute_run",
    "find_spikes",
    "first_nonfinite",
    "load_config_file",
    "merge_overrides",
    "plan_runs",
    "robust_z",
    "run_experiment",
    "run_grid",
    "run_id",
    "spike_scores",
    "train_run",
    "validate_config",
]
