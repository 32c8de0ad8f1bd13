"""Forward kernels of the fused row norm.

One kernel family computes every forward of the backend; compile-time flags switch its parts:

    h    = x + gate ⊙ addend                      (prologue; addend and gate optional)
    μ    = mean(h)                                 (LayerNorm only, ``CENTER``)
    rstd = 1 / sqrt(mean((h − μ)²) + ε)            (RMSNorm: μ = 0)
    x̂    = (h − μ) · rstd
    y    = r(x̂) ⊙ (o + w) ⊙ (1 + s) + b + t        (epilogue, see ``affine_epilogue``)

With ``STORE_H`` the prologue's h is written (rounded to its storage dtype) and the norm works on
the rounded value; with ``NORM`` off only the prologue runs (the gated residual). Statistics are
float32 and written per row: ``MEAN`` (LayerNorm) and ``RSTD``, never the row divided by anything.

``norm_forward_tile_kernel`` holds ``ROWS`` whole rows in registers ([ROWS, BLOCK_D] ≥ D wide);
``norm_forward_chunked_kernel`` walks one long row in BLOCK_D-wide chunks: pass 1 forms h and
the statistics (LayerNorm: a Welford update per lane, lanes merged exactly at the end), pass 2
re-reads h (from ``H_OUT`` when stored, else x) and writes y.
"""

from __future__ import annotations

import triton
import triton.language as tl

from normlab.kernels.triton.helpers import (
    affine_epilogue,
    cast_rne,
    inv_sqrt,
    residual_prologue,
    row_ptrs,
)


@triton.jit
def norm_forward_tile_kernel(
    X,
    ADDEND,
    GATE,
    WEIGHT,
    BIAS,
    SCALE,
    SHIFT,
    Y,
    H_OUT,
    MEAN,
    RSTD,
    n_rows,
    D,
    stride_x,
    stride_a,
    stride_g,
    stride_s,
    stride_t,
    gate_group,
    scale_group,
    shift_group,
    eps,
    weight_offset,
    NORM: tl.constexpr,
    CENTER: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
    HAS_GATE: tl.constexpr,
    STORE_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    col_ok = cols < D
    mask = row_ok[:, None] & col_ok[None, :]
    h = residual_prologue(
        X, ADDEND, GATE, H_OUT, rows, cols, mask, stride_x, stride_a, stride_g, D, gate_group,
        HAS_ADDEND, HAS_GATE, STORE_H, SOFT_BF16,
    )  # fmt: skip
    if NORM:
        if CENTER:
            mean = tl.sum(h, axis=1) / D
            tl.store(MEAN + rows, mean, mask=row_ok)
            h = tl.where(mask, h - mean[:, None], 0.0)
        rstd = inv_sqrt(tl.sum(h * h, axis=1) / D + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        y = affine_epilogue(
            h * rstd[:, None], rows, cols, col_ok, mask, WEIGHT, BIAS, SCALE, SHIFT,
            stride_s, stride_t, scale_group, shift_group, weight_offset,
            HAS_WEIGHT, HAS_BIAS, HAS_SCALE, HAS_SHIFT, ROUND_DTYPE, SOFT_BF16,
        )  # fmt: skip
        tl.store(row_ptrs(Y, rows, D, cols), cast_rne(y, Y.dtype.element_ty, SOFT_BF16), mask=mask)


@triton.jit
def norm_forward_chunked_kernel(
    X,
    ADDEND,
    GATE,
    WEIGHT,
    BIAS,
    SCALE,
    SHIFT,
    Y,
    H_OUT,
    MEAN,
    RSTD,
    n_rows,
    D,
    stride_x,
    stride_a,
    stride_g,
    stride_s,
    stride_t,
    gate_group,
    scale_group,
    shift_group,
    eps,
    weight_offset,
    NORM: tl.constexpr,
    CENTER: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
    HAS_GATE: tl.constexpr,
    STORE_H: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) + tl.arange(0, 1)
    row_ok = rows < n_rows
    lanes = tl.arange(0, BLOCK_D)
    count = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    lane_mean = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    lane_m2 = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    for start in range(0, D, BLOCK_D):
        cols = start + lanes
        mask = row_ok[:, None] & (cols < D)[None, :]
        h = residual_prologue(
            X, ADDEND, GATE, H_OUT, rows, cols, mask, stride_x, stride_a, stride_g, D,
            gate_group, HAS_ADDEND, HAS_GATE, STORE_H, SOFT_BF16,
        )  # fmt: skip
        if NORM:
            if CENTER:
                count += mask.to(tl.float32)
                delta = h - lane_mean
                lane_mean += tl.where(mask, delta / tl.maximum(count, 1.0), 0.0)
                lane_m2 += tl.where(mask, delta * (h - lane_mean), 0.0)
            else:
                lane_m2 += h * h
    if NORM:
        if CENTER:
            # Exact merge of the lanes' (count, mean, M2): M2 = Σ M2ₗ + Σ nₗ (meanₗ − μ)².
            mean = tl.sum(count * lane_mean, axis=1) / D
            spread = lane_mean - mean[:, None]
            var = (tl.sum(lane_m2, axis=1) + tl.sum(count * spread * spread, axis=1)) / D
            tl.store(MEAN + rows, mean, mask=row_ok)
        else:
            var = tl.sum(lane_m2, axis=1) / D
        rstd = inv_sqrt(var + eps)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        if STORE_H:
            tl.debug_barrier()  # pass 2 reads the h that pass 1 stored
        for start in range(0, D, BLOCK_D):
            cols = start + lanes
            col_ok = cols < D
            mask = row_ok[:, None] & col_ok[None, :]
            if STORE_H:
                h = tl.load(row_ptrs(H_OUT, rows, D, cols), mask=mask, other=0.0).to(tl.float32)
            else:
                h = tl.load(row_ptrs(X, rows, stride_x, cols), mask=mask, other=0.0).to(tl.float32)
            if CENTER:
                h = h - mean[:, None]
            y = affine_epilogue(
                h * rstd[:, None], rows, cols, col_ok, mask, WEIGHT, BIAS, SCALE, SHIFT,
                stride_s, stride_t, scale_group, shift_group, weight_offset,
                HAS_WEIGHT, HAS_BIAS, HAS_SCALE, HAS_SHIFT, ROUND_DTYPE, SOFT_BF16,
            )  # fmt: skip
            y_low = cast_rne(y, Y.dtype.element_ty, SOFT_BF16)
            tl.store(row_ptrs(Y, rows, D, cols), y_low, mask=mask)
