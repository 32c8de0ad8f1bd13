"""Conditioned norms and gated residuals on the fused kernels.

- ``ada_rms_norm`` / ``ada_layer_norm``: y = x̂ ⊙ (1 + s) + t (π0.5 AdaRMS, DiT adaLN).
- ``gated_residual``: h' = h + g ⊙ o, summed in float32, stored in h's dtype.
- ``gated_add_ada_rms_norm``: one AdaRMS block step, h' = h + g ⊙ o; y = x̂(h') ⊙ (1 + s) + t,
  returning (y, h') from one pass over the rows.

s, t, g are per sequence ([B, 1, D]) or per token ([B, T, D]) (see
:mod:`normlab.kernels.triton.rows`). Backward: with G = 1 + s and x̂ as in the norm,
dh' = rstd·(G ⊙ dy − x̂·mean(x̂ ⊙ G ⊙ dy)) (LayerNorm also subtracts mean(G ⊙ dy)) plus the
gradient of the returned h'; dh = dh', do = g ⊙ dh', dg = Σ o ⊙ dh', ds = Σ dy ⊙ x̂, dt = Σ dy,
the sums running over the tokens that share a modulation row, in a fixed order.
"""

from __future__ import annotations

import torch

from normlab.kernels import reference
from normlab.kernels.triton.ops import fused_norm
from normlab.kernels.triton.rows import (
    align_reduced_rows,
    check_device,
    modulation_rows,
    token_rows,
    uses_reference,
)


def _ada_norm(
    kind: str,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    check_device(x)
    rows = token_rows(x)
    scale_rows, shift_rows = align_reduced_rows(
        rows.shape[0],
        [
            modulation_rows(scale, x.shape),
            None if shift is None else modulation_rows(shift, x.shape),
        ],
    )
    y, _, _, _ = fused_norm(
        rows, None, None, None, None, scale_rows, shift_rows, kind, eps, 0.0, None, out_dtype,
        None,
    )  # fmt: skip
    return y.view(x.shape)


def ada_rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """y = x·rsqrt(mean(x²) + ε) ⊙ (1 + scale) + shift."""
    if uses_reference(x):
        return reference.ada_rms_norm(x, scale, shift, eps, out_dtype)
    return _ada_norm("rms", x, scale, shift, eps, out_dtype)


def ada_layer_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """y = (x − μ)·rsqrt(σ² + ε) ⊙ (1 + scale) + shift."""
    if uses_reference(x):
        return reference.ada_layer_norm(x, scale, shift, eps, out_dtype)
    return _ada_norm("layer", x, scale, shift, eps, out_dtype)


def gated_residual(h: torch.Tensor, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """h' = h + gate ⊙ out in float32, returned in h's dtype."""
    if uses_reference(h):
        return reference.gated_residual(h, out, gate)
    check_device(h)
    _, h_new, _, _ = fused_norm(
        token_rows(h), token_rows(out), modulation_rows(gate, h.shape), None, None, None, None,
        "none", 1.0, 0.0, None, h.dtype, h.dtype,
    )  # fmt: skip
    return h_new.view(h.shape)


def gated_add_ada_rms_norm(
    h: torch.Tensor,
    out: torch.Tensor,
    gate: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h' = h + gate ⊙ out; y = x̂(h') ⊙ (1 + scale) + shift; returns (y, h')."""
    if uses_reference(h):
        return reference.gated_add_ada_rms_norm(h, out, gate, scale, shift, eps, out_dtype)
    check_device(h)
    rows = token_rows(h)
    gate_rows, scale_rows, shift_rows = align_reduced_rows(
        rows.shape[0],
        [
            modulation_rows(gate, h.shape),
            modulation_rows(scale, h.shape),
            None if shift is None else modulation_rows(shift, h.shape),
        ],
    )
    y, h_new, _, _ = fused_norm(
        rows, token_rows(out), gate_rows, None, None, scale_rows, shift_rows, "rms", eps, 0.0,
        None, out_dtype, h.dtype,
    )  # fmt: skip
    return y.view(h.shape), h_new.view(h.shape)
