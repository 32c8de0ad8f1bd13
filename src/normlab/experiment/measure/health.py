"""Norm health over training: what every norm layer of a model sees and does on a fixed batch.

At every evaluation the training loop runs one fixed validation batch through the model (eval
mode, no gradients, no random numbers drawn) with a forward hook on every norm layer (found by
module type and class name, :func:`norm_layers`, so torch's and Hugging Face's norms are found
too). Per layer, over every token vector x ∈ R^D of its input (``N`` tokens), in float32
(float64 for float64 input):

- ``in_rms`` = √mean(x²) over all values of the input, and ``out_rms`` the same of its output y
  (the first tensor a conditional norm returns);
- for a layer whose formula is known (normlab's LayerNorm, RMSNorm, AdaRMSNorm,
  AdaLayerNormZero and torch's ``nn.LayerNorm`` / ``nn.RMSNorm``), x̂ recomputed from the input
  with the layer's own ε and kind (DESIGN §1): LayerNorm x̂ = (x − μ)·rsqrt(σ² + ε), RMSNorm
  x̂ = x·rsqrt(mean(x²) + ε); then ``xhat_ms`` = mean(x̂²) over all values (≈ 1 for both kinds;
  ε large against mean(x²) or σ² pulls it below 1), ``xhat_mean`` = mean(x̂) (≈ 0 for
  LayerNorm), ``xhat_var`` = the mean over tokens of each token's variance of x̂ (≈ 1 for
  LayerNorm) and ``xhat_mean_rms`` = √(mean over tokens of m_t²), m_t = the mean of token t's
  x̂ (0 for LayerNorm; for RMSNorm m_t = μ_t / rms_t, so it says how far the inputs are from
  zero-mean, without the cancellation between tokens of opposite sign that ``xhat_mean`` has);
- for a layer with a gain (``weight``): ``gain_mean`` = mean(g) and ``gain_max_abs`` = max |g| of
  the effective gain g (o + w for an RMSNorm with offset o, w otherwise);
- for an unconditional LayerNorm or RMSNorm of known formula, with y_ref = g ⊙ x̂ (+ β):
  ``formula_err`` = √mean((y − y_ref)²) / √mean(y_ref²), the distance of what the layer
  returned from what its formula says, and ``out_xhat_ms`` = mean(x̂²) · mean((y − β)²) /
  mean((g ⊙ x̂)²), the mean square of the x̂ the layer itself returned, read through its gain
  (it equals mean(x̂²) for a layer that returns y_ref, and for a uniform gain it is exactly
  mean(x̂_y²) of the returned x̂_y = (y − β) / g; weighting by g² keeps channels with g ≈ 0 from
  dividing their rounding by g). A layer whose forward forgets the root shows up in both
  (``out_xhat_ms`` ≈ 1 / mean(x²)) even where the recomputed x̂ statistics look right.

A layer called several times in one batch is averaged over its calls (``calls`` says how many).
For another norm (DyT, a Hugging Face class, …) the x̂ fields are null. The record this produces
is ``health`` in ``metrics.jsonl`` (:data:`normlab.run_format.HEALTH_RECORD`); the drift flag is
the analysis's (:func:`normlab.analysis.health.health_flags`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from normlab._checks import stats_dtype
from normlab.audit.model import is_norm_module
from normlab.experiment.measure.activations import run_hooked_pass
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm
from normlab.run_format import HEALTH_STATS

__all__ = [
    "HEALTH_STATS",
    "NormFormula",
    "effective_gain",
    "formula_of",
    "layer_health",
    "norm_health",
    "norm_layers",
    "normalized",
]


LAYERNORM = "layernorm"
RMSNORM = "rmsnorm"


@dataclass(frozen=True)
class NormFormula:
    """How a layer computes x̂: ``kind`` (``"layernorm"`` or ``"rmsnorm"``), ``eps`` (None:
    the machine epsilon of the statistics dtype, as normlab's and torch's RMSNorm) and ``dims``,
    the trailing dimensions it normalises together."""

    kind: str
    eps: float | None
    dims: int = 1


def norm_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The norm layers of ``model`` in module order, as (qualified name, module): every module
    that :func:`normlab.audit.is_norm_module` recognises (a known norm class, or a class name
    ending in ``Norm`` / holding ``RMSNorm`` or ``LayerNorm``, or DyT), except those inside
    another norm layer. The root module itself counts when it is a norm."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not is_norm_module(module):
            continue
        if any(name.startswith(f"{outer}.") or outer == "" for outer, _ in found):
            continue
        found.append((name, module))
    return found


def formula_of(module: nn.Module) -> NormFormula | None:
    """The x̂ formula of a normlab or torch norm layer, or None for any other module."""
    if isinstance(module, (LayerNorm, nn.LayerNorm)):
        return NormFormula(LAYERNORM, float(module.eps), len(module.normalized_shape))
    if isinstance(module, (RMSNorm, nn.RMSNorm)):
        eps = None if module.eps is None else float(module.eps)
        return NormFormula(RMSNORM, eps, len(module.normalized_shape))
    if isinstance(module, AdaLayerNormZero):
        return NormFormula(LAYERNORM, float(module.eps))
    if isinstance(module, AdaRMSNorm):
        return NormFormula(RMSNORM, None if module.eps is None else float(module.eps))
    return None


def normalized(x: torch.Tensor, formula: NormFormula) -> torch.Tensor:
    """x̂ of ``x`` [..., D] (the last ``formula.dims`` dimensions flattened to D) in float32
    (float64 for float64 ``x``): LayerNorm (x − μ)·rsqrt(σ² + ε), σ² biased; RMSNorm
    x·rsqrt(mean(x²) + ε). ε = None is the machine epsilon of the statistics dtype."""
    sd = stats_dtype(x.dtype)
    v = x.detach().to(sd).flatten(-formula.dims) if formula.dims > 1 else x.detach().to(sd)
    eps = torch.finfo(sd).eps if formula.eps is None else formula.eps
    if formula.kind == LAYERNORM:
        centred = v - v.mean(dim=-1, keepdim=True)
        return centred * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
    if formula.kind == RMSNORM:
        return v * torch.rsqrt(v.square().mean(dim=-1, keepdim=True) + eps)
    raise ValueError(f"formula.kind: expected 'layernorm' or 'rmsnorm', got {formula.kind!r}")


def effective_gain(module: nn.Module) -> torch.Tensor | None:
    """The gain g the layer multiplies x̂ by, in float32: o + w for a normlab RMSNorm with
    ``weight_offset`` o, ``weight`` otherwise; None when it has no tensor ``weight``."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    gain = weight.detach().float()
    offset = getattr(module, "weight_offset", 0.0)
    return gain + float(offset) if isinstance(offset, (int, float)) else gain


def _rms(t: torch.Tensor) -> float:
    return math.sqrt(t.detach().to(stats_dtype(t.dtype)).square().mean().item())


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return None


def layer_health(
    x: torch.Tensor, y: torch.Tensor | None, module: nn.Module
) -> dict[str, float | None]:
    """The statistics of :data:`HEALTH_STATS` for one call of the norm ``module`` on input
    ``x`` with output ``y`` (see the module docstring for the formulas); the x̂ fields are None
    when the layer's formula is unknown, the gain fields when it has no ``weight``."""
    stats: dict[str, float | None] = dict.fromkeys(HEALTH_STATS)
    stats["in_rms"] = _rms(x)
    if y is not None and y.is_floating_point():
        stats["out_rms"] = _rms(y)
    formula = formula_of(module)
    if formula is not None:
        xh = normalized(x, formula)
        stats["xhat_ms"] = xh.square().mean().item()
        stats["xhat_mean"] = xh.mean().item()
        stats["xhat_var"] = xh.var(dim=-1, unbiased=False).mean().item()
        stats["xhat_mean_rms"] = xh.mean(dim=-1).square().mean().sqrt().item()
    gain = effective_gain(module)
    if gain is not None and gain.numel():
        stats["gain_mean"] = gain.mean().item()
        stats["gain_max_abs"] = gain.abs().max().item()
    if formula is not None and isinstance(y, torch.Tensor) and _unconditional(module):
        stats.update(_output_check(xh, y, module, formula))
    return stats


def _unconditional(module: nn.Module) -> bool:
    return not isinstance(module, (AdaRMSNorm, AdaLayerNormZero))


def _output_check(
    xh: torch.Tensor, y: torch.Tensor, module: nn.Module, formula: NormFormula
) -> dict[str, float]:
    """``formula_err`` = √mean((y − y_ref)²) / √mean(y_ref²) with y_ref = g ⊙ x̂ + β, and
    ``out_xhat_ms`` = mean(x̂²) · mean((y − β)²) / mean((g ⊙ x̂)²) (g, β where the layer has
    them), from x̂ (:func:`normalized`) and the layer's output y; both NaN when y's shape is
    not x̂'s."""
    scaled = xh
    gain = effective_gain(module)
    if gain is not None:
        scaled = scaled * gain.to(xh.dtype).reshape(-1)
    out = y.detach().to(xh.dtype)
    out = out.flatten(-formula.dims) if formula.dims > 1 else out
    if out.shape != xh.shape:
        return {"formula_err": math.nan, "out_xhat_ms": math.nan}
    ref, returned = scaled, out
    bias = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        beta = bias.detach().to(xh.dtype).reshape(-1)
        ref, returned = scaled + beta, out - beta
    scale = ref.square().mean().sqrt().item()
    diff = (out - ref).square().mean().sqrt().item()
    err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    scaled_ms = scaled.square().mean().item()
    returned_ms = returned.square().mean().item()
    ratio = returned_ms / scaled_ms if scaled_ms > 0 else (1.0 if returned_ms == 0 else math.inf)
    return {"formula_err": err, "out_xhat_ms": xh.square().mean().item() * ratio}


def _mean_over_calls(calls: list[dict[str, float | None]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in HEALTH_STATS:
        values = [c[key] for c in calls if c[key] is not None]
        merged[key] = sum(values) / len(values) if values else None
    merged["calls"] = len(calls)
    return merged


@torch.no_grad()
def norm_health(
    model: nn.Module,
    run_batch: Callable[[nn.Module], object],
    kinds: bool = True,
) -> dict[str, dict[str, Any]]:
    """{layer name: statistics} of every norm layer of ``model`` (:func:`norm_layers`) on the
    batch ``run_batch(model)`` runs through it, in eval mode without gradients; the hooks are
    removed and the training mode restored afterwards, even when the forward raises. Each
    layer's entry holds :data:`HEALTH_STATS` (averaged over its calls), ``calls`` and, with
    ``kinds``, ``kind`` (``"layernorm"``, ``"rmsnorm"`` or None when the formula is unknown).
    A layer the batch did not reach is left out."""
    layers = norm_layers(model)
    seen: dict[str, list[dict[str, float | None]]] = {name: [] for name, _ in layers}

    def hook_for(name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if x is not None and x.is_floating_point() and x.numel():
                seen[name].append(layer_health(x, _first_tensor(out), module))

        return hook

    handles = [m.register_forward_hook(hook_for(n)) for n, m in layers]
    run_hooked_pass(model, run_batch, handles)
    result: dict[str, dict[str, Any]] = {}
    for name, module in layers:
        if not seen[name]:
            continue
        entry = _mean_over_calls(seen[name])
        if kinds:
            formula = formula_of(module)
            entry["kind"] = formula.kind if formula is not None else None
        result[name or type(module).__name__] = entry
    return result
