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

__all__ = [
    "DEFAULT_PRECISION",
    "MODES",
    "PRECISIONS",
    "clip_grad_norm",
    "full_state_dict",
    "mixed_precision_policy",
    "unwrap",
    "wrap",
]

MODES = ("ddp", "fsdp")
PRECISIONS = ("fp32", "bf16", "fp16")
"""The training precisions: float32, or autocast to bfloat16 or float16 around forward and loss
(the mixed-precision policies of :func:`mixed_precision_policy`)."""
DEFAULT_PRECISION = "fp32"
"""The precision of an experiment that asks for none, and of a run config that names none."""
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


def unwrap(model: nn.Module) -> nn.Module:
    """The module :func:`wrap` was given: DDP's ``.module``; an FSDP2 model is its own (its
    parameters are then sharded DTensors, see :func:`full_state_dict`)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state on rank 0, as plain CPU tensors with the unwrapped names (what a
    single-process run's ``state_dict()`` holds); ``{}`` on the other ranks.

    Under FSDP2 this is a collective (every rank must call it: the shards are gathered with
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict``, full and offloaded to the
    CPU on rank 0). Under DDP or one process it copies rank 0's replica; the others return
    ``{}`` without communicating."""
    from torch.distributed.tensor import DTensor

    base = unwrap(model)
    sharded = any(isinstance(p, DTensor) for p in base.parameters())
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(base, options=options)
        return {k: v.detach().clone() for k, v in state.items()} if rank == 0 else {}
    if rank != 0:
        return {}
    return {k: v.detach().cpu().clone() for k, v in base.state_dict().items()}
