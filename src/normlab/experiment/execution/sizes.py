"""Before a compare allocates anything: estimate what it will need and refuse what cannot fit.

:func:`check_experiment_sizes` bounds, from the validated config alone (nothing is planned,
read or built):

* the grid: ``runs = arms × seeds``; planning holds one spec per run in memory (about
  :data:`SPEC_BYTES` each) and each run writes its folder (about :data:`RUN_DISK_BYTES` plus
  :data:`RECORD_BYTES` per step);
* the testbed's data and model: what its ``TestbedConfig.check_sizes`` declares
  (:data:`normlab.experiment.testbeds.base.SizeCheck`; the GPT: its data cache at its cap and
  ``parallel + 1`` workers of its model; the DiT: its images; the user's model: its
  ``--model`` source's footprint).

The estimates are rough (within a small factor) and only refuse sizes far beyond the machine;
each message names the key and both numbers.
"""

from __future__ import annotations

from pathlib import Path

from normlab._plural import counted, noun
from normlab._resources import available_memory, check_fits, free_disk
from normlab.experiment.config import ExperimentConfig

SPEC_BYTES = 8 * 1024
"""Memory for one planned run (its spec and summary) in the grid's process."""
RUN_DISK_BYTES = 16 * 1024
"""Disk for one run's folder before its per-step records (run.json, summary.json, ...)."""
RECORD_BYTES = 256
"""Disk for one step's record in ``metrics.jsonl``."""


def n_runs(cfg: ExperimentConfig) -> int:
    """``arms × seeds`` without listing the seeds (a count may be astronomically large)."""
    n_seeds = cfg.seeds if isinstance(cfg.seeds, int) else len(cfg.seeds)
    return len(cfg.norms) * len(cfg.placements) * n_seeds


def check_experiment_sizes(cfg: ExperimentConfig, out: Path) -> None:
    """Raise ``ValueError`` naming the config key when the grid, the data or the model of
    ``cfg`` would need more memory or disk (``out``'s) than the machine has now."""
    memory, disk = available_memory(), free_disk(out)
    runs = n_runs(cfg)
    arms = counted(len(cfg.arm_names()), "arm")
    grid = f"the grid of {runs:,} {noun(runs, 'run')} ({arms} × seeds)"
    fewer = "lower seeds (or use fewer norms and placements)"
    check_fits(runs * SPEC_BYTES, memory, grid, "in memory", fewer)
    steps = cfg.resolved_steps()
    on_disk = f"on {str(out)!r}'s disk"
    check_fits(runs * (RUN_DISK_BYTES + steps * RECORD_BYTES), disk, grid, on_disk, fewer)
    check_sizes = cfg.testbeds[cfg.testbed].config.check_sizes
    if check_sizes is not None:
        check_sizes(cfg, memory, disk, on_disk)
