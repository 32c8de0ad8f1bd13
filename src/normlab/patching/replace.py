"""replace_norms: walk a model, decide each norm module's replacement, swap them in (the same
function, verified; or, with ``to``, another kind of norm in every norm slot)."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from normlab._checks import check_bool
from normlab.patching.arm import ArmNorm, check_slot_norm
from normlab.patching.candidates import (
    NORMLAB_MODULES,
    Builders,
    class_name,
    replacement_for,
    short_repr,
)
from normlab.patching.refusal import HoldsNorms, Refused
from normlab.patching.slots import norm_modules
from normlab.patching.swap import SwappedNorm, plan_swaps, put_norms


@dataclass(frozen=True)
class NormReplacement:
    """What :func:`replace_norms` did with one norm module.

    ``names``: every attribute path that reaches the module (one module may sit in several
    places). ``replacement``: the normlab module that replaced it (or would, with ``dry_run``),
    None when the original is kept, with ``reason`` saying why. ``max_error``: per probe dtype,
    the largest |y_normlab − y_original| relative to max |y_original| (empty with ``to``: the
    new norm computes another function). With ``to``: ``dim``, the slot's width D, and
    ``eps``, the new norm's ε (None when it has no ε attribute); both None otherwise.
    """

    names: tuple[str, ...]
    original: str
    replacement: str | None
    replaced: bool
    reason: str
    max_error: dict[str, float] = field(default_factory=dict)
    dim: int | None = None
    eps: float | None = None

    def describe(self) -> str:
        """One line: ``name: Original -> replacement`` or ``name: Original kept (reason)``."""
        where = ", ".join(self.names)
        if self.replacement is None:
            return f"{where}: {self.original} kept ({self.reason})"
        done = "replaced by" if self.replaced else "would be replaced by"
        return f"{where}: {self.original} {done} {self.replacement} ({self.reason})"


def replace_norms(
    model: nn.Module,
    *,
    to: str | None = None,
    dry_run: bool = False,
    strict: bool = False,
    names: Iterable[str] | None = None,
) -> list[NormReplacement]:
    """Swap every norm module of ``model`` for the normlab layer that computes the same function,
    or, with ``to``, put the norm ``to`` into every norm slot that can take it.

    Returns one :class:`NormReplacement` per norm module found, in the order of
    ``model.named_modules()``. ``dry_run``: decide and verify, but change nothing. ``strict``:
    raise ``ValueError`` (before anything is changed) if some norm module would be kept, other
    than one that already is normlab's or one that only holds other norm modules (each of those
    is reported on its own). ``names``: only the norm modules at or under these attribute paths
    (``ValueError`` for a path that names no module or holds no norm module).

    ``to``: a registered unconditional norm kind (:func:`normlab.available_norms`, e.g.
    ``"rmsnorm"`` or ``normlab.track``'s ``run.norm``) or ``"none"`` (the identity). Every norm
    slot (:func:`normlab.patching.slots.norm_slots`: a per-token norm of one width D, nothing a
    swap would drop) gets ``make_norm(to, D, eps=ε)`` with the slot's own ε where it has one,
    in the dtype and device of the slot's parameters, built in a forked random state seeded by
    the kind and the slot's path (:class:`normlab.patching.arm.ArmNorm`): exactly what
    ``normlab compare --model`` does to each arm's model, so that, for a seed, every parameter
    outside the norms stays as it was and the random streams after the call are the same
    whatever ``to`` is. The other norm modules are kept and reported with the reason (held);
    ``strict`` refuses any held one. A module that only holds norm modules is not reported
    (each norm inside it is).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if to is not None:
        to = check_slot_norm(to, "to")
    dry_run = check_bool(dry_run, "dry_run")
    strict = check_bool(strict, "strict")
    found = list(norm_modules(model))
    wanted = _wanted_modules(model, names, {id(m) for m, _ in found})
    if to is not None:
        return _into_slots(model, to, found, dry_run, strict, wanted)
    results: list[tuple[NormReplacement, nn.Module | None, bool]] = []
    cache: dict[tuple, Builders | Refused] = {}
    with _isolated(model):
        for module, paths in found:
            if wanted is not None and id(module) not in wanted:
                continue
            if not paths:  # the model itself is a norm: nothing holds it to swap it in
                why = "it is the model itself: use normlab's layer"
                results.append(
                    (_kept(module, paths, why), None, not isinstance(module, NORMLAB_MODULES))
                )
                continue
            try:
                candidate, how, errors = replacement_for(module, cache)
            except Refused as why:
                counts = not isinstance(why, HoldsNorms) and not isinstance(module, NORMLAB_MODULES)
                results.append((_kept(module, paths, str(why)), None, counts))
                continue
            report = NormReplacement(
                names=paths,
                original=class_name(module),
                replacement=short_repr(candidate),
                replaced=not dry_run,
                reason=how,
                max_error=errors,
            )
            results.append((report, candidate, False))
    if strict:
        kept = [r for r, _, counts in results if counts]
        if kept:
            lines = "; ".join(r.describe() for r in kept)
            raise ValueError(f"model: {len(kept)} norm module(s) cannot be replaced: {lines}")
    if not dry_run:
        for report, candidate, _ in results:
            if candidate is not None:
                for path in report.names:
                    _put(model, path, candidate)
    return [r for r, _, _ in results]


def _into_slots(
    model: nn.Module,
    kind: str,
    found: list[tuple[nn.Module, tuple[str, ...]]],
    dry_run: bool,
    strict: bool,
    wanted: set[int] | None,
) -> list[NormReplacement]:
    """``replace_norms(model, to=kind)``: every wanted norm slot gets the kind's norm
    (:func:`normlab.patching.swap.plan_swaps`), the others are reported as kept."""
    swapped, held, new_norms = plan_swaps(model, ArmNorm(kind), only=wanted)
    if strict and held:
        lines = "; ".join(h.describe() for h in held)
        raise ValueError(f"model: {len(held)} norm module(s) cannot take {kind!r}: {lines}")
    if not dry_run:
        put_norms(model, new_norms)
    reports = {s.paths: _slot_report(s, not dry_run) for s in swapped}
    reports.update(
        {h.paths: NormReplacement(h.paths, h.original, None, False, h.reason) for h in held}
    )
    return [reports[paths] for _, paths in found if paths in reports]


def _slot_report(slot: SwappedNorm, replaced: bool) -> NormReplacement:
    eps = "no ε" if slot.eps is None else f"ε = {slot.eps:g}"
    return NormReplacement(
        names=slot.paths,
        original=slot.original,
        replacement=slot.replacement,
        replaced=replaced,
        reason=f"norm slot of width {slot.dim}, {eps}",
        dim=slot.dim,
        eps=slot.eps,
    )


@contextlib.contextmanager
def _isolated(model: nn.Module) -> Iterator[None]:
    """Probe without side effects: torch's RNG states restored afterwards, autograd on (also
    under ``torch.no_grad`` / ``torch.inference_mode``), dtype-mismatch notices silenced."""
    cuda = sorted(
        {
            t.device.index
            for t in itertools.chain(model.parameters(), model.buffers())
            if t.device.type == "cuda" and t.device.index is not None
        }
    )
    with (
        torch.random.fork_rng(devices=cuda),
        torch.inference_mode(False),
        torch.enable_grad(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # torch's dtype-mismatch notices are expected here
        yield


def _wanted_modules(
    model: nn.Module, names: Iterable[str] | None, norms: set[int]
) -> set[int] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise TypeError("names: expected an iterable of attribute paths, got a single str")
    wanted: set[int] = set()
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"names: expected attribute paths (str), got {type(name).__name__}")
        try:
            sub = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"names: {name!r} names no sub-module of the model") from None
        under = {id(m) for m in sub.modules()} & norms
        if not under:
            raise ValueError(f"names: {name!r} is not a norm module and holds none")
        wanted |= under
    return wanted


def _kept(module: nn.Module, paths: tuple[str, ...], reason: str) -> NormReplacement:
    return NormReplacement(paths, class_name(module), None, False, reason)


def _put(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at the attribute path ``path`` of ``model``."""
    parent_path, _, child_name = path.rpartition(".")
    setattr(model.get_submodule(parent_path), child_name, new)
