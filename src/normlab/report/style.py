"""Colours and matplotlib settings shared by every plot of the report.

Figures are drawn on :class:`matplotlib.figure.Figure` with the Agg canvas directly, never
through ``pyplot``, so building a report neither needs a display nor changes the global backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import matplotlib

__all__ = ["ARM_PALETTE", "arm_colors", "plot_style"]

ARM_PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#7F7F7F",  # grey
    "#000000",  # black
)
"""Okabe–Ito colours: distinguishable with the common colour-vision deficiencies."""

_RC = {
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e3e3",
    "grid.linewidth": 0.7,
    "legend.frameon": False,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
}


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    """One colour per arm, in the experiment's arm order (cycling past eight arms)."""
    return {arm: ARM_PALETTE[i % len(ARM_PALETTE)] for i, arm in enumerate(arms)}


@contextmanager
def plot_style() -> Iterator[None]:
    """Apply the report's matplotlib settings inside a ``with`` block."""
    with matplotlib.rc_context(_RC):
        yield
