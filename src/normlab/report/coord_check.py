"""The coordinate check's figure, drawn from its JSON (``CoordCheck.to_dict`` of
:mod:`normlab.models.coord_check`): one panel per layer, activation size against width on log-log
axes, one line per training step."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from normlab.report.plots import figure_png
from normlab.report.style import plot_style

__all__ = ["plot_coord_check"]

MAX_COLUMNS = 4


def plot_coord_check(data: Mapping[str, Any]) -> bytes:
    """PNG bytes: for each layer, mean |x| vs width (log-log), a line per step coloured from
    dark (step 1, the initialisation) to light (the last step); each panel's title gives the
    slope of log size vs log width at the last step."""
    widths = data["widths"]
    layers = list(data["sizes"])
    steps = int(data["steps"])
    ncols = min(MAX_COLUMNS, len(layers))
    nrows = math.ceil(len(layers) / ncols)
    cmap = matplotlib.colormaps["viridis"]
    with plot_style():
        fig = Figure(figsize=(3.2 * ncols, 2.7 * nrows + 0.6), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, layer in zip(axes, layers, strict=False):
            for t, row in enumerate(data["sizes"][layer]):
                color = cmap(t / max(1, steps - 1) * 0.9)
                ax.plot(widths, row, marker="o", markersize=3, color=color, label=f"step {t + 1}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(widths, [str(w) for w in widths])
            ax.set_title(f"{layer}  (slope {data['slopes'][layer][-1]:+.2f})", fontsize=10)
            ax.set_xlabel("d_model")
            ax.set_ylabel("mean |x|")
        for ax in axes[len(layers) :]:
            ax.set_visible(False)
        handles, labels = axes[0].get_legend_handles_labels()
        keep = sorted({0, steps // 2, steps - 1})
        fig.legend(
            [handles[i] for i in keep],
            [labels[i] for i in keep],
            loc="outside lower center",
            ncol=len(keep),
            fontsize=9,
        )
        verdict = "flat" if data["flat"] else "not flat"
        fig.suptitle(
            f"coordinate check, {data['parametrization']} (base d_model {data['base_d_model']}, "
            f"lr {data['lr']:g}): {verdict} (flat: every |slope| after step 1 ≤ "
            f"{data['threshold']:g}; the logits may shrink)",
            x=0.01,
            ha="left",
            fontsize=11,
            fontweight="bold",
        )
        return figure_png(fig)
