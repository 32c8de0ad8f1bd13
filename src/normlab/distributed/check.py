"""A tiny GPT trained data-parallel: the reference wiring of :mod:`normlab.distributed` into a
training loop, and the run the tests launch.

``python -m torch.distributed.run --standalone --nproc-per-node N -m normlab.distributed.check
--out DIR`` (or :func:`normlab.distributed.launcher.launch`) trains
``GPTConfig(d_model=32, n_layers=2, n_heads=2, context=16, vocab_size=256)`` with AdamW and
gradient clipping on batches drawn by :class:`normlab.data.batches.TrainBatches` from a fixed
random token stream, each rank on its shard of the global batch; rank 0 writes ``DIR/result.json``
(per-step global loss and gradient norm, per-rank peak memory and throughput with totals) and
the trained model's full state, ``DIR/model.pt`` (both atomically). The
same function run in one plain process (:func:`train`) is the single-process reference: over
its few steps the losses must agree for every N to float32 rounding (longer runs drift apart as
Adam amplifies that rounding, docs/scaling.md). ``--fail-rank R --fail-at-step S`` makes rank
R raise at step S (the crash path); with ``--hang`` it sleeps forever instead (the timeout
path).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.elastic.multiprocessing.errors import record

from normlab._io import write_bytes_atomic, write_json_atomic, write_text_atomic
from normlab._resources import peak_memory
from normlab.data.batches import TrainBatches
from normlab.distributed.batch import loss_weight, shard_bounds
from normlab.distributed.launcher import parallel_mode
from normlab.distributed.metrics import gather_rank_stats, global_mean, group_grad_norms
from normlab.distributed.process_group import DistContext, exit_rank, init_from_env, teardown
from normlab.distributed.wrap import clip_grad_norm, full_state_dict, wrap
from normlab.models import GPTConfig, build_gpt

__all__ = ["RESULT_FILE", "STATE_FILE", "TINY_GPT", "main", "peak_memory_bytes", "train"]

RESULT_FILE = "result.json"
STATE_FILE = "model.pt"
TINY_GPT = GPTConfig(  # learned positions: the GPT the parameter tolerances were set on
    vocab_size=256, context=16, d_model=32, n_layers=2, n_heads=2, positions="learned"
)
TOKENS = 1 << 14


class InjectedFailure(RuntimeError):
    """The failure ``--fail-rank`` asks for."""


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this rank (:func:`normlab._resources.peak_memory`): CUDA's max allocated
    bytes on a GPU, else the process's peak resident set."""
    return peak_memory(device)[0]


def train(
    ctx: DistContext,
    *,
    steps: int = 5,
    batch_size: int = 8,
    seed: int = 0,
    mode: str = "ddp",
    precision: str = "fp32",
    lr: float = 3e-3,
    grad_clip: float = 0.5,
    fail_rank: int | None = None,
    fail_at_step: int = 1,
    keep_state: bool = False,
    hang: bool = False,
) -> dict[str, Any]:
    """Train the tiny GPT for ``steps`` AdamW steps on global batches of ``batch_size`` rows and
    return ``{"loss": [L_1, …], "grad_norm": [‖g‖_1, …], "layer_grad_norms": {group: ‖g_G‖}
    (last step, before clipping), "ranks": gather_rank_stats(…)}``,
    every value global (the same on every rank); with ``keep_state`` also ``"state_dict"``, the
    trained model's full state on rank 0 (:func:`full_state_dict`, a collective).

    Step s: every rank draws the s-th global batch (x, y) ∈ [B, T]² of the run's seed, keeps rows
    [o_r, o_r + n_r), backpropagates (N·n_r/B)·L_r, clips to the global norm ``grad_clip``,
    steps AdamW (weight decay 0.1 on matrices and embeddings), and logs
    L = Σ_r (n_r/B)·L_r."""
    rng = np.random.Generator(np.random.PCG64(seed))
    tokens = rng.integers(0, TINY_GPT.vocab_size, size=TOKENS, dtype=np.int64)
    batches = TrainBatches(tokens, batch_size, TINY_GPT.context, seed)
    start, stop = shard_bounds(batch_size, ctx.rank, ctx.world_size)
    weight = loss_weight(batch_size, ctx.rank, ctx.world_size)

    base = build_gpt(TINY_GPT, seed).to(ctx.device)  # paired init: same on every rank
    norms = set(base.norm_parameter_names())
    model = wrap(base, mode, precision, device=ctx.device)  # FSDP2 replaces base's parameters
    decay = [p for n, p in base.named_parameters() if p.dim() >= 2 and n not in norms]
    rest = [p for n, p in base.named_parameters() if not (p.dim() >= 2 and n not in norms)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=lr
    )

    losses, grad_norms, layer_norms, elapsed = [], [], {}, 0.0
    for step in range(1, steps + 1):
        x, y = batches.next()
        if fail_rank == ctx.rank and step == fail_at_step:
            if hang:
                while True:  # a rank stuck outside any collective: only a timeout ends the run
                    time.sleep(1.0)
            raise InjectedFailure(f"rank {ctx.rank} fails at step {step} (--fail-rank)")
        begun = time.perf_counter()
        _, loss = model(x[start:stop].to(ctx.device), y[start:stop].to(ctx.device))
        optimizer.zero_grad(set_to_none=True)
        (loss * weight).backward()
        if step == steps:  # before clipping, as train.py logs them
            layer_norms = group_grad_norms(model, base.parameter_groups())
        grad_norms.append(clip_grad_norm(base.parameters(), grad_clip))
        optimizer.step()
        local = loss.item()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        elapsed += time.perf_counter() - begun
        losses.append(global_mean(ctx, local, stop - start, batch_size))
    tokens_per_s = steps * (stop - start) * TINY_GPT.context / elapsed if elapsed else 0.0
    ranks = gather_rank_stats(
        ctx, {"peak_memory_bytes": peak_memory_bytes(ctx.device), "tokens_per_s": tokens_per_s}
    )
    state = {"state_dict": full_state_dict(model)} if keep_state else {}
    return {
        **state,
        "loss": losses,
        "grad_norm": grad_norms,
        "layer_grad_norms": layer_norms,
        "ranks": ranks,
        "world_size": ctx.world_size,
        "mode": mode,
        "precision": precision,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m normlab.distributed.check")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--grad-clip", type=float, default=0.5)
    p.add_argument("--device", default=None, choices=("cpu", "cuda"))
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-at-step", type=int, default=1)
    p.add_argument("--hang", action="store_true", help="the failing rank hangs instead of raising")
    return p


@record
def main(argv: list[str] | None = None) -> int:
    """One rank of the check run (the parallel mode comes from ``NORMLAB_PARALLEL``)."""
    ns = _parser().parse_args(argv)
    ctx = init_from_env(device=ns.device, timeout_s=120.0)
    ns.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(ns.out / f"rank{ctx.rank}.pid", f"{os.getpid()}\n")
    try:
        result = train(
            ctx,
            steps=ns.steps,
            batch_size=ns.batch_size,
            seed=ns.seed,
            mode=parallel_mode(),
            precision=ns.precision,
            grad_clip=ns.grad_clip,
            fail_rank=ns.fail_rank,
            fail_at_step=ns.fail_at_step,
            keep_state=True,
            hang=ns.hang,
        )
        state = result.pop("state_dict")
        if ctx.is_main:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            write_bytes_atomic(ns.out / STATE_FILE, buffer.getvalue())
            write_json_atomic(ns.out / RESULT_FILE, result)
    finally:
        teardown()
    if ctx.distributed:
        exit_rank()  # done and on disk: skip the interpreter's shutdown (see exit_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
