"""Device helpers shared by the forward and backward norm kernels.

All arithmetic happens in float32; values meet their storage dtype only when loaded
(``.to(float32)``, exact) and when stored (:func:`cast_rne`, round to nearest even).
"""

from __future__ import annotations

import triton
import triton.language as tl

from normlab.kernels.triton import interpreter_requested

# Triton picks compiled or interpreted kernels when they are decorated, i.e. on this import.
KERNELS_INTERPRETED = interpreter_requested()


@triton.jit
def cast_rne(v, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Round float32 ``v`` to ``dtype`` to nearest, ties to even.

    GPUs do this in one instruction. Triton's CPU interpreter truncates float32 → bfloat16, so
    with ``SOFT_BF16`` the rounding is done on the bits: add 0x7FFF plus the lowest kept bit,
    clear the low 16 bits; the final cast is then exact. NaN is passed through unchanged.
    """
    if SOFT_BF16 and dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
        return rounded.to(dtype)
    else:
        return v.to(dtype)


@triton.jit
def row_ptrs(BASE, rows, stride, cols):
    """Pointers to ``BASE[rows, cols]`` for a row-major [rows, D] view with row ``stride``."""
    return BASE + rows.to(tl.int64)[:, None] * stride + cols[None, :]


@triton.jit
def inv_sqrt(v):
    """1 / sqrt(v), correctly rounded square root and division (a per-row scalar: cheap)."""
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(v))


@triton.jit
def residual_prologue(
    X,
    ADDEND,
    GATE,
    H_OUT,
    rows,
    cols,
    mask,
    stride_x,
    stride_a,
    stride_g,
    stride_h,
    gate_group,
    HAS_ADDEND: tl.constexpr,
    HAS_GATE: tl.constexpr,
    STORE_H: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    """h = x + gate ⊙ addend (gate optional, addend optional), summed in float32.

    With ``STORE_H`` h is rounded to ``H_OUT``'s dtype and stored, and the rounded value is
    returned: the norm then sees exactly the h it returns, as the reference does.
    The gate row of token row r is r // gate_group (1: per token; T: per sequence).
    """
    h = tl.load(row_ptrs(X, rows, stride_x, cols), mask=mask, other=0.0).to(tl.float32)
    if HAS_ADDEND:
        a = tl.load(row_ptrs(ADDEND, rows, stride_a, cols), mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            g_rows = rows // gate_group
            g = tl.load(row_ptrs(GATE, g_rows, stride_g, cols), mask=mask, other=0.0)
            a = g.to(tl.float32) * a
        h = h + a
    if STORE_H:
        h_low = cast_rne(h, H_OUT.dtype.element_ty, SOFT_BF16)
        tl.store(row_ptrs(H_OUT, rows, stride_h, cols), h_low, mask=mask)
        h = h_low.to(tl.float32)
    return h


@triton.jit
def affine_epilogue(
    xhat,
    rows,
    cols,
    col_ok,
    mask,
    WEIGHT,
    BIAS,
    SCALE,
    SHIFT,
    stride_s,
    stride_t,
    scale_group,
    shift_group,
    weight_offset,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
):
    """y = r(x̂) ⊙ (o + w) ⊙ (1 + s) + b + t in float32, each factor and term optional.

    r rounds x̂ to ``ROUND_DTYPE`` and back (LLaMA casting) when that is not None. The weight
    offset o is added to the weight in float32. Scale and shift rows follow their group sizes.
    """
    y = xhat
    if ROUND_DTYPE is not None:
        y = cast_rne(y, ROUND_DTYPE, SOFT_BF16).to(tl.float32)
    if HAS_WEIGHT:
        w = tl.load(WEIGHT + cols, mask=col_ok, other=0.0).to(tl.float32) + weight_offset
        y = y * w[None, :]
    if HAS_SCALE:
        s = tl.load(row_ptrs(SCALE, rows // scale_group, stride_s, cols), mask=mask, other=0.0)
        y = y * (1.0 + s.to(tl.float32))
    if HAS_BIAS:
        b = tl.load(BIAS + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y + b[None, :]
    if HAS_SHIFT:
        t = tl.load(row_ptrs(SHIFT, rows // shift_group, stride_t, cols), mask=mask, other=0.0)
        y = y + t.to(tl.float32)
    return y


@triton.jit
def normalized_and_upstream(
    HN,
    DY,
    WEIGHT,
    SCALE,
    rows,
    cols,
    col_ok,
    mask,
    stride_hn,
    stride_dy,
    stride_s,
    scale_group,
    mean,
    rstd,
    weight_offset,
    CENTER: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    """Recompute x̂ = (h − μ)·rstd (0 outside the row) and g = ∂L/∂x̂ = dy ⊙ (o + w) ⊙ (1 + s).

    Returns (x̂, dy, g), all float32. ``mean`` is ignored unless ``CENTER``.
    """
    h = tl.load(row_ptrs(HN, rows, stride_hn, cols), mask=mask, other=0.0).to(tl.float32)
    if CENTER:
        h = h - mean[:, None]
    xhat = tl.where(mask, h * rstd[:, None], 0.0)
    dy = tl.load(row_ptrs(DY, rows, stride_dy, cols), mask=mask, other=0.0).to(tl.float32)
    g = dy
    if HAS_WEIGHT:
        w = tl.load(WEIGHT + cols, mask=col_ok, other=0.0).to(tl.float32) + weight_offset
        g = g * w[None, :]
    if HAS_SCALE:
        s = tl.load(row_ptrs(SCALE, rows // scale_group, stride_s, cols), mask=mask, other=0.0)
        g = g * (1.0 + s.to(tl.float32))
    return xhat, dy, g
