"""A count said with its noun: ``1 seed``, ``3 seeds``. Every sentence that states a count of
things (seeds, runs, arms, steps, …) writes it through :func:`counted`, so no line reads
"1 seeds"."""

from __future__ import annotations

__all__ = ["counted", "noun"]


def noun(n: int, singular: str, plural: str | None = None) -> str:
    """``singular`` when ``n`` is 1 (or −1), else ``plural`` (``singular`` + "s" unless
    given): the noun alone, for "1 of 3 runs" where the count and the noun are apart."""
    if abs(n) == 1:
        return singular
    return plural if plural is not None else f"{singular}s"


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and its noun: ``counted(1, "seed")`` is ``1 seed``, ``counted(3, "paired seed")``
    ``3 paired seeds``, ``counted(0, "run")`` ``0 runs``."""
    return f"{n} {noun(n, singular, plural)}"
