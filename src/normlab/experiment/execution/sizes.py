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


_FEWER = "lower seeds (or use fewer norms and placements)"


def _grid_words(cfg: ExperimentConfig) -> str:
    runs = n_runs(cfg)
    arms = counted(len(cfg.arm_names()), "arm")
    return f"the grid of {runs:,} {noun(runs, 'run')} ({arms} × seeds)"


def _on_disk(out: Path) -> str:
    return f"on {str(out)!r}'s disk"


def check_experiment_sizes(cfg: ExperimentConfig, out: Path) -> None:
    """Raise ``ValueError`` naming the config key when the grid, the data or the model of
    ``cfg`` would need more memory or disk (``out``'s) than the machine has now. Under a
    budget of tokens per parameter the runs' records are checked once the grid has resolved
    its steps (:func:`check_records_disk`)."""
    memory, disk = available_memory(), free_disk(out)
    check_fits(n_runs(cfg) * SPEC_BYTES, memory, _grid_words(cfg), "in memory", _FEWER)
    steps = cfg.fixed_steps()
    if steps is not None:
        check_records_disk(cfg, out, steps, disk)
    check_sizes = cfg.testbeds[cfg.testbed].config.check_sizes
    if check_sizes is not None:
        check_sizes(cfg, memory, disk, _on_disk(out))


def check_records_disk(
    cfg: ExperimentConfig, out: Path, steps: int, disk: int | None = None
) -> None:
    """Raise ``ValueError`` naming the seeds when the runs' folders of ``steps`` steps each
    would need more of ``out``'s disk (``disk`` bytes free; measured when None) than it has."""
    runs = n_runs(cfg)
    free = free_disk(out) if disk is None else disk
    need = runs * (RUN_DISK_BYTES + steps * RECORD_BYTES)
    check_fits(need, free, _grid_words(cfg), _on_disk(out), _FEWER)
