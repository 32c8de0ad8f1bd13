"""μP (width-wise, Adam) for a transformers model of ``--model hf:…``, applied from outside the
model's own modules.

Let d be the config's ``hidden_size`` and d₀ the base width (``lm.base_hidden_size``). The
*base model* is the same config set to d₀ by the size rule of
:mod:`normlab.models.external.scaling` (head size fixed, heads and MLP widths in proportion),
built on the meta device (shapes only). As microsoft/mup's ``set_base_shapes`` does, each
parameter's shape is compared with the base model's: a dimension that differs grows with the
width ("infinite"), one that does not is fixed. Then, by what the parameter is:

==========================================  ==============  ==============  ==================
parameter                                   initial values  Adam(W) rate    forward
==========================================  ==============  ==============  ==================
hidden matrix: a ``nn.Linear`` (or GPT-2's  drawn as sp,    lr · r          as sp
``Conv1D``) weight whose fan-in and fan-out times √r
both grow (attention q, k, v, o; the MLP)
output embedding (tied or not)              as sp           lr              logits · d₀ / d
input embeddings, biases, norm gains        as sp           lr              as sp
(vectors), anything of fixed shape
==========================================  ==============  ==============  ==================

with r = fan_in₀ / fan_in, the matrix's fan-in in the base model over its own (d₀ / d for a
matrix reading the residual stream, I₀ / I for one reading the MLP's hidden layer). The initial
values are the transformers initialisation's own draws (normal with ``initializer_range``), so
multiplying them by √r gives a deviation ∝ 1/√fan_in with the base width's constant. Weight
decay of a group at rate lr · r is divided by r (lr · weight_decay per step is width-free).

The output multiplier is a forward hook on the model's output embedding
(``get_output_embeddings()``, the ``lm_head``): its output, the logits, times d₀ / d, before
anything the model does after it (a soft-cap, Granite's ``logits_scaling``). Because it acts on
the head's output and not on its weight, a head tied to the input embedding is handled by the
same rule (constant initial deviation and rate serve the matrix as an input and, with the
multiplier, as an output; see docs/mup.md).

The attention scale is not changed: the size rule holds the head size fixed, so μP's 1/d_head
and the module's own 1/√d_head differ by a constant, the same at every width, and the base
model computes exactly what the model at d₀ computes. Depth is not a μP dimension here.

Refused (:class:`MupError`, one line naming ``--parametrization``): a factory source (no
config to set to the base width), a config without an integer ``hidden_size``, a base width the
size rule cannot make, a model without an output embedding module, and any parameter whose
shape grows with the width but whose fan-in cannot be told (not the weight of a ``nn.Linear``,
``Conv1D`` or ``nn.Embedding``: e.g. experts stored as one 3-D tensor), or a matrix whose fan-in
grows but whose fan-out does not, other than the output embedding (it would need a multiplier
of its own). At d = d₀ every factor is exactly 1 and no hook is added: ``mup`` builds and
computes exactly what ``sp`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from normlab._checks import UsageValueError

__all__ = [
    "PARAMETRIZATIONS",
    "PARAMETRIZATION_OPTION",
    "LogitMultiplier",
    "MupError",
    "SourceMup",
    "apply_mup",
    "hidden_ratios",
]

PARAMETRIZATIONS = ("sp", "mup")
PARAMETRIZATION_OPTION = "--parametrization"


class MupError(UsageValueError):
    """A model μP cannot scale; the message is one line naming :data:`PARAMETRIZATION_OPTION`
    (a usage error: ``--parametrization mup`` is not taken for this model)."""


@dataclass(frozen=True)
class SourceMup:
    """μP of one transformers model: ``width`` d, ``base_width`` d₀ and ``ratios``, the fan-in
    ratio r = fan_in₀ / fan_in of each hidden matrix by its name in the transformers model."""

    width: int
    base_width: int
    ratios: dict[str, float] = field(default_factory=dict)

    @property
    def output_multiplier(self) -> float:
        """The factor on the logits: d₀ / d."""
        return self.base_width / self.width

    def record(self) -> dict[str, Any]:
        """JSON-ready: the widths, the output multiplier and the ratios."""
        return {
            "parametrization": "mup",
            "width": self.width,
            "base_width": self.base_width,
            "output_multiplier": self.output_multiplier,
            "hidden_ratios": dict(self.ratios),
        }


class LogitMultiplier:
    """A forward hook that multiplies a module's output by ``factor`` (picklable, copied with
    the model)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * self.factor


def _fan_dims(module: nn.Module) -> tuple[int, int] | None:
    """(fan-in dim, fan-out dim) of a layer's ``weight``: ``nn.Linear`` [out, in] → (1, 0),
    transformers' ``Conv1D`` [in, out] → (0, 1); None for anything else."""
    if isinstance(module, nn.Linear):
        return 1, 0
    if type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers"):
        return 0, 1
    return None


def hidden_ratios(net: nn.Module, base: nn.Module) -> dict[str, float]:
    """{name: r = fan_in₀ / fan_in} of each hidden matrix of ``net`` against ``base`` (the same
    model at the base width, on any device); see the module docstring for the classes and the
    refusals (:class:`MupError`)."""
    base_shapes = {n: tuple(p.shape) for n, p in base.named_parameters()}
    owner: dict[int, tuple[nn.Module, str]] = {}
    for _mname, module in net.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            owner.setdefault(id(p), (module, pname))
    out_module = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    out_weight = getattr(out_module, "weight", None)
    ratios: dict[str, float] = {}
    for name, p in net.named_parameters():
        shape = tuple(p.shape)
        base_shape = base_shapes.get(name)
        if base_shape is None or len(base_shape) != len(shape):
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup cannot scale {name!r}: the base model has no "
                "parameter of that name and rank"
            )
        grows = [i for i, (a, b) in enumerate(zip(shape, base_shape, strict=True)) if a != b]
        if p.dim() < 2 or not grows:
            continue  # a vector (bias, norm gain) or a fixed shape: as sp
        module, pname = owner[id(p)]
        if isinstance(module, nn.Embedding) and pname == "weight":
            continue  # an input embedding [V, d]: as sp
        dims = _fan_dims(module) if pname == "weight" else None
        if dims is None or p.dim() != 2:
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup cannot scale {name!r} ({type(module).__name__}, "
                f"shape {list(shape)}): it grows with the width but its fan-in cannot be told "
                "(only nn.Linear, Conv1D and nn.Embedding weights are scaled); expected sp"
            )
        fan_in, fan_out = dims
        if fan_in in grows and fan_out in grows:
            ratios[name] = base_shape[fan_in] / shape[fan_in]
        elif fan_in in grows and p is not out_weight:
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup cannot scale {name!r} (shape {list(shape)}): "
                "its fan-in grows with the width but its fan-out does not, and it is not the "
                "output embedding; expected every hidden size to follow the width"
            )
        # else: an input-like matrix (fixed fan-in) or the output embedding: as sp
    return ratios


def apply_mup(net: nn.Module, mup: SourceMup) -> None:
    """Scale ``net`` in place (after its seeded initialisation, before its norms are swapped):
    each hidden matrix's values times √r, and a :class:`LogitMultiplier` d₀ / d on the output
    embedding. Nothing at all when d = d₀."""
    with torch.no_grad():
        params = dict(net.named_parameters())
        for name, r in mup.ratios.items():
            if r != 1.0:
                params[name].mul_(math.sqrt(r))
    if mup.output_multiplier != 1.0:
        head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
        if not isinstance(head, nn.Module):
            raise MupError(
                f"{PARAMETRIZATION_OPTION}: mup needs the model's output embedding "
                f"(get_output_embeddings()) for the logits' multiplier; {type(net).__name__} "
                "has none. Expected sp"
            )
        head.register_forward_hook(LogitMultiplier(mup.output_multiplier))
