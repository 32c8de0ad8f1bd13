"""Launch heuristics for the Triton norm kernels: block shapes, warps and reduction splits.

Every choice is a fixed function of the problem's shape (rows N, width D, rows per modulation
segment G), never of the GPU it runs on, so that the weight and modulation gradients come out
with the same bits on every run and every machine of a given architecture. No autotuning.

- Rows up to ``MAX_TILE_D_*`` wide are held whole in registers as a 2-D tile
  ``[rows, next_pow2(D)]``; short rows are stacked several to a program so that a tile holds
  about ``TILE_ELEMENTS_*`` values.
- Longer rows (up to D = 65536 and beyond) go to the chunked kernels, which walk each row in
  chunks of ``CHUNK_D_*`` columns.
- Parameter gradients are reduced in two passes: about ``PARTIAL_ROWS_TARGET`` programs write
  one fp32 partial row each (at least one per modulation segment), then a second kernel sums
  each segment's partials in a fixed order, ``REDUCE_BLOCK_SPLITS`` × ``REDUCE_BLOCK_D`` at a
  time (narrow column blocks, so that even one weight vector spreads over many programs).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TILE_D_FORWARD = 8192
MAX_TILE_D_BACKWARD = 4096
CHUNK_D_FORWARD = 4096
CHUNK_D_BACKWARD = 2048
TILE_ELEMENTS_FORWARD = 4096
TILE_ELEMENTS_BACKWARD = 2048
# The backward keeps about twice as many live float32 tiles (x̂, g, dh, up to three partial-sum
# accumulators): half as many values per thread keeps it clear of register spills.
VALUES_PER_THREAD_FORWARD = 16
VALUES_PER_THREAD_BACKWARD = 8
MAX_ROWS_PER_TILE = 128
PARTIAL_ROWS_TARGET = 256
REDUCE_BLOCK_D = 128
REDUCE_BLOCK_SPLITS = 32


def next_power_of_2(n: int) -> int:
    """Smallest power of two ≥ n (1 for n ≤ 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def warps_for(elements: int, values_per_thread: int = 16) -> int:
    """Warps for a tile of ``elements`` values: about ``values_per_thread`` each, 1 to 16 warps."""
    warps = 1
    while warps < 16 and warps * 32 * values_per_thread < elements:
        warps *= 2
    return warps


@dataclass(frozen=True)
class RowLaunch:
    """How a row kernel covers its rows.

    ``chunked``: rows are walked in ``block_d``-wide chunks, one row at a time; otherwise a
    program holds a ``[rows, block_d]`` tile with ``block_d ≥ D``.
    """

    block_d: int
    rows: int
    num_warps: int
    chunked: bool


def forward_launch(n_rows: int, d: int) -> RowLaunch:
    """Tile shape of the forward kernel for ``n_rows`` rows of width ``d``."""
    return _row_launch(
        n_rows,
        d,
        MAX_TILE_D_FORWARD,
        CHUNK_D_FORWARD,
        TILE_ELEMENTS_FORWARD,
        VALUES_PER_THREAD_FORWARD,
    )


def backward_launch(n_rows: int, d: int, group: int) -> RowLaunch:
    """Tile shape of the backward kernel; a tile never spans two segments of ``group`` rows."""
    return _row_launch(
        min(n_rows, group),
        d,
        MAX_TILE_D_BACKWARD,
        CHUNK_D_BACKWARD,
        TILE_ELEMENTS_BACKWARD,
        VALUES_PER_THREAD_BACKWARD,
    )


def _row_launch(
    n_rows: int, d: int, max_tile_d: int, chunk_d: int, tile_elements: int, per_thread: int
) -> RowLaunch:
    if d > max_tile_d:
        block_d = min(chunk_d, next_power_of_2(d))
        return RowLaunch(block_d, 1, warps_for(block_d, per_thread), True)
    block_d = next_power_of_2(d)
    rows = max(1, min(MAX_ROWS_PER_TILE, tile_elements // block_d, next_power_of_2(n_rows)))
    return RowLaunch(block_d, rows, warps_for(rows * block_d, per_thread), False)


def reduction_splits(n_segments: int, rows_per_segment: int, rows_per_step: int) -> int:
    """Programs per segment in the backward pass, each writing one partial row.

    About ``PARTIAL_ROWS_TARGET`` programs in all, never more than the segment has steps of
    ``rows_per_step`` rows, at least one per segment.
    """
    steps = -(-rows_per_segment // rows_per_step)
    wanted = -(-PARTIAL_ROWS_TARGET // max(1, n_segments))
    return max(1, min(steps, wanted))
