"""The reference math of every norm, stated once (DESIGN §1): the ``"torch"`` backend.

Two forms of the same formulas, both composite PyTorch ops that autograd differentiates:

- the eight backend functions (``layer_norm`` … ``gated_add_ada_rms_norm``, the interface of
  :data:`normlab.kernels.BACKEND_FUNCTIONS`) on tensors [..., D], with modulation tensors
  (scale, shift, gate) as views broadcasting over x. They are the portable implementation, the
  oracle every other backend is tested against, and what every fast backend falls back to
  (under ``torch.compile``, torch.func transforms, forward-mode AD, …; see
  :mod:`normlab.kernels.frontend`);
- the fused norm on rows [N, D] that the fast backends compute (``fused_forward``,
  ``fused_backward``, ``graph_gradients``; the formulas are in :mod:`normlab.kernels.frontend`'s
  docstring): the ``"compiled"`` backend hands the first two to Inductor, and the front end
  differentiates ``fused_forward`` when a caller asks for a gradient graph.

Statistics are always taken in float32 (float64 for float64 input); ε sits inside the square
root. The functions receive already-validated arguments (see :mod:`normlab.functional`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
    # x − μ ≡ 0 for one element, so its gradient is 0 exactly: written as a product with 0,
    # autograd gives 0 instead of g − g summed into x's other gradients with a rounding
    xc = xf * 0.0 if xf.shape[-1] == 1 else xf - xf.mean(-1, keepdim=True)
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
    h = residual_sum(x, residual, residual_in_fp32)
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
    h = residual_sum(x, residual, residual_in_fp32)
    return layer_norm(h, weight, bias, eps, out_dtype), h


def sum_dtype(dtype: torch.dtype, residual_in_fp32: bool) -> torch.dtype:
    """dtype of h = x + r: float32 when ``residual_in_fp32`` (float64 stays float64), else x's."""
    return torch.float32 if residual_in_fp32 and dtype != torch.float64 else dtype


def residual_sum(
    x: torch.Tensor, residual: torch.Tensor | None, residual_in_fp32: bool
) -> torch.Tensor:
    """h = x + residual (x alone when ``residual`` is None), summed in the statistics dtype and
    returned in :func:`sum_dtype`."""
    acc = stats_dtype(x.dtype)
    h = x.to(acc) if residual is None else x.to(acc) + residual.to(acc)
    return h.to(sum_dtype(x.dtype, residual_in_fp32))


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


# ----------------------------------------------------------------------------------------------
# The fused norm on rows [N, D] (what the fast backends compute; see normlab.kernels.frontend)
# ----------------------------------------------------------------------------------------------
def grouped(rows: torch.Tensor, m: torch.Tensor, op: Callable[..., torch.Tensor]) -> torch.Tensor:
    """op(rows, m), where row k of m [K, D] serves the G = N / K rows k·G … of rows [N, D]."""
    k, d = m.shape
    return op(rows.view(k, -1, d), m.view(k, 1, d)).view(rows.shape)


def group_sum(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Σ over each group of N / k consecutive rows: [N, D] → [k, D]."""
    return rows.view(k, -1, rows.shape[-1]).sum(1)


def fused_forward(
    x: torch.Tensor,
    res: torch.Tensor | None,
    gate: torch.Tensor | None,
    gain: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    centre: bool,
    hat_round: torch.dtype | None,
    h_dtype: torch.dtype | None,
    out_dtype: torch.dtype | None,
) -> tuple[Any, Any, Any, Any]:
    """(y, h, μ, rstd) of the fused norm (the formulas of :mod:`normlab.kernels.frontend`)."""
    sd = stats_dtype(x.dtype)
    hf = x.to(sd)
    h = None
    if res is not None:
        other = res.to(sd)
        if gate is not None:
            other = grouped(other, gate.to(sd), torch.mul)
        h = (hf + other).to(h_dtype)
        hf = h.to(sd)
    if out_dtype is None:
        return None, h, None, None
    mean = None
    if centre:
        mean = hf.mean(-1, keepdim=True)
        xc = hf - mean
        rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
        xhat = xc * rstd
        mean = mean.squeeze(-1)
    else:
        rstd = torch.rsqrt((hf * hf).mean(-1, keepdim=True) + eps)
        xhat = hf * rstd
    y = xhat.to(hat_round).to(sd) if hat_round is not None else xhat
    if gain is not None:
        y = y * gain
    if bias is not None:
        y = y + bias
    if scale is not None:
        y = grouped(y, 1.0 + scale.to(sd), torch.mul)
    if shift is not None:
        y = grouped(y, shift.to(sd), torch.add)
    return y.to(out_dtype), h, mean, rstd.squeeze(-1)


def fused_backward(
    h: torch.Tensor,
    mean: torch.Tensor | None,
    rstd: torch.Tensor | None,
    dy: torch.Tensor | None,
    dh: torch.Tensor | None,
    gain: torch.Tensor | None,
    scale: torch.Tensor | None,
    gate: torch.Tensor | None,
    other: torch.Tensor | None,
    centre: bool,
    hat_round: torch.dtype | None,
    k_scale: int,
    k_shift: int,
    k_gate: int,
    need_weight: bool,
    need_bias: bool,
    need_scale: bool,
    need_shift: bool,
    need_gate: bool,
    need_other: bool,
) -> tuple[Any, ...]:
    """(dh_total, dgain, dbias, dscale, dshift, dgate, do), all in the statistics dtype except
    dh_total (h's dtype): one pass over h and dy with the saved μ and rstd."""
    sd = stats_dtype(h.dtype)
    dgain = dbias = dscale = dshift = None
    if dy is not None and rstd is not None:
        hf = h.to(sd)
        r = rstd.unsqueeze(-1)
        xhat = (hf - mean.unsqueeze(-1)) * r if centre else hf * r
        g = dy.to(sd)
        if need_weight:
            q = xhat.to(hat_round).to(sd) if hat_round is not None else xhat
            dgain = (g * q).sum(0)
        if need_bias:
            dbias = g.sum(0)
        if need_scale:
            dscale = group_sum(g * xhat, k_scale)
        if need_shift:
            dshift = group_sum(g, k_shift)
        d = g
        if scale is not None:
            d = grouped(d, 1.0 + scale.to(sd), torch.mul)
        if gain is not None:
            d = d * gain
        if hat_round is not None:
            d = d.to(hat_round).to(sd)
        c1 = (d * xhat).mean(-1, keepdim=True)
        dn = r * ((d - d.mean(-1, keepdim=True)) - xhat * c1) if centre else r * (d - xhat * c1)
        dn = dn.to(h.dtype)
    else:
        dn = torch.zeros_like(h)
    if dh is not None:
        dn = (dn.to(sd) + dh.to(sd)).to(h.dtype)
    dgate = do = None
    if gate is not None:
        dnf = dn.to(sd)
        if need_other:
            do = grouped(dnf, gate.to(sd), torch.mul)
        if need_gate:
            dgate = group_sum(dnf * other.to(sd), k_gate)
    return dn, dgain, dbias, dscale, dshift, dgate, do


def graph_gradients(
    normed: torch.Tensor,
    dy: torch.Tensor | None,
    dh: torch.Tensor | None,
    *,
    weight: torch.Tensor | None,
    offset: float,
    scale: torch.Tensor | None,
    gate: torch.Tensor | None,
    other: torch.Tensor | None,
    eps: float,
    centre: bool,
    hat_round: torch.dtype | None,
    out_dtype: torch.dtype | None,
    k_gate: int,
    k_shift: int,
    needs: Sequence[bool],
    dtypes: Sequence[torch.dtype | None],
) -> tuple[torch.Tensor | None, ...]:
    """The gradients of (x, r or o, gate, weight, bias, scale, shift) as a differentiable graph,
    for a backward called with ``create_graph=True``.

    ``normed`` is what the norm read: x, or the h of a sum (an output of the fused op, whose
    own graph leads back to x and r or o). y is recomputed from it by :func:`fused_forward`,
    μ and rstd included, with gain = weight + offset, and differentiated by autograd with
    ``create_graph=True``; then dh_total = ∂y/∂h + dh and

        dx = dh_total,  dr = dh_total  (h = x + r)
        do = gate ⊙ dh_total,  dgate = Σ_group o ⊙ dh_total  (h = x + gate ⊙ o)
        dbias = Σ_rows dy,  dshift = Σ_group dy.

    ``gate`` and ``other`` (o) are given for a gated sum only; ``needs`` and ``dtypes`` follow
    the input order above, and each gradient is returned in its input's dtype.
    """
    sd = stats_dtype(normed.dtype)
    d_normed = d_weight = d_bias = d_scale = d_shift = None
    if out_dtype is not None and dy is not None:
        gain = None if weight is None else weight.to(sd) + offset
        y = fused_forward(
            normed, None, None, gain, None, scale, None, eps, centre, hat_round, None, out_dtype
        )[0]
        wrt = {
            name: t
            for name, t in (("normed", normed), ("weight", weight), ("scale", scale))
            if t is not None and t.requires_grad
        }
        if wrt:
            found = torch.autograd.grad(
                y, list(wrt.values()), dy, create_graph=True, allow_unused=True
            )
            got = dict(zip(wrt, found, strict=True))
            d_normed, d_weight, d_scale = got.get("normed"), got.get("weight"), got.get("scale")
        if needs[4]:
            d_bias = dy.to(sd).sum(0)
        if needs[6]:
            d_shift = group_sum(dy.to(sd), k_shift)
    if dh is not None:
        d_normed = dh if d_normed is None else d_normed.to(sd) + dh.to(sd)
    if d_normed is None:
        d_normed = torch.zeros_like(normed)
    d_other = d_gate = None
    if gate is not None:
        if needs[1]:
            d_other = grouped(d_normed.to(sd), gate.to(sd), torch.mul)
        if needs[2] and other is not None:
            d_gate = group_sum(d_normed.to(sd) * other.to(sd), k_gate)
    elif needs[1]:
        d_other = d_normed
    grads = (d_normed, d_other, d_gate, d_weight, d_bias, d_scale, d_shift)
    return tuple(
        None if g is None or not need or dt is None else g.to(dt)
        for g, need, dt in zip(grads, needs, dtypes, strict=True)
    )
