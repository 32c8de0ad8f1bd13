"""Put one arm's norm into every norm slot of a model that can take it; hold the rest.

This is the one implementation behind both ``normlab compare --model`` (each arm's model) and
``normlab.replace_norms(model, to=kind)``: the slots are :func:`normlab.patching.slots.norm_slots`
(whose checks decide which modules can be swapped and why the others are held), the new norms
are an :class:`~normlab.patching.arm.ArmNorm`'s.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from torch import nn

from normlab.patching.arm import ArmNorm
from normlab.patching.slots import norm_slots


@dataclass(frozen=True)
class SwappedNorm:
    """A norm slot that now holds the arm's norm: ``paths`` (every attribute path of the slot,
    relative to the user's model), ``original`` (the class it held, ``module.Class``; for a
    factory, the class the arm's make_norm built), ``kind`` and ``dim`` of the arm's norm, its
    ``eps`` (None: it has no ε attribute) and ``replacement``, the new module's repr."""

    paths: tuple[str, ...]
    original: str
    kind: str
    dim: int
    eps: float | None
    replacement: str

    def describe(self) -> str:
        eps = "" if self.eps is None else f", ε = {self.eps:g}"
        return f"{', '.join(self.paths)}: {self.original} → {self.kind} (dim {self.dim}{eps})"


@dataclass(frozen=True)
class HeldNorm:
    """A norm module kept as it is in every arm (its parameters are then shared by the arms and
    start equal): ``paths``, ``original`` class and ``reason``."""

    paths: tuple[str, ...]
    original: str
    reason: str

    def describe(self) -> str:
        return f"{', '.join(self.paths)}: {self.original} held ({self.reason})"


NewNorms = list[tuple[tuple[str, ...], nn.Module]]
"""The norms a swap puts in: (every path of the slot, the new module)."""


def swap_norms(model: nn.Module, arm: ArmNorm) -> tuple[list[SwappedNorm], list[HeldNorm]]:
    """Swap each norm slot of ``model`` (:func:`normlab.patching.slots.norm_slots`) for
    ``arm.build(D, ε, key=path)`` in place; return what was swapped and what was held
    (:func:`plan_swaps`, then :func:`put_norms`)."""
    swapped, held, new = plan_swaps(model, arm)
    put_norms(model, new)
    return swapped, held


def plan_swaps(
    model: nn.Module, arm: ArmNorm, only: Container[int] | None = None
) -> tuple[list[SwappedNorm], list[HeldNorm], NewNorms]:
    """What :func:`swap_norms` does, without changing ``model``: the slots that get the arm's
    norm, those held (with the reason), and the new norms to put in.

    D is the slot's vector size (its last dimension: the hidden size, or the head size of a
    per-head q/k norm), ε the slot's own where it has one. Which slots are swapped depends on
    the model alone, never on the arm, so every arm swaps the same places and holds the same
    modules. A module reached by several paths gets one new norm at all of them. The new norm
    takes the dtype and device of the slot's parameters, and the slot's training mode.
    ``only``: the ids of the norm modules to consider (the others are left out of all three).
    """
    swapped: list[SwappedNorm] = []
    held: list[HeldNorm] = []
    new_norms: NewNorms = []
    for slot in norm_slots(model):
        if only is not None and id(slot.module) not in only:
            continue
        if slot.held is not None:
            held.append(HeldNorm(slot.paths, slot.original, slot.held))
            continue
        assert slot.dim is not None  # a swappable slot has a width
        new = arm.build(slot.dim, slot.eps, key=slot.paths[0])
        p = next(slot.module.parameters(), None)
        if p is not None:
            new = new.to(device=p.device, dtype=p.dtype)
        new.train(slot.module.training)
        new_norms.append((slot.paths, new))
        built = arm.built[-1]
        swapped.append(
            SwappedNorm(slot.paths, slot.original, arm.kind, slot.dim, built.eps, module_repr(new))
        )
    return swapped, held, new_norms


def put_norms(model: nn.Module, new_norms: NewNorms) -> None:
    """Put each new norm at every path of its slot."""
    for paths, new in new_norms:
        for path in paths:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, new)


def module_repr(module: nn.Module) -> str:
    """``normlab.Layer(arguments)`` for a normlab module, ``package.module.Class(arguments)``
    otherwise."""
    cls = type(module)
    where = "normlab" if cls.__module__.startswith("normlab.") else cls.__module__
    return f"{where}.{cls.__name__}({module.extra_repr()})"
