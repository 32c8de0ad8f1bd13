"""Number formatting shared by the verdict texts and the report."""

from __future__ import annotations

import math

__all__ = ["fmt_bytes", "fmt_num", "fmt_p", "fmt_ratio", "fmt_signed"]


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
