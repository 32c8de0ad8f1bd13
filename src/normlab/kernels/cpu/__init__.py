"""The ``"cpp"`` backend: fused C++ norm kernels for CPU tensors, forward and backward.

:class:`CppProvider` is the provider of :mod:`normlab.kernels.frontend` (which validates, groups
rows, wires autograd and falls back to the reference formula): its ``forward`` and ``backward``
fill one ctypes structure each and make one call into the C++ library (``normlab_forward`` /
``normlab_backward``; formulas in ``normlab_cpu.cpp`` in this folder). One pass over memory per
direction: the forward reads x (and r, or gate and o, and per-token modulation) once and writes
y (and h) once; the backward reads h and dy once and writes dx once, producing the weight and
modulation gradients in the same pass with deterministic sums. The library is compiled on first
use and cached (:mod:`._build`), in the build variant that :func:`current_variant` names:
``"native"`` unless ``NORMLAB_CPU_VARIANT`` or :func:`set_variant` / :func:`use_variant` chose
``"portable"`` or ``"general"``, which run the kernels' other code paths (:func:`fast_path` says
which path a variant runs). When it cannot be built, :func:`available` is False,
:func:`unavailable_reason` says why, ``"auto"`` uses another backend, and a call that asks for
``backend="cpp"`` by name raises :class:`normlab.kernels.BackendUnavailableError` (the module
functions below raise ``RuntimeError``). Non-CPU tensors go to the reference formula, as do the
calls the front end hands to it (empty tensors, torch.compile, torch.func, forward-mode AD).

The module-level functions are the backend interface (the signatures of
:mod:`normlab.kernels.reference`).
"""

from __future__ import annotations

import ctypes

import torch

from normlab._checks import stats_dtype
from normlab.kernels.cpu._build import (
    VARIANTS,
    build_error,
    compiler,
    current_variant,
    fast_path,
    load_library,
    set_variant,
    use_variant,
)
from normlab.kernels.cpu.cache_size import last_level_cache_bytes
from normlab.kernels.frontend import FusedBackend, FusedSpec, Gradients, Needs, Operands, Saved

__all__ = [
    "VARIANTS",
    "ada_layer_norm",
    "ada_rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "available",
    "build_error",
    "compiler",
    "current_variant",
    "fast_path",
    "gated_add_ada_rms_norm",
    "gated_residual",
    "layer_norm",
    "rms_norm",
    "set_variant",
    "unavailable_reason",
    "use_variant",
]

_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_NO_TYPE = -1
LANES = 64  # fixed number of row lanes for the deterministic column sums
GRAIN = 32768  # elements per thread below which fewer threads are used (waking one costs more)


def _fields(*names: str) -> list[tuple[str, type]]:
    kinds = {"eps": ctypes.c_double}
    out = []
    for name in names:
        if name in kinds:
            out.append((name, kinds[name]))
        elif name.endswith(("_dtype", "_group")) or name in (
            "rows",
            "dim",
            "nthreads",
            "centre",
            "stream",
            "lanes",
            "hat_round",
        ):
            out.append((name, ctypes.c_int64))
        else:
            out.append((name, ctypes.c_void_p))
    return out


class _ForwardArgs(ctypes.Structure):
    _fields_ = _fields(
        "rows", "dim", "nthreads", "centre", "stream", "eps",
        "x", "x_dtype", "res", "res_dtype", "gate", "gate_dtype", "gate_group",
        "h_out", "h_dtype", "gain", "bias", "hat_round",
        "scale", "scale_dtype", "scale_group", "shift", "shift_dtype", "shift_group",
        "y", "y_dtype", "mean_out", "rstd_out",
    )  # fmt: skip


class _BackwardArgs(ctypes.Structure):
    _fields_ = _fields(
        "rows", "dim", "nthreads", "centre", "lanes", "stream",
        "h", "h_dtype", "mean", "rstd", "dy", "dy_dtype", "gain", "hat_round",
        "scale", "scale_dtype", "scale_group", "dh_in", "dh_in_dtype",
        "dx", "dx_dtype", "dres", "dres_dtype",
        "gate", "gate_dtype", "gate_group", "other", "other_dtype",
        "dgain", "dgain_dtype", "dbias", "dbias_dtype", "dscale", "dscale_dtype",
        "dshift", "dshift_dtype", "shift_group", "dgate", "dgate_dtype", "workspace",
    )  # fmt: skip


def _stream(x: torch.Tensor) -> int:
    """1 when the call moves more bytes than the last-level cache holds: its outputs are then
    written with non-temporal stores (they would be evicted before any reuse anyway)."""
    return int(2 * x.numel() * x.element_size() >= last_level_cache_bytes())


def _threads(elements: int) -> int:
    """Threads for a call: torch's intra-op count, fewer for small tensors."""
    return max(1, min(torch.get_num_threads(), elements // GRAIN))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _code(dt: torch.dtype | None) -> int:
    return _NO_TYPE if dt is None else _CODES[dt]


def _contig(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().contiguous()


class CppProvider:
    """Runs :class:`~normlab.kernels.frontend.FusedSpec` calls through the C++ library (CPU
    tensors only; contiguous rows; the gain arrives as weight + offset in float32/float64)."""

    strided_rows = False
    adds_offset = False

    def declines(self, x: torch.Tensor) -> bool:
        return x.device.type != "cpu"

    def _lib(self) -> ctypes.CDLL:
        lib = load_library()
        if lib is None:
            raise RuntimeError(f"normlab C++ CPU kernels are unavailable: {build_error()}")
        return lib

    def forward(
        self, spec: FusedSpec, ops: Operands, need_stats: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        lib = self._lib()
        x = ops.x.detach()
        n, d = x.shape
        sd = stats_dtype(x.dtype)
        res, gate = _contig(ops.res), _contig(ops.gate)
        scale, shift = _contig(ops.scale), _contig(ops.shift)
        h = None
        if spec.h_dtype is not None:
            h = torch.empty((n, d), dtype=spec.h_dtype)
        y = None if spec.out_dtype is None else torch.empty((n, d), dtype=spec.out_dtype)
        mean = torch.empty(n, dtype=sd) if need_stats and spec.centre and y is not None else None
        rstd = torch.empty(n, dtype=sd) if need_stats and y is not None else None
        args = _ForwardArgs(
            rows=n,
            dim=d,
            nthreads=_threads(n * d),
            centre=int(spec.centre),
            stream=_stream(x),
            eps=ops.eps,
            x=_ptr(x),
            x_dtype=_code(x.dtype),
            res=_ptr(res),
            res_dtype=_code(None if res is None else res.dtype),
            gate=_ptr(gate),
            gate_dtype=_code(None if gate is None else gate.dtype),
            gate_group=ops.gate_group,
            h_out=_ptr(h),
            h_dtype=_code(spec.h_dtype),
            gain=_ptr(ops.gain),
            bias=_ptr(ops.bias),
            hat_round=_code(spec.hat_round),
            scale=_ptr(scale),
            scale_dtype=_code(None if scale is None else scale.dtype),
            scale_group=ops.scale_group,
            shift=_ptr(shift),
            shift_dtype=_code(None if shift is None else shift.dtype),
            shift_group=ops.shift_group,
            y=_ptr(y),
            y_dtype=_code(spec.out_dtype),
            mean_out=_ptr(mean),
            rstd_out=_ptr(rstd),
        )
        lib.normlab_forward(ctypes.byref(args), ctypes.c_int64(int(sd == torch.float64)))
        return y, h, mean, rstd

    def backward(
        self,
        spec: FusedSpec,
        ops: Operands,
        saved: Saved,
        dy: torch.Tensor | None,
        dh: torch.Tensor | None,
        needs: Needs,
    ) -> Gradients:
        lib = self._lib()
        h = saved.h.detach()
        n, d = h.shape
        sd = stats_dtype(h.dtype)
        lanes = max(1, min(n, LANES * -(-torch.get_num_threads() // LANES)))
        grads = Gradients()
        res_separate = needs.res is not None and (spec.gated or needs.res != needs.x)
        dx_needed = needs.x is not None or (needs.res is not None and not res_separate)
        dx_dtype = needs.x if needs.x is not None else needs.res
        dx = torch.empty((n, d), dtype=dx_dtype) if dx_needed else None
        dres = torch.empty((n, d), dtype=needs.res) if res_separate else None

        def column(dt: torch.dtype | None, group: int) -> torch.Tensor | None:
            return None if dt is None else torch.empty((n // group, d), dtype=dt)

        dgain = column(needs.weight, n)
        dbias = column(needs.bias, n)
        dscale = column(needs.scale, ops.scale_group)
        dshift = column(needs.shift, ops.shift_group)
        dgate = column(needs.gate, ops.gate_group)
        active = sum(t is not None for t in (dgain, dbias, dscale, dshift, dgate))
        workspace = torch.empty((active, lanes, 2, d), dtype=sd) if active else None
        gate, other, scale = ops.gate, ops.res if spec.gated else None, ops.scale
        args = _BackwardArgs(
            rows=n,
            dim=d,
            nthreads=_threads(n * d),
            centre=int(spec.centre),
            lanes=lanes,
            stream=_stream(h),
            h=_ptr(h),
            h_dtype=_code(h.dtype),
            mean=_ptr(saved.mean),
            rstd=_ptr(saved.rstd),
            dy=_ptr(dy),
            dy_dtype=_code(None if dy is None else dy.dtype),
            gain=_ptr(ops.gain),
            hat_round=_code(spec.hat_round),
            scale=_ptr(scale),
            scale_dtype=_code(None if scale is None else scale.dtype),
            scale_group=ops.scale_group,
            dh_in=_ptr(dh),
            dh_in_dtype=_code(None if dh is None else dh.dtype),
            dx=_ptr(dx),
            dx_dtype=_code(dx_dtype if dx_needed else None),
            dres=_ptr(dres),
            dres_dtype=_code(needs.res if res_separate else None),
            gate=_ptr(gate),
            gate_dtype=_code(None if gate is None else gate.dtype),
            gate_group=ops.gate_group,
            other=_ptr(other),
            other_dtype=_code(None if other is None else other.dtype),
            dgain=_ptr(dgain),
            dgain_dtype=_code(needs.weight),
            dbias=_ptr(dbias),
            dbias_dtype=_code(needs.bias),
            dscale=_ptr(dscale),
            dscale_dtype=_code(needs.scale),
            dshift=_ptr(dshift),
            dshift_dtype=_code(needs.shift),
            shift_group=ops.shift_group,
            dgate=_ptr(dgate),
            dgate_dtype=_code(needs.gate),
            workspace=_ptr(workspace),
        )
        lib.normlab_backward(ctypes.byref(args), ctypes.c_int64(int(sd == torch.float64)))
        grads.x = dx if needs.x is not None else None
        grads.res = dres if res_separate else (dx if needs.res is not None else None)
        grads.weight = None if dgain is None else dgain.view(d)
        grads.bias = None if dbias is None else dbias.view(d)
        grads.scale, grads.shift, grads.gate = dscale, dshift, dgate
        return grads


_provider = CppProvider()
_backend = FusedBackend(_provider)
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


def available() -> bool:
    """True when the C++ kernels of the :func:`current_variant` are built and loaded (builds them
    on the first call)."""
    return load_library() is not None


_REASON_CHARS = 300


def unavailable_reason() -> str | None:
    """None when the kernels load, else a short reason and how to get them (builds on first call).

    The full compiler output is :func:`build_error`.
    """
    if available():
        return None
    error = build_error() or "unknown error"
    variant = current_variant()
    kernels = "the C++ CPU kernels" + ("" if variant == "native" else f" ({variant} variant)")
    if error.startswith("disabled by NORMLAB_CPU_KERNELS"):
        return f"{kernels} are {error}; unset it (or set it to 1) to build them"
    if error.startswith("no C++ compiler found"):  # says already how to get one
        return f"{kernels} cannot be built: {error}"
    return (
        f"{kernels} could not be built with {compiler()} ({_first_error(error)}); "
        "install a C++17 compiler (g++ or clang++) on PATH or point NORMLAB_CXX at one (full "
        "error: normlab.kernels.cpu.build_error())"
    )


def _first_error(error: str) -> str:
    """The first compiler diagnostic (``error:``) of a build error, else its first line, short."""
    lines = [" ".join(line.split()) for line in error.splitlines() if line.strip()]
    found = next((line for line in lines if "error:" in line.lower()), None)
    if found is None:
        compiled = len(lines) > 1 and lines[0].startswith("the C++ kernels did not compile")
        found = "the compiler failed with every flag set" if compiled else lines[0]
    return found if len(found) <= _REASON_CHARS else found[: _REASON_CHARS - 1] + "…"
