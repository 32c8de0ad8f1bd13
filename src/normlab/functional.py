"""Functional norms: one function per norm, the math of DESIGN §1, autograd included.

Every function normalises each token's vector over the last dimension of ``x`` ([..., D]),
accumulates its statistics in float32 (float64 for float64 input), keeps ε inside the square
root, validates its arguments, and dispatches to a backend (``backend=None`` uses the default,
see :mod:`normlab.kernels`). ``out_dtype`` chooses the output dtype; by default the output has
``x``'s dtype (``casting="fp32"`` RMSNorm: float32).
"""

from __future__ import annotations

from typing import Any

import torch

from normlab._checks import (
    check_bool,
    check_casting,
    check_finite_number,
    check_input,
    check_layer_norm_eps,
    check_out_dtype,
    check_param,
    check_same_shape,
    modulation_view,
    resolve_eps,
    stats_dtype,
)
from normlab.kernels import get_default_backend, resolve_backend

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


def _backend(name: str | None, x: torch.Tensor) -> Any:
    """The backend for a call: ``name`` (``None``: the default), resolved for ``x``.

    While ``torch.compile`` traces the caller, ``"auto"`` is the reference formula, which fuses
    into the caller's graph; choosing a native backend would probe its availability (file
    system, locks) and break the graph.
    """
    if torch.compiler.is_compiling() and (name or get_default_backend()) == "auto":
        name = "torch"
    return resolve_backend(name, x)


def _rms_out_dtype(casting: str, dtype: torch.dtype) -> torch.dtype:
    """Default output dtype: x's dtype, or the statistics dtype in ``"fp32"`` casting."""
    return stats_dtype(dtype) if casting == "fp32" else dtype


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dimension.

    μ = mean(x), σ² = mean((x − μ)²) (biased), x̂ = (x − μ)·rsqrt(σ² + ε),
    y = γ ⊙ x̂ + β, with γ = ``weight`` and β = ``bias`` (each optional), all in float32.
    Unlike ``torch.nn.functional.layer_norm`` there is no ``normalized_shape`` argument: the
    statistics are always over the last dimension. ``eps`` is a float > 0 (``None`` is refused,
    as torch's ``layer_norm`` refuses it; it is the RMS family's convention only).
    """
    check_input("x", x)
    check_param("weight", weight, x)
    check_param("bias", bias, x)
    eps = check_layer_norm_eps(eps)
    out = check_out_dtype(out_dtype) or x.dtype
    return _backend(backend, x).layer_norm(x, weight, bias, eps, out)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = 1e-6,
    weight_offset: float = 0.0,
    casting: str = "llama",
    *,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension.

    m = mean(x²), x̂ = x·rsqrt(m + ε), y = (o + w) ⊙ x̂ with o = ``weight_offset``
    (0: LLaMA form, w starts at 1; 1: Gemma form, w starts at 0). The offset is added in float32.
    With ``weight=None`` the gain is 1 and y = x̂. ``eps=None`` is ε = the machine epsilon of the
    statistics dtype (float32 for 16-bit x, float64 for float64), as ``torch.nn.RMSNorm``.

    ``casting`` fixes where rounding happens for 16-bit input:
    ``"llama"``: x̂ is cast to x's dtype, then multiplied by the gain (HF LlamaRMSNorm);
    ``"gemma"``: x̂ and the gain meet in float32, one cast at the end (HF GemmaRMSNorm);
    ``"fp32"``: as ``"gemma"``, and the output stays float32 unless ``out_dtype`` is given.
    """
    check_input("x", x)
    check_param("weight", weight, x)
    eps = resolve_eps(eps, x.dtype)
    weight_offset = check_finite_number(weight_offset, "weight_offset")
    casting = check_casting(casting)
    out = check_out_dtype(out_dtype) or _rms_out_dtype(casting, x.dtype)
    return _backend(backend, x).rms_norm(x, weight, eps, weight_offset, casting, out, x.dtype)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    eps: float | None = 1e-6,
    weight_offset: float = 0.0,
    casting: str = "llama",
    *,
    residual_in_fp32: bool = False,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and RMSNorm: h = x + residual; returns (rms_norm(h), h).

    The sum is taken in float32 and kept in float32 when ``residual_in_fp32`` (else cast to x's
    dtype); the norm then works on h exactly as :func:`rms_norm`, rounding x̂ to x's dtype in
    ``"llama"`` casting. ``residual=None`` means h = x. ``eps=None`` as in :func:`rms_norm`.
    ``residual_in_fp32`` must be a bool.
    """
    check_input("x", x)
    if residual is not None:
        check_same_shape("residual", residual, x)
    check_param("weight", weight, x)
    eps = resolve_eps(eps, x.dtype)
    weight_offset = check_finite_number(weight_offset, "weight_offset")
    casting = check_casting(casting)
    residual_in_fp32 = check_bool(residual_in_fp32, "residual_in_fp32")
    out = check_out_dtype(out_dtype) or _rms_out_dtype(casting, x.dtype)
    return _backend(backend, x).add_rms_norm(
        x, residual, weight, eps, weight_offset, casting, residual_in_fp32, out
    )


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    residual_in_fp32: bool = False,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and LayerNorm: h = x + residual; returns (layer_norm(h), h).

    The sum is taken in float32 and kept in float32 when ``residual_in_fp32`` (a bool).
    ``eps`` as in :func:`layer_norm` (a float; no ``None``).
    """
    check_input("x", x)
    if residual is not None:
        check_same_shape("residual", residual, x)
    check_param("weight", weight, x)
    check_param("bias", bias, x)
    eps = check_layer_norm_eps(eps)
    residual_in_fp32 = check_bool(residual_in_fp32, "residual_in_fp32")
    out = check_out_dtype(out_dtype) or x.dtype
    return _backend(backend, x).add_layer_norm(
        x, residual, weight, bias, eps, residual_in_fp32, out
    )


def ada_rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float | None = 1e-6,
    *,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Adaptive RMSNorm (π0.5 AdaRMS): y = x̂ ⊙ (1 + scale) + shift, x̂ = x·rsqrt(mean(x²) + ε).

    ``scale`` and ``shift`` are per sequence ([B, D] or [B, 1, D]) or per token ([B, T, D]) for
    x of shape [B, T, D]; [B, D] stays per sequence for x with more token axes [B, …, D]. The
    modulation is applied in float32 and cast once at the end. ``eps=None`` as in
    :func:`rms_norm` (the machine epsilon of the statistics dtype).
    """
    check_input("x", x)
    scale_v = modulation_view("scale", scale, x)
    shift_v = None if shift is None else modulation_view("shift", shift, x)
    eps = resolve_eps(eps, x.dtype)
    out = check_out_dtype(out_dtype) or x.dtype
    return _backend(backend, x).ada_rms_norm(x, scale_v, shift_v, eps, out)


def ada_layer_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Adaptive LayerNorm (DiT adaLN): y = x̂ ⊙ (1 + scale) + shift, x̂ = (x − μ)·rsqrt(σ² + ε).

    Shapes as :func:`ada_rms_norm`; the LayerNorm has no affine of its own. ``eps`` is a
    float > 0, as for :func:`layer_norm` and torch's ``layer_norm``: ``None`` (the RMS family's
    "machine epsilon of the dtype") is refused with a ``TypeError``.
    """
    check_input("x", x)
    scale_v = modulation_view("scale", scale, x)
    shift_v = None if shift is None else modulation_view("shift", shift, x)
    eps = check_layer_norm_eps(eps)
    out = check_out_dtype(out_dtype) or x.dtype
    return _backend(backend, x).ada_layer_norm(x, scale_v, shift_v, eps, out)


def gated_residual(
    h: torch.Tensor, out: torch.Tensor, gate: torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """Gated residual update: h' = h + gate ⊙ out, summed in float32, returned in h's dtype.

    ``gate`` is per sequence ([B, D] or [B, 1, D]) or per token ([B, T, D]).
    """
    check_input("h", h)
    check_same_shape("out", out, h, x_name="h")
    gate_v = modulation_view("gate", gate, h, x_name="h")
    return _backend(backend, h).gated_residual(h, out, gate_v)


def gated_add_ada_rms_norm(
    h: torch.Tensor,
    out: torch.Tensor,
    gate: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor | None = None,
    eps: float | None = 1e-6,
    *,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block step of an AdaRMS network: h' = h + g ⊙ o; y = x̂(h') ⊙ (1 + s) + t.

    Returns (y, h'). Shapes of gate, scale and shift, and ``eps=None``, as :func:`ada_rms_norm`.
    """
    check_input("h", h)
    check_same_shape("out", out, h, x_name="h")
    gate_v = modulation_view("gate", gate, h, x_name="h")
    scale_v = modulation_view("scale", scale, h, x_name="h")
    shift_v = None if shift is None else modulation_view("shift", shift, h, x_name="h")
    eps = resolve_eps(eps, h.dtype)
    out_dt = check_out_dtype(out_dtype) or h.dtype
    return _backend(backend, h).gated_add_ada_rms_norm(
        h, out, gate_v, scale_v, shift_v, eps, out_dt
    )
