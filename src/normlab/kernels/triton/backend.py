"""The ``"triton"`` backend: :class:`TritonProvider`, the fused Triton kernels behind the front
end of :mod:`normlab.kernels.frontend` (which validates, groups rows, wires autograd and falls
back to the reference formula).

The provider's ``forward`` / ``backward`` call the host launchers of
:mod:`normlab.kernels.triton.launch` directly (one forward kernel, one backward kernel plus an
ordered sum of partial column sums). While ``torch.compile`` traces the caller (or
``torch.export`` exports it), ``traced`` calls the custom operator ``normlab::fused_norm`` of
:mod:`normlab.kernels.triton.ops` instead, which the compiler keeps as one opaque node with its
registered autograd. float64 input is handed to the reference backend (its statistics must be
float64); a CPU tensor is an error unless the kernels run on Triton's interpreter.

The module-level functions are the backend interface (the signatures of
:mod:`normlab.kernels.reference`).
"""

from __future__ import annotations

import torch

from normlab.kernels.frontend import FusedBackend, FusedSpec, Gradients, Needs, Operands, Saved
from normlab.kernels.triton import launch
from normlab.kernels.triton.helpers import KERNELS_INTERPRETED

__all__ = [
    "ada_layer_norm",
    "ada_rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "gated_add_ada_rms_norm",
    "gated_residual",
    "layer_norm",
    "rms_norm",
]


def check_device(x: torch.Tensor) -> None:
    """Compiled kernels need a GPU tensor; interpreted ones (``TRITON_INTERPRET=1``) take any."""
    if x.device.type != "cuda" and not KERNELS_INTERPRETED:
        raise ValueError(
            f"backend: 'triton' got a tensor on {x.device.type}; expected a CUDA tensor "
            "(or set TRITON_INTERPRET=1 before importing triton to run on the CPU interpreter)"
        )


def _kind(spec: FusedSpec) -> str:
    if spec.out_dtype is None:
        return "none"
    return "layer" if spec.centre else "rms"


def _out_dtype(spec: FusedSpec) -> torch.dtype:
    """The kernels' y dtype; for the gated sum alone (no y) any dtype, h's."""
    out = spec.out_dtype if spec.out_dtype is not None else spec.h_dtype
    assert out is not None
    return out


def _produced(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor | None:
    """A gradient from the launcher (empty: not produced) in its input's dtype."""
    return None if dtype is None or t.numel() == 0 else t.to(dtype)


class TritonProvider:
    """Runs :class:`~normlab.kernels.frontend.FusedSpec` calls through the Triton kernels.

    Rows may have any row stride (split views of a Linear's output are read in place); the
    weight arrives as given and the kernels add the offset in float32.
    """

    strided_rows = True
    adds_offset = True

    def declines(self, x: torch.Tensor) -> bool:
        if x.dtype == torch.float64:
            return True
        check_device(x)
        return False

    def forward(
        self, spec: FusedSpec, ops: Operands, need_stats: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        kind = _kind(spec)
        y, h, mean, rstd = launch.norm_forward(
            ops.x.detach(),
            None if ops.res is None else ops.res.detach(),
            None if ops.gate is None else ops.gate.detach(),
            ops.gain,
            ops.bias,
            None if ops.scale is None else ops.scale.detach(),
            None if ops.shift is None else ops.shift.detach(),
            kind=kind,
            eps=ops.eps,
            weight_offset=ops.offset,
            round_dtype=spec.hat_round,
            out_dtype=_out_dtype(spec),
            h_dtype=spec.h_dtype,
        )
        return (
            None if kind == "none" else y,
            None if spec.h_dtype is None else h,
            mean if kind == "layer" else None,
            None if kind == "none" else rstd,
        )

    def backward(
        self,
        spec: FusedSpec,
        ops: Operands,
        saved: Saved,
        dy: torch.Tensor | None,
        dh: torch.Tensor | None,
        needs: Needs,
    ) -> Gradients:
        kind = _kind(spec)
        n, d = saved.h.shape
        # The backward kernel sums the modulation gradients over one row-group size per launch:
        # a tensor shared by more rows (say one vector, while another is per sequence) is
        # repeated to the finest group, in float32, and its repeats are summed back afterwards.
        groups = {
            name: group
            for name, group, dt in (
                ("gate", ops.gate_group, needs.gate),
                ("scale", ops.scale_group, needs.scale),
                ("shift", ops.shift_group, needs.shift),
            )
            if dt is not None and group > 1
        }
        target = min(groups.values(), default=1)
        repeats = {name: group // target for name, group in groups.items() if group != target}

        def finer(name: str, m: torch.Tensor | None) -> torch.Tensor | None:
            if m is None or name not in repeats:
                return m
            return m.to(torch.float32).repeat_interleave(repeats[name], dim=0)

        gate = finer("gate", ops.gate) if spec.gated else None
        scale = finer("scale", ops.scale)
        shift_rows = n // ops.shift_group if "shift" not in repeats else n // target
        shift_dtype = torch.float32 if "shift" in repeats else needs.shift
        addend = ops.res if spec.gated and needs.gate is not None else None
        flags = [
            dt is not None
            for dt in (needs.x, needs.res, needs.gate, needs.weight, needs.bias, needs.scale)
        ] + [needs.shift is not None]
        dx, dres, dgate, dweight, dbias, dscale, dshift = launch.norm_backward(
            None if kind == "none" else dy,
            dh,
            None if kind == "none" else saved.h,
            saved.mean,
            saved.rstd,
            ops.gain,
            scale,
            addend,
            gate,
            kind=kind,
            weight_offset=ops.offset,
            round_dtype=spec.hat_round,
            n_rows=n,
            d=d,
            x_dtype=needs.x if needs.x is not None else saved.h.dtype,
            addend_dtype=None if ops.res is None else ops.res.dtype,
            bias_dtype=needs.bias,
            shift_rows=shift_rows,
            shift_dtype=shift_dtype,
            needs=flags,
        )

        def summed(name: str, t: torch.Tensor) -> torch.Tensor:
            if name not in repeats or t.numel() == 0:
                return t
            return t.view(-1, repeats[name], d).sum(1)

        return Gradients(
            x=_produced(dx, needs.x),
            res=_produced(dres, needs.res),
            gate=_produced(summed("gate", dgate), needs.gate),
            weight=_produced(dweight, needs.weight),
            bias=_produced(dbias, needs.bias),
            scale=_produced(summed("scale", dscale), needs.scale),
            shift=_produced(summed("shift", dshift), needs.shift),
        )

    def traced(
        self, spec: FusedSpec, ops: Operands
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The call as the custom operator ``normlab::fused_norm`` (autograd registered with it),
        for ``torch.compile`` and ``torch.export`` to keep as one node."""
        from normlab.kernels.triton.ops import fused_norm

        n = ops.x.shape[0]
        gate, scale, shift = _align_reduced_rows(n, [ops.gate, ops.scale, ops.shift])
        kind = _kind(spec)
        y, h, _, _ = fused_norm(
            ops.x, ops.res, gate, ops.gain, ops.bias, scale, shift, kind, ops.eps, ops.offset,
            spec.hat_round, _out_dtype(spec), spec.h_dtype,
        )  # fmt: skip
        return (None if kind == "none" else y), (None if spec.h_dtype is None else h)


def _align_reduced_rows(n_rows: int, mods: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Give every modulation tensor whose gradient is summed over tokens the same group size
    (the custom operator's backward reduces over one group size per launch).

    A tensor with larger groups (say shared, while another is per sequence) is repeated to the
    finer rows, and autograd adds the repeats back. Only tensors that require grad count; the
    common case needs no copy.
    """
    if not torch.is_grad_enabled():
        return mods
    groups = {
        n_rows // m.shape[0]
        for m in mods
        if m is not None and m.requires_grad and 0 < m.shape[0] < n_rows
    }
    if len(groups) <= 1:
        return mods
    target = min(groups)
    aligned: list[torch.Tensor | None] = []
    for m in mods:
        group = n_rows // m.shape[0] if m is not None and m.shape[0] else 0
        if m is None or not m.requires_grad or group in (0, 1, target):
            aligned.append(m)
        else:
            reps = group // target
            aligned.append(m.unsqueeze(1).expand(-1, reps, -1).reshape(-1, m.shape[-1]))
    return aligned


_backend = FusedBackend(TritonProvider())
(
    layer_norm,
    rms_norm,
    add_rms_norm,
    add_layer_norm,
    ada_rms_norm,
    ada_layer_norm,
    gated_residual,
    gated_add_ada_rms_norm,
) = _backend.functions()
