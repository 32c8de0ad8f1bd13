"""Train one run of the grid from its resolved config (``run.json``), logging every step.

This is the body of a worker process; it knows nothing of the grid. What depends on the testbed
(GPT or DiT: model, data, loss, validation) comes from :mod:`normlab.experiment.testbeds`; the loop,
schedule, clipping, anomaly detection and timing are shared. It appends ``train``,
``eval``, ``health``, ``layer_grad_norms`` and ``anomaly`` records to ``metrics.jsonl`` (see
docs/run-format.md) and returns the run's summary. A non-finite loss or gradient stops the run
with status ``"diverged"``: a result, not an error. The run's training precision
(:mod:`normlab.experiment.training.precision`) wraps forward and loss in autocast; an fp16 step
that the
gradient scaler skips (inf/NaN in the scaled gradients) is counted in ``n_skipped_steps`` and is
neither a divergence nor a gradient anomaly. Norm health (:mod:`normlab.experiment.measure.health`)
is recorded after every evaluation on a fixed validation batch, in float32, without drawing random
numbers, so it changes nothing of the training.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from normlab._resources import peak_memory
from normlab.experiment.measure.activations import SavedActivationBytes
from normlab.experiment.measure.anomaly import SpikeDetector, SpikeRule
from normlab.experiment.measure.health import norm_health
from normlab.experiment.testbeds import Testbed, make_testbed, warm_up_gpt
from normlab.experiment.training import parallel as par_
from normlab.experiment.training.precision import DEFAULT_PRECISION, PrecisionStep, autocast_for
from normlab.experiment.training.schedule import lr_at, make_optimizer
from normlab.experiment.training.step_timer import StepTimer
from normlab.models import GPTConfig, combined_digest, shared_parameter_digests
from normlab.run_format import (
    ANOMALY_RECORD,
    DIVERGED,
    EVAL_RECORD,
    FINISHED,
    GRAD_SPIKE,
    HEALTH_RECORD,
    LAYER_GRAD_RECORD,
    LOSS_SPIKE,
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    POSTTRAIN_FIELDS,
    TRAIN_RECORD,
)
from normlab.run_format.folder import append_record


class RunAborted(RuntimeError):
    """Training stopped from outside (the grid's process is gone); the run stays unfinished."""


def gpt_config(spec: dict[str, Any]) -> GPTConfig:
    """The testbed of a resolved GPT run config."""
    return GPTConfig(**spec["model"], norm=spec["norm"], placement=spec["placement"])


def _group_grad_norms(model: nn.Module, groups: dict[str, list[str]]) -> dict[str, float]:
    params = dict(model.named_parameters())
    norms = {}
    for group, names in groups.items():
        grads = [params[n].grad for n in names if params[n].grad is not None]
        if grads:
            norms[group] = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
            ).item()
    return norms


warm_up = warm_up_gpt  # the GPT's warm-up, under its earlier name


def _warm_up_counting_saved_bytes(task: Testbed, device: torch.device) -> int | None:
    """Run the task's warm-up (a forward and backward of the training shape) and return the
    bytes its forward saved for the backward, parameters left out (see
    :mod:`normlab.experiment.measure.activations`); None, after a plain warm-up, where autograd's
    saved-tensor hooks are not supported."""
    try:
        with SavedActivationBytes(task.model.parameters()) as counter:
            task.warm_up(device)
        return counter.bytes
    except (RuntimeError, NotImplementedError):
        task.model.zero_grad(set_to_none=True)
        task.warm_up(device)
        return None


def run_precision(spec: dict[str, Any]) -> str:
    """The run's training precision (``fp32`` for a run.json written before precisions)."""
    return str(spec.get("precision", DEFAULT_PRECISION))


def precision_step(
    spec: dict[str, Any], device: torch.device, optimizer: torch.optim.Optimizer
) -> PrecisionStep:
    """The backward / clip / step sequence of the run's precision (fp16: with a gradient scaler
    starting at ``spec["fp16_init_scale"]``, torch's default when absent)."""
    return PrecisionStep(run_precision(spec), device, optimizer, spec.get("fp16_init_scale"))


def health_record(
    task: Testbed, model: torch.nn.Module, device: torch.device, step: int
) -> dict[str, Any] | None:
    """The ``health`` record of ``model`` (the task's model, not its DDP wrapper, so the layer
    names are the one-process run's) at ``step``: :func:`norm_health` on the testbed's fixed
    validation batch (its ``health_batch(model, device)``), or None for a testbed without one
    or a model without norm layers."""
    run_batch = getattr(task, "health_batch", None)
    if run_batch is None:
        return None
    layers = norm_health(model, lambda m: run_batch(m, device))
    return {"type": HEALTH_RECORD, "step": step, "layers": layers} if layers else None


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work, so that a step's time covers its kernels."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def train_run(
    spec: dict[str, Any],
    run_dir: Path,
    on_step: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    wait_for_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Train the run described by ``spec`` (the content of ``run.json``); return its summary.

    The GPT's token cache is read from ``run_dir/../../data``; the DiT's images are made again
    from ``spec["data"]``. ``on_step(step)`` is called after every
    step (progress); ``should_stop()`` is polled every step and raises :class:`RunAborted`.
    ``wait_for_start()``, if given, is called once the run is set up (data mapped or made, model
    built and checked, optimiser made) and must return when training may begin; ``wall_s`` and every
    timing count from then on.
    """
    run_dir = Path(run_dir)
    t = spec["train"]
    seed = spec["seed"]
    par = par_.run_parallel(spec)  # one process: rank 0 of 1, nothing changes
    device = par.ctx.device
    main = par.ctx.is_main
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(seed)

    task = make_testbed(spec, run_dir)
    model = task.model
    digest = combined_digest(shared_parameter_digests(model))
    if digest != spec["init_digest"]:
        raise RuntimeError(
            f"paired init: this worker's shared parameters hash to {digest[:16]}, the grid "
            f"checked {spec['init_digest'][:16]}"
        )
    model.to(device)
    with autocast_for(run_precision(spec), device):  # the warm-up sees the training precision
        saved_bytes = _warm_up_counting_saved_bytes(task, device)
    groups = task.parameter_groups()
    par_.shard_task(task, par)
    trained = par_.wrap_for_training(task, par)  # `model` itself for one process
    optimizer = make_optimizer(model, t["lr"], t["weight_decay"], (t["beta1"], t["beta2"]))
    precision = precision_step(spec, device, optimizer)
    params = list(model.parameters())
    tokens_per_step = task.tokens_per_step
    rank_tokens_per_step = tokens_per_step * par.rows // par.global_rows
    total_steps = t["steps"]
    max_norm = t["grad_clip"] if t["grad_clip"] > 0 else math.inf
    a = spec["anomaly"]
    loss_spikes = SpikeDetector(SpikeRule(a["window"], a["warmup"], a["loss_z"], a["min_scale"]))
    grad_spikes = SpikeDetector(SpikeRule(a["window"], a["warmup"], a["grad_z"], a["min_scale"]))
    target = t["target_val_loss"]

    train_time = 0.0
    losses: list[float] = []
    throughputs: list[float] = []
    evals: list[dict[str, Any]] = []
    counts = {LOSS_SPIKE: 0, GRAD_SPIKE: 0, "clipped": 0}
    status, diverged_at, steps_done = FINISHED, None, 0

    def log(record: dict[str, Any]) -> None:
        if main:  # rank 0 writes the run's files
            append_record(run_dir, record)

    def evaluate(step: int) -> None:
        record = {
            "type": EVAL_RECORD,
            "step": step,
            **task.evaluate(device),
            "tokens_seen": step * tokens_per_step,
            "elapsed_s": train_time,
        }
        log(record)
        evals.append(record)
        # every rank runs the fixed batch (a sharded model's forward needs every rank, as the
        # evaluation's); rank 0 logs what its hooks saw: in float32 the one-process numbers
        # (FSDP2 with a 16-bit policy runs this forward in 16 bits, one process in float32)
        health = health_record(task, model, device, step)
        if health is not None:
            log(health)

    def anomaly(step: int, kind: str, value: float, z: float | None) -> None:
        log({"type": ANOMALY_RECORD, "step": step, "kind": kind, "value": value, "z": z})

    if wait_for_start is not None:
        wait_for_start()
    wall_start = time.perf_counter()
    timer = StepTimer(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    evaluate(0)
    for step in range(1, total_steps + 1):
        if should_stop is not None and should_stop():
            raise RunAborted(f"stopped at step {step}: the grid's process is gone")
        lr = lr_at(step, t["lr"], total_steps, t["warmup"], t["min_lr_ratio"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        timer.start()
        with precision.autocast():
            loss = task.train_loss(device)
        optimizer.zero_grad(set_to_none=True)
        loss_value = par_.global_loss(loss.detach().item(), par)
        outcome = precision.run(
            par_.scaled_loss(loss, par),
            loss_value,
            partial(par_.grad_norm, params, max_norm, par),
            partial(par_.layer_grad_norms, trained, groups, par, _group_grad_norms)
            if step % t["layer_grad_interval"] == 0
            else None,
        )
        layer_norms = outcome.read
        grad_norm, skipped = outcome.grad_norm, outcome.skipped
        finite = math.isfinite(loss_value) and (math.isfinite(grad_norm) or skipped)
        _sync(device)
        step_time = timer.stop()  # CUDA events on a GPU
        train_time += step_time
        steps_done = step
        clipped = outcome.stepped and grad_norm > max_norm
        counts["clipped"] += clipped
        losses.append(loss_value)
        if step > t["throughput_warmup"]:
            throughputs.append(rank_tokens_per_step / step_time)
        log(
            {
                "type": TRAIN_RECORD,
                "step": step,
                "loss": loss_value,
                "grad_norm": grad_norm,
                "clipped": clipped,
                "lr": lr,
                "step_time_s": step_time,
                "tokens_seen": step * tokens_per_step,
                **({"skipped": skipped} if precision.scaler is not None else {}),
            },
        )
        if layer_norms is not None:
            log({"type": LAYER_GRAD_RECORD, "step": step, "norms": layer_norms})
        if not finite:
            kind = NONFINITE_LOSS if not math.isfinite(loss_value) else NONFINITE_GRAD
            anomaly(step, kind, loss_value if kind == NONFINITE_LOSS else grad_norm, None)
            status, diverged_at = DIVERGED, step
            break
        for detector, value, kind in (
            (loss_spikes, loss_value, LOSS_SPIKE),
            *(() if skipped else ((grad_spikes, grad_norm, GRAD_SPIKE),)),
        ):
            z = detector.update(value)
            if detector.is_spike(z):
                counts[kind] += 1
                anomaly(step, kind, value, z)
        if step % t["eval_interval"] == 0 or step == total_steps:
            evaluate(step)
        if on_step is not None:
            on_step(step)

    peak_bytes, peak_kind = peak_memory(device)
    tokens_per_s = statistics.median(throughputs) if throughputs else None
    ranks = par_.rank_fields(par, peak_bytes, tokens_per_s)
    if not par_.main_rank_model(task, spec, trained, par):
        return {}  # ranks other than 0 write nothing
    model = task.model
    n_params, n_norm_params = model.count_parameters()
    finite_evals = [e for e in evals if e["val_loss"] is not None and math.isfinite(e["val_loss"])]
    reached = next(
        (e for e in finite_evals if target is not None and e["val_loss"] <= target), None
    )
    tail = [v for v in losses[-max(1, len(losses) // 10) :] if math.isfinite(v)]
    final = evals[-1] if status == FINISHED else None
    quality = task.quality_summary(final, finite_evals)
    posttrain: dict[str, Any] = dict.fromkeys(POSTTRAIN_FIELDS)
    if final is not None:
        quality.update(task.finish(device))
        posttrain.update(task.posttrain(device, final))
    return {
        "run_id": spec["run_id"],
        "arm": spec["arm"],
        "seed": seed,
        "norm": spec["norm"],
        "placement": spec["placement"],
        "precision": run_precision(spec),
        "status": status,
        "diverged_at": diverged_at,
        "steps": steps_done,
        "tokens": steps_done * tokens_per_step,
        "n_params": n_params,
        "n_norm_params": n_norm_params,
        **quality,
        "final_train_loss": statistics.fmean(tail) if tail else None,
        "tokens_per_s": ranks["total_tokens_per_s"] if par.ctx.distributed else tokens_per_s,
        "peak_memory_bytes": max(ranks["rank_peak_memory_bytes"]),
        "peak_memory_kind": peak_kind,
        "saved_activation_bytes": saved_bytes,
        **posttrain,
        "target_val_loss": target,
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "tokens_to_target": reached["tokens_seen"] if reached else None,
        "n_loss_spikes": counts[LOSS_SPIKE],
        "n_grad_spikes": counts[GRAD_SPIKE],
        "n_skipped_steps": precision.n_skipped,
        "n_clipped": counts["clipped"],
        "wall_s": time.perf_counter() - wall_start,
        "device": str(device),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "data_fingerprint": task.data_fingerprint,
        **ranks,
    }
