"""The one host front end of the fast backends (cpp, compiled, triton): every fused norm call
goes through here, and only the kernels differ (a *provider*).

A call ``normlab.functional.rms_norm(x, w, backend="cpp")`` takes three hops:
``functional.rms_norm`` validates the arguments → :class:`FusedBackend` here decides whether the
reference formula must run instead (:meth:`FusedBackend.uses_reference`), views x as rows [N, D],
groups the modulation rows, and wires autograd (:class:`_FusedNorm`) → the provider computes
(``CppProvider.forward`` in :mod:`normlab.kernels.cpu`: one ctypes call into the C++ library;
``InductorProvider`` in :mod:`normlab.kernels.compiled`; ``TritonProvider`` in
:mod:`normlab.kernels.triton.backend`).

Every op of :mod:`normlab.kernels.reference` is an instance of one fused computation on the rows
of ``x`` viewed as [N, D] (N tokens):

    h = x,  or  h = x + r,  or  h = x + gate ⊙ o     (summed in float32, rounded to h's dtype)
    LayerNorm: μ = mean(h), rstd = 1/sqrt(mean((h − μ)²) + ε), x̂ = (h − μ)·rstd
    RMSNorm:   rstd = 1/sqrt(mean(h²) + ε),                 x̂ = h·rstd
    q = x̂ rounded to the input dtype ("llama" casting) or x̂
    y = ((q ⊙ gain + bias) ⊙ (1 + scale) + shift), each factor optional

A provider implements ``forward(spec, ops, need_stats) -> (y, h, mean, rstd)`` and
``backward(spec, ops, saved, dy, dh, needs) -> Gradients``. The backward is one fused pass over h
and dy per row that yields dx together with the column sums dgain, dbias, dscale, dshift, dgate;
it reuses the float32 (float64 for float64 input) μ and rstd saved by the forward:

    d̂ = dy ⊙ (1 + scale) ⊙ gain                      (rounded like x̂ in "llama" casting)
    RMSNorm:   dh = rstd·(d̂ − x̂·mean(d̂ ⊙ x̂))
    LayerNorm: dh = rstd·(d̂ − mean(d̂) − x̂·mean(d̂ ⊙ x̂))
    dgain = Σ_rows dy ⊙ q, dbias = Σ_rows dy, dscale = Σ_group dy ⊙ x̂, dshift = Σ_group dy
    with a sum: dh += (incoming gradient of h), dx = dr = dh; gated: do = dh ⊙ gate,
    dgate = Σ_group dh ⊙ o.

Modulation tensors (scale, shift, gate) arrive as views broadcasting over x. The common layouts
(per token [B, T, D], per sequence [B, 1, D], one vector [D]) are a [K, D] tensor whose row k
serves the G = N / K consecutive rows k·G … (k+1)·G − 1 of x; any other broadcast is
materialised to [N, D] first and autograd sums its gradient back.

The reference formula (:mod:`normlab.kernels.reference`) runs instead of the provider for empty
tensors, while ``torch.compile`` traces the caller (it then fuses into the caller's graph; a
provider with a traceable custom operator, ``traced``, is called instead), while a torch.func
transform is active (vmap, grad, jvp, jacrev, jacfwd, …), while a forward-mode AD level is open
(``torch.autograd.forward_ad.dual_level``: the kernels would drop the tangents), and for the
inputs a provider declines (``declines``: a device or dtype it cannot take). A backward called
with ``create_graph=True`` differentiates the reference formula (:func:`reference.graph_gradients`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.autograd.forward_ad as _forward_ad

from normlab._checks import stats_dtype
from normlab.kernels import reference
from normlab.kernels.reference import graph_gradients


@dataclass(frozen=True)
class FusedSpec:
    """The static part of one fused norm call (what a compiled kernel specialises on)."""

    centre: bool  # LayerNorm (subtract the mean) or RMSNorm
    out_dtype: torch.dtype | None  # dtype of y; None: no norm, only the gated sum h
    hat_round: torch.dtype | None = None  # "llama" casting: x̂ is rounded to this dtype
    h_dtype: torch.dtype | None = None  # dtype of h when a sum is formed (None: no sum)
    gated: bool = False  # h = x + gate ⊙ o instead of x + r


@dataclass
class Operands:
    """The tensors of one call, rows flattened: x, r/o are [N, D]; modulation is [K, D].

    ``gain`` is weight + offset in the statistics dtype, or, for a provider that
    ``adds_offset``, the weight as given with the offset in ``offset`` (0 otherwise); ``bias``
    likewise is in the statistics dtype, or as given.
    """

    x: torch.Tensor
    eps: float
    res: torch.Tensor | None = None  # r of h = x + r, or o of h = x + gate ⊙ o
    gate: torch.Tensor | None = None
    gate_group: int = 1
    gain: torch.Tensor | None = None
    offset: float = 0.0
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    scale_group: int = 1
    shift: torch.Tensor | None = None
    shift_group: int = 1


@dataclass
class Saved:
    """What the backward reads: the normalised input h (or x), and the forward statistics."""

    h: torch.Tensor
    mean: torch.Tensor | None
    rstd: torch.Tensor


@dataclass
class Needs:
    """Which gradients the backward must produce, and their dtypes."""

    x: torch.dtype | None = None
    res: torch.dtype | None = None
    gate: torch.dtype | None = None
    weight: torch.dtype | None = None
    bias: torch.dtype | None = None
    scale: torch.dtype | None = None
    shift: torch.dtype | None = None


@dataclass
class Gradients:
    x: torch.Tensor | None = None
    res: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    shift: torch.Tensor | None = None


class Provider(Protocol):
    """Computes the fused norm forward and backward on flattened operands.

    ``strided_rows``: takes row views with any row stride (unit column stride), so split views
    of a Linear's output are read in place; else every row tensor arrives contiguous.
    ``adds_offset``: reads the weight as given and adds :attr:`Operands.offset` itself.
    ``declines(x)``: True for inputs the reference formula must take (a device or dtype the
    kernels cannot run); it may raise for inputs that are an error on this backend.
    A provider may also define ``traced(spec, ops) -> (y, h)``, run while ``torch.compile``
    traces the caller: an operator the compiler keeps as one node, with its own autograd.
    """

    strided_rows: bool
    adds_offset: bool

    def declines(self, x: torch.Tensor) -> bool: ...

    def forward(
        self, spec: FusedSpec, ops: Operands, need_stats: bool
    ) -> tuple[
        torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None
    ]: ...

    def backward(
        self,
        spec: FusedSpec,
        ops: Operands,
        saved: Saved,
        dy: torch.Tensor | None,
        dh: torch.Tensor | None,
        needs: Needs,
    ) -> Gradients: ...


# ----------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------
def group_rows(
    m: torch.Tensor, shape: torch.Size, strided: bool = False
) -> tuple[torch.Tensor, int] | None:
    """View a modulation tensor broadcasting over ``shape`` as [K, D] rows serving G rows each.

    Possible when the leading dimensions of ``m`` equal those of ``shape`` up to some axis and
    are 1 after it (per token, per sequence, one vector). Returns (m2d, G), or None. m2d is
    contiguous, or (``strided``) a row view with unit column stride.
    """
    lead = list(shape[:-1])
    mlead = [1] * (len(lead) - (m.dim() - 1)) + list(m.shape[:-1])
    split = 0
    while split < len(lead) and mlead[split] == lead[split]:
        split += 1
    if any(s != 1 for s in mlead[split:]):
        return None
    k = math.prod(lead[:split])
    g = math.prod(lead[split:])
    return _flat(m, k, shape[-1], strided), g


def _rows_of(m: torch.Tensor, shape: torch.Size, strided: bool) -> tuple[torch.Tensor, int]:
    grouped = group_rows(m, shape, strided)
    if grouped is not None and grouped[1] > 0:
        return grouped
    n = math.prod(shape[:-1])
    return m.expand(shape).reshape(n, shape[-1]).contiguous(), 1


def _flat(t: torch.Tensor, n: int, d: int, strided: bool = False) -> torch.Tensor:
    """t as [n, d] rows: contiguous, or (``strided``) any row stride with unit column stride."""
    if strided:
        rows = t.reshape(n, d)
        return rows if rows.stride(-1) == 1 else rows.contiguous()
    return t.contiguous().view(n, d)


def _operands(
    provider: Provider,
    x: torch.Tensor,
    eps: float,
    offset: float,
    groups: tuple[int, int, int],
    res: torch.Tensor | None,
    gate: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
) -> Operands:
    """The provider's operands; the gain is weight + offset in the statistics dtype (the offset
    added in that dtype), unless the provider adds the offset itself."""
    if provider.adds_offset:
        gain = None if weight is None else weight.detach().contiguous()
        bias = None if bias is None else bias.detach().contiguous()
    else:
        sd = stats_dtype(x.dtype)
        gain = None if weight is None else weight.detach().to(sd).contiguous()
        if gain is not None and offset != 0.0:
            gain = gain + offset
        bias = None if bias is None else bias.detach().to(sd).contiguous()
        offset = 0.0
    return Operands(
        x=x,
        eps=eps,
        res=res,
        gate=gate,
        gate_group=groups[0],
        gain=gain,
        offset=offset,
        bias=bias,
        scale=scale,
        scale_group=groups[1],
        shift=shift,
        shift_group=groups[2],
    )


# ----------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------
class _FusedNorm(torch.autograd.Function):
    """Forward and backward both by the provider; μ and rstd are saved from the forward.

    The provider's backward returns plain tensors. When the caller asks for a gradient graph
    (``create_graph=True``: gradient penalties, Hessian-vector products), the gradients are
    built instead by differentiating the reference formula with autograd, so that second
    derivatives are exact (see :func:`_graph_gradients`). torch.func transforms and forward-mode
    AD never reach this function (:meth:`FusedBackend.uses_reference`).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        provider: Provider,
        spec: FusedSpec,
        eps: float,
        offset: float,
        groups: tuple[int, int, int],
        x: torch.Tensor,
        res: torch.Tensor | None,
        gate: torch.Tensor | None,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        scale: torch.Tensor | None,
        shift: torch.Tensor | None,
    ) -> Any:
        ops = _operands(provider, x, eps, offset, groups, res, gate, weight, bias, scale, shift)
        y, h, mean, rstd = provider.forward(spec, ops, need_stats=True)
        normed = x if h is None else h
        ctx.set_materialize_grads(False)
        ctx.provider, ctx.spec, ctx.eps, ctx.groups = provider, spec, eps, groups
        ctx.offset, ctx.kernel_offset = offset, ops.offset
        ctx.dtypes = tuple(
            None if t is None else t.dtype for t in (x, res, gate, weight, bias, scale, shift)
        )
        ctx.save_for_backward(normed, mean, rstd, ops.gain, res, gate, scale, weight)
        if spec.out_dtype is None:
            return h
        return y if spec.h_dtype is None else (y, h)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:  # type: ignore[override]
        spec: FusedSpec = ctx.spec
        normed, mean, rstd, gain, res, gate, scale, weight = ctx.saved_tensors
        if spec.out_dtype is None:
            dy, dh = None, grads[0]
        else:
            dy = grads[0]
            dh = grads[1] if spec.h_dtype is not None else None
        n, d = normed.shape
        strided = ctx.provider.strided_rows
        dy = None if dy is None else _flat(dy, n, d, strided)
        dh = None if dh is None else _flat(dh, n, d, strided)
        if torch.is_grad_enabled():  # create_graph=True: the gradients must be a graph
            return (None,) * 5 + _graph_gradients(ctx, normed, weight, res, gate, scale, dy, dh)
        need = ctx.needs_input_grad[5:]
        needs = Needs(*(dt if flag else None for dt, flag in zip(ctx.dtypes, need, strict=True)))
        ops = Operands(
            x=normed,
            eps=ctx.eps,
            res=res,
            gate=gate,
            gate_group=ctx.groups[0],
            gain=gain,
            offset=ctx.kernel_offset,
            scale=scale,
            scale_group=ctx.groups[1],
            shift_group=ctx.groups[2],
        )
        saved = Saved(h=normed, mean=mean, rstd=rstd)
        g = ctx.provider.backward(spec, ops, saved, dy, dh, needs)
        return (None,) * 5 + (g.x, g.res, g.gate, g.weight, g.bias, g.scale, g.shift)


def _graph_gradients(
    ctx: Any,
    normed: torch.Tensor,
    weight: torch.Tensor | None,
    res: torch.Tensor | None,
    gate: torch.Tensor | None,
    scale: torch.Tensor | None,
    dy: torch.Tensor | None,
    dh: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    """:func:`~normlab.kernels.reference.graph_gradients` for this function's saved state."""
    spec: FusedSpec = ctx.spec
    n = normed.shape[0]
    return graph_gradients(
        normed,
        dy,
        dh,
        weight=weight,
        offset=ctx.offset,
        scale=scale,
        gate=gate if spec.gated else None,
        other=res if spec.gated else None,
        eps=ctx.eps,
        centre=spec.centre,
        hat_round=spec.hat_round,
        out_dtype=spec.out_dtype,
        k_gate=n // ctx.groups[0],
        k_shift=n // ctx.groups[2],
        needs=ctx.needs_input_grad[5:],
        dtypes=ctx.dtypes,
    )


def _needs_autograd(tensors: tuple[torch.Tensor | None, ...]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def run(
    provider: Provider,
    spec: FusedSpec,
    x: torch.Tensor,
    eps: float,
    *,
    res: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    offset: float = 0.0,
    bias: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
) -> Any:
    """Run the fused norm on ``x`` [..., D] by ``provider``; returns y, (y, h), or h (gated sum
    only). Through :class:`_FusedNorm` when a gradient is wanted, else the provider's forward
    alone (no statistics kept); while ``torch.compile`` traces, the provider's ``traced``."""
    shape = x.shape
    d = shape[-1]
    n = math.prod(shape[:-1])
    strided = provider.strided_rows
    x2 = _flat(x, n, d, strided)
    r2 = None if res is None else _flat(res, n, d, strided)
    gate2, gate_g = (None, 1) if gate is None else _rows_of(gate, shape, strided)
    scale2, scale_g = (None, 1) if scale is None else _rows_of(scale, shape, strided)
    shift2, shift_g = (None, 1) if shift is None else _rows_of(shift, shape, strided)
    groups = (gate_g, scale_g, shift_g)
    tensors = (x2, r2, gate2, weight, bias, scale2, shift2)
    if torch.compiler.is_compiling():  # only a provider with a traced operator gets here
        # the traced operator takes the weight as given, the offset apart, and its own autograd
        ops = Operands(x2, eps, r2, gate2, gate_g, weight, offset, bias, scale2, scale_g, shift2)
        ops.shift_group = shift_g
        y, h = provider.traced(spec, ops)  # type: ignore[attr-defined]
        out = h if spec.out_dtype is None else (y if spec.h_dtype is None else (y, h))
    elif _needs_autograd(tensors):
        out = _FusedNorm.apply(provider, spec, eps, offset, groups, *tensors)
    else:
        ops = _operands(provider, x2, eps, offset, groups, r2, gate2, weight, bias, scale2, shift2)
        y, h, _, _ = provider.forward(spec, ops, need_stats=False)
        out = h if spec.out_dtype is None else (y if spec.h_dtype is None else (y, h))
    if isinstance(out, tuple):
        return tuple(t.view(shape) for t in out)
    return out.view(shape)


# ----------------------------------------------------------------------------------------------
# The backend functions (the interface of normlab.kernels.reference) over a provider
# ----------------------------------------------------------------------------------------------
class FusedBackend:
    """The eight backend functions of :mod:`normlab.kernels.reference`, computed by a provider.

    Each function runs the reference formula instead when :meth:`uses_reference` says so, else
    builds the :class:`FusedSpec` of its op and calls :func:`run`. :meth:`functions` returns
    them in the order of ``normlab.kernels.BACKEND_FUNCTIONS``, for a backend module to expose.
    """

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.traceable = callable(getattr(provider, "traced", None))

    def uses_reference(self, x: torch.Tensor) -> bool:
        """Whether this call must run the reference formula (see the module docstring).

        Checks, cheapest first: ``torch.compile`` tracing; an empty x; an active torch.func
        transform (``torch._C._are_functorch_transforms_active``); an open forward-mode AD level
        (``torch.autograd.forward_ad``, which every dual tensor needs); the provider's choice.
        """
        if torch.compiler.is_compiling():
            return not self.traceable or self.provider.declines(x)
        return (
            x.numel() == 0
            or torch._C._are_functorch_transforms_active()
            or _forward_ad._current_level >= 0
            or self.provider.declines(x)
        )

    def functions(self) -> tuple[Any, ...]:
        """The eight backend functions, in the order of ``normlab.kernels.BACKEND_FUNCTIONS``."""
        return (
            self.layer_norm,
            self.rms_norm,
            self.add_rms_norm,
            self.add_layer_norm,
            self.ada_rms_norm,
            self.ada_layer_norm,
            self.gated_residual,
            self.gated_add_ada_rms_norm,
        )

    def layer_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β."""
        if self.uses_reference(x):
            return reference.layer_norm(x, weight, bias, eps, out_dtype)
        spec = FusedSpec(centre=True, out_dtype=out_dtype)
        return run(self.provider, spec, x, eps, weight=weight, bias=bias)

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        eps: float,
        weight_offset: float,
        casting: str,
        out_dtype: torch.dtype,
        io_dtype: torch.dtype,
    ) -> torch.Tensor:
        """y = (o + w) ⊙ r(x·rsqrt(mean(x²) + ε)), r rounding to ``io_dtype`` in "llama"."""
        if self.uses_reference(x):
            return reference.rms_norm(x, weight, eps, weight_offset, casting, out_dtype, io_dtype)
        spec = FusedSpec(
            centre=False,
            out_dtype=out_dtype,
            hat_round=io_dtype if casting == "llama" else None,
        )
        return run(self.provider, spec, x, eps, weight=weight, offset=weight_offset)

    def add_rms_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor | None,
        eps: float,
        weight_offset: float,
        casting: str,
        residual_in_fp32: bool,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h = x + residual; (rms_norm(h), h)."""
        if residual is None or self.uses_reference(x):
            h = reference.residual_sum(x, residual, residual_in_fp32)
            y = self.rms_norm(h, weight, eps, weight_offset, casting, out_dtype, x.dtype)
            return y, h
        spec = FusedSpec(
            centre=False,
            out_dtype=out_dtype,
            hat_round=x.dtype if casting == "llama" else None,
            h_dtype=reference.sum_dtype(x.dtype, residual_in_fp32),
        )
        return run(self.provider, spec, x, eps, res=residual, weight=weight, offset=weight_offset)

    def add_layer_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        residual_in_fp32: bool,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h = x + residual; (layer_norm(h), h)."""
        if residual is None or self.uses_reference(x):
            h = reference.residual_sum(x, residual, residual_in_fp32)
            return self.layer_norm(h, weight, bias, eps, out_dtype), h
        spec = FusedSpec(
            centre=True,
            out_dtype=out_dtype,
            h_dtype=reference.sum_dtype(x.dtype, residual_in_fp32),
        )
        return run(self.provider, spec, x, eps, res=residual, weight=weight, bias=bias)

    def ada_rms_norm(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        shift: torch.Tensor | None,
        eps: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """y = x·rsqrt(mean(x²) + ε) ⊙ (1 + scale) + shift."""
        if self.uses_reference(x):
            return reference.ada_rms_norm(x, scale, shift, eps, out_dtype)
        spec = FusedSpec(centre=False, out_dtype=out_dtype)
        return run(self.provider, spec, x, eps, scale=scale, shift=shift)

    def ada_layer_norm(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        shift: torch.Tensor | None,
        eps: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """y = (x − μ)·rsqrt(σ² + ε) ⊙ (1 + scale) + shift."""
        if self.uses_reference(x):
            return reference.ada_layer_norm(x, scale, shift, eps, out_dtype)
        spec = FusedSpec(centre=True, out_dtype=out_dtype)
        return run(self.provider, spec, x, eps, scale=scale, shift=shift)

    def gated_residual(
        self, h: torch.Tensor, out: torch.Tensor, gate: torch.Tensor
    ) -> torch.Tensor:
        """h' = h + gate ⊙ out, summed in float32, in h's dtype."""
        if self.uses_reference(h):
            return reference.gated_residual(h, out, gate)
        spec = FusedSpec(centre=False, out_dtype=None, h_dtype=h.dtype, gated=True)
        return run(self.provider, spec, h, 1.0, res=out, gate=gate)

    def gated_add_ada_rms_norm(
        self,
        h: torch.Tensor,
        out: torch.Tensor,
        gate: torch.Tensor,
        scale: torch.Tensor,
        shift: torch.Tensor | None,
        eps: float,
        out_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h' = h + gate ⊙ out; (x̂(h') ⊙ (1 + scale) + shift, h')."""
        if self.uses_reference(h):
            return reference.gated_add_ada_rms_norm(h, out, gate, scale, shift, eps, out_dtype)
        spec = FusedSpec(centre=False, out_dtype=out_dtype, h_dtype=h.dtype, gated=True)
        return run(self.provider, spec, h, eps, res=out, gate=gate, scale=scale, shift=shift)
