"""Second pass of the deterministic gradient reduction.

``out[p, :] = Σ_{s<S} partials[p·S + s, :]`` in float32, rounded once to ``out``'s dtype. Each
program owns ``BLOCK_D`` columns of one segment and adds ``BLOCK_S`` partial rows at a time, in
the order s = 0, 1, …, S − 1 between tiles and in the compiled reduction tree within a tile:
a fixed order for a given shape, so the same bits on every run. No atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl

from normlab.kernels.triton.helpers import cast_rne


@triton.jit
def sum_partials_kernel(
    PARTIALS,
    OUT,
    D,
    splits,
    SOFT_BF16: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    segment = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    first = PARTIALS + segment * splits * D
    total = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, splits, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        mask = (s < splits)[:, None] & col_ok[None, :]
        tile = tl.load(first + s[:, None] * D + cols[None, :], mask=mask, other=0.0)
        total += tl.sum(tile, axis=0)
    tl.store(
        OUT + segment * D + cols, cast_rne(total, OUT.dtype.element_ty, SOFT_BF16), mask=col_ok
    )
