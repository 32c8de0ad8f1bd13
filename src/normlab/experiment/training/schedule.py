"""The learning-rate schedule and the optimiser shared by every arm."""

from __future__ import annotations

import math

import torch

from normlab.models.dit import DiT
from normlab.models.external import SourceLM
from normlab.models.gpt import GPT
from normlab.models.mup import param_groups


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
