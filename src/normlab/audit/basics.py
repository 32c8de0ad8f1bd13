"""What every probe of :mod:`normlab.audit` shares: calling the target, comparing outputs, and
the tolerances a correct implementation meets on a probe.

Tolerances are derived from the dtype the output was computed in and the vector size D:

- one rounding of the output costs at most half a unit ``u = finfo(dtype).eps`` relative, and a
  LLaMA-style implementation rounds twice (x̂, then the gain product): 2u bounds both;
- a statistic accumulated over D values in float32 is off by about ``eps32 · sqrt(D)`` for a
  random-walk sum: 4 of those are allowed (float32 statistics are correct at any input dtype).

So :func:`output_tolerance` = ``2u + 4 eps32 sqrt(D)``: 2.4e-7 + 3.1e-5 for float32 at
D = 4096, 1.6 % for bfloat16. The dtype is the one the output was computed in
(:func:`effective_dtype`): float32 results returned as float64 are held to float32's
tolerance. A probe's error is compared with its tolerance; anything beyond is a finding, never
rounded away.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

NormFn = Callable[[torch.Tensor], torch.Tensor]
# the gain is read off f(S·v) at S = 2^20 (v = [+1, −1, …]): the statistic 2^40, its root and
# rsqrt are exact in float32 and bfloat16, and ε is negligible wherever it sits (outside the root
# ε = 1 moves x̂ by 1e-6; at S = 2^10 it moved it by 1e-3, which a bfloat16 output rounds away)
GAIN_READ_SCALE = 2.0**20
# what a target raises for input it does not take (a dtype, a shape, an assert on x.dim())
CALL_ERRORS = (RuntimeError, TypeError, ValueError, IndexError, AssertionError)


class NonFinite(Exception):
    """A probe that needs finite output got NaN or infinity (carries the probe's name)."""

    def __init__(self, probe: str, what: str) -> None:
        super().__init__(what)
        self.probe = probe
        self.what = what


def call(f: NormFn, x: torch.Tensor) -> torch.Tensor:
    """``f(x)`` without gradients and dtype warnings; the first item of a tuple; same shape.

    ``f`` gets a copy of ``x`` (a target that writes into its input must not change the
    probes), and the result is detached from it."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dtype-mismatch notices are expected while probing
        y = f(x.clone())
    if isinstance(y, tuple):
        y = y[0]
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        shape = getattr(y, "shape", type(y).__name__)
        raise ValueError(
            f"target: returned {shape} for input {tuple(x.shape)}; expected the same shape"
        )
    return y


def finite_call(f: NormFn, x: torch.Tensor, probe: str) -> torch.Tensor:
    """:func:`call`, raising :class:`NonFinite` when the output holds NaN or infinity."""
    y = call(f, x)
    if not bool(torch.isfinite(y).all()):
        bad = int((~torch.isfinite(y)).sum())
        raise NonFinite(
            probe,
            f"{bad} of {y.numel()} outputs are NaN or infinite on finite {x.dtype} input "
            f"of shape {tuple(x.shape)} (max |x| = {float(x.abs().max()):.3g})",
        )
    return y


def alternating(n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """n rows of v = [+1, −1, +1, …]: mean 0 and mean(v²) = var(v) = 1."""
    v = torch.ones(d, dtype=dtype)
    v[1::2] = -1.0
    return v.expand(n, d).clone()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ‖a − b‖ / ‖b‖ in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def row_scales(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row, the least-squares k with a ≈ k·ref (float64)."""
    a, ref = a.double(), ref.double()
    return (a * ref).sum(-1) / (ref * ref).sum(-1).clamp_min(1e-300)


def row_shape_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """How far the rows of ``a`` are from a per-row multiple of those of ``ref`` (relative)."""
    a, ref = a.double(), ref.double()
    k = row_scales(a, ref)[..., None]
    return float((a - k * ref).norm() / a.norm().clamp_min(1e-300))


def rounding(dtype: torch.dtype) -> float:
    """The unit of rounding at 1 of a floating dtype (``finfo.eps``)."""
    return float(torch.finfo(dtype).eps)


def accumulation_error(dtype: torch.dtype, d: int) -> float:
    """Relative error allowed for a statistic of D values: 4·eps32·sqrt(D), whatever the dtype
    (the contract asks for float32 statistics at least; Hugging Face's T5LayerNorm keeps them in
    float32 for float64 input too, and is correct)."""
    del dtype
    return 4 * rounding(torch.float32) * math.sqrt(d)


def output_tolerance(dtype: torch.dtype, d: int) -> float:
    """Relative (L2) error a correct norm's output in ``dtype`` may show: 2u + 4·eps32·sqrt(D)."""
    return 2 * rounding(dtype) + accumulation_error(dtype, d)


def working_dtype(y: torch.Tensor) -> torch.dtype:
    """The precision ``y`` was computed in: the coarsest floating dtype whose grid holds every
    value of ``y`` (an implementation that computes in float32 and returns float64 has float32
    outputs; tolerances follow that, not the returned dtype)."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        if rounding(dtype) > rounding(y.dtype) and torch.equal(y, y.to(dtype).to(y.dtype)):
            return dtype
    return y.dtype


def effective_dtype(f: NormFn, x: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """The precision a norm really works in, measured: the finest dtype (no finer than
    :func:`working_dtype` of ``y = f(x)``) whose unit of rounding covers the change in the rows'
    *shapes* of f(x) − b when x is scaled by 1 + 2⁻¹² + 2⁻²⁰, to which a normaliser's row shapes
    are invariant. (A float32 x̂ times a bfloat16 weight returned as float64 holds float64
    values, but only float32 precision.)"""
    base = working_dtype(y)
    try:
        y2 = call(f, (x.double() * (1.0 + 2.0**-12 + 2.0**-20)).to(x.dtype))
    except CALL_ERRORS:
        return base
    if not bool(torch.isfinite(y2).all()):
        return base
    noise = row_shape_error(y2.double() - b.double(), y.double() - b.double())
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        if rounding(dtype) >= rounding(base) and noise <= rounding(dtype):
            return dtype
    return torch.bfloat16


def ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of ``t``'s dtype at each value of ``t`` (float64)."""
    info = torch.finfo(t.dtype)
    mag = t.double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def shrink(m: torch.Tensor | float, eps: float | None, placement: str) -> torch.Tensor | float:
    """The factor by which ε shrinks x̂ of a row with statistic m (1 when ε is unknown).

    Inside the root sqrt(m / (m + ε)); outside sqrt(m) / (sqrt(m) + ε)."""
    if eps is None:
        return 1.0
    if isinstance(m, float):
        m = torch.tensor(m, dtype=torch.float64)
    if placement.startswith("outside"):
        return m.sqrt() / (m.sqrt() + eps)
    if placement.startswith("inside"):
        return torch.sqrt(m / (m + eps))
    return 1.0
