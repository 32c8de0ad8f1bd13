"""Black-box probing of one norm: what does this implementation really compute?

The norm is treated as a function y = f(x) on [N, D] tensors, assumed to have the form
y = g ⊙ x̂ + b with a per-channel gain g and bias b. The probes:

1. **bias**: b = f(0) (every norm with ε maps 0 to x̂ = 0).
2. **normalises?** A normaliser divides each row by a statistic of the whole row, so:
   (a) changing one element changes the other outputs (not element-wise, unlike DyT or an
   activation); (b) at a large input scale (mean square 1e4, where any plausible ε moves x̂ by
   less than ε / 2e4) f(c·x) = f(x) for c > 0; (c) at the probe's own scale, where ε may
   matter, scaling x changes each row of f(x) − b only by a factor (ε shrinks a row's
   magnitude, never its shape). All three must hold.
3. **gain**: v = [+1, −1, +1, …] has mean 0 and mean(v²) = var(v) = 1, so x̂(S·v) = v for both
   LayerNorm and RMSNorm (S = 100 makes ε negligible), and g = (f(S·v) − b) / v.
4. **centering**: f(x + a·1) = f(x) ⇔ the mean is subtracted.
5. **statistic**: the shape of x̂ = (f(X) − b) / g on random X of mean square 1e4, compared with
   candidate statistics (variance, mean square, mean absolute value); the constant factor that
   tells the biased variance from the unbiased one, or mean(x²) from ‖x‖², is read from the gain
   when the module exposes its weight.
6. **ε placement**: on x = s·v for s ≤ 1, r(s) = |x̂(s·v)| / |x̂(S·v)|. Inside the root
   r = s / sqrt(s² + ε), so ε = s²(1/r² − 1) is the same at every s; outside the root
   r = s / (s + ε), so ε = s(1/r − 1) is. The hypothesis whose ε estimates agree wins.
7. **statistics precision**: float16 input with |x| ≈ 300 (x² overflows float16 past 256) and
   bfloat16 rows of 4096 values (the row's implied rsqrt(m + ε) drifts ≈ 0.1% when m is rounded
   to bfloat16, ≈ 0.002% when it stays in float32).
8. **casting** (RMS family in bfloat16): bit-for-bit against the LLaMA and Gemma formulas.
"""

from __future__ import annotations

import math
import reprlib
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

NormFn = Callable[[torch.Tensor], torch.Tensor]

SCALE_STEP = 3.7  # the factor c of the scale-invariance probes
LARGE_MEAN_SQUARE = 1e4  # input scale at which ε is negligible: ε = 1 moves x̂ by 5e-5
GAIN_SCALE = math.sqrt(LARGE_MEAN_SQUARE)  # x = GAIN_SCALE · v has that mean square
TOLERANCE = 1e-3  # relative error allowed by the invariance probes (at least; see _tolerance)
MIN_DIM = 4  # at D = 2 every centred row is a multiple of [1, −1]: the shape probe cannot fail
GAIN_NAMES = ("weight", "gamma", "gain")  # what a norm module's own gain parameter is called


def check_probe_dim(dim: object) -> int:
    """The probes' vector size: an even integer >= :data:`MIN_DIM` (bool refused)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < MIN_DIM or dim % 2:
        raise ValueError(f"dim: expected an even integer >= {MIN_DIM} for the probes, got {dim!r}")
    return dim


def module_weight(module: object, dim: int) -> torch.Tensor | None:
    """The gain parameter a norm module exposes, or None.

    Its own tensor attribute ``weight`` (else ``gamma``, ``gain``) holding ``dim`` values, as
    ``torch.nn.LayerNorm``, ``torch.nn.RMSNorm`` and normlab's layers have. Both
    :func:`audit_norm` (when given a module and no ``weight``) and the ``normlab audit norm``
    command use it.
    """
    if not isinstance(module, nn.Module):
        return None
    for name in GAIN_NAMES:
        w = getattr(module, name, None)
        if isinstance(w, torch.Tensor) and w.numel() == dim:
            return w
    return None


def _normalized_size(module: object) -> int | None:
    """D of a module with a one-dimensional ``normalized_shape`` (an int or (D,)), else None."""
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1:
        d = shape[0]
        return d if isinstance(d, int) and not isinstance(d, bool) else None
    return None


@dataclass
class NormAudit:
    """What a norm implementation computes, as found by :func:`audit_norm`."""

    target: str
    dim: int
    normalizes: bool
    centering: bool
    statistic: str
    eps: float | None
    eps_placement: str
    gain_form: str
    has_bias: bool
    stats_precision: dict[str, str] = field(default_factory=dict)
    casting: str | None = None
    max_rel_error: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _alternating(n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    v = torch.ones(d, dtype=dtype)
    v[1::2] = -1.0
    return v.expand(n, d).clone()


def _call(f: NormFn, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dtype-mismatch notices are expected while probing
        y = f(x)
    if isinstance(y, tuple):
        y = y[0]
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        shape = getattr(y, "shape", type(y).__name__)
        raise ValueError(
            f"target: returned {shape} for input {tuple(x.shape)}; expected the same shape"
        )
    return y


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ‖a − b‖ / ‖b‖ in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _probe_dtype(f: NormFn, d: int) -> torch.dtype:
    """The most precise input dtype the target accepts: float64 (if it also returns float64),
    else float32, else a 16-bit dtype (a module whose parameters are bfloat16 or float16 and
    that does not cast its input)."""
    gen = torch.Generator().manual_seed(4)  # torch's global generator is left alone
    try:
        y = _call(f, torch.randn(2, d, generator=gen, dtype=torch.float64))
        if y.dtype == torch.float64:
            return torch.float64
    except (RuntimeError, TypeError, ValueError):
        pass
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        try:
            _call(f, torch.randn(2, d, generator=gen).to(dtype))
            return dtype
        except (RuntimeError, TypeError, ValueError):
            continue
    return torch.float32  # let the first probe raise the target's own error


def _tolerance(*tensors: torch.Tensor) -> float:
    """Relative error the invariance probes allow: :data:`TOLERANCE`, or four units of
    rounding of the least precise dtype among the probe's inputs and outputs."""
    return max(TOLERANCE, *(4 * torch.finfo(t.dtype).eps for t in tensors))


_CANDIDATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "variance": lambda x: (
        (x - x.mean(-1, keepdim=True))
        * torch.rsqrt((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True))
    ),
    "mean square": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)),
    "mean absolute deviation": lambda x: (
        (x - x.mean(-1, keepdim=True)) / (x - x.mean(-1, keepdim=True)).abs().mean(-1, keepdim=True)
    ),
    "mean absolute value": lambda x: x / x.abs().mean(-1, keepdim=True),
}


def _eps_fits(ratios: list[tuple[float, float]], inside: bool, rounds: int = 3) -> list[float]:
    """ε from each (s, r(s)) under one placement hypothesis.

    r is measured against x̂ at scale ``GAIN_SCALE``, which ε shrinks a little too (by
    S / sqrt(S² + ε) inside the root, S / (S + ε) outside): a few rounds of correcting r with
    the current estimate remove that bias (it matters from ε ≈ 1e-2 up).
    """
    big = GAIN_SCALE
    ref_shrink = 1.0
    fits: list[float] = []
    for _ in range(rounds):
        fits = []
        for s, r_measured in ratios:
            r = r_measured * ref_shrink
            fits.append(s * s * (1.0 / (r * r) - 1.0) if inside else s * (1.0 / r - 1.0))
        eps = max(float(torch.tensor(fits).median()), 0.0)
        ref_shrink = big / math.sqrt(big * big + eps) if inside else big / (big + eps)
    return fits


def _estimate_eps(
    f: NormFn, b: torch.Tensor, d: int, dtype: torch.dtype
) -> tuple[float | None, str]:
    """Estimate ε and where it sits from the shrinkage of x̂(s·v) at small s."""
    v = _alternating(4, d, dtype)
    ref = (_call(f, GAIN_SCALE * v) - b).double()  # g ⊙ x̂(v), ε nearly without effect
    scales = [10.0**-k for k in range(0, 9 if dtype == torch.float64 else 5)]
    ratios = []
    for s in scales:
        out = (_call(f, s * v) - b).double()
        r = float((out * ref).sum() / (ref * ref).sum())
        if 0.02 < r < 0.98:
            ratios.append((s, r))
    if not ratios:
        return None, "no ε effect seen down to |x| = 1e-8" if dtype == torch.float64 else (
            "no ε effect seen down to |x| = 1e-4"
        )
    inside, outside = _eps_fits(ratios, inside=True), _eps_fits(ratios, inside=False)

    def spread(values: list[float]) -> float:
        logs = [math.log(max(val, 1e-300)) for val in values]
        return max(logs) - min(logs)

    if len(inside) == 1:
        return inside[0], "inside the root (one usable probe point; placement not confirmed)"
    if spread(inside) <= spread(outside):
        return float(torch.tensor(inside).median()), "inside the root: x·rsqrt(m + ε)"
    return float(torch.tensor(outside).median()), "outside the root: x / (sqrt(m) + ε) (a defect)"


def _fp16_overflow_check(f: NormFn, d: int, family: str) -> str:
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(8, d, generator=gen) * 300).clamp(-60000, 60000)
    try:
        y = _call(f, x.half())
    except (RuntimeError, TypeError, ValueError) as err:
        return f"float16 input not accepted ({type(err).__name__})"
    if not torch.isfinite(y).all():
        return "float16: non-finite output at |x| ≈ 300 — statistics squared in float16"
    shape = _CANDIDATES[family](x.half().double())
    cos = float(torch.nn.functional.cosine_similarity(y.double(), shape, dim=-1).min())
    if cos < 0.99:
        return "float16: wrong output at |x| ≈ 300 — statistics overflow in float16"
    return "float16: correct at |x| ≈ 300 — statistics not kept in float16"


def _eps_shrink(
    xd: torch.Tensor, family: str, eps: float | None, placement: str
) -> torch.Tensor | float:
    """The factor by which ε shrinks each row of x̂ (1 when ε is unknown or not modelled)."""
    if eps is None or family not in ("variance", "mean square"):
        return 1.0
    xs = xd - xd.mean(-1, keepdim=True) if family == "variance" else xd
    m = xs.pow(2).mean(-1)
    if placement.startswith("outside"):
        return m.sqrt() / (m.sqrt() + eps)
    return torch.sqrt(m / (m + eps))


def _bf16_precision_check(
    f: NormFn,
    b: torch.Tensor,
    g: torch.Tensor,
    family: str,
    eps: float | None = None,
    placement: str = "",
) -> str:
    d = g.shape[-1]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(256, d, generator=gen).bfloat16()
    try:
        y = _call(f, x).double()
    except (RuntimeError, TypeError, ValueError) as err:
        return f"bfloat16 input not accepted ({type(err).__name__})"
    xd = x.double()
    xs = xd - xd.mean(-1, keepdim=True) if family in ("variance", "mean absolute deviation") else xd
    # least-squares estimate of the row's scale factor k in (y − b)/g = k·xs
    implied = ((y - b.double()) / g.double() * xs).sum(-1) / (xs * xs).sum(-1)
    exact = (_CANDIDATES[family](xd) * xs).sum(-1) / (xs * xs).sum(-1)
    exact = exact * _eps_shrink(xd, family, eps, placement)
    err = float(((implied - exact) / exact).abs().median())
    if err > 7e-4:
        return f"bfloat16: statistics rounded to bfloat16 (row scale off by {err:.3%}, median)"
    return f"bfloat16: statistics in float32 or better (row scale within {err:.3%}, median)"


def _row_shape_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """How far the rows of ``a`` are from a per-row multiple of those of ``ref`` (relative)."""
    a, ref = a.double(), ref.double()
    k = (a * ref).sum(-1, keepdim=True) / (ref * ref).sum(-1, keepdim=True).clamp_min(1e-300)
    return float((a - k * ref).norm() / a.norm().clamp_min(1e-300))


def _why_not_normalizing(
    f: NormFn,
    x: torch.Tensor,
    y: torch.Tensor,
    big: torch.Tensor,
    y_big: torch.Tensor,
    b: torch.Tensor,
) -> tuple[str, str] | None:
    """``None`` if ``f`` behaves as a row normaliser, else (the reason, what acts like that).

    ``y = f(x)`` at the probe scale and ``y_big = f(big)`` with ``big`` a multiple of ``x`` of
    mean square :data:`LARGE_MEAN_SQUARE`; ``b = f(0)``. See step 2 of the module docstring.
    """
    bumped = x.clone()
    bumped[:, 0] += 30.0 * x.double().pow(2).mean(-1).sqrt().to(x.dtype)
    if _rel(_call(f, bumped)[:, 1:] - b[1:], y[:, 1:] - b[1:]) < 1e-9:
        return (
            "it acts element-wise: changing one input leaves the other outputs unchanged",
            "as DyT, tanh or the identity do",
        )
    tol = _tolerance(x, y)
    if _rel(_call(f, SCALE_STEP * big) - b, y_big - b) >= tol:
        return (
            "the output changes with the input's scale, even where ε is negligible",
            "as a linear map does, or ε applied without a root: x / (m + ε)",
        )
    if _row_shape_error(_call(f, SCALE_STEP * x) - b, y - b) >= tol:
        return (
            "scaling the input changes the shape of the output, not only its size",
            "as the normalisation of a non-linear function of x, e.g. of tanh(x), does",
        )
    return None


def audit_norm(
    f: NormFn,
    dim: int = 64,
    *,
    target: str = "norm",
    weight: torch.Tensor | None = None,
) -> NormAudit:
    """Probe ``f`` (a module or callable [N, dim] → [N, dim]) and report what it computes.

    ``f`` is the norm: a ``torch.nn.Module`` or any callable taking x [N, dim] and returning a
    tensor of the same shape (or a tuple whose first item is one); wrap a conditional norm with
    its condition, e.g. ``lambda x: norm(x, cond)[0]``. ``dim`` (even, >= 4) is the vector size
    of the probes and must be the norm's own size. ``weight`` is the implementation's gain
    parameter: it lets the audit tell ``w`` from ``1 + w`` and fixes the constant factor of the
    statistic. When ``f`` is a module and ``weight`` is None, the module's own gain parameter is
    used (:func:`module_weight`: ``weight``, ``gamma`` or ``gain`` with ``dim`` values), as
    ``normlab audit norm`` does. The gain is changed during the casting probe and restored.
    """
    if not callable(f):
        raise TypeError(
            f"f: expected the norm to probe: a torch.nn.Module or a callable mapping a tensor "
            f"[N, dim] to one of the same shape (wrap a conditional norm, e.g. "
            f"lambda x: norm(x, cond)[0]), got {type(f).__name__} {reprlib.repr(f)}"
        )
    dim = check_probe_dim(dim)
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise TypeError(
            f"weight: expected the norm's gain parameter (a torch.Tensor of {dim} values) or "
            f"None, got {type(weight).__name__}"
        )
    size = _normalized_size(f)
    if size is not None and size != dim:
        raise ValueError(
            f"dim: {dim} does not match the module's normalized_shape "
            f"{getattr(f, 'normalized_shape', None)}; expected dim={size}"
        )
    if weight is None:
        weight = module_weight(f, dim)
    dtype = _probe_dtype(f, dim)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, dim, generator=gen, dtype=dtype) * 2 + 0.5
    notes: list[str] = []

    try:
        b = _call(f, torch.zeros(1, dim, dtype=dtype))[0]
    except (RuntimeError, TypeError, ValueError, IndexError) as err:
        raise ValueError(
            f"f: {target!r} failed on the first probe, a {dtype} tensor of shape [1, {dim}] "
            f"({type(err).__name__}: {err}); expected a norm over vectors of size dim={dim} "
            "mapping [N, dim] to [N, dim] (does its size match dim?)"
        ) from err
    v = _alternating(1, dim, dtype)
    g = ((_call(f, GAIN_SCALE * v) - b) / v)[0]
    has_bias = bool(b.abs().max() > 1e-6)

    y = _call(f, x)
    big = x * math.sqrt(LARGE_MEAN_SQUARE / float(x.double().pow(2).mean()))
    y_big = _call(f, big)
    why_not = _why_not_normalizing(f, x, y, big, y_big, b)
    if why_not is not None:
        reason, like = why_not
        return NormAudit(
            target=target, dim=dim, normalizes=False, centering=False,
            statistic=f"none: {reason}", eps=None,
            eps_placement="n/a", gain_form="unknown", has_bias=has_bias,
            notes=[f"not a normalizer: {reason} ({like})"],
        )  # fmt: skip
    centering = _rel(_call(f, x + 5.0) - b, y - b) < _tolerance(x, y)
    if (g.abs() < 1e-8).any():
        notes.append("some channels have zero gain; they were left out of the statistic fit")
    live = g.abs() >= 1e-8
    hat = (y_big.double() - b.double()) / torch.where(live, g, torch.ones_like(g)).double()
    big64, v64 = big.double(), v.double()  # candidates in float64: 16-bit x² would overflow
    errors = {
        name: _rel(hat[:, live], (cand(big64) * (v64[0] / cand(v64)[0]))[:, live])
        for name, cand in _CANDIDATES.items()
    }
    family = min(errors, key=errors.get)
    max_rel = errors[family]
    statistic = {"variance": "variance", "mean square": "mean square"}.get(family, family)
    if family == "mean square" and centering:
        family, statistic = "variance", "variance"

    gain_form = "no gain parameter exposed"
    if weight is not None:
        w = weight.detach().to("cpu", torch.float64).reshape(-1)
        gd = g.double()
        if w.numel() == dim:
            forms = {
                "w": gd - w,
                "1 + w": gd - (1 + w),
                "w · sqrt((D − 1) / D) (unbiased variance)": gd - w * math.sqrt((dim - 1) / dim),
                "w / sqrt(D) (L2 norm, not mean square)": gd - w / math.sqrt(dim),
            }
            best = min(forms, key=lambda k: float(forms[k].abs().max()))
            gain_form = (
                best
                if float(forms[best].abs().max()) < 1e-3 * max(1.0, float(gd.abs().max()))
                else "unknown"
            )
            if "unbiased" in best:
                statistic = "variance (unbiased, D − 1)"
            elif "L2" in best:
                statistic = "sum of squares (L2 norm)"
    if statistic == "variance":
        statistic = "variance (biased, D)" if weight is not None else "variance"

    eps, placement = _estimate_eps(f, b, dim, dtype)
    if eps is not None and math.isclose(eps, torch.finfo(dtype).eps, rel_tol=0.05):
        notes.append(
            f"ε equals the machine epsilon of the probe dtype ({dtype}): the implementation "
            "derives ε from a dtype (as torch's eps=None does) instead of a fixed value"
        )
    precision = {
        "float16": _fp16_overflow_check(f, dim, family),
        "bfloat16": _bf16_precision_check(f, b, g, family, eps, placement),
    }
    casting = _casting_check(f, weight, dim, eps, family) if family == "mean square" else None
    return NormAudit(
        target=target, dim=dim, normalizes=True, centering=centering, statistic=statistic,
        eps=eps, eps_placement=placement, gain_form=gain_form, has_bias=has_bias,
        stats_precision=precision, casting=casting, max_rel_error=max_rel, notes=notes,
    )  # fmt: skip


def _casting_check(
    f: NormFn, weight: torch.Tensor | None, dim: int, eps: float | None, family: str
) -> str | None:
    """Which 16-bit rounding the RMS family follows, bit for bit, in bfloat16.

    The gain is set to a random value for the check and restored afterwards.
    """
    if weight is None or eps is None:
        return None
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, dim, generator=gen).bfloat16()
    saved = weight.detach().clone()
    try:
        with torch.no_grad():  # a non-trivial gain, or LLaMA and Gemma rounding coincide
            weight.copy_(saved + 0.37 * torch.randn(saved.shape, generator=gen).to(saved))
            y = _call(f, x)
            w = weight.detach().to("cpu").clone()
    except (RuntimeError, TypeError, ValueError):
        return None
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    if y.dtype == torch.float32:
        return "fp32: bfloat16 input gives a float32 output (x̂ and the gain meet in float32)"
    xf = x.float()
    hat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    for offset in (0.0, 1.0):
        gain32 = w.float() + offset
        llama = (gain32 * hat.to(x.dtype).float()).to(x.dtype)
        gemma = (hat * gain32).to(x.dtype)
        if torch.equal(y.to(x.dtype), llama):
            return "llama: x̂ rounded to the input dtype, then times the gain"
        if torch.equal(y.to(x.dtype), gemma):
            return "gemma: x̂ and the gain meet in float32, one rounding at the end"
    return "neither LLaMA nor Gemma rounding, bit for bit"
