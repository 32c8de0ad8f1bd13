"""Explicit conversions between modulation orderings.

π0.5's AdaRMS splits its Linear's output as (scale, shift, gate); DiT's adaLN-Zero as
(shift, scale, gate). The two are the same Linear with its output rows permuted in blocks of D.
Nothing in normlab converts implicitly: call these.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from normlab._checks import check_bool

PI05_ORDER: tuple[str, ...] = ("scale", "shift", "gate")
DIT_ORDER: tuple[str, ...] = ("shift", "scale", "gate")


def reorder_chunks(
    t: torch.Tensor, src: Sequence[str], dst: Sequence[str], dim: int = 0
) -> torch.Tensor:
    """Permute the equal chunks of ``t`` along ``dim`` from the order ``src`` to ``dst``.

    ``src`` and ``dst`` name the chunks (e.g. ``("shift", "scale", "gate")``, a list or tuple of
    strings, not one string); ``dst`` must be a permutation of ``src``, ``dim`` an axis of ``t``
    and ``t.shape[dim]`` a multiple of ``len(src)``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t: expected a torch.Tensor, got {type(t).__name__}")
    src, dst = _chunk_names(src, "src"), _chunk_names(dst, "dst")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__} {dim!r}")
    if t.dim() == 0:
        raise ValueError("t: got a 0-d tensor; expected at least one dimension to split")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(
            f"dim: {dim} is not an axis of t (shape {tuple(t.shape)}); expected "
            f"{-t.dim()} <= dim < {t.dim()}"
        )
    if len(set(src)) != len(src):
        raise ValueError(f"src: chunk names must be distinct, got {src}")
    if sorted(src) != sorted(dst):
        raise ValueError(f"dst: expected a permutation of src {src}, got {dst}")
    size = t.shape[dim]
    if size % len(src):
        raise ValueError(
            f"t: size {size} along dim {dim} is not a multiple of the {len(src)} chunks {src}"
        )
    chunks = dict(zip(src, t.chunk(len(src), dim=dim), strict=True))
    return torch.cat([chunks[name] for name in dst], dim=dim)


def _chunk_names(names: object, arg: str) -> tuple[str, ...]:
    """``names`` as a tuple of chunk names: a list or tuple of strings (one string is refused:
    ``"abc"`` would be read as the three names a, b, c)."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(
            f"{arg}: expected a list or tuple of chunk names such as ('shift', 'scale', 'gate'), "
            f"got {type(names).__name__} {names!r}"
        )
    out = tuple(names)
    if not out or not all(isinstance(n, str) for n in out):
        raise TypeError(
            f"{arg}: expected a non-empty list or tuple of chunk names (strings), got {names!r}"
        )
    return out


def reorder_linear(linear: nn.Linear, src: Sequence[str], dst: Sequence[str]) -> nn.Linear:
    """A copy of ``linear`` whose output rows (weight and bias) are reordered from src to dst."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear: expected torch.nn.Linear, got {type(linear).__name__}")
    new = copy.deepcopy(linear)
    with torch.no_grad():
        new.weight.copy_(reorder_chunks(linear.weight, src, dst, dim=0))
        if linear.bias is not None:
            new.bias.copy_(reorder_chunks(linear.bias, src, dst, dim=0))
    return new


def dit_to_pi05(linear: nn.Linear, *, gate: bool = True) -> nn.Linear:
    """(shift, scale, gate) → (scale, shift, gate).

    ``gate=False`` for a two-chunk Linear (shift, scale) → (scale, shift). The chunk count is
    given, not guessed: a 2·D Linear with D divisible by 3 would also split into three chunks.
    """
    n = _chunk_count(linear, gate)
    return reorder_linear(linear, DIT_ORDER[:n], PI05_ORDER[:n])


def pi05_to_dit(linear: nn.Linear, *, gate: bool = True) -> nn.Linear:
    """(scale, shift, gate) → (shift, scale, gate); ``gate=False`` for a two-chunk Linear."""
    n = _chunk_count(linear, gate)
    return reorder_linear(linear, PI05_ORDER[:n], DIT_ORDER[:n])


def _chunk_count(linear: nn.Linear, gate: bool) -> int:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear: expected torch.nn.Linear, got {type(linear).__name__}")
    n = 3 if check_bool(gate, "gate") else 2
    out = linear.out_features
    if out % n:
        raise ValueError(
            f"linear: out_features {out} is not a multiple of {n}; expected {n}·D for a "
            f"modulation Linear {'with' if gate else 'without'} a gate chunk"
            + (" (pass gate=False for a two-chunk Linear)" if gate else "")
        )
    return n
