"""replace_norms: walk a model, decide each norm module's replacement, swap them in."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from normlab._checks import check_bool
from normlab.audit.model import is_norm_module
from normlab.patching.candidates import (
    NORMLAB_MODULES,
    Builders,
    class_name,
    replacement_for,
    short_repr,
)
from normlab.patching.refusal import HoldsNorms, Refused


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
    than one that already is normlab's or one that only holds other norm modules (each of those
    is reported on its own). ``names``: only the norm modules at or under these attribute paths
    (``ValueError`` for a path that names no module or holds no norm module).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    dry_run = check_bool(dry_run, "dry_run")
    strict = check_bool(strict, "strict")
    found = list(_norm_modules(model))
    wanted = _wanted_modules(model, names, {id(m) for m, _ in found})
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
    return NormReplacement(paths, class_name(module), None, False, reason)


def _put(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put ``new`` at the attribute path ``path`` of ``model``."""
    parent_path, _, child_name = path.rpartition(".")
    setattr(model.get_submodule(parent_path), child_name, new)
