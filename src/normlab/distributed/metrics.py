"""Metrics of a data-parallel run reduced over ranks, so rank 0 logs the global values.

- the step's loss: L = Σ_r (n_r / B) · L_r (a weighted sum, :func:`global_mean`);
- the gradient norm: already global (see :func:`normlab.distributed.wrap.clip_grad_norm`); the
  per-group norms of the ``layer_grad_norms`` records: :func:`group_grad_norms`;
- per-rank figures (peak memory, tokens per second): gathered to every rank with their totals
  (:func:`gather_rank_stats`).
Every function here is a collective: all ranks call it, in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from normlab.distributed.process_group import DistContext

__all__ = ["gather_rank_stats", "global_mean", "global_sum", "group_grad_norms"]


def global_sum(ctx: DistContext, value: float) -> float:
    """Σ_r value_r over ranks (in float64); ``value`` itself without a process group."""
    if not ctx.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def global_mean(ctx: DistContext, local_mean: float, local_rows: int, global_rows: int) -> float:
    """The mean over the global batch of B rows from each rank's mean over its n_r rows:
    Σ_r (n_r / B) · local_mean_r."""
    if global_rows < 1:
        raise ValueError(f"global_rows: expected an int >= 1, got {global_rows!r}")
    return global_sum(ctx, float(local_mean) * local_rows / global_rows)


def gather_rank_stats(ctx: DistContext, stats: dict[str, float]) -> dict[str, object]:
    """Each rank's ``stats`` (same keys on every rank) gathered to all ranks:
    ``{"per_rank": [stats_0, …, stats_{N-1}], "total": {k: Σ_r stats_r[k]},
    "max": {k: max_r stats_r[k]}}``. Totals of a rate (tokens per second) are the run's
    throughput; the max of peak memory is what the largest rank needed."""
    keys = sorted(stats)
    local = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=ctx.device)
    if ctx.distributed:
        parts = [torch.empty_like(local) for _ in range(ctx.world_size)]
        dist.all_gather(parts, local)
        table = torch.stack(parts).cpu()
    else:
        table = local.cpu()[None]
    per_rank = [dict(zip(keys, row.tolist(), strict=True)) for row in table]
    return {
        "per_rank": per_rank,
        "total": dict(zip(keys, table.sum(0).tolist(), strict=True)),
        "max": dict(zip(keys, table.max(0).values.tolist(), strict=True)),
    }


def group_grad_norms(model: nn.Module, groups: dict[str, list[str]]) -> dict[str, float]:
    """‖g_G‖₂ = sqrt(Σ_{p∈G} ‖g_p‖²) for each group G of parameter names (the unwrapped names,
    as ``GPT.parameter_groups()`` gives them), over the whole model on every rank; groups with no
    gradient are left out. Under FSDP2 each parameter's norm is reduced over its shards (a
    collective per parameter: every rank must call this at the same step); under DDP or one
    process the gradients are already whole."""
    from normlab.distributed.wrap import unwrap

    params = dict(unwrap(model).named_parameters())
    norms = {}
    for group, names in groups.items():
        parts = []
        for name in names:
            grad = params[name].grad
            if grad is None:
                continue
            norm = torch.linalg.vector_norm(grad.float())
            full = getattr(norm, "full_tensor", None)
            parts.append((full() if full is not None else norm).detach())
        if parts:
            norms[group] = float(torch.linalg.vector_norm(torch.stack(parts)).item())
    return norms
