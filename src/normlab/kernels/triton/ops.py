"""The fused norm as PyTorch custom operators: ``normlab::fused_norm`` and its backward.

Registered with :mod:`torch.library` with fake (meta) implementations and an autograd formula,
so ``torch.compile`` (``fullgraph=True``) and ``torch.export`` trace through them as single
opaque nodes instead of breaking the graph on a Triton launch. The Triton backend calls them
only while the caller is traced (``TritonProvider.traced`` in
:mod:`normlab.kernels.triton.backend`); eager calls go through the front end's autograd
function (:mod:`normlab.kernels.frontend`) to the launchers directly.

``fused_norm(x, addend, gate, weight, bias, scale, shift, ...) -> (y, h, mean, rstd)`` computes

    h = x + gate ⊙ addend;   y = norm(h) ⊙ (o + w) ⊙ (1 + s) + b + t

on 2-D row tensors (see :mod:`normlab.kernels.triton.launch`); ``kind="none"`` returns h alone.
Its backward saves only what it needs: the normalised tensor (the stored h, or x), the float32
``mean``/``rstd`` per row, the weight, scale and gate, and the addend only when d_gate is wanted.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from normlab.kernels.reference import graph_gradients
from normlab.kernels.triton import launch

_N_TENSOR_INPUTS = 7  # x, addend, gate, weight, bias, scale, shift


def _rows(t: Tensor | None) -> Tensor | None:
    """A 2-D row view with unit column stride (copies only when the columns are strided)."""
    if t is None or t.stride(-1) == 1:
        return t
    return t.contiguous()


def _vector(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()


@torch.library.custom_op("normlab::fused_norm", mutates_args=())
def fused_norm(
    x: Tensor,
    addend: Tensor | None,
    gate: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    scale: Tensor | None,
    shift: Tensor | None,
    kind: str,
    eps: float,
    weight_offset: float,
    round_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
    h_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused (gated) residual add, norm and affine/modulation; returns (y, h, mean, rstd).

    x, addend: [N, D]; gate, scale, shift: [M, D] with token row r using row r // (N / M);
    weight, bias: [D]. ``kind``: ``"rms"``, ``"layer"`` or ``"none"``. ``round_dtype``: round x̂
    to this dtype before the weight (LLaMA casting). ``h_dtype``: store and return h in this
    dtype (None: h is not returned, the norm reads x). Unproduced outputs are empty.
    """
    return launch.norm_forward(
        _rows(x),
        _rows(addend),
        _rows(gate),
        _vector(weight),
        _vector(bias),
        _rows(scale),
        _rows(shift),
        kind=kind,
        eps=eps,
        weight_offset=weight_offset,
        round_dtype=round_dtype,
        out_dtype=out_dtype,
        h_dtype=h_dtype,
    )


@fused_norm.register_fake
def _fused_norm_fake(
    x: Tensor,
    addend: Tensor | None,
    gate: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    scale: Tensor | None,
    shift: Tensor | None,
    kind: str,
    eps: float,
    weight_offset: float,
    round_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
    h_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    launch.check_forward_args(kind, addend, h_dtype)
    n, d = x.shape
    norm = kind != "none"
    y = x.new_empty((n, d) if norm else (0,), dtype=out_dtype)
    h = x.new_empty((n, d), dtype=h_dtype) if h_dtype is not None else x.new_empty((0,))
    mean = x.new_empty((n,) if kind == "layer" else (0,), dtype=torch.float32)
    rstd = x.new_empty((n,) if norm else (0,), dtype=torch.float32)
    return y, h, mean, rstd


@torch.library.custom_op("normlab::fused_norm_backward", mutates_args=())
def fused_norm_backward(
    dy: Tensor | None,
    dh: Tensor | None,
    hn: Tensor | None,
    mean: Tensor | None,
    rstd: Tensor | None,
    weight: Tensor | None,
    scale: Tensor | None,
    addend: Tensor | None,
    gate: Tensor | None,
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
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dx, d_addend, d_gate, d_weight, d_bias, d_scale, d_shift) of ``fused_norm``.

    See :mod:`normlab.kernels.triton.backward` for the formulas. Gradients not asked for in
    ``needs`` (same order), or identically zero, come back empty.
    """
    return launch.norm_backward(
        _rows(dy),
        _rows(dh),
        _rows(hn),
        mean,
        rstd,
        _vector(weight),
        _rows(scale),
        _rows(addend),
        _rows(gate),
        kind=kind,
        weight_offset=weight_offset,
        round_dtype=round_dtype,
        n_rows=n_rows,
        d=d,
        x_dtype=x_dtype,
        addend_dtype=addend_dtype,
        bias_dtype=bias_dtype,
        shift_rows=shift_rows,
        shift_dtype=shift_dtype,
        needs=needs,
    )


@fused_norm_backward.register_fake
def _fused_norm_backward_fake(
    dy: Tensor | None,
    dh: Tensor | None,
    hn: Tensor | None,
    mean: Tensor | None,
    rstd: Tensor | None,
    weight: Tensor | None,
    scale: Tensor | None,
    addend: Tensor | None,
    gate: Tensor | None,
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
    needs: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    ref = next(t for t in (dy, dh, hn, rstd) if t is not None)
    layout = launch.grad_layout(
        kind=kind,
        n_rows=n_rows,
        d=d,
        has_dy=dy is not None,
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
    return tuple(
        ref.new_empty((0,), dtype=torch.float32)
        if spec is None
        else ref.new_empty(spec[0], dtype=spec[1])
        for spec in layout.values()
    )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x, addend, gate, weight, bias, scale, shift = inputs[:_N_TENSOR_INPUTS]
    kind, eps, offset, round_dtype, out_dtype, h_dtype = inputs[_N_TENSOR_INPUTS:]
    _y, h, mean, rstd = output
    needs = [bool(v) for v in ctx.needs_input_grad[:_N_TENSOR_INPUTS]]
    hn = None if kind == "none" else (h if h_dtype is not None else x)
    # o for d_gate = Σ o ⊙ dh; g for d_addend = g ⊙ dh (and d_gate's shape).
    addend_values = addend if (gate is not None and needs[2]) else None
    gate_values = gate if (needs[1] or needs[2]) else None
    ctx.save_for_backward(hn, mean, rstd, weight, scale, addend_values, gate_values)
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)  # an unused y or h sends None, not a tensor of zeros
    ctx.needs = needs
    ctx.stores_h = h_dtype is not None
    ctx.eps, ctx.out_dtype = eps, out_dtype  # for a backward that builds a graph
    ctx.meta = {
        "kind": kind,
        "weight_offset": offset,
        "round_dtype": round_dtype,
        "n_rows": x.shape[0],
        "d": x.shape[1],
        "x_dtype": x.dtype,
        "addend_dtype": None if addend is None else addend.dtype,
        "bias_dtype": None if bias is None else bias.dtype,
        "shift_rows": 0 if shift is None else shift.shape[0],
        "shift_dtype": None if shift is None else shift.dtype,
    }


def _backward(
    ctx: Any, dy: Tensor | None, dh: Tensor | None, _dmean: Tensor | None, _drstd: Tensor | None
) -> tuple[Tensor | None, ...]:
    hn, mean, rstd, weight, scale, addend_values, gate = ctx.saved_tensors
    meta = ctx.meta
    dy = None if meta["kind"] == "none" else dy
    dh = dh if ctx.stores_h else None
    if torch.is_grad_enabled():  # create_graph=True: the gradients must be a graph
        return (*_graph_backward(ctx, dy, dh), None, None, None, None, None, None)
    grads = fused_norm_backward(
        dy, dh, hn, mean, rstd, weight, scale, addend_values, gate, **meta, needs=ctx.needs
    )
    layout = launch.grad_layout(
        kind=meta["kind"],
        n_rows=meta["n_rows"],
        d=meta["d"],
        has_dy=dy is not None,
        x_dtype=meta["x_dtype"],
        addend_dtype=meta["addend_dtype"],
        gate=gate,
        has_addend_values=addend_values is not None,
        weight=weight,
        bias_dtype=meta["bias_dtype"],
        scale=scale,
        shift_rows=meta["shift_rows"],
        shift_dtype=meta["shift_dtype"],
        needs=ctx.needs,
    )
    tensor_grads = tuple(
        grad if spec is not None else None
        for grad, spec in zip(grads, layout.values(), strict=True)
    )
    return (*tensor_grads, None, None, None, None, None, None)


def _graph_backward(ctx: Any, dy: Tensor | None, dh: Tensor | None) -> tuple[Tensor | None, ...]:
    """The tensor inputs' gradients as a differentiable graph (see
    :func:`~normlab.kernels.reference.graph_gradients`): the Triton backward's outputs carry
    no graph, so a second derivative goes through the reference formula instead."""
    hn, _mean, _rstd, weight, scale, addend_values, gate = ctx.saved_tensors
    meta = ctx.meta
    normed = hn if hn is not None else dh  # kind "none": the gated sum alone, no norm
    if normed is None:
        return (None,) * _N_TENSOR_INPUTS
    dtypes = (
        meta["x_dtype"],
        meta["addend_dtype"],
        None if gate is None else gate.dtype,
        None if weight is None else weight.dtype,
        meta["bias_dtype"],
        None if scale is None else scale.dtype,
        meta["shift_dtype"],
    )
    return graph_gradients(
        normed,
        dy,
        dh,
        weight=weight,
        offset=meta["weight_offset"],
        scale=scale,
        gate=gate,
        other=addend_values,
        eps=ctx.eps,
        centre=meta["kind"] == "layer",
        hat_round=meta["round_dtype"],
        out_dtype=None if meta["kind"] == "none" else ctx.out_dtype,
        k_gate=1 if gate is None else gate.shape[0],
        k_shift=max(1, meta["shift_rows"]),
        needs=ctx.needs,
        dtypes=dtypes,
    )


torch.library.register_autograd("normlab::fused_norm", _backward, setup_context=_setup_context)
