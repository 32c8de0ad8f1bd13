"""The learning-rate schedules and the optimiser shared by every arm.

Two schedules (``train.schedule``): ``cosine`` (:func:`lr_at`, the default) and ``wsd``,
warm-up–stable–decay (:func:`wsd_lr_at`; Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations", and MiniCPM), whose rate until its cooldown does not
depend on the run's length, so that one stable run can branch off the cooldowns of shorter
budgets (:mod:`normlab.experiment.training.branches`). :func:`schedule_of` reads a run's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from normlab.models.dit import DiT
from normlab.models.external import SourceLM
from normlab.models.gpt import GPT
from normlab.models.mup import param_groups
from normlab.run_format.train_options import COSINE, WSD, fraction_steps, train_option


def lr_at(step: int, peak_lr: float, total_steps: int, warmup: int, min_ratio: float) -> float:
    """Learning rate of 1-based ``step``: linear warm-up, then cosine decay.

    Warm-up (step ≤ warmup): lr = peak · step / warmup. After it, with progress
    p = (step − warmup) / (total − warmup): lr = peak · (r + (1 − r) · (1 + cos πp) / 2),
    r = ``min_ratio``, so it falls from the peak to r · peak at the last step.
    """
    if step < 1 or step > total_steps:
        raise ValueError(f"step: expected 1 <= step <= {total_steps}, got {step}")
    if warmup > 0 and step <= warmup:
        return peak_lr * step / warmup
    decay_steps = total_steps - warmup
    progress = (step - warmup) / decay_steps if decay_steps > 0 else 1.0
    return peak_lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def wsd_lr_at(
    step: int,
    peak_lr: float,
    total_steps: int,
    warmup: int,
    min_ratio: float,
    cooldown: float,
    decay: str,
) -> float:
    """Learning rate of 1-based ``step`` under warm-up–stable–decay.

    With n = ``total_steps``, w = ``warmup``, r = ``min_ratio`` and a cooldown of
    D = :func:`~normlab.run_format.train_options.fraction_steps` (n, ``cooldown``) steps
    (1 ≤ D ≤ n − w): warm-up (step ≤ w) lr = peak · step / w; stable (w < step ≤ n − D)
    lr = peak; cooldown (step > n − D), with progress p = (step − (n − D)) / D ∈ (0, 1]:
    lr = peak · (r + (1 − r) · (1 − p)) for ``decay`` ``linear``, and
    lr = peak · (r + (1 − r) · (1 − √p)) for ``sqrt``. The rate is continuous: p → 0 gives the
    peak of the stable phase, and the last step is r · peak.
    """
    if step < 1 or step > total_steps:
        raise ValueError(f"step: expected 1 <= step <= {total_steps}, got {step}")
    if decay not in DECAYS:
        raise ValueError(f"decay: expected one of {', '.join(DECAYS)}, got {decay!r}")
    d = fraction_steps(total_steps, cooldown)
    if not 1 <= d <= total_steps - warmup:
        raise ValueError(
            f"cooldown: {cooldown!r} of {total_steps} steps is {d} steps; expected at least 1 "
            f"and at most total_steps − warmup = {total_steps - warmup}"
        )
    if warmup > 0 and step <= warmup:
        return peak_lr * step / warmup
    stable_end = total_steps - d
    if step <= stable_end:
        return peak_lr
    progress = (step - stable_end) / d
    shape = 1.0 - progress if decay == "linear" else 1.0 - math.sqrt(progress)
    return peak_lr * (min_ratio + (1.0 - min_ratio) * shape)


SCHEDULES: tuple[str, ...] = (COSINE, WSD)
"""The learning-rate schedules (``train.schedule``)."""
DECAYS: tuple[str, ...] = ("linear", "sqrt")
"""The shapes of a wsd cooldown (``train.decay``)."""


@dataclass(frozen=True)
class Schedule:
    """A run's learning-rate schedule: ``kind`` ``cosine`` (:func:`lr_at`) or ``wsd``
    (:func:`wsd_lr_at`, with ``cooldown`` and ``decay``, None for cosine), peak ``peak_lr``
    over ``total_steps``."""

    kind: str
    peak_lr: float
    total_steps: int
    warmup: int
    min_ratio: float
    cooldown: float | None = None
    decay: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"kind: expected one of {', '.join(SCHEDULES)}, got {self.kind!r}")
        if self.kind == WSD and (self.cooldown is None or self.decay is None):
            raise ValueError(
                f"cooldown, decay: a wsd schedule needs both, got {self.cooldown!r} and "
                f"{self.decay!r}"
            )

    def lr(self, step: int) -> float:
        """The rate of 1-based ``step``."""
        if self.kind == COSINE:
            return lr_at(step, self.peak_lr, self.total_steps, self.warmup, self.min_ratio)
        assert self.cooldown is not None and self.decay is not None  # __post_init__
        return wsd_lr_at(
            step,
            self.peak_lr,
            self.total_steps,
            self.warmup,
            self.min_ratio,
            self.cooldown,
            self.decay,
        )

    def cooldown_start(self) -> int:
        """The last step of a wsd schedule's stable phase, n − D (its state is where a
        cooldown of this length begins); ValueError for ``cosine``, which has none."""
        if self.kind != WSD or self.cooldown is None:
            raise ValueError(f"kind: only a wsd schedule has a cooldown, this one is {self.kind}")
        return self.total_steps - fraction_steps(self.total_steps, self.cooldown)

    def for_budget(self, total_steps: int) -> Schedule:
        """The same schedule over ``total_steps`` (a branch's budget)."""
        return replace(self, total_steps=total_steps)


def schedule_of(train: Mapping[str, Any]) -> Schedule:
    """The schedule of a run config's ``train`` section (cosine where it names none; a wsd
    schedule's ``cooldown`` and ``decay`` are recorded with it)."""
    kind = str(train_option(train, "schedule"))
    wsd = {k: train.get(k) if kind == WSD else None for k in ("cooldown", "decay")}
    return Schedule(
        kind=kind,
        peak_lr=float(train["lr"]),
        total_steps=int(train["steps"]),
        warmup=int(train["warmup"]),
        min_ratio=float(train["min_lr_ratio"]),
        **wsd,
    )


def make_optimizer(
    model: GPT | DiT | SourceLM, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices and embeddings only (not on norms, biases or scalars).

    The GPT's groups are :func:`normlab.models.mup.param_groups`' (under ``sp`` the two groups
    below, each with ``lr_mult`` 1; under ``mup`` the hidden matrices' rate is lr · d₀ / d), so
    the schedule must set rates with :func:`normlab.models.mup.set_lr`; so are those of a
    ``--model`` source built under ``mup`` (its ``lr_multipliers()``: lr · fan_in₀ / fan_in for
    hidden matrices). Other models (and a source
    under ``sp``): one group of the decayed parameters (2-D and more, outside norms), one of the
    rest. Uses the fused implementation where this torch and device offer it, else the default
    one.
    """
    if isinstance(model, GPT):
        groups = param_groups(model, lr, weight_decay)
    elif isinstance(model, SourceLM) and model.mup is not None:
        groups = param_groups(model, lr, weight_decay, model.lr_multipliers())
    else:
        norms = set(model.norm_parameter_names())
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (decay if p.dim() >= 2 and name not in norms else no_decay).append(p)
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
