"""Which normlab layer could replace a norm module: torch's own classes map directly, any other
is identified by the black-box audit; the candidates are then checked (:mod:`.verify`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from normlab.audit.model import is_norm_module, takes_condition
from normlab.audit.probe import MIN_DIM, NormAudit, audit_norm
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm
from normlab.layers.dyt import DynamicTanh
from normlab.patching.refusal import HoldsNorms, Refused, Unverifiable
from normlab.patching.verify import verify

EPS_ATTRIBUTES = ("eps", "variance_epsilon", "epsilon")
NORMLAB_MODULES = (LayerNorm, RMSNorm, AdaRMSNorm, AdaLayerNormZero, DynamicTanh)
_OTHER_AXES = (
    nn.GroupNorm,
    nn.modules.batchnorm._NormBase,  # BatchNorm*, InstanceNorm*, SyncBatchNorm
    nn.LocalResponseNorm,
)
_RMS_CASTINGS = (("llama", False), ("llama", True), ("gemma", False), ("fp32", False))
_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_MODULE_INTERNALS = frozenset(vars(nn.Module())) - {"training"}
_SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device)
# candidate builders: each makes the normlab layer around the parameters of a module of the
# same configuration, with how the layer was identified
Builders = list[tuple[Callable[[nn.Module], nn.Module], str]]


def class_name(module: nn.Module) -> str:
    """``module.Class`` of a module."""
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def short_repr(module: nn.Module) -> str:
    """``normlab.Layer(arguments)`` of a normlab module."""
    return f"normlab.{type(module).__name__}({module.extra_repr()})"


def replacement_for(
    module: nn.Module, cache: dict[tuple, Builders | Refused]
) -> tuple[nn.Module, str, dict[str, float]]:
    """The verified normlab module for ``module``, how it was identified, and its errors.

    ``cache`` holds, per class and configuration (:func:`_signature`), the candidate builders in
    the order to try them (the last winner first), or the audit's refusal.
    """
    _check_replaceable(module)
    key = _signature(module)
    builders = cache.get(key)
    if builders is None:
        try:
            builders = _builders(module)
        except Refused as why:
            cache[key] = why
            raise
        cache[key] = builders
    if isinstance(builders, Refused):
        raise builders
    probe = _probe_copy(module, stand_in=False)
    failures = []
    for i, (build, how) in enumerate(builders):
        candidate = build(probe).train(module.training)
        _check_state_dict(module, candidate)
        try:
            errors = verify(probe, candidate)
        except Unverifiable:
            raise
        except Refused as why:
            failures.append(f"{short_repr(candidate)}: {why}")
            continue
        cache[key] = [builders[i], *builders[:i], *builders[i + 1 :]]
        if _on_meta(module):
            how += " with stand-in values for its meta-device parameters"
        return build(module).train(module.training), f"{how}; verified", errors
    raise Refused("no normlab layer reproduced it: " + "; ".join(failures))


def _check_replaceable(module: nn.Module) -> None:
    """Raise Refused when swapping ``module`` would lose more than its function."""
    if isinstance(module, NORMLAB_MODULES):
        raise Refused("already a normlab module")
    if isinstance(module, _OTHER_AXES):
        raise Refused(
            "normalises over the batch or over channel groups, not each token's last dimension"
        )
    if takes_condition(module):
        raise Refused(
            "a conditional norm (its forward takes cond): build normlab.AdaRMSNorm or "
            "normlab.AdaLayerNormZero in its place by hand"
        )
    if any(getattr(module, attr, None) for attr in _HOOKS):
        raise Refused("it has hooks, which a replacement would drop")
    extra = _extra_inputs(module)
    if extra:
        raise Refused(
            f"its forward takes {', '.join(extra)} besides the input, which a normlab layer "
            "does not"
        )
    if "forward" in vars(module):
        raise Refused(
            "its forward is set on the instance (as accelerate's device hooks do), which a "
            "replacement would drop"
        )
    if parametrize.is_parametrized(module):
        raise Refused(
            "its parameters are parametrized (torch.nn.utils.parametrize), which a replacement "
            "would drop"
        )
    own = [p for p in module._parameters.values() if p is not None]
    if not own and any(is_norm_module(m) for m in module.modules() if m is not module):
        raise HoldsNorms("it holds norm modules of its own; each is reported on its own")
    if any(True for _ in module.children()) or any(True for _ in module.buffers()):
        raise Refused("it holds sub-modules or buffers, which a replacement would drop")


def _extra_inputs(module: nn.Module) -> list[str]:
    """The named parameters of ``module.forward`` after the input (``residual`` of a fused
    add + norm, …): callers may pass them, and a normlab layer's forward takes x only."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return [p.name for p in named[1:]]


def _check_state_dict(module: nn.Module, candidate: nn.Module) -> None:
    have = list(module.state_dict(keep_vars=True))
    new = list(candidate.state_dict(keep_vars=True))
    if sorted(have) != sorted(new):
        raise Refused(
            f"its state dict holds {', '.join(have) or 'nothing'}; the normlab layer's "
            f"{', '.join(new) or 'nothing'}"
        )


def _signature(module: nn.Module) -> tuple:
    """What a norm module's function may depend on besides its parameter values: its class,
    its mode, its attributes, and the shapes, dtypes and devices of its parameters."""
    attrs = []
    for name, value in sorted(vars(module).items()):
        if name in _MODULE_INTERNALS:
            continue
        simple = isinstance(value, _SIMPLE) or (
            isinstance(value, tuple) and all(isinstance(v, _SIMPLE) for v in value)
        )
        attrs.append((name, value if simple else ("id", id(value))))
    params = tuple(
        (name, None if p is None else (tuple(p.shape), p.dtype, p.device))
        for name, p in module._parameters.items()
    )
    return (type(module), tuple(attrs), params)


def _on_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def _probe_copy(module: nn.Module, *, stand_in: bool) -> nn.Module:
    """A shallow copy of ``module`` with parameters of its own that require grad: clones of the
    original's (``stand_in``, or on the meta device: deterministic stand-in values, the weight
    around 1 and the rest around 0, on the CPU for meta parameters)."""
    probe = nn.Module.__new__(type(module))
    probe.__dict__.update(vars(module))
    probe._parameters = {}
    gen = torch.Generator().manual_seed(4)
    for name, p in module._parameters.items():
        if p is None:
            probe._parameters[name] = None
            continue
        if stand_in or p.is_meta:
            device = torch.device("cpu") if p.is_meta else p.device
            values = 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            values = values + (1.0 if name == "weight" else 0.0)
            data = values.to(device=device, dtype=p.dtype)
        else:
            data = p.detach().clone()
        probe._parameters[name] = nn.Parameter(data, requires_grad=data.is_floating_point())
    return probe


def _take_parameters(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new`` the very Parameter objects of ``old`` (same names)."""
    for name, _ in list(new.named_parameters(recurse=False)):
        setattr(new, name, old._parameters[name])
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


def _builders(module: nn.Module) -> Builders:
    """The candidates for ``module``, in the order to try them."""
    if isinstance(module, nn.LayerNorm):
        return [(_from_torch_layer_norm, "torch.nn.LayerNorm")]
    if isinstance(module, nn.RMSNorm):
        return [(_from_torch_rms_norm, "torch.nn.RMSNorm")]
    return _from_audit(module)


@dataclass(frozen=True)
class _Layout:
    """What a replacement is built with, besides its parameters: the width, ε, whether it has
    a weight and a bias, and the parameters' dtype (None without parameters)."""

    dim: int
    eps: float
    affine: bool
    bias: bool
    dtype: torch.dtype | None


def _from_audit(module: nn.Module) -> Builders:
    """Candidates for a norm module of unknown class, from what the audit finds it computes:
    a centred norm → normlab.LayerNorm, a mean-square one → normlab.RMSNorm in each casting
    (the audit's first); anything else is refused with what the audit found."""
    params = dict(module.named_parameters(recurse=False))
    dim = _audit_width(module, params)
    weight = params.get("weight")
    audit = _audit(_probe_copy(module, stand_in=True), dim)
    if not audit.normalizes:
        raise Refused(f"the audit finds it does not normalise ({audit.statistic})")
    if "inside" not in audit.eps_placement:
        raise Refused(f"ε placement: {audit.eps_placement}")
    eps, source = _eps_attribute(module), "attribute"
    if eps is None:
        eps, source = _rounded_eps(audit.eps), "estimated by the audit"
    dtype = weight.dtype if weight is not None else None
    layout = _Layout(dim, eps, weight is not None, "bias" in params, dtype)
    found = f"audited: {audit.statistic}, gain {_gain(audit, layout)}, ε = {eps:g} ({source})"
    if audit.centering:
        return _layer_norm_builders(audit, layout, found)
    return _rms_norm_builders(audit, layout, found)


def _audit_width(module: nn.Module, params: dict[str, nn.Parameter]) -> int:
    """The width D the audit probes: the weight's size, else the module's one-dimensional
    ``normalized_shape``; refused unless the parameters are a weight (and bias) or none, and D
    is one even dimension >= :data:`~normlab.audit.probe.MIN_DIM`."""
    if set(params) - {"weight", "bias"} or ("bias" in params and "weight" not in params):
        listed = ", ".join(params)
        raise Refused(f"expected parameters weight (and bias) or none, found: {listed}")
    weight = params.get("weight")
    dim = weight.numel() if weight is not None else _parameterless_width(module)
    if (weight is not None and weight.dim() != 1) or dim < MIN_DIM or dim % 2:
        shape = tuple(weight.shape) if weight is not None else (dim,)
        raise Refused(f"width {shape}: the audit needs one even dimension >= {MIN_DIM}")
    return dim


def _gain(audit: NormAudit, layout: _Layout) -> str:
    """The gain's form as the audit found it, for messages ("1 (no weight)" without one)."""
    return audit.gain_form if layout.affine else "1 (no weight)"


def _layer_norm_builders(audit: NormAudit, layout: _Layout, found: str) -> Builders:
    """normlab.LayerNorm for a centred norm: refused unless its statistic is the biased
    variance and its gain w (or it has no weight)."""
    affine = layout.affine
    biased = audit.statistic.startswith("variance (biased") or (
        not affine and audit.statistic == "variance"  # biased or not: the check tells
    )
    if not biased or (affine and audit.gain_form != "w"):
        raise Refused(
            f"centred, but {audit.statistic} with gain {_gain(audit, layout)}: "
            "normlab.LayerNorm is γ ⊙ (x − μ)·rsqrt(biased variance + ε) + β"
        )

    def layer_norm(source: nn.Module) -> nn.Module:
        new = LayerNorm(
            layout.dim,
            eps=layout.eps,
            elementwise_affine=affine,
            bias=layout.bias,
            device="meta",
            dtype=layout.dtype,
        )
        return _take_parameters(new, source)

    return [(layer_norm, found)]


def _rms_norm_builders(audit: NormAudit, layout: _Layout, found: str) -> Builders:
    """normlab.RMSNorm for a mean-square norm with gain w or 1 + w and no bias, one candidate
    per casting of :data:`_RMS_CASTINGS`, the casting the audit found first."""
    affine = layout.affine
    if audit.statistic != "mean square" or (affine and audit.gain_form not in ("w", "1 + w")):
        raise Refused(
            f"{audit.statistic} with gain {_gain(audit, layout)}: normlab.RMSNorm is "
            "(o + w) ⊙ x·rsqrt(mean(x²) + ε)"
        )
    if layout.bias:
        raise Refused("an RMS norm with a bias: normlab.RMSNorm has none")
    offset = 1.0 if audit.gain_form == "1 + w" else 0.0
    preferred = (audit.casting or "").split(":")[0]

    def rms_norm(casting: str, promote: bool) -> Callable[[nn.Module], nn.Module]:
        def build(source: nn.Module) -> nn.Module:
            new = RMSNorm(
                layout.dim,
                layout.eps,
                affine,
                weight_offset=offset,
                casting=casting,
                promote_output=promote,
                device="meta",
                dtype=layout.dtype,
            )
            return _take_parameters(new, source)

        return build

    order = sorted(_RMS_CASTINGS, key=lambda cp: cp[0] != preferred)
    return [(rms_norm(casting, promote), found) for casting, promote in order]


def _eps_attribute(module: nn.Module) -> float | None:
    for attr in EPS_ATTRIBUTES:
        value = getattr(module, attr, None)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def _rounded_eps(estimate: float | None) -> float:
    """The audit's ε estimate to one significant digit (1e-05, 1e-06, 5e-06, …): an ε is a
    round number, and the verification's ε-sensitive rows reject a wrong one."""
    if estimate is None or not math.isfinite(estimate) or estimate <= 0:
        raise Refused(
            f"no ε attribute ({', '.join(EPS_ATTRIBUTES)}) holding a number >= 0, and the "
            "audit saw no effect of ε to estimate it from"
        )
    exponent = math.floor(math.log10(estimate))
    return float(f"{round(estimate / 10.0**exponent)}e{exponent}")


def _parameterless_width(module: nn.Module) -> int:
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if isinstance(shape, (tuple, list)) and len(shape) == 1 and isinstance(shape[0], int):
        return shape[0]
    raise Refused("no parameters, and no normalized_shape attribute of one dimension")


def _audit(module: nn.Module, dim: int) -> NormAudit:
    p = next(module.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")

    def call(x: torch.Tensor) -> torch.Tensor:  # the audit's [N, D] rows as [1, N, D] tokens
        y = module(x.to(device)[None])
        return (y[0] if isinstance(y, tuple) else y)[0].cpu()

    try:
        weight = module._parameters.get("weight")
        return audit_norm(call, dim, target=class_name(module), weight=weight)
    except Exception as err:  # the module's own error on [N, D] probe input
        raise Refused(f"the audit could not probe it: {type(err).__name__}: {err}") from None
