"""RMSNorm family on the fused kernels: ``rms_norm`` and ``add_rms_norm``.

m = mean(h²), x̂ = h·rsqrt(m + ε), y = (o + w) ⊙ r(x̂), where o is the weight offset (added in
float32) and r rounds x̂ to the input dtype in ``"llama"`` casting (identity in ``"gemma"`` and
``"fp32"``); h = x, or h = x + residual as in :mod:`normlab.kernels.triton.layer_norm`.
Backward: dh = rstd·(g − x̂·mean(x̂ ⊙ g)) with g = (o + w) ⊙ dy; dw = Σ dy ⊙ r(x̂). The rounding
r passes gradients straight through, in float32.
"""

from __future__ import annotations

import torch

from normlab.kernels import reference
from normlab.kernels.triton.ops import fused_norm
from normlab.kernels.triton.rows import check_device, residual_dtype, token_rows, uses_reference


def _round_dtype(casting: str, io_dtype: torch.dtype) -> torch.dtype | None:
    return io_dtype if casting == "llama" else None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    casting: str,
    out_dtype: torch.dtype,
    io_dtype: torch.dtype,
) -> torch.Tensor:
    """y = (o + w) ⊙ r(x·rsqrt(mean(x²) + ε)) over the last dimension."""
    if uses_reference(x):
        return reference.rms_norm(x, weight, eps, weight_offset, casting, out_dtype, io_dtype)
    check_device(x)
    y, _, _, _ = fused_norm(
        token_rows(x), None, None, weight, None, None, None, "rms", eps, weight_offset,
        _round_dtype(casting, io_dtype), out_dtype, None,
    )  # fmt: skip
    return y.view(x.shape)


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
    """h = x + residual; returns (rms_norm(h), h), rounding x̂ to x's dtype in LLaMA casting."""
    if uses_reference(x):
        return reference.add_rms_norm(
            x, residual, weight, eps, weight_offset, casting, residual_in_fp32, out_dtype
        )
    check_device(x)
    y, h, _, _ = fused_norm(
        token_rows(x), None if residual is None else token_rows(residual), None, weight, None,
        None, None, "rms", eps, weight_offset, _round_dtype(casting, x.dtype), out_dtype,
        residual_dtype(x, residual_in_fp32),
    )  # fmt: skip
    return y.view(x.shape), h.view(x.shape)
