"""Name → factory for norms, used by configs, models and the CLI.

``make_norm("rmsnorm", 768)`` builds a module; :func:`register_norm` adds a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from normlab._checks import check_bool
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm

NormFactory = Callable[..., nn.Module]

_REGISTRY: dict[str, NormFactory] = {}
_CONDITIONAL: set[str] = set()


def register_norm(
    kind: str, factory: NormFactory, *, overwrite: bool = False, conditional: bool = False
) -> None:
    """Register ``factory(dim, **kw) -> nn.Module`` under ``kind``.

    ``conditional=True`` marks a norm whose forward is ``(x, cond) -> (y, gate)`` (its factory
    then takes ``cond_dim``), see :func:`is_conditional`.
    """
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"kind: expected an identifier-like name, got {kind!r}")
    if not callable(factory):
        raise TypeError(f"factory: expected a callable, got {type(factory).__name__}")
    overwrite = check_bool(overwrite, "overwrite")
    conditional = check_bool(conditional, "conditional")
    if kind in _REGISTRY and not overwrite:
        raise ValueError(
            f"kind: {kind!r} is already registered; expected a new name or overwrite=True"
        )
    _REGISTRY[kind] = factory
    if conditional:
        _CONDITIONAL.add(kind)
    else:
        _CONDITIONAL.discard(kind)


def available_norms() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_REGISTRY)


def _factory(kind: object) -> NormFactory:
    try:
        return _REGISTRY[kind]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(
            f"kind: unknown norm {kind!r}; expected one of {', '.join(available_norms())}"
        ) from None


def make_norm(kind: str, dim: int, **kwargs: Any) -> nn.Module:
    """Build the norm ``kind`` for vectors of size ``dim``; ``kwargs`` go to its constructor."""
    return _factory(kind)(dim, **kwargs)


def is_conditional(kind: str) -> bool:
    """Whether ``kind`` takes a condition (its forward is ``(x, cond) -> (y, gate)``)."""
    _factory(kind)
    return kind in _CONDITIONAL


def _rmsnorm_gemma(dim: int, **kw: Any) -> RMSNorm:
    """RMSNorm with the Gemma gain 1 + w and Gemma casting (both can be overridden)."""
    return RMSNorm(dim, **{"weight_offset": 1.0, "casting": "gemma", **kw})


def _layernorm_nobias(dim: int, **kw: Any) -> LayerNorm:
    """LayerNorm with a gain and no bias."""
    return LayerNorm(dim, bias=False, **kw)


register_norm("layernorm", LayerNorm)
register_norm("layernorm_nobias", _layernorm_nobias)
register_norm("rmsnorm", RMSNorm)
register_norm("rmsnorm_gemma", _rmsnorm_gemma)
register_norm("adarms", AdaRMSNorm, conditional=True)
register_norm("adaln_zero", AdaLayerNormZero, conditional=True)
