"""The minimum-memory-traffic model: how many bytes an op must move, at the least.

A norm is memory-bound: its floor is the time to move its tensors once. Counting in *units* of
one full-size tensor (N·D elements of the input dtype):

==========  ====================================  ===============================================
op          forward                               backward
==========  ====================================  ===============================================
rms, layer  2: read x, write y                    3: read x, dy; write dx
add_rms     4: read x, r; write y, h              4: read h, dy, dh; write dx (= dr, one tensor)
ada_rms     4: read x, s, t; write y              6: read x, dy, s; write dx, ds, dt
            (per-token scale s and shift t)
==========  ====================================  ===============================================

fwd+bwd is the sum (5 units for rms and layer). Per-channel parameters add their own size once
(the weight read by each pass; the weight gradient written once; the bias likewise), which is
negligible next to N·D but counted so that small N stays honest. Achieved bandwidth = modelled
bytes / time; the fraction of copy bandwidth compares it with a plain copy measured in the same
run (a copy reads and writes each byte once: 2 units per N·D).
"""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("rms", "layer", "add_rms", "ada_rms")
MODES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class Traffic:
    """Full-size tensors read and written, and per-channel vectors read and written."""

    tensors_read: int
    tensors_written: int
    vectors_read: int = 0
    vectors_written: int = 0

    @property
    def units(self) -> int:
        return self.tensors_read + self.tensors_written

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.tensors_read + other.tensors_read,
            self.tensors_written + other.tensors_written,
            self.vectors_read + other.vectors_read,
            self.vectors_written + other.vectors_written,
        )


_FORWARD = {
    "rms": Traffic(1, 1, vectors_read=1),
    "layer": Traffic(1, 1, vectors_read=2),
    "add_rms": Traffic(2, 2, vectors_read=1),
    "ada_rms": Traffic(3, 1),
}
_BACKWARD = {
    "rms": Traffic(2, 1, vectors_read=1, vectors_written=1),
    "layer": Traffic(2, 1, vectors_read=1, vectors_written=2),
    "add_rms": Traffic(3, 1, vectors_read=1, vectors_written=1),
    "ada_rms": Traffic(3, 3),
}


def traffic(op: str, mode: str) -> Traffic:
    """The tensors an op moves at the least in ``mode`` ("fwd" or "fwd+bwd")."""
    if op not in _FORWARD:
        raise ValueError(f"op: unknown op {op!r}; expected one of {', '.join(OPS)}")
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    forward = _FORWARD[op]
    return forward if mode == "fwd" else forward + _BACKWARD[op]


def min_bytes(
    op: str, mode: str, rows: int, dim: int, itemsize: int, param_itemsize: int | None = None
) -> int:
    """Bytes moved at the least: units · N·D·b plus the per-channel vectors (D·b_param each)."""
    t = traffic(op, mode)
    p = itemsize if param_itemsize is None else param_itemsize
    return t.units * rows * dim * itemsize + (t.vectors_read + t.vectors_written) * dim * p


def copy_bytes(numel: int, itemsize: int) -> int:
    """Bytes a copy of ``numel`` elements moves: each read once and written once."""
    return 2 * numel * itemsize
