"""Name → factory for norms, used by configs, models and the CLI.

``make_norm("rmsnorm", 768)`` builds a module; :func:`register_norm` adds a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm

NormFactory = Callable[..., nn.Module]

_REGISTRY: dict[str, NormFactory] = {}


def register_norm(kind: str, factory: NormFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(dim, **kw) -> nn.Module`` under ``kind``."""
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ValueError(f"kind: expected an identifier-like name, got {kind!r}")
    if not callable(factory):
        raise TypeError(f"factory: expected a callable, got {type(factory).__name__}")
    if kind in _REGISTRY and not overwrite:
        raise ValueError(f"kind: {kind!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[kind] = factory


def available_norms() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_REGISTRY)


def make_norm(kind: str, dim: int, **kwargs: Any) -> nn.Module:
    """Build the norm ``kind`` for vectors of size ``dim``; ``kwargs`` go to its constructor."""
    try:
        factory = _REGISTRY[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f"kind: unknown norm {kind!r}; expected one of {', '.join(available_norms())}"
        ) from None
    return factory(dim, **kwargs)


def is_conditional(kind: str) -> bool:
    """Whether ``kind`` takes a condition (its forward is ``(x, cond) -> (y, gate)``)."""
    return kind in _CONDITIONAL


_CONDITIONAL = {"adarms", "adaln_zero"}

register_norm("layernorm", LayerNorm)
register_norm("layernorm_nobias", lambda dim, **kw: LayerNorm(dim, bias=False, **kw))
register_norm("rmsnorm", RMSNorm)
register_norm(
    "rmsnorm_gemma",
    lambda dim, **kw: RMSNorm(dim, **{"weight_offset": 1.0, "casting": "gemma", **kw}),
)
register_norm("adarms", AdaRMSNorm)
register_norm("adaln_zero", AdaLayerNormZero)
