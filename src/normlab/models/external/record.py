"""What an arm did to a model's norms: which were swapped for the arm's kind, which were held."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class NormSwapRecord:
    """One arm's norms on a model source: ``source`` (as given to ``--model``), the arm's
    ``kind`` (None: the model's own norms, nothing swapped), ``swapped`` and ``held`` in the
    order of the model's modules, and ``settings``: what the source was built with (the
    ``--model-set`` values and the vocabulary size)."""

    source: str
    kind: str | None
    swapped: tuple[SwappedNorm, ...]
    held: tuple[HeldNorm, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> list[str]:
        """One line per norm module: swapped ones first, then the held ones."""
        return [s.describe() for s in self.swapped] + [h.describe() for h in self.held]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as lists)."""
        return asdict(self)

    @property
    def swapped_paths(self) -> tuple[str, ...]:
        """Every attribute path that holds one of the arm's norms."""
        return tuple(p for s in self.swapped for p in s.paths)
