"""The training loop's side of a run spread over several processes (torchrun ranks).

:func:`run_parallel` reads the run's place from torchrun's environment; without it (a plain
worker process) it is the single-process context, and every helper here then does exactly what
the single-process loop did (no collective, no rescaling), so that path stays bit-identical.
With N ranks (see :mod:`normlab.distributed`):

- every rank draws the global batch of B rows the single-process run draws and keeps its rows
  [o_r, o_r + n_r) (:class:`ShardedBatches`; the DiT's noise, times and label dropout are drawn
  for the whole batch before the slice), so the data order and the paired start do not depend
  on N;
- the model is wrapped for DDP or FSDP2 (:func:`wrap_for_training`), each rank backpropagates
  (N · n_r / B) · L_r (:func:`scaled_loss`), and the logged loss is the global mean
  L = Σ_r (n_r / B) · L_r (:func:`global_loss`);
- rank 0 alone writes files; every rank evaluates (an FSDP forward is a collective);
- at the end rank 0 rebuilds the whole model from the gathered state
  (:func:`main_rank_model`) for the post-training steps, which run on rank 0 only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from normlab.distributed import (
    DistContext,
    clip_grad_norm,
    full_state_dict,
    gather_rank_stats,
    global_mean,
    group_grad_norms,
    init_from_env,
    loss_weight,
    parallel_mode,
    shard_bounds,
    wrap,
)
from normlab.distributed.wrap import DEFAULT_PRECISION

__all__ = [
    "RunParallel",
    "ShardedBatches",
    "global_loss",
    "grad_norm",
    "layer_grad_norms",
    "main_rank_model",
    "rank_fields",
    "run_parallel",
    "scaled_loss",
    "shard_task",
    "wrap_for_training",
]

COLLECTIVE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RunParallel:
    """This process's part of a run: its :class:`DistContext`, the parallel ``mode`` (``ddp`` or
    ``fsdp``), the run's ``precision``, and its rows [start, stop) of every global batch of
    ``global_rows`` rows."""

    ctx: DistContext
    mode: str
    precision: str
    global_rows: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """n_r: the rows of the global batch this rank trains on."""
        return self.stop - self.start

    @property
    def weight(self) -> float:
        """N · n_r / B (1 for one process)."""
        return loss_weight(self.global_rows, self.ctx.rank, self.ctx.world_size)


def run_parallel(spec: dict[str, Any]) -> RunParallel:
    """The context of the run ``spec`` in this process: joined to torchrun's process group when
    torchrun started it (``WORLD_SIZE`` set; CUDA runs on ``cuda:LOCAL_RANK`` with NCCL, CPU
    runs with gloo), else rank 0 of 1 on ``spec["device"]`` without a group. The precision is
    the run's ``precision`` (fp32 when the run config has none)."""
    batch = int(spec["train"]["batch_size"])
    precision = str(spec.get("precision", DEFAULT_PRECISION))
    device = torch.device(spec["device"])
    if "WORLD_SIZE" not in os.environ:
        ctx = DistContext(0, 1, 0, device, None)
        return RunParallel(ctx, "ddp", precision, batch, 0, batch)
    ctx = init_from_env("cuda" if device.type == "cuda" else "cpu", COLLECTIVE_TIMEOUT_S)
    start, stop = shard_bounds(batch, ctx.rank, ctx.world_size)
    return RunParallel(ctx, parallel_mode(), precision, batch, start, stop)


class ShardedBatches:
    """A testbed's batch source that keeps this rank's rows of every global batch: ``next()``
    draws the global batch from ``source`` (a tensor or a tuple of tensors with the batch
    first) and returns rows [start, stop) of each; other attributes are the source's."""

    def __init__(self, source: Any, start: int, stop: int) -> None:
        self.source, self.start, self.stop = source, start, stop

    def next(self) -> Any:
        batch = self.source.next()
        if isinstance(batch, torch.Tensor):
            return batch[self.start : self.stop]
        return type(batch)(v[self.start : self.stop] for v in batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def shard_task(task: Any, par: RunParallel) -> None:
    """Make the testbed ``task`` draw only this rank's rows (nothing for one process)."""
    if par.ctx.distributed:
        task.batches = ShardedBatches(task.batches, par.start, par.stop)


def wrap_for_training(task: Any, par: RunParallel) -> nn.Module:
    """Wrap ``task.model`` for data parallelism and return the module to train with (the model
    itself for one process). Under DDP ``task.model`` then becomes the DDP module, so the
    testbed's loss runs through it; its evaluation does the same on every rank."""
    if not par.ctx.distributed:
        return task.model
    base = task.model
    task.model = wrap(base, par.mode, par.precision, device=par.ctx.device)
    return base


def scaled_loss(loss: torch.Tensor, par: RunParallel) -> torch.Tensor:
    """What this rank backpropagates: (N · n_r / B) · L_r; ``loss`` itself for one process."""
    return loss if not par.ctx.distributed else loss * par.weight


def global_loss(local: float, par: RunParallel) -> float:
    """The global batch's mean loss Σ_r (n_r / B) · L_r (a collective); ``local`` for one
    process."""
    if not par.ctx.distributed:
        return local
    return global_mean(par.ctx, local, par.rows, par.global_rows)


def grad_norm(params: list[nn.Parameter], max_norm: float, par: RunParallel) -> float:
    """Clip to the global gradient norm and return it (a collective under FSDP2)."""
    if not par.ctx.distributed:
        return torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    return clip_grad_norm(params, max_norm)


def layer_grad_norms(
    model: nn.Module, groups: dict[str, list[str]], par: RunParallel, local: Any
) -> dict[str, float]:
    """Per-group gradient norms over the whole model; ``local(model, groups)`` (the
    single-process computation) for one process."""
    if not par.ctx.distributed:
        return local(model, groups)
    return group_grad_norms(model, groups)


def rank_fields(par: RunParallel, peak_bytes: int, tokens_per_s: float | None) -> dict[str, Any]:
    """The per-rank summary fields, gathered over ranks (a collective): ``world_size``,
    ``parallel_mode`` (``single``, ``ddp`` or ``fsdp``), ``rank_peak_memory_bytes`` and
    ``rank_tokens_per_s`` (lists by rank), ``total_peak_memory_bytes`` (Σ_r) and
    ``total_tokens_per_s`` (Σ_r, the run's throughput)."""
    stats = gather_rank_stats(
        par.ctx,
        {"peak": float(peak_bytes), "tps": float("nan") if tokens_per_s is None else tokens_per_s},
    )
    per_rank = stats["per_rank"]
    assert isinstance(per_rank, list)
    tps = [r["tps"] for r in per_rank]
    known = all(v == v for v in tps)  # nan: no timed step
    return {
        "world_size": par.ctx.world_size,
        "parallel_mode": par.mode if par.ctx.distributed else "single",
        "rank_peak_memory_bytes": [int(r["peak"]) for r in per_rank],
        "rank_tokens_per_s": tps if known else None,
        "total_peak_memory_bytes": int(sum(r["peak"] for r in per_rank)),
        "total_tokens_per_s": sum(tps) if known else None,
    }


def main_rank_model(task: Any, spec: dict[str, Any], trained: nn.Module, par: RunParallel) -> bool:
    """After training: gather the whole trained model to rank 0 (a collective) and make it
    ``task.model`` there, unwrapped, for the steps that run on rank 0 alone (samples,
    post-training measurements). Returns whether this process is rank 0."""
    if not par.ctx.distributed:
        return True
    state = full_state_dict(trained)
    if not par.ctx.is_main:
        return False
    from normlab.experiment.testbeds import build_model, init_seed

    model = build_model(spec, init_seed(spec))
    model.load_state_dict(state)
    task.model = model.to(par.ctx.device)
    return True
