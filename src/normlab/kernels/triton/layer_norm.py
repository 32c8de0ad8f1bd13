"""LayerNorm family on the fused kernels: ``layer_norm`` and ``add_layer_norm``.

μ = mean(h), σ² = mean((h − μ)²), x̂ = (h − μ)·rsqrt(σ² + ε), y = γ ⊙ x̂ + β, with h = x, or
h = x + residual summed in float32 (and returned, in float32 when ``residual_in_fp32``).
Backward: dh = rstd·(g − mean(g) − x̂·mean(x̂ ⊙ g)) with g = γ ⊙ dy; dγ = Σ dy ⊙ x̂; dβ = Σ dy.
"""

from __future__ import annotations

import torch

from normlab.kernels import reference
from normlab.kernels.triton.ops import fused_norm
from normlab.kernels.triton.rows import check_device, residual_dtype, token_rows, uses_reference


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β over the last dimension."""
    if uses_reference(x):
        return reference.layer_norm(x, weight, bias, eps, out_dtype)
    check_device(x)
    y, _, _, _ = fused_norm(
        token_rows(x), None, None, weight, bias, None, None, "layer", eps, 0.0, None, out_dtype,
        None,
    )  # fmt: skip
    return y.view(x.shape)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    residual_in_fp32: bool,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; returns (layer_norm(h), h) in one pass over the rows."""
    if uses_reference(x):
        return reference.add_layer_norm(x, residual, weight, bias, eps, residual_in_fp32, out_dtype)
    check_device(x)
    y, h, _, _ = fused_norm(
        token_rows(x), None if residual is None else token_rows(residual), None, weight, bias,
        None, None, "layer", eps, 0.0, None, out_dtype, residual_dtype(x, residual_in_fp32),
    )  # fmt: skip
    return y.view(x.shape), h.view(x.shape)
