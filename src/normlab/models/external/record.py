"""What an arm did to a model's norms: which were swapped for the arm's kind, which were held
(each one a :class:`~normlab.patching.swap.SwappedNorm` or
:class:`~normlab.patching.swap.HeldNorm`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from normlab.patching.swap import HeldNorm, SwappedNorm

__all__ = ["HeldNorm", "NormSwapRecord", "SwappedNorm"]


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
