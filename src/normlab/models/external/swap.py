"""Put one arm's norm into every norm slot of a model that can take it; hold the rest."""

from __future__ import annotations

from torch import nn

from normlab.models.external.arm import ArmNorm
from normlab.models.external.record import HeldNorm, SwappedNorm
from normlab.patching.slots import norm_slots


def swap_norms(model: nn.Module, arm: ArmNorm) -> tuple[list[SwappedNorm], list[HeldNorm]]:
    """Swap each norm slot of ``model`` (:func:`normlab.patching.slots.norm_slots`) for
    ``arm.build(D, ε, key=path)`` in place; return what was swapped and what was held.

    D is the slot's vector size (its last dimension: the hidden size, or the head size of a
    per-head q/k norm), ε the slot's own where it has one. Which slots are swapped depends on
    the model alone, never on the arm, so every arm swaps the same places and holds the same
    modules. A module reached by several paths gets one new norm at all of them. The new norm
    takes the dtype and device of the slot's parameters.
    """
    swapped: list[SwappedNorm] = []
    held: list[HeldNorm] = []
    for slot in norm_slots(model):
        if slot.held is not None:
            held.append(HeldNorm(slot.paths, slot.original, slot.held))
            continue
        assert slot.dim is not None  # a swappable slot has a width
        new = arm.build(slot.dim, slot.eps, key=slot.paths[0])
        p = next(slot.module.parameters(), None)
        if p is not None:
            new = new.to(device=p.device, dtype=p.dtype)
        new.train(slot.module.training)
        for path in slot.paths:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent), name, new)
        built = arm.built[-1]
        swapped.append(
            SwappedNorm(slot.paths, slot.original, arm.kind, slot.dim, built.eps, module_repr(new))
        )
    return swapped, held


def module_repr(module: nn.Module) -> str:
    """``normlab.Layer(arguments)`` for a normlab module, ``package.module.Class(arguments)``
    otherwise."""
    cls = type(module)
    where = "normlab" if cls.__module__.startswith("normlab.") else cls.__module__
    return f"{where}.{cls.__name__}({module.extra_repr()})"
