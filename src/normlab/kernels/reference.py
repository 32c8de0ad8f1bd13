"""The reference backend: composite PyTorch ops that state the math of DESIGN §1 directly.

Autograd differentiates these formulas, so they serve both as the portable implementation and
as the oracle that every other backend is tested against. Statistics are always taken in
float32 (float64 for float64 input); epsilon sits inside the square root.

All functions receive already-validated arguments (see :mod:`normlab.functional`); modulation
tensors (scale, shift, gate) arrive as views that broadcast over ``x``.
"""

from __future__ import annotations

import torch

from normlab._checks import stats_dtype


def _rms_hat(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x̂ = x · rsqrt(mean(x²) + ε), in the statistics dtype."""
    xf = x.to(stats_dtype(x.dtype))
    ms = xf.pow(2).mean(-1, keepdim=True)
    return xf * torch.rsqrt(ms + eps)


def _layer_hat(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x̂ = (x − μ) · rsqrt(σ² + ε), biased variance, two-pass, in the statistics dtype."""
    xf = x.to(stats_dtype(x.dtype))
    xc = xf - xf.mean(-1, keepdim=True)
    var = xc.pow(2).mean(-1, keepdim=True)
    return xc * torch.rsqrt(var + eps)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    y = _layer_hat(x, eps)
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(out_dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    casting: str,
    out_dtype: torch.dtype,
    io_dtype: torch.dtype,
) -> torch.Tensor:
    y = _rms_hat(x, eps)
    if casting == "llama":
        # LLaMA: x̂ is rounded to the input dtype before it meets the gain.
        y = y.to(io_dtype)
    if weight is not None:
        sd = stats_dtype(io_dtype)
        gain = weight.to(sd)
        if weight_offset != 0.0:
            gain = gain + weight_offset  # the offset is added in float32, never in 16 bits
        y = y.to(sd) * gain
    return y.to(out_dtype)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    casting: str,
    residual_in_fp32: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    h = _residual_sum(x, residual, residual_in_fp32)
    return rms_norm(h, weight, eps, weight_offset, casting, out_dtype, x.dtype), h


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    residual_in_fp32: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    h = _residual_sum(x, residual, residual_in_fp32)
    return layer_norm(h, weight, bias, eps, out_dtype), h


def _residual_sum(
    x: torch.Tensor, residual: torch.Tensor | None, residual_in_fp32: bool
) -> torch.Tensor:
    acc = stats_dtype(x.dtype)
    h = x.to(acc) if residual is None else x.to(acc) + residual.to(acc)
    return h if residual_in_fp32 and x.dtype != torch.float64 else h.to(x.dtype)


def _modulate(xhat: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None) -> torch.Tensor:
    y = xhat * (1.0 + scale.to(xhat.dtype))
    if shift is not None:
        y = y + shift.to(xhat.dtype)
    return y


def ada_rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return _modulate(_rms_hat(x, eps), scale, shift).to(out_dtype)


def ada_layer_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return _modulate(_layer_hat(x, eps), scale, shift).to(out_dtype)


def gated_residual(h: torch.Tensor, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    acc = stats_dtype(h.dtype)
    return (h.to(acc) + gate.to(acc) * out.to(acc)).to(h.dtype)


def gated_add_ada_rms_norm(
    h: torch.Tensor,
    out: torch.Tensor,
    gate: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    h_new = gated_residual(h, out, gate)
    return ada_rms_norm(h_new, scale, shift, eps, out_dtype), h_new
