"""Every rank trains on its shard of the same global batch, so a run does not depend on N.

Each rank draws the global batch the single-process run would draw (same data seed, same order),
then keeps a contiguous slice of its rows: with B rows over N ranks, rank r takes rows
[o_r, o_r + n_r) where n_r = ⌊B/N⌋ + (1 if r < B mod N else 0) (``torch.tensor_split``'s split).
The global batch, the data order and the paired start are then the same for every N.

The loss is the mean over the global batch: L = Σ_r (n_r / B) · L_r, L_r the mean over rank r's
rows. DDP and FSDP average gradients over ranks, g = (1/N) Σ_r ∇ℓ_r, so each rank backpropagates
ℓ_r = (N · n_r / B) · L_r (:func:`loss_weight`); with equal shards the factor is 1 and the
mean of local means is the global mean.
"""

from __future__ import annotations

import torch

__all__ = ["loss_weight", "shard_bounds", "shard_rows"]


def _check(global_rows: int, rank: int, world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")
    if global_rows < world_size:
        raise ValueError(
            f"batch_size: {global_rows} rows cannot give each of {world_size} ranks one; expected "
            f"batch_size >= --nproc-per-node × --nnodes = {world_size}"
        )


def shard_bounds(global_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows [start, stop) of a global batch of ``global_rows`` rows:
    n_r = ⌊B/N⌋ + [r < B mod N], start = Σ_{q<r} n_q."""
    _check(global_rows, rank, world_size)
    base, extra = divmod(global_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_rows(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous rows of the global ``batch`` (first dimension), a view."""
    start, stop = shard_bounds(batch.shape[0], rank, world_size)
    return batch[start:stop]


def loss_weight(global_rows: int, rank: int, world_size: int) -> float:
    """The factor N · n_r / B by which rank r scales its mean loss before backward, so that the
    gradient averaged over ranks is the gradient of the global batch's mean loss."""
    start, stop = shard_bounds(global_rows, rank, world_size)
    return world_size * (stop - start) / global_rows
