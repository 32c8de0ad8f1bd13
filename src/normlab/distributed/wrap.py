"""Wrap a model for data-parallel training: DDP, or FSDP2 (``fully_shard``) per block then root.

Composable, torchtitan-style: :func:`wrap` takes a built model (parameters already initialised
with the paired seed, already on the rank's device) and returns the module the training loop
calls. :func:`clip_grad_norm` clips by the global gradient norm under either wrapping and returns
it as a float.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["MODES", "PRECISIONS", "clip_grad_norm", "mixed_precision_policy", "wrap"]

MODES = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(precision: str):  # -> MixedPrecisionPolicy | None
    """FSDP2's mixed-precision policy for ``precision``: ``fp32`` → None (parameters, compute
    and gradient reduction in float32); ``bf16`` / ``fp16`` → parameters gathered and computed
    in that dtype, gradients reduced in float32 (``reduce_dtype``), the sharded master copy and
    the optimiser state stay float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return None
    return MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32)


def _blocks(model: nn.Module, blocks_attr: str) -> list[nn.Module]:
    blocks = getattr(model, blocks_attr, None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise ValueError(
            f"blocks_attr: FSDP shards the model per block; expected {type(model).__name__}."
            f"{blocks_attr} to be a non-empty nn.ModuleList"
        )
    return list(blocks)


def wrap(
    model: nn.Module,
    mode: str = "ddp",
    precision: str = "fp32",
    *,
    blocks_attr: str = "blocks",
    device: torch.device | None = None,
) -> nn.Module:
    """The data-parallel form of ``model`` over the joined process group.

    ``ddp``: :class:`~torch.nn.parallel.DistributedDataParallel`; every rank keeps the whole
    model and gradients are averaged over ranks, g = (1/N) Σ_r g_r, during backward. Its
    ``precision`` must be applied by the training loop (autocast); DDP keeps float32 weights.
    Without a process group (one process) the model is returned as it is.
    ``fsdp``: FSDP2 ``fully_shard`` on each ``model.<blocks_attr>[i]``, then on the root (the
    embeddings, final norm and head, tied weights included, form the root's group), with
    :func:`mixed_precision_policy` (``precision``). It needs a process group of >= 2 ranks; the
    module is changed in place and returned. Gradients are reduce-scattered as the mean over
    ranks, as DDP's. ``device``: the rank's device for DDP's ``device_ids`` (CUDA only).
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
    policy = mixed_precision_policy(precision)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if mode == "fsdp":
        if world < 2:
            raise ValueError(
                f"--fsdp: FSDP shards the model over processes; expected --nproc-per-node "
                f"(times --nnodes) >= 2, got {world} process"
            )
        from torch.distributed.fsdp import fully_shard

        kwargs = {} if policy is None else {"mp_policy": policy}
        for block in _blocks(model, blocks_attr):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    if device is not None and device.type == "cuda":
        return DistributedDataParallel(model, device_ids=[device.index])
    return DistributedDataParallel(model)


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip gradients to the global norm ‖g‖₂ = sqrt(Σ_p ‖g_p‖²) ≤ ``max_norm`` (``inf``: only
    measure) and return ‖g‖₂ before clipping, as a float, the same on every rank.

    Under DDP the gradients are already all-reduced, so every rank's local norm is the global one.
    Under FSDP2 the gradients are DTensors sharded over ranks; ``clip_grad_norm_`` reduces their
    squared norms over the mesh (its result is a replicated DTensor, read with
    ``full_tensor()``), so each rank scales its shard by the same factor."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)
    return float((full() if full is not None else norm).item())
