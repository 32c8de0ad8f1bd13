"""Cooldowns branched from one stable run (``train.branches``, under the ``wsd`` schedule).

Under warm-up–stable–decay the rate before a cooldown does not depend on the run's length
(:func:`normlab.experiment.training.schedule.wsd_lr_at`), so a run of n steps and a run of
B < n steps train the same steps 1 … B − D_B, D_B = ``fraction_steps(B, cooldown)`` (the
stable prefix, bit for bit: same initial weights, batches, rates and optimiser). At the end of
step s_B = B − D_B (:func:`branch_plan`) the run keeps its whole training state in memory
(:class:`TrainingState`: model, optimiser, gradient scaler, batch stream, torch's generators,
the count of skipped fp16 steps), trains steps s_B + 1 … B at budget B's cooldown rates exactly
as the run of B steps would, evaluates the model at step B, records it (a ``branch`` record in
``metrics.jsonl``, an entry of the summary's ``branches``), then puts the state back and the
stable run goes on.

A branch's steps are timed on their own (``train_s``): the run's ``elapsed_s``, throughput and
``wall_s`` leave the branches out; they write no ``train`` records and feed no spike detector
(so the run's anomalies are its own). A branch whose loss or gradient is not finite stops there,
``diverged``, without an evaluation.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from normlab.experiment.training.schedule import Schedule
from normlab.run_format import (
    BRANCH_RECORD,
    DIVERGED,
    FINAL_PREFIX,
    FINISHED,
    FULL_VAL_PREFIX,
    prefixed,
)

__all__ = ["BranchLoop", "TrainingState", "branch_entry", "branch_plan", "run_branch"]


def branch_plan(schedule: Schedule, budgets: Iterable[int]) -> dict[int, list[int]]:
    """{step s: the budgets whose cooldown starts after step s}, s = B − D_B the last stable
    step of budget B under ``schedule`` (a wsd schedule), budgets in ascending order."""
    plan: dict[int, list[int]] = {}
    for budget in sorted(budgets):
        start = schedule.for_budget(budget).cooldown_start()
        if start > schedule.cooldown_start():
            raise ValueError(
                f"branches: budget {budget}'s cooldown starts after step {start}, inside the "
                f"run's own cooldown (from step {schedule.cooldown_start()})"
            )
        plan.setdefault(start, []).append(budget)
    return plan


class BranchLoop(Protocol):
    """What a branch needs of the training loop
    (:class:`normlab.experiment.training.train.RunLoop`)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    task: Any
    precision: Any
    device: torch.device
    schedule: Schedule
    losses: list[float]
    tokens_per_step: int
    full_val: bool

    def optimise(self, lr: float, read_layers: bool) -> Any: ...


@dataclass
class TrainingState:
    """A copy of everything a training step reads and changes, but the loop's own records:
    the model's state dict, the optimiser's and the gradient scaler's, the batch stream's
    position, torch's CPU generator (and the CUDA ones), and the skipped-step count."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any] | None
    stream: object
    cpu_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    n_skipped: int

    @classmethod
    def capture(cls, loop: BranchLoop) -> TrainingState:
        """The loop's state now (copies, so that training on does not change them)."""
        scaler = loop.precision.scaler
        return cls(
            model={k: v.detach().clone() for k, v in loop.model.state_dict().items()},
            optimizer=copy.deepcopy(loop.optimizer.state_dict()),
            scaler=None if scaler is None else copy.deepcopy(scaler.state_dict()),
            stream=loop.task.stream_state(),
            cpu_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            n_skipped=loop.precision.n_skipped,
        )

    def restore(self, loop: BranchLoop) -> None:
        """Put the loop back in this state (once: the optimiser takes the copied tensors)."""
        loop.model.load_state_dict(self.model)
        loop.optimizer.load_state_dict(self.optimizer)
        if self.scaler is not None:
            loop.precision.scaler.load_state_dict(self.scaler)
        loop.task.restore_stream(self.stream)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        loop.precision.n_skipped = self.n_skipped


def run_branch(
    loop: BranchLoop, start: int, budget: int, check_stop: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Train budget ``budget``'s cooldown from the state after step ``start`` (steps
    ``start`` + 1 … ``budget`` at ``loop.schedule.for_budget(budget)``'s rates), evaluate it,
    put the state back, and return the ``branch`` record. ``check_stop(step)`` is called before
    every step (it raises to stop the run; the state is put back first)."""
    state = TrainingState.capture(loop)
    schedule = loop.schedule.for_budget(budget)
    losses, train_s, diverged_at = [], 0.0, None
    try:
        for step in range(start + 1, budget + 1):
            if check_stop is not None:
                check_stop(step)
            result = loop.optimise(schedule.lr(step), read_layers=False)
            train_s += result.step_time
            losses.append(result.loss)
            if not result.finite:
                diverged_at = step
                break
        values: dict[str, Any] = {}
        if diverged_at is None:
            values = loop.task.evaluate(loop.device)
            if loop.full_val:
                values.update(prefixed(FULL_VAL_PREFIX, loop.task.full_evaluate(loop.device)))
    finally:
        state.restore(loop)
    seen = [*loop.losses[:start], *losses]
    tail = [v for v in seen[-max(1, budget // 10) :] if math.isfinite(v)]
    return {
        "type": BRANCH_RECORD,
        "steps": budget,
        "from_step": start,
        "status": FINISHED if diverged_at is None else DIVERGED,
        "diverged_at": diverged_at,
        **values,
        "final_train_loss": statistics.fmean(tail) if tail and diverged_at is None else None,
        "tokens_seen": budget * loop.tokens_per_step,
        "train_s": train_s,
    }


def branch_entry(record: dict[str, Any]) -> dict[str, Any]:
    """A ``branch`` record as its entry of the summary's ``branches``: status, the evaluation
    named as a run's summary names its last one (``final_val_loss``, …; ``full_`` ones as
    they are), the mean training loss of its last 10 % of steps, tokens and ``train_s``."""
    own = ("type", "steps", "from_step", "status", "diverged_at", "final_train_loss")
    own += ("tokens_seen", "train_s")
    values = {k: v for k, v in record.items() if k not in own}
    evaluation = {k: v for k, v in values.items() if not k.startswith(FULL_VAL_PREFIX)}
    return {
        "status": record["status"],
        "diverged_at": record["diverged_at"],
        **prefixed(FINAL_PREFIX, evaluation),
        **{k: v for k, v in values.items() if k.startswith(FULL_VAL_PREFIX)},
        "final_train_loss": record["final_train_loss"],
        "tokens": record["tokens_seen"],
        "train_s": record["train_s"],
    }
