"""Backward kernels of the fused row norm (see :mod:`normlab.kernels.triton.forward`).

Per row, with x̂ = (h − μ)·rstd and g = ∂L/∂x̂ = dy ⊙ (o + w) ⊙ (1 + s):

    RMSNorm:   ∂L/∂h = rstd · (g − x̂ · mean(x̂ ⊙ g))
    LayerNorm: ∂L/∂h = rstd · (g − mean(g) − x̂ · mean(x̂ ⊙ g))

(differentiate x̂ = h·rstd with ∂rstd/∂h = −rstd³·h/D, resp. through μ as well), then the
gradient of the returned h is added: dh = ∂L/∂h + dh_out. The prologue h = x + gate ⊙ addend
gives dx = dh, d_addend = dh ⊙ gate, d_gate = dh ⊙ addend. Per-channel and modulation terms:
dw = dy ⊙ r(x̂) (r: the LLaMA rounding of the forward), db = dy, ds = dy ⊙ x̂, dt = dy.

Rows are split into segments of ``group`` consecutive rows (all rows for the weight and bias,
one sequence for per-sequence modulation). Program ``pid`` takes segment ``pid // splits`` and
every ``splits``-th step of it; its sums of dw, db, ds, dt, d_gate go to row ``pid`` of a float32
partial buffer, never to a shared address, and :mod:`normlab.kernels.triton.reduce` adds the
``splits`` partial rows of each segment in order. Per-token modulation gradients need no sum
and are stored directly (``REDUCE_*`` off). No atomics anywhere: the bits never change.

The tile kernel holds ``ROWS`` rows in registers and keeps [ROWS, BLOCK_D] accumulators; the
chunked kernel walks one long row twice (pass 1: mean(x̂ ⊙ g) and mean(g); pass 2: dh and the
gradients) and adds into its own partial row in memory (zero-initialised by the launcher).
"""

from __future__ import annotations

import triton
import triton.language as tl

from normlab.kernels.triton.helpers import cast_rne, normalized_and_upstream, row_ptrs


@triton.jit
def _store_cast(PTR, rows, D, cols, mask, value, SOFT_BF16: tl.constexpr):
    """Store float32 ``value`` at ``PTR[rows, cols]`` ([N, D] contiguous) in PTR's dtype."""
    tl.store(
        row_ptrs(PTR, rows, D, cols), cast_rne(value, PTR.dtype.element_ty, SOFT_BF16), mask=mask
    )


@triton.jit
def _add_to_partial(PART, pid, D, cols, mask, value):
    """PART[pid, cols] += value: a program's own partial row, so no other program touches it."""
    ptrs = row_ptrs(PART, pid + tl.arange(0, 1), D, cols)
    tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + value, mask=mask)


@triton.jit
def norm_backward_tile_kernel(
    HN,
    DY,
    DH,
    MEAN,
    RSTD,
    WEIGHT,
    SCALE,
    ADDEND,
    GATE,
    DX,
    DADDEND,
    DWEIGHT,
    DBIAS,
    DSCALE,
    DSHIFT,
    DGATE,
    D,
    group,
    splits,
    stride_hn,
    stride_dy,
    stride_dh,
    stride_s,
    stride_a,
    stride_g,
    scale_group,
    gate_group,
    weight_offset,
    NORM: tl.constexpr,
    CENTER: tl.constexpr,
    HAS_DY: tl.constexpr,
    HAS_DH: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
    HAS_GATE: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,
    NEED_DX: tl.constexpr,
    NEED_DADDEND: tl.constexpr,
    NEED_DWEIGHT: tl.constexpr,
    NEED_DBIAS: tl.constexpr,
    NEED_DSCALE: tl.constexpr,
    NEED_DSHIFT: tl.constexpr,
    NEED_DGATE: tl.constexpr,
    REDUCE_SCALE: tl.constexpr,
    REDUCE_SHIFT: tl.constexpr,
    REDUCE_GATE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    segment = pid // splits
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    acc_w = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    acc_b = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    acc_s = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    acc_t = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    acc_g = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for step in range(pid % splits, tl.cdiv(group, ROWS), splits):
        local = step * ROWS + tl.arange(0, ROWS)
        rows = segment * group + local
        row_ok = local < group
        mask = row_ok[:, None] & col_ok[None, :]
        dh = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        if NORM and HAS_DY:
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            mean = rstd
            if CENTER:
                mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            xhat, dy, g = normalized_and_upstream(
                HN, DY, WEIGHT, SCALE, rows, cols, col_ok, mask, stride_hn, stride_dy, stride_s,
                scale_group, mean, rstd, weight_offset, CENTER, HAS_WEIGHT, HAS_SCALE,
            )  # fmt: skip
            dh = g - xhat * (tl.sum(xhat * g, axis=1) / D)[:, None]
            if CENTER:
                dh = dh - (tl.sum(g, axis=1) / D)[:, None]
            dh = dh * rstd[:, None]
            if NEED_DWEIGHT:
                if ROUND_DTYPE is not None:
                    acc_w += dy * cast_rne(xhat, ROUND_DTYPE, SOFT_BF16).to(tl.float32)
                else:
                    acc_w += dy * xhat
            if NEED_DBIAS:
                acc_b += dy
            if NEED_DSCALE:
                if REDUCE_SCALE:
                    acc_s += dy * xhat
                else:
                    _store_cast(DSCALE, rows, D, cols, mask, dy * xhat, SOFT_BF16)
            if NEED_DSHIFT:
                if REDUCE_SHIFT:
                    acc_t += dy
                else:
                    _store_cast(DSHIFT, rows, D, cols, mask, dy, SOFT_BF16)
        if HAS_DH:
            dh += tl.load(row_ptrs(DH, rows, stride_dh, cols), mask=mask, other=0.0).to(tl.float32)
        if NEED_DX:
            _store_cast(DX, rows, D, cols, mask, dh, SOFT_BF16)
        if HAS_GATE:
            if NEED_DADDEND:
                gate = tl.load(
                    row_ptrs(GATE, rows // gate_group, stride_g, cols), mask=mask, other=0.0
                )
                _store_cast(DADDEND, rows, D, cols, mask, dh * gate.to(tl.float32), SOFT_BF16)
            if NEED_DGATE:
                a = tl.load(row_ptrs(ADDEND, rows, stride_a, cols), mask=mask, other=0.0)
                if REDUCE_GATE:
                    acc_g += dh * a.to(tl.float32)
                else:
                    _store_cast(DGATE, rows, D, cols, mask, dh * a.to(tl.float32), SOFT_BF16)
        elif HAS_ADDEND and NEED_DADDEND:
            _store_cast(DADDEND, rows, D, cols, mask, dh, SOFT_BF16)
    if NEED_DWEIGHT:
        tl.store(DWEIGHT + pid.to(tl.int64) * D + cols, tl.sum(acc_w, axis=0), mask=col_ok)
    if NEED_DBIAS:
        tl.store(DBIAS + pid.to(tl.int64) * D + cols, tl.sum(acc_b, axis=0), mask=col_ok)
    if NEED_DSCALE and REDUCE_SCALE:
        tl.store(DSCALE + pid.to(tl.int64) * D + cols, tl.sum(acc_s, axis=0), mask=col_ok)
    if NEED_DSHIFT and REDUCE_SHIFT:
        tl.store(DSHIFT + pid.to(tl.int64) * D + cols, tl.sum(acc_t, axis=0), mask=col_ok)
    if NEED_DGATE and REDUCE_GATE:
        tl.store(DGATE + pid.to(tl.int64) * D + cols, tl.sum(acc_g, axis=0), mask=col_ok)


@triton.jit
def norm_backward_chunked_kernel(
    HN,
    DY,
    DH,
    MEAN,
    RSTD,
    WEIGHT,
    SCALE,
    ADDEND,
    GATE,
    DX,
    DADDEND,
    DWEIGHT,
    DBIAS,
    DSCALE,
    DSHIFT,
    DGATE,
    D,
    group,
    splits,
    stride_hn,
    stride_dy,
    stride_dh,
    stride_s,
    stride_a,
    stride_g,
    scale_group,
    gate_group,
    weight_offset,
    NORM: tl.constexpr,
    CENTER: tl.constexpr,
    HAS_DY: tl.constexpr,
    HAS_DH: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
    HAS_GATE: tl.constexpr,
    ROUND_DTYPE: tl.constexpr,
    NEED_DX: tl.constexpr,
    NEED_DADDEND: tl.constexpr,
    NEED_DWEIGHT: tl.constexpr,
    NEED_DBIAS: tl.constexpr,
    NEED_DSCALE: tl.constexpr,
    NEED_DSHIFT: tl.constexpr,
    NEED_DGATE: tl.constexpr,
    REDUCE_SCALE: tl.constexpr,
    REDUCE_SHIFT: tl.constexpr,
    REDUCE_GATE: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    segment = pid // splits
    lanes = tl.arange(0, BLOCK_D)
    for local in range(pid % splits, group, splits):
        rows = segment * group + local + tl.arange(0, 1)
        if NORM and HAS_DY:
            rstd = tl.load(RSTD + rows)
            mean = rstd
            if CENTER:
                mean = tl.load(MEAN + rows)
            lane_dot = tl.zeros([1, BLOCK_D], dtype=tl.float32)
            lane_sum = tl.zeros([1, BLOCK_D], dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                cols = start + lanes
                col_ok = cols < D
                mask = col_ok[None, :]
                xhat, dy, g = normalized_and_upstream(
                    HN, DY, WEIGHT, SCALE, rows, cols, col_ok, mask, stride_hn, stride_dy,
                    stride_s, scale_group, mean, rstd, weight_offset, CENTER, HAS_WEIGHT,
                    HAS_SCALE,
                )  # fmt: skip
                lane_dot += xhat * g
                lane_sum += g
            dot = tl.sum(lane_dot, axis=1) / D
            g_mean = tl.sum(lane_sum, axis=1) / D
        for start in range(0, D, BLOCK_D):
            cols = start + lanes
            col_ok = cols < D
            mask = col_ok[None, :]
            dh = tl.zeros([1, BLOCK_D], dtype=tl.float32)
            if NORM and HAS_DY:
                xhat, dy, g = normalized_and_upstream(
                    HN, DY, WEIGHT, SCALE, rows, cols, col_ok, mask, stride_hn, stride_dy,
                    stride_s, scale_group, mean, rstd, weight_offset, CENTER, HAS_WEIGHT,
                    HAS_SCALE,
                )  # fmt: skip
                dh = g - xhat * dot[:, None]
                if CENTER:
                    dh = dh - g_mean[:, None]
                dh = dh * rstd[:, None]
                if NEED_DWEIGHT:
                    if ROUND_DTYPE is not None:
                        xa = cast_rne(xhat, ROUND_DTYPE, SOFT_BF16).to(tl.float32)
                        _add_to_partial(DWEIGHT, pid, D, cols, mask, dy * xa)
                    else:
                        _add_to_partial(DWEIGHT, pid, D, cols, mask, dy * xhat)
                if NEED_DBIAS:
                    _add_to_partial(DBIAS, pid, D, cols, mask, dy)
                if NEED_DSCALE:
                    if REDUCE_SCALE:
                        _add_to_partial(DSCALE, pid, D, cols, mask, dy * xhat)
                    else:
                        _store_cast(DSCALE, rows, D, cols, mask, dy * xhat, SOFT_BF16)
                if NEED_DSHIFT:
                    if REDUCE_SHIFT:
                        _add_to_partial(DSHIFT, pid, D, cols, mask, dy)
                    else:
                        _store_cast(DSHIFT, rows, D, cols, mask, dy, SOFT_BF16)
            if HAS_DH:
                dh_ptrs = row_ptrs(DH, rows, stride_dh, cols)
                dh += tl.load(dh_ptrs, mask=mask, other=0.0).to(tl.float32)
            if NEED_DX:
                _store_cast(DX, rows, D, cols, mask, dh, SOFT_BF16)
            if HAS_GATE:
                if NEED_DADDEND:
                    g_ptrs = row_ptrs(GATE, rows // gate_group, stride_g, cols)
                    gate = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
                    _store_cast(DADDEND, rows, D, cols, mask, dh * gate, SOFT_BF16)
                if NEED_DGATE:
                    a = tl.load(row_ptrs(ADDEND, rows, stride_a, cols), mask=mask, other=0.0)
                    if REDUCE_GATE:
                        _add_to_partial(DGATE, pid, D, cols, mask, dh * a.to(tl.float32))
                    else:
                        _store_cast(DGATE, rows, D, cols, mask, dh * a.to(tl.float32), SOFT_BF16)
            elif HAS_ADDEND and NEED_DADDEND:
                _store_cast(DADDEND, rows, D, cols, mask, dh, SOFT_BF16)
        tl.debug_barrier()  # the next row's updates of the partial rows see this row's
