"""The norm slots of the testbeds: the GPT's (any unconditional registered kind, ``dyt`` or
``none``) and the DiT's (any conditional registered kind).

Importing this module registers ``"dyt"`` (:class:`normlab.layers.DynamicTanh`) with
:func:`normlab.register_norm`, so ``make_norm("dyt", D)`` works once ``normlab.models`` is
imported.
"""

from __future__ import annotations

from torch import nn

from normlab.layers.dyt import DynamicTanh
from normlab.registry import available_norms, is_conditional, make_norm, register_norm

NO_NORM = "none"

if "dyt" not in available_norms():
    register_norm("dyt", DynamicTanh)


def model_norm_kinds() -> list[str]:
    """Kinds a testbed accepts: the unconditional registered kinds, plus ``"none"``."""
    return sorted([k for k in available_norms() if not is_conditional(k)] + [NO_NORM])


def check_model_norm(kind: object) -> str:
    """``kind`` must name an unconditional registered norm or ``"none"``."""
    if not isinstance(kind, str):
        raise TypeError(f"norm: expected a norm name (str), got {type(kind).__name__} {kind!r}")
    if kind == NO_NORM:
        return kind
    if kind not in available_norms():
        raise ValueError(
            f"norm: unknown norm {kind!r}; expected one of {', '.join(model_norm_kinds())} "
            "(register your own with normlab.register_norm)"
        )
    if is_conditional(kind):
        raise ValueError(
            f"norm: {kind!r} is a conditional norm (it needs a condition vector); the GPT "
            f"testbed has none. Expected one of {', '.join(model_norm_kinds())}"
        )
    return kind


def dit_norm_kinds() -> list[str]:
    """Norm kinds the DiT accepts: the registered conditional kinds (``adaln_zero``, ``adarms``)."""
    return sorted(k for k in available_norms() if is_conditional(k))


def check_dit_norm(kind: object) -> str:
    """``kind`` must name a conditional registered norm (its forward is ``(x, cond) -> (y, g)``)."""
    if not isinstance(kind, str):
        raise TypeError(f"norm: expected a norm name (str), got {type(kind).__name__} {kind!r}")
    kinds = ", ".join(dit_norm_kinds())
    if kind not in available_norms():
        raise ValueError(
            f"norm: unknown norm {kind!r}; expected a conditional norm: one of {kinds} "
            "(register your own with normlab.register_norm(..., conditional=True))"
        )
    if not is_conditional(kind):
        raise ValueError(
            f"norm: {kind!r} takes no condition; the DiT modulates every norm with the time "
            f"(and label) embedding. Expected a conditional norm: one of {kinds}"
        )
    return kind


def make_model_norm(
    kind: str, dim: int, eps: float | None = None, dyt_alpha_init: float = 0.5
) -> nn.Module:
    """Build one norm slot of a testbed.

    ``"none"`` is the identity. ``"dyt"`` gets ``alpha_init=dyt_alpha_init``. Any other kind is
    built with :func:`normlab.make_norm`; when ``eps`` is given and the built norm has an ``eps``
    attribute, it is built with that ε, so every arm of a comparison can share one ε. ``kind``
    is one :class:`normlab.models.GPTConfig` validated.
    """
    if kind == NO_NORM:
        return nn.Identity()
    if kind == "dyt":
        return make_norm(kind, dim, alpha_init=dyt_alpha_init)
    norm = make_norm(kind, dim)
    if eps is not None and hasattr(norm, "eps") and norm.eps != eps:
        norm = make_norm(kind, dim, eps=eps)
    return norm
