"""Host side of the fused row norm: allocate outputs, pick the launch shape, run the kernels.

Inputs arrive as 2-D row views ([N, D] for token tensors, [M, D] for modulation tensors whose
row for token r is r // (N / M)) with unit column stride; any row stride works, so split views
of a Linear's output are read in place. Outputs are contiguous.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
import triton.language as tl

from normlab.kernels.triton import config
from normlab.kernels.triton.backward import (
    norm_backward_chunked_kernel,
    norm_backward_tile_kernel,
)
from normlab.kernels.triton.forward import norm_forward_chunked_kernel, norm_forward_tile_kernel
from normlab.kernels.triton.helpers import KERNELS_INTERPRETED
from normlab.kernels.triton.reduce import sum_partials_kernel

KINDS = ("rms", "layer", "none")
GRAD_NAMES = ("x", "addend", "gate", "weight", "bias", "scale", "shift")

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _tl_dtype(dtype: torch.dtype | None) -> tl.dtype | None:
    if dtype is None:
        return None
    if dtype not in _TL_DTYPES:
        raise TypeError(f"round_dtype: expected float16, bfloat16 or float32, got {dtype}")
    return _TL_DTYPES[dtype]


@contextlib.contextmanager
def _on_device(t: torch.Tensor) -> Iterator[None]:
    """Launch on ``t``'s GPU (Triton launches on the current device)."""
    if t.device.type == "cuda":
        with torch.cuda.device(t.device):
            yield
    else:
        yield


def _soft_bf16(t: torch.Tensor) -> bool:
    """Round to bfloat16 in software on Triton's interpreter, whose own cast truncates."""
    return KERNELS_INTERPRETED or t.device.type != "cuda"


def _group(n_rows: int, m: torch.Tensor | None) -> int:
    """Rows per modulation row: 1 per token, T per sequence, N for one shared row."""
    if m is None:
        return 1
    if m.shape[0] < 1 or n_rows % m.shape[0]:
        raise ValueError(
            f"modulation: {m.shape[0]} rows do not divide the {n_rows} token rows; "
            "expected per-token, per-segment or shared rows"
        )
    return n_rows // m.shape[0]


def _options(num_warps: int) -> dict[str, object]:
    """Compile options of every launch.

    Contracting a·b + c into one FMA is asked for explicitly: it is at least as exact, and
    Triton's default for it is changing.
    """
    return {"num_warps": num_warps, "enable_fp_fusion": True}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stride(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.stride(0)


MAX_ROWS = 2**31 - 1


def _check_rows(n_rows: int) -> None:
    """The kernels index rows in int32 (row offsets, ``row · stride``, are int64): at most
    2³¹ − 1 rows, else the last programs' row indices wrap and they write out of bounds."""
    if n_rows > MAX_ROWS:
        raise ValueError(
            f"rows: {n_rows} rows (the product of the leading dimensions); at most {MAX_ROWS} "
            "supported, split the batch"
        )


def check_forward_args(kind: str, addend: torch.Tensor | None, h_dtype: torch.dtype | None) -> None:
    """Reject calls the kernels do not implement consistently.

    An addend needs ``h_dtype``: the backward differentiates the norm of the h it is handed
    (x when h is not stored), and the chunked forward's second pass re-reads x or the stored h.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    if addend is not None and h_dtype is None:
        raise ValueError("addend: h = x + gate * addend must be stored; pass h_dtype")


def norm_forward(
    x: torch.Tensor,
    addend: torch.Tensor | None,
    gate: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    *,
    kind: str,
    eps: float,
    weight_offset: float,
    round_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
    h_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the fused forward; returns (y, h, mean, rstd), empty where not produced.

    ``kind``: ``"rms"``, ``"layer"`` or ``"none"`` (prologue only); ``h_dtype``: dtype in which
    h = x + gate ⊙ addend is stored and returned (None: not stored).
    """
    check_forward_args(kind, addend, h_dtype)
    n, d = x.shape
    _check_rows(n)
    norm = kind != "none"
    y = x.new_empty((n, d) if norm else (0,), dtype=out_dtype)
    h = x.new_empty((n, d), dtype=h_dtype) if h_dtype is not None else x.new_empty((0,))
    mean = x.new_empty((n,) if kind == "layer" else (0,), dtype=torch.float32)
    rstd = x.new_empty((n,) if norm else (0,), dtype=torch.float32)
    if n == 0:
        return y, h, mean, rstd
    launch = config.forward_launch(n, d)
    args = (
        x,
        x if addend is None else addend,
        x if gate is None else gate,
        x if weight is None else weight,
        x if bias is None else bias,
        x if scale is None else scale,
        x if shift is None else shift,
        y if norm else x,
        h if h_dtype is not None else x,
        mean if kind == "layer" else x,
        rstd if norm else x,
        n,
        d,
        x.stride(0),
        _stride(addend),
        _stride(gate),
        _stride(scale),
        _stride(shift),
        _group(n, gate),
        _group(n, scale),
        _group(n, shift),
        float(eps),
        float(weight_offset),
    )
    flags = {
        "NORM": norm,
        "CENTER": kind == "layer",
        "HAS_ADDEND": addend is not None,
        "HAS_GATE": gate is not None,
        "STORE_H": h_dtype is not None,
        "HAS_WEIGHT": weight is not None,
        "HAS_BIAS": bias is not None,
        "HAS_SCALE": scale is not None,
        "HAS_SHIFT": shift is not None,
        "ROUND_DTYPE": _tl_dtype(round_dtype),
        "SOFT_BF16": _soft_bf16(x),
        "BLOCK_D": launch.block_d,
    }
    with _on_device(x):
        if launch.chunked:
            norm_forward_chunked_kernel[(n,)](*args, **flags, **_options(launch.num_warps))
        else:
            grid = (_cdiv(n, launch.rows),)
            norm_forward_tile_kernel[grid](
                *args, **flags, ROWS=launch.rows, **_options(launch.num_warps)
            )
    return y, h, mean, rstd


def grad_layout(
    *,
    kind: str,
    n_rows: int,
    d: int,
    has_dy: bool,
    x_dtype: torch.dtype,
    addend_dtype: torch.dtype | None,
    gate: torch.Tensor | None,
    has_addend_values: bool,
    weight: torch.Tensor | None,
    bias_dtype: torch.dtype | None,
    scale: torch.Tensor | None,
    shift_rows: int,
    shift_dtype: torch.dtype | None,
    needs: Sequence[bool],
) -> dict[str, tuple[tuple[int, ...], torch.dtype] | None]:
    """Shape and dtype of each gradient the backward produces (None: not produced).

    A gradient is produced when asked for and not identically zero: the per-channel and
    modulation terms need dy (the norm's output was used), d_gate needs the addend's values.
    """
    need = dict(zip(GRAD_NAMES, (bool(v) for v in needs), strict=True))
    has_dy = has_dy and kind != "none"
    layout: dict[str, tuple[tuple[int, ...], torch.dtype] | None] = dict.fromkeys(GRAD_NAMES)
    if need["x"]:
        layout["x"] = ((n_rows, d), x_dtype)
    if need["addend"] and addend_dtype is not None:
        layout["addend"] = ((n_rows, d), addend_dtype)
    if need["gate"] and gate is not None and has_addend_values:
        layout["gate"] = (tuple(gate.shape), gate.dtype)
    if need["weight"] and weight is not None and has_dy:
        layout["weight"] = ((d,), weight.dtype)
    if need["bias"] and bias_dtype is not None and has_dy:
        layout["bias"] = ((d,), bias_dtype)
    if need["scale"] and scale is not None and has_dy:
        layout["scale"] = (tuple(scale.shape), scale.dtype)
    if need["shift"] and shift_dtype is not None and has_dy:
        layout["shift"] = ((shift_rows, d), shift_dtype)
    return layout


class _BackwardTensors(NamedTuple):
    """The backward's tensor inputs (None: absent), as :func:`norm_backward` takes them."""

    hn: torch.Tensor | None  # the tensor the norm normalised (the stored h, or x)
    dy: torch.Tensor | None
    dh: torch.Tensor | None
    mean: torch.Tensor | None
    rstd: torch.Tensor | None
    weight: torch.Tensor | None
    scale: torch.Tensor | None
    addend: torch.Tensor | None
    gate: torch.Tensor | None


def _empty_grads(
    layout: dict[str, tuple[tuple[int, ...], torch.dtype] | None], device: torch.device
) -> tuple[torch.Tensor, ...]:
    """The gradients of zero rows: zeros of each produced gradient's shape, empty otherwise."""
    return tuple(
        torch.empty((0,), device=device, dtype=torch.float32)
        if spec is None
        else torch.zeros(spec[0], device=device, dtype=spec[1])
        for spec in layout.values()
    )


def _reduce_groups(
    layout: dict[str, tuple[tuple[int, ...], torch.dtype] | None], n: int
) -> dict[str, int]:
    """Rows summed into one row of each reduced gradient: all n for d_weight and d_bias,
    n / M for a modulation gradient (scale, shift, gate) of M < n rows. One group size for all,
    else ``ValueError``."""
    reduce_groups = {}
    for name, spec in layout.items():
        if name in ("weight", "bias") and spec is not None:
            reduce_groups[name] = n
        elif name in ("scale", "shift", "gate") and spec is not None and spec[0][0] < n:
            reduce_groups[name] = n // spec[0][0]
    if len(set(reduce_groups.values())) > 1:
        raise ValueError(
            f"gradient reduction: tensors reduce over different row groups {reduce_groups}; "
            "expected one group size"
        )
    return reduce_groups


def _grad_buffers(
    layout: dict[str, tuple[tuple[int, ...], torch.dtype] | None],
    reduce_groups: dict[str, int],
    chunked: bool,
    programs: int,
    n: int,
    d: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """What the kernels write, per gradient name: [n, D] in the gradient's dtype, or float32
    partial rows [programs, D] for a reduced gradient (zeroed for the chunked kernel, which
    accumulates into them), or an empty float32 stand-in where none is produced."""

    def out_rows(name: str) -> torch.Tensor:
        spec = layout[name]
        if spec is None:  # float32 as in the fake implementation, whatever the default dtype
            return torch.empty((0,), device=device, dtype=torch.float32)
        if name in reduce_groups:
            alloc = torch.zeros if chunked else torch.empty
            return alloc((programs, d), device=device, dtype=torch.float32)
        return torch.empty((n, d), device=device, dtype=spec[1])

    return {name: out_rows(name) for name in GRAD_NAMES}


def _backward_args(
    t: _BackwardTensors,
    grads: dict[str, torch.Tensor],
    need: dict[str, bool],
    kind: str,
    stand_in: torch.Tensor,
    n: int,
    d: int,
    group: int,
    splits: int,
    weight_offset: float,
) -> tuple:
    """The kernels' positional arguments: inputs, gradient outputs (``stand_in`` for the absent
    ones, which the flags keep the kernel from touching), sizes, strides and row groups."""
    norm = kind != "none"
    has_dy = norm and t.dy is not None
    has_dh = t.dh is not None
    return (
        t.hn if (t.hn is not None and norm) else stand_in,
        t.dy if has_dy else stand_in,
        t.dh if has_dh else stand_in,
        t.mean if (kind == "layer" and t.mean is not None) else stand_in,
        t.rstd if norm else stand_in,
        stand_in if t.weight is None else t.weight,
        stand_in if t.scale is None else t.scale,
        stand_in if t.addend is None else t.addend,
        stand_in if t.gate is None else t.gate,
        *(
            grads[name] if need[name] else stand_in
            for name in ("x", "addend", "weight", "bias", "scale", "shift", "gate")
        ),
        d,
        group,
        splits,
        _stride(t.hn) if norm else 0,
        _stride(t.dy) if has_dy else 0,
        _stride(t.dh) if has_dh else 0,
        _stride(t.scale),
        _stride(t.addend),
        _stride(t.gate),
        _group(n, t.scale),
        _group(n, t.gate),
        float(weight_offset),
    )


def _backward_flags(
    t: _BackwardTensors,
    need: dict[str, bool],
    reduce_groups: dict[str, int],
    kind: str,
    has_addend: bool,
    round_dtype: torch.dtype | None,
    ref: torch.Tensor,
    block_d: int,
) -> dict[str, object]:
    """The kernels' compile-time flags: which inputs are present, which gradients to produce
    and which of them to reduce over row groups."""
    norm = kind != "none"
    return {
        "NORM": norm,
        "CENTER": kind == "layer",
        "HAS_DY": norm and t.dy is not None,
        "HAS_DH": t.dh is not None,
        "HAS_WEIGHT": t.weight is not None,
        "HAS_SCALE": t.scale is not None,
        "HAS_ADDEND": has_addend,
        "HAS_GATE": t.gate is not None,
        "ROUND_DTYPE": _tl_dtype(round_dtype),
        "NEED_DX": need["x"],
        "NEED_DADDEND": need["addend"],
        "NEED_DWEIGHT": need["weight"],
        "NEED_DBIAS": need["bias"],
        "NEED_DSCALE": need["scale"],
        "NEED_DSHIFT": need["shift"],
        "NEED_DGATE": need["gate"],
        "REDUCE_SCALE": "scale" in reduce_groups,
        "REDUCE_SHIFT": "shift" in reduce_groups,
        "REDUCE_GATE": "gate" in reduce_groups,
        "SOFT_BF16": _soft_bf16(ref),
        "BLOCK_D": block_d,
    }


def _sum_reduced(
    grads: dict[str, torch.Tensor],
    layout: dict[str, tuple[tuple[int, ...], torch.dtype] | None],
    reduce_groups: dict[str, int],
    n: int,
    splits: int,
) -> tuple[torch.Tensor, ...]:
    """The gradients named in ``GRAD_NAMES``, each reduced one's ``splits`` partial rows per
    segment summed in order (:func:`sum_partials`) into its own shape and dtype."""
    for name, rows_group in reduce_groups.items():
        spec = layout[name]
        assert spec is not None
        summed = sum_partials(grads[name], n // rows_group, splits, spec[1])
        grads[name] = summed.view(spec[0])
    return tuple(grads[name] for name in GRAD_NAMES)


def norm_backward(
    dy: torch.Tensor | None,
    dh: torch.Tensor | None,
    hn: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor | None,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    addend: torch.Tensor | None,
    gate: torch.Tensor | None,
    *,
    kind: str,
    weight_offset: float,
    round_dtype: torch.dtype | None,
    n_rows: int,
    d: int,
    x_dtype: torch.dtype,
    addend_dtype: torch.dtype | None,
    bias_dtype: torch.dtype | None,
    shift_rows: int,
    shift_dtype: torch.dtype | None,
    needs: Sequence[bool],
) -> tuple[torch.Tensor, ...]:
    """Run the fused backward; returns the gradients named in ``GRAD_NAMES``.

    ``dy``/``dh``: gradients of y and of the returned h (None or empty: unused). ``hn``: the
    tensor the norm normalised (the stored h, or x). ``addend`` is needed only for d_gate.
    Gradients that :func:`grad_layout` does not produce come back as empty tensors.

    The rows split into segments of ``group`` rows (those summed into one row of a reduced
    gradient) and each segment over ``splits`` programs; each program writes one float32
    partial row of every reduced gradient, and the partials are summed afterwards in order.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    _check_rows(n_rows)
    ref = next(t for t in (dy, dh, hn, rstd) if t is not None)
    device, n = ref.device, n_rows
    layout = grad_layout(
        kind=kind,
        n_rows=n,
        d=d,
        has_dy=kind != "none" and dy is not None,
        x_dtype=x_dtype,
        addend_dtype=addend_dtype,
        gate=gate,
        has_addend_values=addend is not None,
        weight=weight,
        bias_dtype=bias_dtype,
        scale=scale,
        shift_rows=shift_rows,
        shift_dtype=shift_dtype,
        needs=needs,
    )
    need = {name: spec is not None for name, spec in layout.items()}
    if n == 0:
        return _empty_grads(layout, device)

    reduce_groups = _reduce_groups(layout, n)
    group = next(iter(reduce_groups.values()), n)
    segments = n // group
    launch = config.backward_launch(n, d, group)
    splits = config.reduction_splits(segments, group, launch.rows)
    programs = segments * splits
    grads = _grad_buffers(layout, reduce_groups, launch.chunked, programs, n, d, device)
    t = _BackwardTensors(hn, dy, dh, mean, rstd, weight, scale, addend, gate)
    args = _backward_args(t, grads, need, kind, ref, n, d, group, splits, weight_offset)
    flags = _backward_flags(
        t, need, reduce_groups, kind, addend_dtype is not None, round_dtype, ref, launch.block_d
    )
    with _on_device(ref):
        if launch.chunked:
            norm_backward_chunked_kernel[(programs,)](*args, **flags, **_options(launch.num_warps))
        else:
            norm_backward_tile_kernel[(programs,)](
                *args, **flags, ROWS=launch.rows, **_options(launch.num_warps)
            )
    return _sum_reduced(grads, layout, reduce_groups, n, splits)


def sum_partials(
    partials: torch.Tensor, segments: int, splits: int, dtype: torch.dtype
) -> torch.Tensor:
    """Add each segment's ``splits`` consecutive partial rows, in order: [segments, D] in dtype."""
    d = partials.shape[-1]
    if splits == 1 and dtype == torch.float32:
        return partials
    out = torch.empty((segments, d), device=partials.device, dtype=dtype)
    block_d = min(config.REDUCE_BLOCK_D, config.next_power_of_2(d))
    block_s = min(config.REDUCE_BLOCK_SPLITS, config.next_power_of_2(splits))
    with _on_device(partials):
        sum_partials_kernel[(segments, _cdiv(d, block_d))](
            partials,
            out,
            d,
            splits,
            SOFT_BF16=_soft_bf16(partials),
            BLOCK_S=block_s,
            BLOCK_D=block_d,
            **_options(config.warps_for(block_s * block_d)),
        )
    return out
