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

Options of budget and noise studies (absent from a run config, they change nothing): the
schedule (:func:`normlab.experiment.training.schedule.schedule_of`: cosine, or wsd), cooldowns
branched from the stable run (``train.branches``, :mod:`normlab.experiment.training.branches`),
the final model on the whole validation split (``train.full_val``) and an average of the last
weights (``train.average_last``, :mod:`normlab.experiment.measure.averaging`), whose fields
follow the summary's (:meth:`RunLoop.option_fields`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from normlab._resources import peak_memory
from normlab.experiment.measure.activations import SavedActivationBytes
from normlab.experiment.measure.anomaly import SpikeDetector, SpikeRule
from normlab.experiment.measure.averaging import WeightAverage
from normlab.experiment.measure.health import norm_health
from normlab.experiment.testbeds import Testbed, data_seed, make_testbed, testbed_of
from normlab.experiment.training import parallel as par_
from normlab.experiment.training.branches import branch_entry, branch_plan, run_branch
from normlab.experiment.training.precision import (
    DEFAULT_PRECISION,
    PrecisionStep,
    StepOutcome,
    autocast_for,
)
from normlab.experiment.training.schedule import make_optimizer, schedule_of
from normlab.experiment.training.step_timer import StepTimer
from normlab.models import GPTConfig, combined_digest, shared_parameter_digests
from normlab.models.mup import set_lr
from normlab.run_format import (
    ANOMALY_RECORD,
    AVERAGED_PREFIX,
    BRANCHES_FIELD,
    DIVERGED,
    EVAL_RECORD,
    FINISHED,
    FULL_VAL_PREFIX,
    GRAD_SPIKE,
    HEALTH_RECORD,
    LAYER_GRAD_RECORD,
    LOSS_SPIKE,
    NONFINITE_GRAD,
    NONFINITE_LOSS,
    POSTTRAIN_FIELDS,
    TRAIN_RECORD,
    prefixed,
    testbed_format,
)
from normlab.run_format.folder import append_record
from normlab.run_format.summary import build_summary
from normlab.run_format.train_options import fraction_steps, train_option


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
    built and checked, optimiser made) and must return when training may begin; ``wall_s`` and
    every timing count from then on.
    """
    run = RunLoop(spec, Path(run_dir))
    if wait_for_start is not None:
        wait_for_start()

    def check_stop(step: int) -> None:
        if should_stop is not None and should_stop():
            raise RunAborted(f"stopped at step {step}: the grid's process is gone")

    run.begin()
    run.branch_off(0, check_stop)
    for step in range(1, run.total_steps + 1):
        check_stop(step)
        if not run.train_step(step):
            break  # diverged
        if step % run.t["eval_interval"] == 0 or step == run.total_steps:
            run.evaluate(step)
        run.branch_off(step, check_stop)
        if on_step is not None:
            on_step(step)
    return run.summary()


@dataclass
class StepResult:
    """One optimiser step: the (global) loss, the precision's outcome, whether loss and
    gradient were finite (a step the fp16 scaler skipped counts as finite), its seconds."""

    loss: float
    outcome: StepOutcome
    finite: bool
    step_time: float


class RunLoop:
    """One run's training, step by step: :meth:`__init__` sets it up (paired model checked,
    warm-up, optimiser), :meth:`begin` starts the clocks and evaluates step 0,
    :meth:`train_step` trains one step (:meth:`optimise`) and logs it, :meth:`evaluate`
    validates, :meth:`branch_off` trains the cooldowns that branch off after a step, and
    :meth:`summary` makes the run's summary. Rank 0 alone writes ``metrics.jsonl``."""

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        self.spec, self.run_dir = spec, run_dir
        self.t = t = spec["train"]
        self.par = par = par_.run_parallel(spec)  # one process: rank 0 of 1, nothing changes
        self.device = device = par.ctx.device
        torch.set_num_threads(spec["threads"])
        torch.manual_seed(data_seed(spec))  # the run's seed unless train.data_seed is set
        self.task = task = make_testbed(spec, run_dir)
        self.model = model = task.model
        check_paired_start(model, spec)
        model.to(device)
        with autocast_for(run_precision(spec), device):  # the warm-up sees the training precision
            self.saved_bytes = _warm_up_counting_saved_bytes(task, device)
        self.groups = task.parameter_groups()
        par_.shard_task(task, par)
        self.trained = par_.wrap_for_training(task, par)  # `model` itself for one process
        self.optimizer = make_optimizer(model, t["lr"], t["weight_decay"], (t["beta1"], t["beta2"]))
        self.precision = precision_step(spec, device, self.optimizer)
        self.params = list(model.parameters())
        self.tokens_per_step = task.tokens_per_step
        self.rank_tokens_per_step = self.tokens_per_step * par.rows // par.global_rows
        self.total_steps = t["steps"]
        self.max_norm = t["grad_clip"] if t["grad_clip"] > 0 else math.inf
        a = spec["anomaly"]
        self.loss_spikes = SpikeDetector(
            SpikeRule(a["window"], a["warmup"], a["loss_z"], a["min_scale"])
        )
        self.grad_spikes = SpikeDetector(
            SpikeRule(a["window"], a["warmup"], a["grad_z"], a["min_scale"])
        )
        self.train_time = 0.0
        self.losses: list[float] = []
        self.throughputs: list[float] = []
        self.evals: list[dict[str, Any]] = []
        self.counts = {LOSS_SPIKE: 0, GRAD_SPIKE: 0, "clipped": 0}
        self.status, self.diverged_at, self.steps_done = FINISHED, None, 0
        self.set_up_options()

    def set_up_options(self) -> None:
        """The schedule, and the run options' state: the branches' plan and records, the
        whole-split evaluation, the weight average (none of them for a run without them)."""
        t = self.t
        self.schedule = schedule_of(t)
        budgets = train_option(t, "branches")
        self.branch_plan = branch_plan(self.schedule, budgets) if budgets else {}
        self.branches: dict[int, dict[str, Any]] = {}
        self.full_val = bool(train_option(t, "full_val"))
        fraction = train_option(t, "average_last")
        self.averager = None
        if fraction is not None:
            first = self.total_steps - fraction_steps(self.total_steps, fraction) + 1
            self.averager = WeightAverage(self.model, first)

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the run's ``metrics.jsonl`` (rank 0 writes the run's files)."""
        if self.par.ctx.is_main:
            append_record(self.run_dir, record)

    def begin(self) -> None:
        """Start the wall clock and the step timer, reset the device's peak memory, and
        evaluate the initial model (step 0)."""
        self.wall_start = time.perf_counter()
        self.timer = StepTimer(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.model.train()
        self.evaluate(0)

    def evaluate(self, step: int) -> None:
        """Log the ``eval`` record at ``step`` and, where the testbed has a fixed batch for it,
        the ``health`` record."""
        record = {
            "type": EVAL_RECORD,
            "step": step,
            **self.task.evaluate(self.device),
            "tokens_seen": step * self.tokens_per_step,
            "elapsed_s": self.train_time,
        }
        self.log(record)
        self.evals.append(record)
        # every rank runs the fixed batch (a sharded model's forward needs every rank, as the
        # evaluation's); rank 0 logs what its hooks saw: in float32 the one-process numbers
        # (FSDP2 with a 16-bit policy runs this forward in 16 bits, one process in float32)
        health = health_record(self.task, self.model, self.device, step)
        if health is not None:
            self.log(health)

    def optimise(self, lr: float, read_layers: bool) -> StepResult:
        """One optimiser step at rate ``lr`` (each group at lr · its μP multiplier, 1 under
        sp), timed: the next batch's loss under the precision's autocast, backward, the
        per-group gradient norms when ``read_layers``, clipping and the step. Nothing logged:
        the run's steps and a branch's share it."""
        par, device, precision = self.par, self.device, self.precision
        set_lr(self.optimizer, lr)
        self.timer.start()
        with precision.autocast():
            loss = self.task.train_loss(device)
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = par_.global_loss(loss.detach().item(), par)
        outcome = precision.run(
            par_.scaled_loss(loss, par),
            loss_value,
            partial(par_.grad_norm, self.params, self.max_norm, par),
            partial(par_.layer_grad_norms, self.trained, self.groups, par, _group_grad_norms)
            if read_layers
            else None,
        )
        grad_norm, skipped = outcome.grad_norm, outcome.skipped
        finite = math.isfinite(loss_value) and (math.isfinite(grad_norm) or skipped)
        _sync(device)
        return StepResult(loss_value, outcome, finite, self.timer.stop())  # CUDA events on a GPU

    def train_step(self, step: int) -> bool:
        """One optimiser step at the scheduled learning rate (:meth:`optimise`), logged
        (``train`` record, and ``layer_grad_norms`` every ``layer_grad_interval`` steps), then
        the divergence and spike checks, and the weight average's update. False when the loss
        or gradient was not finite (the run diverged and stops)."""
        t, precision = self.t, self.precision
        lr = self.schedule.lr(step)
        result = self.optimise(lr, step % t["layer_grad_interval"] == 0)
        outcome, loss_value, finite = result.outcome, result.loss, result.finite
        grad_norm, skipped = outcome.grad_norm, outcome.skipped
        step_time = result.step_time
        self.train_time += step_time
        self.steps_done = step
        clipped = outcome.stepped and grad_norm > self.max_norm
        self.counts["clipped"] += clipped
        self.losses.append(loss_value)
        if step > t["throughput_warmup"]:
            self.throughputs.append(self.rank_tokens_per_step / step_time)
        self.log(
            {
                "type": TRAIN_RECORD,
                "step": step,
                "loss": loss_value,
                "grad_norm": grad_norm,
                "clipped": clipped,
                "lr": lr,
                "step_time_s": step_time,
                "tokens_seen": step * self.tokens_per_step,
                **({"skipped": skipped} if precision.scaler is not None else {}),
            },
        )
        if outcome.read is not None:
            self.log({"type": LAYER_GRAD_RECORD, "step": step, "norms": outcome.read})
        if not finite:
            kind = NONFINITE_LOSS if not math.isfinite(loss_value) else NONFINITE_GRAD
            self.anomaly(step, kind, loss_value if kind == NONFINITE_LOSS else grad_norm, None)
            self.status, self.diverged_at = DIVERGED, step
            return False
        self.check_spikes(step, loss_value, None if skipped else grad_norm)
        if self.averager is not None:
            self.averager.update(step)
        return True

    def branch_off(self, step: int, check_stop: Callable[[int], None]) -> None:
        """Train, evaluate and log every cooldown that starts after ``step``
        (:func:`normlab.experiment.training.branches.run_branch`), the run's state put back
        after each; the run's clock (``wall_s``) leaves their time out."""
        for budget in self.branch_plan.get(step, ()):
            started = time.perf_counter()
            record = run_branch(self, step, budget, check_stop)
            self.log(record)
            self.branches[budget] = record
            self.wall_start += time.perf_counter() - started

    def check_spikes(self, step: int, loss: float, grad_norm: float | None) -> None:
        """Feed the loss (and the gradient norm, unless the step was skipped) to the spike
        detectors; count and log each spike."""
        for detector, value, kind in (
            (self.loss_spikes, loss, LOSS_SPIKE),
            *(() if grad_norm is None else ((self.grad_spikes, grad_norm, GRAD_SPIKE),)),
        ):
            z = detector.update(value)
            if detector.is_spike(z):
                self.counts[kind] += 1
                self.anomaly(step, kind, value, z)

    def anomaly(self, step: int, kind: str, value: float, z: float | None) -> None:
        """Log an ``anomaly`` record."""
        self.log({"type": ANOMALY_RECORD, "step": step, "kind": kind, "value": value, "z": z})

    def summary(self) -> dict[str, Any]:
        """The run's summary (:func:`normlab.run_format.summary.build_summary` from what the
        loop measured); {} on ranks other than 0. A finished run first gets its testbed's
        end-of-run fields and post-training numbers."""
        spec, task, device, par = self.spec, self.task, self.device, self.par
        peak_bytes, peak_kind = peak_memory(device)
        tokens_per_s = statistics.median(self.throughputs) if self.throughputs else None
        ranks = par_.rank_fields(par, peak_bytes, tokens_per_s)
        if not par_.main_rank_model(task, spec, self.trained, par):
            return {}  # ranks other than 0 write nothing
        n_params, n_norm_params = task.model.count_parameters()
        evals, target = self.evals, self.t["target_val_loss"]
        finite_evals = [
            e for e in evals if e["val_loss"] is not None and math.isfinite(e["val_loss"])
        ]
        reached = next(
            (e for e in finite_evals if target is not None and e["val_loss"] <= target), None
        )
        losses = self.losses
        tail = [v for v in losses[-max(1, len(losses) // 10) :] if math.isfinite(v)]
        final = evals[-1] if self.status == FINISHED else None
        quality = task.quality_summary(final, finite_evals)
        posttrain: dict[str, Any] = dict.fromkeys(POSTTRAIN_FIELDS)
        if final is not None:
            quality.update(task.finish(device))
            posttrain.update(task.posttrain(device, final))
        options = self.option_fields(final is not None)
        measured = {
            "precision": run_precision(spec),
            "diverged_at": self.diverged_at,
            "steps": self.steps_done,
            "tokens": self.steps_done * self.tokens_per_step,
            "n_params": n_params,
            "n_norm_params": n_norm_params,
            **quality,
            "final_train_loss": statistics.fmean(tail) if tail else None,
            "tokens_per_s": ranks["total_tokens_per_s"] if par.ctx.distributed else tokens_per_s,
            "peak_memory_bytes": max(ranks["rank_peak_memory_bytes"]),
            "peak_memory_kind": peak_kind,
            "saved_activation_bytes": self.saved_bytes,
            **posttrain,
            "target_val_loss": target,
            "time_to_target_s": reached["elapsed_s"] if reached else None,
            "tokens_to_target": reached["tokens_seen"] if reached else None,
            "n_loss_spikes": self.counts[LOSS_SPIKE],
            "n_grad_spikes": self.counts[GRAD_SPIKE],
            "n_skipped_steps": self.precision.n_skipped,
            "n_clipped": self.counts["clipped"],
            "wall_s": time.perf_counter() - self.wall_start,
            "device": str(device),
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
            "data_fingerprint": task.data_fingerprint,
            **ranks,
            **options,  # the run options' fields, only where the run sets them
        }
        return build_summary(testbed_format(spec.get("testbed")), spec, self.status, measured)

    def option_fields(self, finished: bool) -> dict[str, Any]:
        """The summary fields of the run's options, after every other field (none for a run
        without them): ``train.full_val``: the final model on the whole validation split
        (``full_`` + each ``eval`` field); ``train.average_last``: the averaged weights
        (``avg_`` + each, and ``avg_full_`` + each with ``full_val``); ``train.branches``:
        ``branches``, {B: its entry} for every branch the run reached. Unless the run finished,
        the evaluations' fields (as :attr:`TestbedFormat.optional` names them) are null."""
        task, device = self.task, self.device
        wanted = [FULL_VAL_PREFIX] if self.full_val else []
        if self.averager is not None:
            wanted.append(AVERAGED_PREFIX)
            wanted += [AVERAGED_PREFIX + FULL_VAL_PREFIX] if self.full_val else []
        fields: dict[str, Any] = {}
        if not finished:
            declared = testbed_format(testbed_of(self.spec)).optional_fields
            fields = {f: None for p in wanted for f in declared if _variant_of(f) == p}
        else:
            if self.full_val:
                fields.update(prefixed(FULL_VAL_PREFIX, task.full_evaluate(device)))
            if self.averager is not None:
                with self.averager.swapped_in():
                    fields.update(prefixed(AVERAGED_PREFIX, task.evaluate(device)))
                    if self.full_val:
                        full = task.full_evaluate(device)
                        fields.update(prefixed(AVERAGED_PREFIX + FULL_VAL_PREFIX, full))
        if self.branch_plan:
            entries = {str(b): branch_entry(r) for b, r in sorted(self.branches.items())}
            fields[BRANCHES_FIELD] = entries
        return fields


def _variant_of(field: str) -> str:
    """The evaluation variant of an optional field: its prefix before ``val_`` (``full_``,
    ``avg_``, ``avg_full_``), "" for others."""
    head, found, _ = field.partition("val_")
    return head if found else ""


def check_paired_start(model: nn.Module, spec: dict[str, Any]) -> None:
    """Raise ``RuntimeError`` unless ``model``'s shared parameters hash to the digest the grid
    checked (``spec["init_digest"]``): every arm of a seed starts from the same values."""
    digest = combined_digest(shared_parameter_digests(model))
    if digest != spec["init_digest"]:
        raise RuntimeError(
            f"paired init: this worker's shared parameters hash to {digest[:16]}, the grid "
            f"checked {spec['init_digest'][:16]}"
        )
