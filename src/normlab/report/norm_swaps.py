"""The report's words on what each arm did to a user model's norm modules (the lm testbed):
from ``experiment.json``'s ``norm_swaps``, one paragraph per arm listing the modules swapped for
the arm's norm and those held fixed, with why."""

from __future__ import annotations

from typing import Any

__all__ = ["norm_swap_paragraphs"]

MAX_PATHS = 12
"""Module paths listed per arm and kind (swapped, held) before the rest are counted."""


def _paths(entries: list[dict[str, Any]]) -> list[str]:
    return [p for e in entries for p in e.get("paths", [])]


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_PATHS])
    more = len(paths) - MAX_PATHS
    return f"{shown} and {more} more" if more > 0 else shown


def norm_swap_paragraphs(experiment: dict[str, Any]) -> list[str]:
    """One paragraph per arm of ``experiment["norm_swaps"]`` ({arm: NormSwapRecord as a dict}):
    the source, the modules swapped (with the class they held and the norm's dim) and the
    modules held fixed with their reason; [] when the experiment has no such records."""
    records = experiment.get("norm_swaps")
    if not isinstance(records, dict) or not records:
        return []
    out = []
    for arm, record in records.items():
        if not isinstance(record, dict):
            continue
        swapped = record.get("swapped") or []
        held = record.get("held") or []
        originals = sorted({str(s.get("original")) for s in swapped})
        dims = sorted({int(s["dim"]) for s in swapped if isinstance(s.get("dim"), int)})
        text = f"Arm {arm} ({record.get('source')}): "
        if swapped:
            text += (
                f"{len(_paths(swapped))} norm modules swapped for {record.get('kind')} "
                f"(were {', '.join(originals)}; dim {', '.join(map(str, dims))}): "
                f"{_listed(_paths(swapped))}"
            )
        else:
            text += "no norm module swapped"
        if held:
            reasons = sorted({str(h.get("reason")) for h in held})
            text += (
                f"; {len(_paths(held))} held fixed, the same in every arm "
                f"({'; '.join(reasons)}): {_listed(_paths(held))}"
            )
        else:
            text += "; none held fixed"
        out.append(text + ".")
    return out
