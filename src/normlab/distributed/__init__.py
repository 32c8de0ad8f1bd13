"""One run on several processes: process group, DDP / FSDP2 wrapping, the global batch sharded
over ranks, metrics reduced over ranks, and a torchrun launcher that reports a failed rank.

Below :mod:`normlab.experiment` (which wires it into the training loop and the runner); it
depends only on torch, :mod:`normlab.models` and :mod:`normlab.data` (its check run).
"""

from normlab.distributed.batch import loss_weight, shard_bounds, shard_rows
from normlab.distributed.launcher import LaunchResult, Layout, launch, parallel_mode
from normlab.distributed.metrics import (
    gather_rank_stats,
    global_mean,
    global_sum,
    group_grad_norms,
)
from normlab.distributed.process_group import (
    DistContext,
    exit_rank,
    init_from_env,
    teardown,
)
from normlab.distributed.wrap import (
    MODES,
    PRECISIONS,
    clip_grad_norm,
    full_state_dict,
    mixed_precision_policy,
    unwrap,
    wrap,
)

__all__ = [
    "MODES",
    "PRECISIONS",
    "DistContext",
    "LaunchResult",
    "Layout",
    "clip_grad_norm",
    "exit_rank",
    "full_state_dict",
    "gather_rank_stats",
    "global_mean",
    "global_sum",
    "group_grad_norms",
    "init_from_env",
    "launch",
    "loss_weight",
    "mixed_precision_policy",
    "parallel_mode",
    "shard_bounds",
    "shard_rows",
    "teardown",
    "unwrap",
    "wrap",
]
