"""The norm slots of a model: where a norm of another kind could take the place of its own.

:func:`norm_slots` finds the norm modules of a model with the machinery of
:func:`~normlab.patching.replace_norms` (:func:`normlab.audit.is_norm_module`: torch's
``LayerNorm`` / ``RMSNorm`` and any class whose name says it normalises) and says, for each,
whether a per-vector norm of width D, y = f(x) for every token's x ∈ R^D over the last
dimension, can stand in its place, or why not. Unlike ``replace_norms``, nothing is verified
against the original's function: the slot is for a norm of a *different* kind (a comparison's
arm), so only the place and the width must fit:

- the module maps [..., D] → [..., D] with one vector size D: torch's classes with a
  one-dimensional ``normalized_shape``; another class with a one-dimensional ``weight`` (and
  ``bias``) of D, or no parameters and a one-dimensional ``normalized_shape``;
- its forward takes the input only and returns one tensor of the input's shape, each token's
  output depending on that token alone (checked on a probe input [2, 3, D], and [2, 3, 2, D]
  for norms that run per head);
- a swap would drop nothing else: no hooks, no forward set on the instance, no parametrized
  parameters, no sub-modules or buffers.

Norms that fail are *held*: kept as they are, with the reason. A module without parameters of
its own that holds norm modules is no slot itself; each norm inside it is one. Norms inside a
held module are held with it, so that a held module keeps its whole function.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from normlab.audit.model import is_norm_module, takes_condition
from normlab.patching.candidates import (
    _HOOKS,
    _OTHER_AXES,
    _eps_attribute,
    _extra_inputs,
    class_name,
)
from normlab.patching.refusal import HoldsNorms, Refused

PROBE_SEED = 7  # the probe input's generator; torch's global generators are not touched


@dataclass(frozen=True)
class NormSlot:
    """One norm module of a model and whether a norm of another kind can take its place.

    ``paths``: every attribute path that reaches the module. ``dim``: the vector size D it
    normalises (None when held for its shape). ``eps``: its ε attribute (``eps``,
    ``variance_epsilon`` or ``epsilon``), None when it has none. ``held``: the reason it must
    stay as it is, None for a slot that can be swapped. ``module``: the module itself.
    """

    paths: tuple[str, ...]
    original: str
    dim: int | None
    eps: float | None
    held: str | None
    module: nn.Module

    @property
    def swappable(self) -> bool:
        """Whether a per-vector norm of width :attr:`dim` can take this module's place."""
        return self.held is None


def norm_slots(model: nn.Module) -> list[NormSlot]:
    """Every norm module of ``model`` as a :class:`NormSlot`, in ``named_modules`` order.

    Containers (no parameters of their own, norm modules inside) are left out; their norms are
    listed one by one. A norm inside a held norm is held too; the model itself, when it is a
    norm, is held (nothing holds it to swap it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    slots: list[NormSlot] = []
    held_inside: set[int] = set()
    for module, paths in norm_modules(model):
        eps = _eps_attribute(module)
        if id(module) in held_inside:
            slots.append(
                NormSlot(paths, class_name(module), None, eps, "inside a held norm", module)
            )
            continue
        if not paths:
            why = "it is the model itself: nothing holds it to swap it"
            slots.append(NormSlot(paths, class_name(module), None, eps, why, module))
            continue
        try:
            dim = slot_width(module)
        except HoldsNorms:
            continue
        except Refused as why:
            held_inside.update(id(m) for m in module.modules() if m is not module)
            slots.append(NormSlot(paths, class_name(module), None, eps, str(why), module))
            continue
        slots.append(NormSlot(paths, class_name(module), dim, eps, None, module))
    return slots


def norm_modules(model: nn.Module) -> Iterator[tuple[nn.Module, tuple[str, ...]]]:
    """Each norm module of ``model`` (:func:`normlab.audit.is_norm_module`) once, in
    ``named_modules`` order, with every path that reaches it ("" paths are left out)."""
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


def slot_width(module: nn.Module) -> int:
    """The vector size D a norm module works on, after checking that a per-vector norm of that
    size can take its place (see the module docstring); raises ``Refused`` saying why not
    (``HoldsNorms`` for a container of norms)."""
    _check_swappable(module)
    dim = _width(module)
    _check_per_token(module, dim)
    return dim


def _check_swappable(module: nn.Module) -> None:
    if isinstance(module, _OTHER_AXES):
        raise Refused(
            "normalises over the batch or over channel groups, not each token's last dimension"
        )
    if takes_condition(module):
        raise Refused("a conditional norm (its forward takes cond), not a per-vector norm")
    if any(getattr(module, attr, None) for attr in _HOOKS):
        raise Refused("it has hooks, which a swap would drop")
    extra = _extra_inputs(module)
    if extra:
        raise Refused(f"its forward takes {', '.join(extra)} besides the input")
    if "forward" in vars(module):
        raise Refused("its forward is set on the instance, which a swap would drop")
    if parametrize.is_parametrized(module):
        raise Refused("its parameters are parametrized, which a swap would drop")
    own = [p for p in module._parameters.values() if p is not None]
    if not own and any(is_norm_module(m) for m in module.modules() if m is not module):
        raise HoldsNorms("it holds norm modules of its own")
    if any(True for _ in module.children()) or any(True for _ in module.buffers()):
        raise Refused("it holds sub-modules or buffers, which a swap would drop")


def _width(module: nn.Module) -> int:
    """D from torch's one-dimensional ``normalized_shape``, a one-dimensional weight (and a
    bias of the same size), or, without parameters, a one-dimensional ``normalized_shape``."""
    params = {n: p for n, p in module._parameters.items() if p is not None}
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or not params:
        shape = getattr(module, "normalized_shape", None)
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape = (shape,)
        if not (isinstance(shape, (tuple, list)) and all(isinstance(s, int) for s in shape)):
            raise Refused("no parameters, and no normalized_shape attribute that gives its width")
        if len(shape) != 1:
            raise Refused(
                f"normalized_shape {tuple(shape)}: it normalises several trailing dimensions as "
                "one vector, not one vector size"
            )
        return int(shape[0])
    unexpected = sorted(set(params) - {"weight", "bias"})
    if unexpected:
        raise Refused(f"parameters other than weight and bias: {', '.join(unexpected)}")
    weight = params.get("weight")
    if weight is None:
        raise Refused("a bias without a weight")
    if weight.dim() != 1:
        raise Refused(
            f"weight of shape {tuple(weight.shape)}: a gain per head and channel, which a "
            "norm of one vector size cannot hold"
        )
    bias = params.get("bias")
    if bias is not None and tuple(bias.shape) != tuple(weight.shape):
        raise Refused(f"bias of shape {tuple(bias.shape)}, weight {tuple(weight.shape)}")
    return weight.numel()


def _check_per_token(module: nn.Module, dim: int) -> None:
    """One forward on [2, 3, D] (a per-head norm that refuses it: [2, 3, 2, D]) in the
    parameters' dtype and device: a tensor of the input's shape comes back, and changing one
    token changes no other token's output. Runs without gradients and in eval mode (restored)."""
    p = next(module.parameters(), None)
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    device = p.device if p is not None else torch.device("cpu")
    if device.type == "meta":
        raise Refused("parameters on the meta device: its forward cannot be probed")
    gen = torch.Generator().manual_seed(PROBE_SEED)
    was_training = module.training
    module.eval()
    try:
        errors = []
        for shape in ((2, 3, dim), (2, 3, 2, dim)):
            x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
            changed = x.clone()
            changed[0, 0] = torch.randn(shape[2:], generator=gen).to(device=device, dtype=dtype)
            try:
                with torch.no_grad():
                    y, y_changed = module(x), module(changed)
            except Exception as err:  # the module's own error on this layout
                errors.append(f"input {list(shape)}: {type(err).__name__}: {err}")
                continue
            if not isinstance(y, torch.Tensor):
                raise Refused(f"its forward returns {type(y).__name__}, not a tensor")
            if tuple(y.shape) != shape:
                raise Refused(
                    f"input {list(shape)} gave output {list(y.shape)}, not the same shape"
                )
            if not torch.equal(y[1], y_changed[1]) or not torch.equal(y[0, 1:], y_changed[0, 1:]):
                raise Refused("one token's output depends on other tokens: not a per-vector norm")
            return
        raise Refused("its forward takes neither probe input: " + "; ".join(errors))
    finally:
        module.train(was_training)
