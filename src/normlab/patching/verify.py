"""Does a candidate compute what the original norm computes? Forward in every probe dtype and
input shape, and gradients of the input and of every parameter."""

from __future__ import annotations

import functools

import torch
from torch import nn

from normlab.patching.refusal import Refused, Unverifiable

PROBE_SCALES = (1e-3, 1e-2, 0.1, 1.0, 10.0)  # row scales of the probe input
MAX_ULPS = 2  # 16-bit outputs: largest allowed distance, in units in the last place
MIN_EXACT = 0.99  # 16-bit outputs: smallest allowed fraction of bit-identical elements
GRAD_TOLERANCE = 1e-4  # float32 / float64 gradients: relative to their largest value
GRAD_ULPS_16 = 8  # 16-bit gradients: units of rounding of the dtype, relative to the largest


def _probe_dtypes(module: nn.Module) -> list[torch.dtype]:
    p = next(module.parameters(), None)
    if p is None or p.dtype == torch.float32:
        return [torch.float32, torch.bfloat16, torch.float16]
    if p.dtype in (torch.bfloat16, torch.float16):
        return [p.dtype, torch.float32]  # a float32 residual stream into 16-bit norms
    return [p.dtype]


def _probe_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rows of random values with scales from 1e-3 to 10 (float16: from 1e-2) and a mean offset,
    shaped [20, *shape] (float16: [16, *shape])."""
    rows = _probe_rows(shape, dtype == torch.float16)
    return rows.to(device=device, dtype=dtype, copy=True)


@functools.lru_cache(maxsize=4)
def _probe_rows(shape: tuple[int, ...], from_1e_2: bool) -> torch.Tensor:
    """:func:`_probe_input`'s values in float64 on the CPU, made once per shape (the many norms
    of a model share a few widths). Never handed out itself: callers copy."""
    gen = torch.Generator().manual_seed(0)
    scales = [s for s in PROBE_SCALES if not from_1e_2 or s >= 1e-2]
    rows = [
        s * (torch.randn((4, *shape), generator=gen, dtype=torch.float64) + 0.5) for s in scales
    ]
    return torch.cat(rows)


@functools.lru_cache(maxsize=4)
def _output_gradient(shape: tuple[int, ...]) -> torch.Tensor:
    """A random output gradient in float64 on the CPU, made once per shape. Callers copy."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _probe_views(x: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """The probe rows (a multiple of 4) as [B, T, *shape] and [B, T, H, *shape]: the token
    and the per-head layouts of a transformer."""
    n = x.shape[0]
    return [x.reshape(4, n // 4, *shape), x.reshape(n // 4, 2, 2, *shape)]


def _normalized_shape(module: nn.Module) -> tuple[int, ...]:
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool):
        return (shape,)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, int) for s in shape):
        return tuple(shape)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return tuple(weight.shape)
    raise Unverifiable("neither normalized_shape nor a weight tells its width")


def _output(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _check_tensor(module(x))


def _check_tensor(y: object) -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise Unverifiable(
            f"its forward returned {type(y).__name__}, not a tensor as a normlab layer does"
        )
    return y


def verify(original: nn.Module, candidate: nn.Module) -> dict[str, float]:
    """Check that ``candidate`` reproduces ``original``; return the relative error per dtype."""
    shape = _normalized_shape(original)
    p = next(original.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    errors: dict[str, float] = {}
    accepted: list[torch.Tensor] = []  # one probe input the original took, per dtype
    rejections: list[str] = []
    for dtype in _probe_dtypes(original):
        name = str(dtype).removeprefix("torch.")
        worst = None
        for x in _probe_views(_probe_input(shape, dtype, device), shape):
            err = _verify_input(original, candidate, x, name)
            if isinstance(err, str):
                rejections.append(err)
                continue
            if not any(a.dtype == dtype for a in accepted):
                accepted.append(x)
            worst = err if worst is None else max(worst, err)
        if worst is not None:
            errors[name] = worst
    if not accepted:
        raise Unverifiable(
            "it took none of the probe inputs ([B, T, D] and [B, T, H, D] in "
            f"{', '.join(str(d).removeprefix('torch.') for d in _probe_dtypes(original))}): "
            + rejections[-1]
        )
    grad_dtype = p.dtype if p is not None and p.dtype != torch.float32 else torch.float32
    x = next((a for a in accepted if a.dtype == grad_dtype), accepted[0])
    _compare_gradients(original, candidate, x)
    return errors


def _verify_input(
    original: nn.Module, candidate: nn.Module, x: torch.Tensor, name: str
) -> float | str:
    """The relative error of the candidate's forward on ``x``, or the original's error message
    when it does not take ``x`` (nothing to match)."""
    what = f"{name} input {list(x.shape)}"
    with torch.no_grad():
        try:
            want = original(x)
        except Exception as err:  # whatever the original raises, it does not take x
            return f"{what}: {type(err).__name__}: {err}"
        _check_tensor(want)
        try:
            got = _output(candidate, x)
        except Exception as err:
            raise Refused(f"{what}: {type(err).__name__}: {err}") from None
    return _compare(got, want, what, x.dtype)


def _compare(
    got: torch.Tensor, want: torch.Tensor, what: str, in_dtype: torch.dtype | None = None
) -> float:
    """The relative error of ``got``; raises Refused when it is not within rounding.

    16-bit outputs: at most :data:`MAX_ULPS` apart and at least :data:`MIN_EXACT` bit-identical.
    A wider output of 16-bit input (a promoted dtype) may carry a flipped 16-bit rounding of x̂
    now and then: at least :data:`MIN_EXACT` of the elements must agree to 16 units of the output
    dtype's rounding, and none may be more than :data:`MAX_ULPS` ulps of the input dtype apart.
    Otherwise the outputs must agree to 16 units of rounding of their dtype (of float32 for
    float64 outputs: many norms compute float64 input in float32), relative to their largest value.
    """
    if got.dtype != want.dtype:
        raise Refused(f"{what}: output dtype {got.dtype} where the original gives {want.dtype}")
    if got.shape != want.shape:
        raise Refused(f"{what}: output shape {tuple(got.shape)}, original {tuple(want.shape)}")
    scale = float(want.detach().double().abs().max().clamp_min(1e-30))
    err = float((got.detach().double() - want.detach().double()).abs().max()) / scale
    if want.dtype in (torch.bfloat16, torch.float16):
        ulps = _ulp_distance(got, want)
        exact = float((ulps == 0).double().mean())
        if int(ulps.max()) > MAX_ULPS or exact < MIN_EXACT:
            raise Refused(
                f"{what}: {exact:.1%} of the outputs bit-identical, up to {int(ulps.max())} "
                f"ulps apart (allowed: >= {MIN_EXACT:.0%}, <= {MAX_ULPS})"
            )
        return err
    if in_dtype in (torch.bfloat16, torch.float16) and want.is_floating_point():
        w64 = want.detach().double().abs()
        diff = (got.detach().double() - want.detach().double()).abs()
        out_eps = torch.finfo(want.dtype).eps
        near = diff <= 16 * out_eps * (w64 + out_eps * scale)  # agree to the output's rounding
        close = float(near.double().mean())
        if bool((diff > MAX_ULPS * torch.finfo(in_dtype).eps * w64 + 1e-30).any()) or (
            close < MIN_EXACT
        ):
            raise Refused(
                f"{what}: {close:.1%} of the outputs agree to {want.dtype} rounding, the rest "
                f"up to {float((diff / (torch.finfo(in_dtype).eps * w64 + 1e-30)).max()):.1f} "
                f"{in_dtype} ulps apart (allowed: >= {MIN_EXACT:.0%}, <= {MAX_ULPS})"
            )
        return err
    # float64: many norms take float64 input to float32 for their statistic (normlab keeps
    # float64), so float64 outputs need only agree to float32 rounding
    tol_dtype = torch.float32 if want.dtype == torch.float64 else want.dtype
    tol = 16 * torch.finfo(tol_dtype).eps if want.is_floating_point() else 0.0
    if not err <= tol:
        raise Refused(
            f"{what}: outputs differ by {err:.2e} of their largest value (allowed {tol:.1e})"
        )
    return err


def _ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in units in the last place of a 16-bit float dtype (sign-magnitude order)."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.detach().contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def _compare_gradients(original: nn.Module, candidate: nn.Module, x: torch.Tensor) -> None:
    """dx and the gradient of every parameter of both modules for one random output gradient,
    equal within :data:`GRAD_TOLERANCE` (16-bit: :data:`GRAD_ULPS_16` units of rounding)."""
    params = [p for p in original.parameters() if p.requires_grad]
    grads = []
    for module, fails in ((original, Unverifiable), (candidate, Refused)):
        xi = x.detach().clone().requires_grad_(True)
        try:
            y = module(xi)
        except Exception as err:
            raise fails(f"with autograd on, {x.dtype} input: {type(err).__name__}: {err}") from None
        y = _check_tensor(y)
        g = _output_gradient(tuple(y.shape)).to(device=y.device, dtype=y.dtype, copy=True)
        try:
            grads.append(torch.autograd.grad(y, [xi, *params], g, allow_unused=True))
        except RuntimeError as err:
            raise fails(f"no gradient of its output ({x.dtype} input): {err}") from None
    labels = ["x"] + [n for n, p in original.named_parameters() if p.requires_grad]
    for label, got, want in zip(labels, grads[1], grads[0], strict=True):
        if want is None or got is None:
            if (want is None) != (got is None):
                raise Refused(f"gradient of {label}: present in one module only")
            continue
        tol = GRAD_TOLERANCE
        if want.dtype in (torch.bfloat16, torch.float16):
            tol = GRAD_ULPS_16 * torch.finfo(want.dtype).eps
        scale = float(want.double().abs().max().clamp_min(1e-30))
        err = float((got.double() - want.double()).abs().max()) / scale
        if not err <= tol:
            raise Refused(
                f"gradient of {label} ({x.dtype}): differs by {err:.2e} of its largest value "
                f"(allowed {tol:.1e})"
            )
