"""Replace the norm modules of a model by normlab's, each one verified before it is swapped.

:func:`replace_norms` walks a model and, for every norm module (see
:func:`normlab.audit.is_norm_module`), builds the normlab layer that computes the same function:

- ``torch.nn.LayerNorm`` → :class:`normlab.LayerNorm` with the same arguments;
- ``torch.nn.RMSNorm`` → :class:`normlab.RMSNorm` with ``casting="gemma"`` (torch rounds once,
  at the end);
- any other module that holds a ``weight`` over the last dimension (and optionally a ``bias``)
  and its ε in an attribute (``eps``, ``variance_epsilon`` or ``epsilon``): Hugging Face's
  ``LlamaRMSNorm``, ``GemmaRMSNorm``, ``T5LayerNorm`` and their many copies, or your own. The
  black-box audit (:func:`normlab.audit.audit_norm`) says what it computes: with the mean
  subtracted and the biased variance, y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β (LayerNorm); without,
  y = (o + w) ⊙ x·rsqrt(mean(x²) + ε) with o = 0 or 1 (RMSNorm). ε must sit inside the root.

A candidate replaces the original only after it reproduced it on random rows whose scales span
1e-3 to 10 (so that ε shows), in each probe dtype (the parameters' dtype; for float32 parameters
also bfloat16 and float16 input): the same output dtype, values equal within float32 rounding
(at most 2 ulps apart and at least 99 % bit-identical in 16-bit), and in the parameters' dtype
the same gradients of x and of every parameter. For an RMS-family module several 16-bit
roundings are tried (LLaMA, Gemma, float32 output, each with or without a promoted output
dtype), and the first that matches in every dtype wins.

The replacement takes over the original's ``Parameter`` objects, so parameter names, the state
dict, weight tying and an optimizer built beforehand all stay valid. A module with hooks, or
with state the audit cannot see (buffers, sub-modules), is kept, and so is one whose function
normlab does not implement; every module found is reported with the reason.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from normlab._checks import check_bool
from normlab.audit.model import _takes_cond, is_norm_module
from normlab.audit.probe import MIN_DIM, NormAudit, audit_norm
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm
from normlab.layers.dyt import DynamicTanh

EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon")
PROBE_SCALES = (1e-3, 1e-2, 0.1, 1.0, 10.0)  # row scales of the probe input
MAX_ULPS = 2  # 16-bit outputs: largest allowed distance, in units in the last place
MIN_EXACT = 0.99  # 16-bit outputs: smallest allowed fraction of bit-identical elements
_NORMLAB = (LayerNorm, RMSNorm, AdaRMSNorm, AdaLayerNormZero, DynamicTanh)
_OTHER_AXES = (
    nn.GroupNorm,
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*, SyncBatchNorm
    nn.LocalResponseNorm,
)
_RMS_CASTINGS = (("llama", False), ("llama", True), ("gemma", False), ("fp32", False))


@dataclass(frozen=True)
class NormReplacement:
    """What :func:`replace_norms` did with one norm module.

    ``names``: every attribute path that reaches the module (one module may sit in several
    places). ``replacement``: the normlab module that replaced it (or would, with ``dry_run``),
    None when the original is kept, with ``reason`` saying why. ``max_error``: per probe dtype,
    the largest |y_normlab − y_original| relative to max |y_original|.
    """

    names: tuple[str, ...]
    original: str
    replacement: str | None
    replaced: bool
    reason: str
    max_error: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: ``name: Original -> replacement`` or ``name: Original kept (reason)``."""
        where = ", ".join(self.names)
        if self.replacement is None:
            return f"{where}: {self.original} kept ({self.reason})"
        done = "replaced by" if self.replaced else "would be replaced by"
        return f"{where}: {self.original} {done} {self.replacement} ({self.reason})"


class _Refused(Exception):
    """A module normlab will not replace; the message says why."""


def replace_norms(
    model: nn.Module,
    *,
    dry_run: bool = False,
    strict: bool = False,
    names: Iterable[str] | None = None,
) -> list[NormReplacement]:
    """Swap every norm module of ``model`` for the normlab layer that computes the same function.

    Returns one :class:`NormReplacement` per norm module found, in the order of
    ``model.named_modules()``. ``dry_run``: decide and verify, but change nothing. ``strict``:
    raise ``ValueError`` (before anything is changed) if some norm module would be kept, other
    than one that already is normlab's. ``names``: only the modules reached by these attribute
    paths (``ValueError`` for a path that names no module).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    dry_run = check_bool(dry_run, "dry_run")
    strict = check_bool(strict, "strict")
    wanted = _wanted_modules(model, names)
    results: list[tuple[NormReplacement, nn.Module | None, nn.Module]] = []
    for module, paths in _norm_modules(model):
        if wanted is not None and id(module) not in wanted:
            continue
        if not paths:  # the model itself is a norm: nothing holds it to swap it in
            results.append(
                (_kept(module, paths, "it is the model itself: use normlab's layer"), None, module)
            )
            continue
        try:
            candidate, how, errors = _replacement(module)
        except _Refused as why:
            results.append((_kept(module, paths, str(why)), None, module))
            continue
        report = NormReplacement(
            names=paths,
            original=_class_name(module),
            replacement=_short_repr(candidate),
            replaced=not dry_run,
            reason=how,
            max_error=errors,
        )
        results.append((report, candidate, module))
    if strict:
        kept = [r for r, _, m in results if r.replacement is None and not isinstance(m, _NORMLAB)]
        if kept:
            lines = "; ".join(r.describe() for r in kept)
            raise ValueError(f"model: {len(kept)} norm module(s) cannot be replaced: {lines}")
    if not dry_run:
        for _report, candidate, module in results:
            if candidate is not None:
                _swap(model, module, candidate)
    return [r for r, _, _ in results]


def _wanted_modules(model: nn.Module, names: Iterable[str] | None) -> set[int] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError("names: expected an iterable of attribute paths, got a single str")
    wanted = set()
    for name in names:
        try:
            wanted.add(id(model.get_submodule(name)))
        except AttributeError:
            raise ValueError(f"names: {name!r} names no sub-module of the model") from None
    return wanted


def _norm_modules(model: nn.Module) -> Iterator[tuple[nn.Module, tuple[str, ...]]]:
    """Each norm module once, with every path that reaches it ("" paths are left out)."""
    paths: dict[int, list[str]] = {}
    order: list[nn.Module] = []
    for name, module in model.named_modules(remove_duplicate=False):
        if not is_norm_module(module):
            continue
        if id(module) not in paths:
            paths[id(module)] = []
            order.append(module)
        if name:
            paths[id(module)].append(name)
    for module in order:
        yield module, tuple(paths[id(module)])


def _kept(module: nn.Module, paths: tuple[str, ...], reason: str) -> NormReplacement:
    return NormReplacement(paths, _class_name(module), None, False, reason)


def _class_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _short_repr(module: nn.Module) -> str:
    return f"normlab.{type(module).__name__}({module.extra_repr()})"


def _swap(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` wherever ``old`` sits in ``model``."""
    for _, parent in model.named_modules(remove_duplicate=False):
        for child_name, child in list(parent._modules.items()):
            if child is old:
                setattr(parent, child_name, new)


# --- choosing the replacement ----------------------------------------------------------------


def _replacement(module: nn.Module) -> tuple[nn.Module, str, dict[str, float]]:
    """The verified normlab module for ``module``, how it was identified, and its errors."""
    if isinstance(module, _NORMLAB):
        raise _Refused("already a normlab module")
    if isinstance(module, _OTHER_AXES):
        raise _Refused(
            "normalises over the batch or over channel groups, not each token's last dimension"
        )
    if _takes_cond(module):
        raise _Refused(
            "a conditional norm (its forward takes cond): build normlab.AdaRMSNorm or "
            "normlab.AdaLayerNormZero in its place by hand"
        )
    if _has_hooks(module):
        raise _Refused("it has hooks, which a replacement would drop")
    if isinstance(module, nn.LayerNorm):
        candidates = [(_from_torch_layer_norm(module), "torch.nn.LayerNorm")]
    elif isinstance(module, nn.RMSNorm):
        candidates = [(_from_torch_rms_norm(module), "torch.nn.RMSNorm")]
    else:
        candidates = _from_audit(module)
    failures = []
    for candidate, how in candidates:
        candidate.train(module.training)
        try:
            errors = _verify(module, candidate)
        except _Refused as why:
            failures.append(f"{_short_repr(candidate)}: {why}")
            continue
        return candidate, f"{how}; verified", errors
    raise _Refused("no normlab layer reproduced it: " + "; ".join(failures))


def _has_hooks(module: nn.Module) -> bool:
    return any(
        getattr(module, attr, None)
        for attr in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
        )
    )


def _take_parameters(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new`` the very Parameter objects of ``old`` (same names)."""
    for name, _ in list(new.named_parameters(recurse=False)):
        setattr(new, name, getattr(old, name))
    return new


def _meta_kwargs(module: nn.Module) -> dict:
    p = next(module.parameters(), None)
    return {"device": "meta", "dtype": p.dtype} if p is not None else {}


def _from_torch_layer_norm(m: nn.LayerNorm) -> nn.Module:
    new = LayerNorm(
        m.normalized_shape,
        eps=m.eps,
        elementwise_affine=m.elementwise_affine,
        bias=m.bias is not None,
        **_meta_kwargs(m),
    )
    return _take_parameters(new, m)


def _from_torch_rms_norm(m: nn.RMSNorm) -> nn.Module:
    new = RMSNorm(
        m.normalized_shape, m.eps, m.elementwise_affine, casting="gemma", **_meta_kwargs(m)
    )
    return _take_parameters(new, m)


def _from_audit(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """Candidates for a norm module of unknown class, from what the audit finds it computes."""
    params = dict(module.named_parameters(recurse=False))
    if set(params) - {"weight", "bias"} or "weight" not in params:
        listed = ", ".join(params) or "none"
        raise _Refused(f"expected parameters weight (and bias), found: {listed}")
    if any(True for _ in module.children()) or any(True for _ in module.buffers()):
        raise _Refused("it holds sub-modules or buffers, which the audit cannot account for")
    weight = params["weight"]
    if weight.dim() != 1 or weight.numel() < MIN_DIM or weight.numel() % 2:
        raise _Refused(
            f"weight shape {tuple(weight.shape)}: the audit needs one even dimension >= {MIN_DIM}"
        )
    eps = _eps_attribute(module)
    dim = weight.numel()
    audit = _audit(module, dim)
    if not audit.normalizes:
        raise _Refused(f"the audit finds it does not normalise ({audit.statistic})")
    if "inside" not in audit.eps_placement:
        raise _Refused(f"ε placement: {audit.eps_placement}")
    kw = {"device": "meta", "dtype": weight.dtype}
    found = f"audited: {audit.statistic}, gain {audit.gain_form}, ε = {eps:g} (attribute)"
    if audit.centering:
        if not audit.statistic.startswith("variance (biased") or audit.gain_form != "w":
            raise _Refused(
                f"centred, but {audit.statistic} with gain {audit.gain_form}: "
                "normlab.LayerNorm is γ ⊙ (x − μ)·rsqrt(biased variance + ε) + β"
            )
        new = LayerNorm(dim, eps=eps, bias="bias" in params, **kw)
        return [(_take_parameters(new, module), found)]
    if audit.statistic != "mean square" or audit.gain_form not in ("w", "1 + w"):
        raise _Refused(
            f"{audit.statistic} with gain {audit.gain_form}: normlab.RMSNorm is "
            "(o + w) ⊙ x·rsqrt(mean(x²) + ε)"
        )
    if "bias" in params:
        raise _Refused("an RMS norm with a bias: normlab.RMSNorm has none")
    offset = 1.0 if audit.gain_form == "1 + w" else 0.0
    preferred = (audit.casting or "").split(":")[0]
    order = sorted(_RMS_CASTINGS, key=lambda cp: cp[0] != preferred)
    candidates = []
    for casting, promote in order:
        new = RMSNorm(dim, eps, weight_offset=offset, casting=casting, promote_output=promote, **kw)
        candidates.append((_take_parameters(new, module), found))
    return candidates


def _eps_attribute(module: nn.Module) -> float:
    for attr in EPS_ATTRIBUTES:
        value = getattr(module, attr, None)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and math.isfinite(value) and value >= 0:
            return float(value)
    raise _Refused(f"no ε attribute ({', '.join(EPS_ATTRIBUTES)}) holding a number >= 0")


def _audit(module: nn.Module, dim: int) -> NormAudit:
    device = next(module.parameters()).device

    def call(x: torch.Tensor) -> torch.Tensor:
        y = module(x.to(device))
        return (y[0] if isinstance(y, tuple) else y).cpu()

    try:
        return audit_norm(call, dim, target=_class_name(module), weight=module.weight)
    except (RuntimeError, TypeError, ValueError) as err:
        raise _Refused(f"the audit could not probe it: {err}") from None


# --- verification ----------------------------------------------------------------------------


def _probe_dtypes(module: nn.Module) -> list[torch.dtype]:
    p = next(module.parameters(), None)
    if p is None or p.dtype == torch.float32:
        return [torch.float32, torch.bfloat16, torch.float16]
    return [p.dtype]


def _probe_input(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rows of random values with scales from 1e-3 to 10 (float16: from 1e-2) and a mean offset."""
    gen = torch.Generator().manual_seed(0)
    scales = [s for s in PROBE_SCALES if dtype != torch.float16 or s >= 1e-2]
    rows = [
        s * (torch.randn((4, *shape), generator=gen, dtype=torch.float64) + 0.5) for s in scales
    ]
    return torch.cat(rows).to(device=device, dtype=dtype)


def _normalized_shape(module: nn.Module) -> tuple[int, ...]:
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, int) for s in shape):
        return tuple(shape)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return tuple(weight.shape)
    raise _Refused("neither normalized_shape nor a weight tells its width")


def _output(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    y = module(x)
    if isinstance(y, tuple):
        y = y[0]
    if not isinstance(y, torch.Tensor):
        raise _Refused(f"its forward returned {type(y).__name__}, not a tensor")
    return y


def _verify(original: nn.Module, candidate: nn.Module) -> dict[str, float]:
    """Check that ``candidate`` reproduces ``original``; return the relative error per dtype."""
    shape = _normalized_shape(original)
    p = next(original.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    errors: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's dtype-mismatch notices are expected here
        for dtype in _probe_dtypes(original):
            errors.update(_verify_dtype(original, candidate, shape, dtype, device))
        _compare_gradients(original, candidate, _probe_input(shape, _grad_dtype(p), device))
    return errors


def _verify_dtype(
    original: nn.Module,
    candidate: nn.Module,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, float]:
    """{dtype name: relative error} of the candidate's forward, or {} when the original
    does not take input of that dtype."""
    x = _probe_input(shape, dtype, device)
    name = str(dtype).removeprefix("torch.")
    with torch.no_grad():
        try:
            want = _output(original, x)
        except (RuntimeError, TypeError, ValueError):
            return {}  # nothing to match
        try:
            got = _output(candidate, x)
        except (RuntimeError, TypeError, ValueError) as err:
            raise _Refused(f"{name} input: {err}") from None
    return {name: _compare(got, want, f"{name} input", dtype)}


def _grad_dtype(p: torch.Tensor | None) -> torch.dtype:
    return p.dtype if p is not None and p.dtype == torch.float64 else torch.float32


def _compare(
    got: torch.Tensor, want: torch.Tensor, what: str, in_dtype: torch.dtype | None = None
) -> float:
    """The relative error of ``got``; raises _Refused when it is not within rounding.

    16-bit outputs: at most :data:`MAX_ULPS` apart and at least :data:`MIN_EXACT` bit-identical.
    A wider output of 16-bit input (a promoted dtype) may carry a flipped 16-bit rounding of x̂
    now and then: at least :data:`MIN_EXACT` of the elements must agree to 16 units of the output
    dtype's rounding, and none may be more than :data:`MAX_ULPS` ulps of the input dtype apart.
    Otherwise the outputs must agree to 16 units of rounding of their dtype (of float32 for
    float64 outputs: many norms compute float64 input in float32), relative to their largest value.
    """
    if got.dtype != want.dtype:
        raise _Refused(f"{what}: output dtype {got.dtype} where the original gives {want.dtype}")
    if got.shape != want.shape:
        raise _Refused(f"{what}: output shape {tuple(got.shape)}, original {tuple(want.shape)}")
    scale = float(want.detach().double().abs().max().clamp_min(1e-30))
    err = float((got.detach().double() - want.detach().double()).abs().max()) / scale
    if want.dtype in (torch.bfloat16, torch.float16):
        ulps = _ulp_distance(got, want)
        exact = float((ulps == 0).double().mean())
        if int(ulps.max()) > MAX_ULPS or exact < MIN_EXACT:
            raise _Refused(
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
            raise _Refused(
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
        raise _Refused(
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
    """dx and the parameter gradients of both modules for one random output gradient."""
    params = [p for p in original.parameters() if p.requires_grad]
    if params and params[0].dtype != x.dtype:
        return  # 16-bit parameters: the forward checks above are the contract
    gen = torch.Generator().manual_seed(1)
    grads = []
    for module in (original, candidate):
        xi = x.detach().clone().requires_grad_(True)
        y = _output(module, xi)
        g = torch.randn(y.shape, generator=gen.manual_seed(1), dtype=torch.float64).to(y)
        grads.append(torch.autograd.grad(y, [xi, *params], g, allow_unused=True))
    labels = ["x"] + [n for n, p in original.named_parameters() if p.requires_grad]
    for label, got, want in zip(labels, grads[1], grads[0], strict=True):
        if want is None or got is None:
            if (want is None) != (got is None):
                raise _Refused(f"gradient of {label}: present in one module only")
            continue
        scale = float(want.double().abs().max().clamp_min(1e-30))
        err = float((got.double() - want.double()).abs().max()) / scale
        if not err <= 1e-4:
            raise _Refused(f"gradient of {label}: differs by {err:.2e} of its largest value")
