"""Before a compare allocates anything: estimate what it will need and refuse what cannot fit.

:func:`check_experiment_sizes` bounds, from the validated config alone (nothing is planned,
read or built):

* the grid: ``runs = arms × seeds``; planning holds one spec per run in memory (about
  :data:`SPEC_BYTES` each) and each run writes its folder (about :data:`RUN_DISK_BYTES` plus
  :data:`RECORD_BYTES` per step);
* the data (GPT): the cache may hold up to ``data.max_bytes`` bytes on ``--out``'s disk, and
  building it holds about three copies in memory (read, split, joined); the cap is checked, not
  the source's size, so a cap the machine could not honour is refused whatever the source;
* the model (GPT): parameters P ≈ L·(12·d² + 13·d) + (V + T)·d; training keeps 4 copies
  (weights, gradients, two Adam moments) of 4 bytes, and activations of about
  4·B·T·(L·(16·d + 2·h·T) + 3·V) bytes; ``parallel + 1`` workers exist at once (one in
  standby);
* the images (DiT): ``(n_train + n_val) · image_size² · 3`` float32 values;
* the user's model (lm): :func:`normlab.models.external.footprint.check_source_fits`, from the
  ``--model`` source's config (parameters, Adam's state, activations), ``parallel + 1`` at once.

The estimates are rough (within a small factor) and only refuse sizes far beyond the machine;
each message names the key and both numbers.
"""

from __future__ import annotations

from pathlib import Path

from normlab._resources import available_memory, check_fits, free_disk
from normlab.experiment.config import ExperimentConfig

SPEC_BYTES = 8 * 1024
"""Memory for one planned run (its spec and summary) in the grid's process."""
RUN_DISK_BYTES = 16 * 1024
"""Disk for one run's folder before its per-step records (run.json, summary.json, ...)."""
RECORD_BYTES = 256
"""Disk for one step's record in ``metrics.jsonl``."""
VOCAB_BYTES = 256


def n_runs(cfg: ExperimentConfig) -> int:
    """``arms × seeds`` without listing the seeds (a count may be astronomically large)."""
    n_seeds = cfg.seeds if isinstance(cfg.seeds, int) else len(cfg.seeds)
    return len(cfg.norms) * len(cfg.placements) * n_seeds


def gpt_worker_bytes(cfg: ExperimentConfig) -> int:
    """Estimated memory of one GPT training worker (see the module docstring)."""
    m, b = cfg.model, cfg.train.batch_size
    d, n_layers, t, h, v = m.d_model, m.n_layers, m.context, m.n_heads, VOCAB_BYTES
    params = n_layers * (12 * d * d + 13 * d) + (v + t) * d
    activations = 4 * b * t * (n_layers * (16 * d + 2 * h * t) + 3 * v)
    return 16 * params + activations


def check_experiment_sizes(cfg: ExperimentConfig, out: Path) -> None:
    """Raise ``ValueError`` naming the config key when the grid, the data or the model of
    ``cfg`` would need more memory or disk (``out``'s) than the machine has now."""
    memory, disk = available_memory(), free_disk(out)
    runs = n_runs(cfg)
    grid = f"the grid of {runs:,} runs ({len(cfg.arm_names())} arms × seeds)"
    fewer = "lower seeds (or use fewer norms and placements)"
    check_fits(runs * SPEC_BYTES, memory, grid, "in memory", fewer)
    steps = cfg.resolved_steps()
    on_disk = f"on {str(out)!r}'s disk"
    check_fits(runs * (RUN_DISK_BYTES + steps * RECORD_BYTES), disk, grid, on_disk, fewer)
    if cfg.testbed == "gpt":
        cap = cfg.data.max_bytes
        what = f"data.max_bytes = {cap:,} (the data cache, at its cap)"
        hint = "lower data.max_bytes"
        check_fits(3 * cap, memory, what, "in memory", hint)
        check_fits(cap, disk, what, on_disk, hint)
        m = cfg.model
        workers = cfg.parallel + 1
        check_fits(
            workers * gpt_worker_bytes(cfg),
            memory,
            f"the model (model.d_model = {m.d_model:,}, model.n_layers = {m.n_layers:,}, "
            f"model.context = {m.context:,}, train.batch_size = {cfg.train.batch_size:,}; "
            f"{workers} workers at once)",
            "in memory",
            "use a smaller model, batch or parallel",
        )
    elif cfg.testbed == "lm":  # the user's model: estimated from its config, see footprint
        from normlab.experiment.testbeds.lm import lm_source, vocab_hint
        from normlab.models.external.footprint import check_source_fits

        source = lm_source(cfg.lm.model_dump(mode="json"), vocab_hint(cfg))
        b, t, norm = cfg.train.batch_size, cfg.lm.context, cfg.norms[0]
        check_source_fits(
            source, batch_size=b, context=t, norm=norm, available=memory, copies=cfg.parallel + 1
        )
    else:
        s = cfg.shapes
        check_fits(
            (s.n_train + s.n_val) * s.image_size**2 * 3 * 4,
            memory,
            f"the images (shapes.n_train + shapes.n_val = {s.n_train + s.n_val:,} of "
            f"{s.image_size}×{s.image_size} pixels)",
            "in memory",
            "use fewer or smaller images",
        )
