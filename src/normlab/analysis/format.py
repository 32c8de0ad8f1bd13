"""Number formatting shared by the verdict texts and the report."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "NO_INTERVAL",
    "fmt_bytes",
    "fmt_interval",
    "fmt_num",
    "fmt_p",
    "fmt_ratio",
    "fmt_signed",
    "with_interval",
]

NO_INTERVAL = "no interval"
"""What stands in an interval's place when it has no ends (fewer than two pairs)."""


def _bad(v: float | None) -> bool:
    return v is None or not math.isfinite(v)


def fmt_num(v: float | None, digits: int = 4) -> str:
    """``v`` with ``digits`` decimals, or an em dash when missing."""
    return "—" if _bad(v) else f"{v:.{digits}f}"


def fmt_signed(v: float | None, digits: int = 4) -> str:
    """``v`` with an explicit sign (``+0.0031``; U+2212 for minus), or an em dash."""
    if _bad(v):
        return "—"
    assert v is not None
    text = f"{v:+.{digits}f}"
    return text.replace("-", "\u2212")


def fmt_ratio(v: float | None, digits: int = 3) -> str:
    """A ratio as ``1.083×``, or an em dash."""
    return "—" if _bad(v) else f"{v:.{digits}f}×"


def fmt_p(p: float | None) -> str:
    """A p-value: ``p < 0.001`` or ``p = 0.034``; an em dash when missing."""
    if _bad(p):
        return "—"
    assert p is not None
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def fmt_bytes(v: float | None) -> str:
    """A byte count in MiB or GiB (binary units), or an em dash."""
    if _bad(v):
        return "—"
    assert v is not None
    mib = v / 2**20
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib:.1f} MiB"


def _has_interval(low: float | None, high: float | None) -> bool:
    return not (_bad(low) or _bad(high))


def fmt_interval(
    low: float | None,
    high: float | None,
    fmt: Callable[[float | None], str] = fmt_signed,
    *,
    label: str = "",
    to: bool = False,
) -> str:
    """An interval for a sentence: ``label [low, high]`` (``95% CI [−0.0012, +0.0034]``), or
    with ``to`` ``label low to high``, each end written by ``fmt``; :data:`NO_INTERVAL` when
    either end is missing or not finite, the label then left out (it names an interval that
    is not there: never "95% CI no interval")."""
    if not _has_interval(low, high):
        return NO_INTERVAL
    ends = f"{fmt(low)} to {fmt(high)}" if to else f"[{fmt(low)}, {fmt(high)}]"
    return f"{label} {ends}" if label else ends


def with_interval(
    value: str,
    low: float | None,
    high: float | None,
    fmt: Callable[[float | None], str] = fmt_signed,
) -> str:
    """A table cell: ``value [low, high]``, or ``value`` alone when there is no interval."""
    if not _has_interval(low, high):
        return value
    return f"{value} {fmt_interval(low, high, fmt)}"
