"""The norm of one arm, built for each slot of a model.

:class:`ArmNorm` is the ``make_norm(dim, eps=None)`` an arm hands to a model: the registered
kind ``kind`` (:func:`normlab.make_norm`, custom kinds included) for vectors of size ``dim``, or
the identity for ``"none"`` (:data:`NO_NORM`). ``normlab compare --model`` builds one per arm,
and so does ``replace_norms(model, to=kind)`` (:mod:`normlab.patching.swap` puts it into the
model's norm slots). Each norm is built inside a forked random state seeded from the kind and a
key (the slot's path, or the call's index), so that

- building it draws nothing from the caller's random stream: the parameters the arms share
  start from the same values whatever norm each arm builds between them;
- its own parameters start as the kind initialises them, the same in every seed.

With ``eps`` given and a built norm that has an ``eps`` attribute of another value, the norm is
built again with ``eps=eps``: every arm then runs with the model's own ε.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from normlab._seeds import parameter_seed
from normlab.registry import available_norms, is_conditional, make_norm

NO_NORM = "none"
"""The kind that puts no norm in a slot: the identity."""

NORM_SEED = 0
"""The seed behind every arm norm's own initialisation (with the kind and the key), the same
for every run seed."""


def slot_norm_kinds() -> list[str]:
    """Kinds a model's norm slots accept: the unconditional registered kinds, plus ``"none"``."""
    return sorted([k for k in available_norms() if not is_conditional(k)] + [NO_NORM])


def check_slot_norm(kind: object, name: str = "norm") -> str:
    """``kind`` names an unconditional registered norm or ``"none"``; errors start
    ``{name}:`` (the argument that gave it)."""
    if not isinstance(kind, str):
        raise ValueError(f"{name}: expected a norm name (str), got {type(kind).__name__} {kind!r}")
    if kind == NO_NORM:
        return kind
    if kind not in available_norms():
        raise ValueError(
            f"{name}: unknown norm {kind!r}; expected one of {', '.join(slot_norm_kinds())} "
            "(register your own with normlab.register_norm)"
        )
    if is_conditional(kind):
        raise ValueError(
            f"{name}: {kind!r} is a conditional norm (its forward takes a condition); a norm "
            f"slot takes x only. Expected one of {', '.join(slot_norm_kinds())}"
        )
    return kind


def forked_rng() -> contextlib.AbstractContextManager[None]:
    """torch's random state forked: the CPU generator, and the CUDA ones once CUDA is in use;
    whatever runs inside leaves the caller's streams as they were."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=cuda)


@dataclass(frozen=True)
class BuiltNorm:
    """One norm an :class:`ArmNorm` built: the module, its width, ε and the key it was seeded
    with."""

    module: nn.Module
    dim: int
    eps: float | None
    key: str


class ArmNorm:
    """``make_norm(dim, eps=None) -> nn.Module`` for one arm's kind; remembers what it built."""

    def __init__(self, kind: str) -> None:
        self.kind = check_slot_norm(kind)
        self.built: list[BuiltNorm] = []

    def __call__(self, dim: int, eps: float | None = None) -> nn.Module:
        """The arm's norm for vectors of size ``dim`` (ε = ``eps`` where the norm has one)."""
        return self.build(dim, eps, key=f"call{len(self.built)}")

    def build(self, dim: int, eps: float | None, key: str) -> nn.Module:
        """As calling it, seeded by ``key`` (a slot's path) instead of the call's index."""
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))):
            raise ValueError(f"eps: expected a float or None, got {eps!r}")
        with forked_rng():
            torch.manual_seed(parameter_seed(NORM_SEED, f"{self.kind}:{key}"))
            module = self._make(dim, eps)
        used = getattr(module, "eps", None)
        used = (
            float(used) if isinstance(used, (int, float)) and not isinstance(used, bool) else None
        )
        self.built.append(BuiltNorm(module, dim, used, key))
        return module

    def _make(self, dim: int, eps: float | None) -> nn.Module:
        if self.kind == NO_NORM:
            return nn.Identity()
        module = make_norm(self.kind, dim)
        if eps is not None and hasattr(module, "eps") and module.eps != eps:
            module = make_norm(self.kind, dim, eps=float(eps))
        return module
