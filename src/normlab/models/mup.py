"""μP, the maximal update parametrisation (Yang & Hu et al., Tensor Programs V), width-wise for
the GPT testbed trained with Adam(W).

Let d be ``d_model`` and d₀ ``base_d_model`` (the *base width*), and for a hidden matrix let
r = fan_in₀ / fan_in be the ratio of its fan-in in the base model (the same config with
d_model = d₀, so the same heads, layers and MLP ratio) to its own: r = d₀ / d for every matrix
of the testbed (up to the rounding of the MLP's hidden size, ``GPTSettings.mlp_hidden``). Under
``parametrization: mup``:

=====================  ==============================  ===================  ===================
parameter              initial standard deviation      Adam learning rate   forward
=====================  ==============================  ===================  ===================
hidden matrices        σ · √r (σ: sp's, residual       lr · r               as sp
(attention qkv, proj;  projections σ / √(2·n_layers))
MLP fc/gate/up, proj)
token, position        σ (as sp)                       lr                   as sp
embeddings
output head (tied to   σ (as sp)                       lr                   logits · d₀ / d
the token embedding
or not)
biases, norm gains     as sp (zero; the norm's own)    lr                   as sp
and biases, scalars
attention              —                               —                    q·k · √(h₀) / h
=====================  ==============================  ===================  ===================

with h = d / n_heads the head size and h₀ = d₀ / n_heads the base model's: the attention
logits are scaled by 1/h instead of sp's 1/√h, times √h₀ so that at the base width the scale
is sp's 1/√h₀. With AdamW, a group whose rate is lr · r has its weight decay divided by r, so
the decay per step lr · weight_decay is the same at every width (decoupled from the width,
as microsoft/mup's ``MuAdamW`` does by default).

The output uses a *multiplier* d₀ / d on the logits rather than a zero-initialised readout:
the testbed ties the head to the token embedding by default, and the embedding must start
from random values; with the multiplier the head keeps sp's constant initial deviation and
constant Adam rate, which for Adam is μP's output layer written in multiplier form (a readout
with init ∝ 1/d and rate ∝ 1/d is the same function of training), so a tied matrix is
right as an input (init and rate constant) and as an output at once. Its logits at
initialisation shrink as 1/√(d / d₀) with the width (they vanish in the limit, as a
zero-initialised readout's do); after the first updates they are of constant size.

Norm gains are *not* width-scaled (they are vectors: constant init, constant rate), nor are
biases, DyT's α, the embedding scale of a DyT arm, or anything else with fewer than two
dimensions. Everything is width-wise: depth (``n_layers``) is not a μP dimension here.

At d = d₀ every factor is exactly 1 and the attention scale is left to PyTorch's default, so
``mup`` at the base width builds, initialises and computes exactly what ``sp`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from normlab.models.config import GPTConfig, GPTSettings

HIDDEN_PREFIX = "blocks."
"""Hidden matrices are the 2-D weights inside the blocks (attention and MLP); norms excluded."""


def is_mup(cfg: GPTSettings) -> bool:
    """Whether ``cfg`` asks for μP."""
    return cfg.parametrization == "mup"


def base_config(cfg: GPTConfig) -> GPTConfig:
    """The base model's config: ``cfg`` with ``d_model`` = ``base_d_model`` (not validated:
    only its parameter shapes are used)."""
    return cfg.model_copy(update={"d_model": cfg.base_d_model})


def output_multiplier(cfg: GPTSettings) -> float:
    """The factor on the logits: d₀ / d under ``mup``, 1 under ``sp``."""
    return cfg.base_d_model / cfg.d_model if is_mup(cfg) else 1.0


def attention_scale(cfg: GPTSettings) -> float | None:
    """The factor on q·k: √h₀ / h under ``mup`` (h = d / n_heads, h₀ = d₀ / n_heads), or None
    (PyTorch's 1/√h) under ``sp`` and at the base width."""
    head, base_head = cfg.d_model // cfg.n_heads, cfg.base_d_model // cfg.n_heads
    if not is_mup(cfg) or head == base_head:
        return None
    return math.sqrt(base_head) / head


def hidden_names(model: nn.Module) -> list[str]:
    """Names of the hidden (matrix-like) parameters: 2-D weights in the blocks, outside norms."""
    norms = set(model.norm_parameter_names())
    return [
        name
        for name, p in model.named_parameters()
        if name.startswith(HIDDEN_PREFIX) and p.dim() == 2 and name not in norms
    ]


def fan_in_ratios(model: nn.Module) -> dict[str, float]:
    """{name: r = fan_in₀ / fan_in} of every hidden matrix; r = 1 for all under ``sp``.

    A hidden matrix reads either the residual stream (fan-in d, base d₀) or the MLP's hidden
    layer (fan-in ``mlp_hidden``, base the base model's); any other fan-in is an error.
    """
    names = hidden_names(model)
    cfg = model.config
    if not is_mup(cfg):
        return dict.fromkeys(names, 1.0)
    base = base_config(cfg)
    base_fan_in = {cfg.d_model: base.d_model, cfg.mlp_hidden: base.mlp_hidden}
    params = dict(model.named_parameters())
    ratios = {}
    for name in names:
        fan_in = params[name].shape[1]
        if fan_in not in base_fan_in:
            raise ValueError(
                f"parametrization: mup cannot scale {name!r}: its fan-in {fan_in} is neither "
                f"d_model ({cfg.d_model}) nor the MLP's hidden size ({cfg.mlp_hidden})"
            )
        ratios[name] = base_fan_in[fan_in] / fan_in
    return ratios


def init_std_multipliers(model: nn.Module) -> dict[str, float]:
    """{name: √r} of every hidden matrix: its sp deviation is multiplied by this (1 under sp
    and at the base width)."""
    return {n: math.sqrt(r) for n, r in fan_in_ratios(model).items()}


def lr_multipliers(model: nn.Module) -> dict[str, float]:
    """{name: multiplier of the Adam learning rate} of every parameter: r for hidden matrices,
    1 for the rest (embeddings, head, biases, norms, scalars)."""
    ratios = fan_in_ratios(model)
    return {name: ratios.get(name, 1.0) for name, _ in model.named_parameters()}


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    multipliers: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """AdamW parameter groups for ``model`` at peak rate ``lr``, one per (rate multiplier,
    decayed or not).

    Each group holds ``params`` (and their ``param_names``), ``lr`` = lr · m, ``lr_mult`` = m
    (``multipliers[name]``; by default the GPT's, :func:`lr_multipliers`: r for hidden matrices
    under ``mup``, 1 otherwise; a ``--model`` source's are its
    :meth:`~normlab.models.external.SourceLM.lr_multipliers`) and
    ``weight_decay``: ``weight_decay`` / m on matrices and embeddings (2-D and more, outside
    norms; so lr · weight_decay per step is width-free), 0 on norms, biases and scalars (the
    rule of ``make_optimizer``). Under ``sp`` there are at most two groups, both with
    ``lr_mult`` 1. A schedule sets each group's rate with :func:`set_lr`. Tied weights appear
    once. Usage::

        optimizer = torch.optim.AdamW(param_groups(model, lr, wd), lr=lr, betas=betas)
    """
    if not lr > 0:
        raise ValueError(f"lr: expected a positive learning rate, got {lr!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay: expected a number >= 0, got {weight_decay!r}")
    mults = lr_multipliers(model) if multipliers is None else multipliers
    norms = set(model.norm_parameter_names())
    groups: dict[tuple[float, bool], dict[str, Any]] = {}
    for name, p in model.named_parameters():
        decay = p.dim() >= 2 and name not in norms
        mult = mults[name]
        group = groups.setdefault(
            (mult, decay),
            {
                "params": [],
                "param_names": [],
                "lr": lr * mult,
                "lr_mult": mult,
                "weight_decay": weight_decay / mult if decay else 0.0,
            },
        )
        group["params"].append(p)
        group["param_names"].append(name)
    return list(groups.values())


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's rate to ``lr`` · its ``lr_mult`` (1 for a group without one)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


def scale_logits(logits: torch.Tensor, multiplier: float) -> torch.Tensor:
    """``logits`` · ``multiplier``, untouched when the multiplier is 1."""
    return logits if multiplier == 1.0 else logits * multiplier


__all__ = [
    "attention_scale",
    "base_config",
    "fan_in_ratios",
    "hidden_names",
    "init_std_multipliers",
    "is_mup",
    "lr_multipliers",
    "output_multiplier",
    "param_groups",
    "scale_logits",
    "set_lr",
]
