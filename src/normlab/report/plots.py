"""The report's plots, drawn from the curves on disk and from the analysis dict.

Every function returns a :class:`matplotlib.figure.Figure` on an Agg canvas; :func:`figure_png`
turns it into PNG bytes. Colours come from :func:`normlab.report.style.arm_colors`, so an arm has
the same colour in every plot.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from normlab._plural import counted
from normlab.analysis.health import (
    CHECKED_XHAT_MS,
    HEALTH_TOLERANCE,
    health_matrix,
    xhat_ms_off,
)
from normlab.analysis.ladder import Rung, predict_ladder
from normlab.analysis.stats import t_interval
from normlab.report.curves import Band, RunCurves, band_over_seeds, moving_average
from normlab.report.style import plot_style
from normlab.run_format import GRAD_ANOMALIES, LOSS_ANOMALIES, TestbedFormat, testbed_format

__all__ = [
    "HEALTH_FLAG_PANEL",
    "HEALTH_PANELS",
    "HealthPanel",
    "figure_png",
    "plot_final_metrics",
    "plot_grad_norm",
    "plot_ladder",
    "plot_ladder_losses",
    "plot_lr_sweep",
    "plot_norm_health",
    "plot_paired_comparison",
    "plot_samples",
    "plot_training_loss",
    "plot_val_bpb",
    "plot_validation",
    "smoothing_window",
]

CurvesByArm = Mapping[str, Sequence[RunCurves]]


def figure_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes (white background, tight bounding box)."""
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.15, facecolor="white")
    return buf.getvalue()


def _figure(
    width: float,
    height: float,
    ncols: int = 1,
    ratios: Sequence[float] | None = None,
    nrows: int = 1,
):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, width_ratios=ratios, squeeze=False)
    return fig, list(axes.ravel())


def _title(fig: Figure, text: str) -> None:
    """A figure-wide title, left-aligned above every panel (panel titles stay short, so two
    side-by-side panels never run their titles into each other)."""
    fig.suptitle(text, x=0.01, ha="left", fontsize=11, fontweight="bold")


def _outside_legend(fig: Figure, handles: list, labels: list[str]) -> None:
    """The legend below the panels, outside every axes, so it never covers a curve or marker;
    up to three entries per row so long arm names do not run past the figure."""
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(handles)))


def _wrap_name(name: str, width: int = 14) -> str:
    """An arm name broken into lines of about ``width`` characters at ``-``, ``_`` or ``.``."""
    if len(name) <= width:
        return name
    lines, line = [], ""
    for part in re.split(r"(?<=[-_.])", name):
        while len(part) > width:  # one long piece without separators: cut it
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:width])
            part = part[width:]
        if line and len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    if line:
        lines.append(line)
    return "\n".join(lines)


def _labels_overlap(fig: Figure, labels: Sequence[Any]) -> bool:
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def smoothing_window(curves: CurvesByArm) -> int:
    """Moving-average window for per-step curves: 1 up to 200 steps, then about 1 % of steps."""
    longest = max((c.train_steps.size for runs in curves.values() for c in runs), default=0)
    return 1 if longest <= 200 else max(3, longest // 100) | 1


def _n_runs(runs: Sequence[RunCurves]) -> int:
    return sum(1 for c in runs if c.train_steps.size or c.eval_steps.size)


def _draw_band(ax: Axes, band: Band, color: str, label: str, marker: str | None = None) -> None:
    if band.steps.size == 0:
        return
    ax.fill_between(band.steps, band.low, band.high, color=color, alpha=0.18, linewidth=0)
    ax.plot(
        band.steps,
        band.mean,
        color=color,
        linewidth=1.8,
        label=label,
        marker=marker,
        markersize=3.5,
    )


def _zoom(ax: Axes, bands: Sequence[Band], start: float, log: bool = False) -> None:
    """Limit ``ax`` to steps ≥ ``start`` and fit the y-range to the bands there."""
    lows, highs, stop = [], [], start
    for b in bands:
        sel = b.steps >= start
        if sel.any():
            lows.append(np.nanmin(b.low[sel]))
            highs.append(np.nanmax(b.high[sel]))
            stop = max(stop, float(b.steps[sel].max()))
    if not lows:
        return
    lo, hi = float(min(lows)), float(max(highs))
    if log and lo > 0:
        pad = (hi / lo) ** 0.08
        ax.set_ylim(lo / pad, hi * pad)
    else:
        pad = 0.08 * (hi - lo) if hi > lo else max(abs(hi) * 0.01, 1e-6)
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlim(start, stop + max(1.0, 0.01 * stop))


def _markers(
    ax: Axes, curves: CurvesByArm, colors: Mapping[str, str], kinds: Sequence[str], series: str
) -> bool:
    """Mark anomalies of ``kinds`` (×) and the last finite point of diverged runs (▼)."""
    drawn = False
    for arm, runs in curves.items():
        for c in runs:
            for a in c.anomalies:
                if a.get("kind") not in kinds or not isinstance(a.get("step"), int):
                    continue
                y = a.get("value")
                if not isinstance(y, (int, float)) or not math.isfinite(y):
                    y = c.value_at(a["step"], series)
                if math.isfinite(y):
                    ax.scatter(
                        [a["step"]],
                        [y],
                        marker="x",
                        s=46,
                        linewidths=1.8,
                        color=colors[arm],
                        zorder=6,
                    )
                    drawn = True
            if c.run.status == "diverged" and series == "train_loss":
                last = c.last_finite_step()
                if last is not None:
                    ax.scatter(
                        [last[0]],
                        [last[1]],
                        marker="v",
                        s=60,
                        color=colors[arm],
                        edgecolors="black",
                        linewidths=0.8,
                        zorder=7,
                    )
                    drawn = True
    return drawn


def _values(c: RunCurves, steps_attr: str, name: str) -> np.ndarray:
    """The series ``name`` of a run: an eval records' field when ``steps_attr`` is
    ``eval_steps`` (any metric a script or a tracker logged), else the attribute."""
    if steps_attr == "eval_steps":
        return c.eval_values(name)
    return np.asarray(getattr(c, name))


def _series_bands(
    curves: CurvesByArm, steps_attr: str, values_attr: str, window: int = 1
) -> dict[str, Band]:
    return {
        arm: band_over_seeds(
            [
                (
                    getattr(c, steps_attr),
                    moving_average(_values(c, steps_attr, values_attr), window),
                )
                for c in runs
                if getattr(c, steps_attr).size
            ]
        )
        for arm, runs in curves.items()
    }


def _integer_steps(*axes: Axes) -> None:
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


_SPIKE_HANDLE = {"marker": "x", "markersize": 7, "markeredgewidth": 1.8}
_DIVERGED_HANDLE = {"marker": "v", "markersize": 7, "markeredgecolor": "black"}


def _marker_legend(ax: Axes, what: str | None, diverged: bool) -> None:
    """Legend of the arms, plus the anomaly markers when some were drawn, below the panels."""
    handles, labels = ax.get_legend_handles_labels()
    if what is not None:
        handles.append(Line2D([], [], color="#444", linestyle="none", **_SPIKE_HANDLE))
        labels.append(what)
    if diverged:
        handles.append(Line2D([], [], color="#888", linestyle="none", **_DIVERGED_HANDLE))
        labels.append("diverged run (last finite loss)")
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    _outside_legend(fig, handles, labels)


def _testbed(analysis: Mapping[str, Any]) -> TestbedFormat:
    return testbed_format(analysis.get("testbed"))


def plot_training_loss(
    curves: CurvesByArm, colors: Mapping[str, str], unit: str = "nats per byte"
) -> Figure:
    """Training loss per arm: mean over seeds, min–max band, spikes and divergences marked.

    Left: the whole run; right: the second half, zoomed in, where the arms differ. ``unit``
    labels the y axis (the GPT's nats per byte by default).
    """
    window = smoothing_window(curves)
    bands = _series_bands(curves, "train_steps", "train_loss", window)
    with plot_style():
        fig, (full, zoom) = _figure(10.0, 4.4 + 0.22 * math.ceil(len(bands) / 3), 2, [1.35, 1.0])
        for arm, band in bands.items():
            label = f"{arm} ({counted(_n_runs(curves[arm]), 'seed')})"
            _draw_band(full, band, colors[arm], label)
            _draw_band(zoom, band, colors[arm], "_nolegend_")
        diverged = any(c.run.status == "diverged" for runs in curves.values() for c in runs)
        spikes = False
        for ax in (full, zoom):
            spikes = _markers(ax, curves, colors, LOSS_ANOMALIES, "train_loss") or spikes
            ax.set_xlabel("step")
        _integer_steps(full, zoom)
        full.set_ylabel(f"training loss ({unit})")
        smooth = f", moving average over {counted(window, 'step')}" if window > 1 else ""
        _title(fig, f"Training loss: mean over seeds, band = min–max{smooth}")
        full.set_title("Whole run", loc="left", fontsize=10, fontweight="normal")
        last = max((float(b.steps.max()) for b in bands.values() if b.steps.size), default=1.0)
        _zoom(zoom, list(bands.values()), last / 2)
        zoom.set_title("Second half, zoomed in", loc="left", fontsize=10, fontweight="normal")
        _marker_legend(full, "loss spike" if spikes else None, diverged)
    return fig


def plot_val_bpb(curves: CurvesByArm, colors: Mapping[str, str]) -> Figure:
    """Validation bits per byte at each evaluation: mean over seeds and min–max band."""
    return plot_validation(curves, colors, testbed_format("gpt"))


def plot_validation(
    curves: CurvesByArm, colors: Mapping[str, str], testbed: TestbedFormat
) -> Figure:
    """The testbed's validation series (``testbed.curve``: bits per byte for the GPT, the
    flow-matching loss for the DiT) at each evaluation: mean over seeds and min–max band."""
    bands = _series_bands(curves, "eval_steps", testbed.curve)
    with plot_style():
        fig, (full, zoom) = _figure(10.0, 4.2 + 0.22 * math.ceil(len(bands) / 3), 2, [1.35, 1.0])
        for arm, band in bands.items():
            label = f"{arm} ({counted(_n_runs(curves[arm]), 'seed')})"
            _draw_band(full, band, colors[arm], label, marker="o")
            _draw_band(zoom, band, colors[arm], "_nolegend_", marker="o")
        for ax in (full, zoom):
            ax.set_xlabel("step")
        full.set_ylabel(f"validation loss ({testbed.unit})")
        _title(fig, f"Validation {testbed.curve_word}: mean over seeds, band = min–max")
        full.set_title("Whole run", loc="left", fontsize=10, fontweight="normal")
        last = max((float(b.steps.max()) for b in bands.values() if b.steps.size), default=1.0)
        _zoom(zoom, list(bands.values()), last / 2)
        zoom.set_title("Second half, zoomed in", loc="left", fontsize=10, fontweight="normal")
        _integer_steps(full, zoom)
        handles, labels = full.get_legend_handles_labels()
        _outside_legend(fig, handles, labels)
    return fig


def plot_grad_norm(
    curves: CurvesByArm, colors: Mapping[str, str], clip: float | None = None
) -> Figure:
    """Global gradient norm (before clipping) on a log scale, with gradient spikes marked."""
    window = smoothing_window(curves)
    bands = _series_bands(curves, "train_steps", "grad_norm", window)
    with plot_style():
        fig, (ax,) = _figure(10.0, 3.9 + 0.22 * math.ceil((len(bands) + 2) / 3))
        for arm, band in bands.items():
            _draw_band(ax, band, colors[arm], f"{arm} ({counted(_n_runs(curves[arm]), 'seed')})")
        drawn = _markers(ax, curves, colors, GRAD_ANOMALIES, "grad_norm")
        if clip is not None:
            ax.axhline(
                clip,
                color="#555",
                linestyle="--",
                linewidth=1.0,
                label=f"clipping threshold ({clip:g})",
            )
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        _integer_steps(ax)
        ax.set_xlabel("step")
        ax.set_ylabel("gradient L2 norm (log scale)")
        smooth = f", moving average over {counted(window, 'step')}" if window > 1 else ""
        _title(fig, f"Gradient norm before clipping: mean over seeds, band = min–max{smooth}")
        _marker_legend(ax, "gradient spike" if drawn else None, False)
    return fig


def _per_arm_panel(
    ax: Axes,
    analysis: Mapping[str, Any],
    arms: Sequence[str],
    colors: Mapping[str, str],
    metric: str,
    scale: float,
    ylabel: str,
    digits: int,
    wrap: int = 14,
) -> None:
    for i, arm in enumerate(arms):
        values = np.asarray(analysis["arms"][arm][metric]["values"], dtype=np.float64) / scale
        if values.size == 0:
            ax.text(
                i,
                0.5,
                "no finished run",
                transform=ax.get_xaxis_transform(),
                ha="center",
                fontsize=8,
                color="#777",
            )
            continue
        jitter = np.linspace(-0.13, 0.13, values.size) if values.size > 1 else np.zeros(1)
        ax.scatter(
            i - 0.22 + jitter * 0.5,
            values,
            s=22,
            color=colors[arm],
            alpha=0.75,
            edgecolors="white",
            linewidths=0.5,
            zorder=3,
        )
        ci = t_interval(values, 0.95)
        mean = float(values.mean())
        if ci.low is not None and ci.high is not None:
            ax.errorbar(
                [i + 0.08],
                [mean],
                yerr=[[mean - ci.low], [ci.high - mean]],
                fmt="D",
                color=colors[arm],
                markersize=6,
                capsize=5,
                linewidth=1.8,
                zorder=4,
            )
        else:
            ax.scatter([i + 0.08], [mean], marker="D", s=36, color=colors[arm], zorder=4)
        ax.annotate(
            f"{mean:.{digits}f}",
            (i + 0.08, mean),
            xytext=(9, 0),
            textcoords="offset points",
            va="center",
            fontsize=8.5,
            color="#222",
        )
    ax.set_xticks(range(len(arms)), [_wrap_name(a, wrap) for a in arms], rotation=0)
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)
    ax.margins(y=0.15)


def plot_final_metrics(
    analysis: Mapping[str, Any], colors: Mapping[str, str], memory_kind: str | None = None
) -> Figure:
    """The final quality metric (GPT: validation bpb; DiT: validation loss), throughput and peak
    memory per arm: seeds as dots, mean ◆ with its 95 % t-interval (unpaired: it includes the
    seed-to-seed variation shared by all arms). Up to three arms with short names the panels sit
    side by side; otherwise one above the other, each the full width, so every arm name has
    room. Names are wrapped; if their labels still collide, they are turned upright, unwrapped."""
    testbed = _testbed(analysis)
    arms = list(analysis["arm_order"])
    mem_label = "peak memory (MiB" + (f", {memory_kind})" if memory_kind else ")")
    wide = len(arms) > 3 or max((len(a) for a in arms), default=0) > 18
    # characters that fit under one arm: the panel's width in inches over about 0.075 in a
    # character at the tick labels' 9 pt
    panel_in = 9.0 if wide else 2.6
    wrap = max(8, int(panel_in / max(1, len(arms)) / 0.075))
    lines = max(_wrap_name(a, wrap).count("\n") + 1 for a in arms) if arms else 1
    with plot_style():
        if wide:
            fig, axes = _figure(10.0, 3 * (2.3 + 0.16 * lines), nrows=3)
        else:
            fig, axes = _figure(10.0, 3.6 + 0.16 * (lines - 1), 3)
        _per_arm_panel(
            axes[0],
            analysis,
            arms,
            colors,
            testbed.quality,
            1.0,
            f"{testbed.quality_label} ({testbed.unit})",
            4,
            wrap,
        )
        _per_arm_panel(
            axes[1],
            analysis,
            arms,
            colors,
            "tokens_per_s",
            1e3,
            "throughput (thousand tokens/s)",
            2,
            wrap,
        )
        _per_arm_panel(
            axes[2], analysis, arms, colors, "peak_memory_bytes", 2**20, mem_label, 1, wrap
        )
        axes[0].set_title(testbed.quality_label.capitalize(), loc="left")
        axes[1].set_title("Training throughput", loc="left")
        axes[2].set_title("Peak memory", loc="left")
        fig.canvas.draw()
        for ax in axes:
            if _labels_overlap(fig, ax.get_xticklabels()):
                ax.set_xticks(range(len(arms)), arms, rotation=90, ha="center")
    return fig


def _paired_values(analysis: Mapping[str, Any], arm: str, metric: str, ratio: bool) -> np.ndarray:
    base = analysis["arms"][analysis["baseline_arm"]][metric]
    cand = analysis["arms"][arm][metric]
    b = dict(zip(base["seeds"], base["values"], strict=True))
    c = dict(zip(cand["seeds"], cand["values"], strict=True))
    seeds = sorted(set(b) & set(c))
    if ratio:
        return np.array([c[s] / b[s] for s in seeds if b[s] > 0 and c[s] > 0])
    return np.array([c[s] - b[s] for s in seeds])


def _interval_row(
    ax: Axes,
    y: float,
    color: str,
    points: np.ndarray,
    center: float | None,
    ci: tuple[float | None, float | None],
    ci_inner: tuple[float | None, float | None] | None = None,
) -> None:
    if points.size:
        offs = np.linspace(-0.12, 0.12, points.size) if points.size > 1 else np.zeros(1)
        ax.scatter(
            points,
            y + 0.22 + offs * 0.4,
            s=18,
            color=color,
            alpha=0.6,
            edgecolors="white",
            linewidths=0.4,
            zorder=3,
        )
    if ci[0] is not None and ci[1] is not None:
        ax.plot([ci[0], ci[1]], [y, y], color=color, linewidth=1.6, zorder=4)
        for end in ci:
            ax.plot([end, end], [y - 0.09, y + 0.09], color=color, linewidth=1.6, zorder=4)
    if ci_inner is not None and ci_inner[0] is not None and ci_inner[1] is not None:
        ax.plot(
            [ci_inner[0], ci_inner[1]],
            [y, y],
            color=color,
            linewidth=6,
            alpha=0.55,
            solid_capstyle="butt",
            zorder=4,
        )
    if center is not None:
        ax.scatter(
            [center],
            [y],
            marker="D",
            s=40,
            color=color,
            edgecolors="black",
            linewidths=0.6,
            zorder=5,
        )


def _verdict_label(ax: Axes, y: float, word: str) -> None:
    """The verdict word at the right end of a row."""
    ax.text(
        0.99,
        y - 0.33,
        word,
        transform=ax.get_yaxis_transform(),
        ha="right",
        va="center",
        fontsize=8.5,
        fontstyle="italic",
        color="#333",
    )


def _paired_row(
    axes: Sequence[Axes],
    y: float,
    analysis: Mapping[str, Any],
    arm: str,
    colors: Mapping[str, str],
    testbed: TestbedFormat,
) -> None:
    """One arm's row on the three panels: its seeds' paired Δ of the quality metric and ratios
    of throughput and peak memory, their mean and intervals, and each panel's verdict."""
    q_ax, t_ax, m_ax = axes
    comp, verdict, color = (
        analysis["comparisons"][arm],
        analysis["verdicts"][arm],
        colors[arm],
    )
    q, t, m = comp[testbed.quality], comp["tokens_per_s"], comp["peak_memory_bytes"]
    q_seeds = _paired_values(analysis, arm, testbed.quality, False)
    _interval_row(
        q_ax,
        y,
        color,
        q_seeds,
        q["mean_diff"],
        (q["ci_low"], q["ci_high"]),
        (q["tost_low"], q["tost_high"]),
    )
    t_seeds = _paired_values(analysis, arm, "tokens_per_s", True)
    _interval_row(t_ax, y, color, t_seeds, t["ratio"], (t["ratio_ci_low"], t["ratio_ci_high"]))
    m_seeds = _paired_values(analysis, arm, "peak_memory_bytes", True)
    _interval_row(m_ax, y, color, m_seeds, m["ratio"], (m["ratio_ci_low"], m["ratio_ci_high"]))
    _verdict_label(q_ax, y, verdict["quality"])
    _verdict_label(t_ax, y, verdict["throughput"])
    _verdict_label(m_ax, y, verdict["memory"])


def _paired_frame(
    fig: Figure,
    axes: Sequence[Axes],
    rows: Sequence[tuple[int, str]],
    base: str,
    testbed: TestbedFormat,
) -> None:
    """The arms' names on the quality panel's rows, the titles and the axis labels."""
    q_ax, t_ax, m_ax = axes
    q_ax.set_yticks([y for y, _ in rows], [arm for _, arm in rows])
    for ax in (t_ax, m_ax):
        ax.set_yticks([y for y, _ in rows], [])
    for ax in (q_ax, t_ax, m_ax):
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.grid(axis="y", visible=False)
    _title(fig, f"Each arm against the baseline {base}, seed by seed")
    q_ax.set_title(f"Δ {testbed.quality_label}", loc="left", fontsize=10)
    t_ax.set_title("Throughput ratio", loc="left", fontsize=10)
    m_ax.set_title("Peak memory ratio", loc="left", fontsize=10)
    q_ax.set_xlabel(f"{testbed.unit} (lower is better)")
    t_ax.set_xlabel("× baseline (higher is better)")
    m_ax.set_xlabel("× baseline (lower is better)")


def _paired_limits(axes: Sequence[Axes], margin: float) -> None:
    """x limits symmetric about no change: 0 ± max(|x|, 1.3·margin) for Δ, 1 ± max(|x − 1|,
    0.01) for the ratios."""
    q_ax, t_ax, m_ax = axes
    lo, hi = q_ax.get_xlim()
    span = max(abs(lo), abs(hi), 1.3 * margin)
    q_ax.set_xlim(-span, span)
    for ax in (t_ax, m_ax):
        lo, hi = ax.get_xlim()
        span = max(abs(lo - 1.0), abs(hi - 1.0), 0.01)
        ax.set_xlim(1.0 - span, 1.0 + span)


def _paired_legend(margin: float, alpha: float, testbed: TestbedFormat) -> list[Patch | Line2D]:
    """The legend's entries: the margin band (none when ``margin`` is 0: no margin was given),
    the 100·(1 − 2α) % and 100·(1 − α) % intervals, the mean and one seed's pair."""
    band = Patch(
        color="#2e7d32",
        alpha=0.2,
        label=f"equivalence margin ±{margin:g} {testbed.short_unit}",
    )
    return [
        *([band] if margin else []),
        Line2D(
            [],
            [],
            color="#555",
            linewidth=6,
            alpha=0.55,
            label=f"{round(100 * (1 - 2 * alpha))}% CI (TOST)",
        ),
        Line2D([], [], color="#555", linewidth=1.6, label=f"{round(100 * (1 - alpha))}% CI"),
        Line2D(
            [],
            [],
            marker="D",
            color="#555",
            markeredgecolor="black",
            linestyle="none",
            label="mean of the pairs",
        ),
        Line2D(
            [],
            [],
            marker="o",
            color="#555",
            alpha=0.6,
            linestyle="none",
            markersize=5,
            label="one seed's pair",
        ),
    ]


def plot_paired_comparison(analysis: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """Each arm against the baseline, seed by seed: Δ of the final quality metric (GPT: bpb; DiT:
    validation loss) with the ±margin band, and the throughput and peak-memory ratios, each with
    its 100·(1 − α) % interval (the 100·(1 − 2α) % TOST interval drawn thick on the quality
    panel; 95 % and 90 % at the default α = 0.05)."""
    testbed = _testbed(analysis)
    base = analysis["baseline_arm"]
    alpha = float(analysis.get("alpha", 0.05))
    arms = [a for a in analysis["arm_order"] if a != base]
    margin = float(analysis.get(testbed.margin_key) or 0.0)  # 0: no margin (--script)
    with plot_style():
        fig, axes = _figure(10.0, 1.6 + 0.8 * max(1, len(arms)), 3, [1.5, 1, 1])
        q_ax, t_ax, m_ax = axes
        if margin:
            q_ax.axvspan(-margin, margin, color="#2e7d32", alpha=0.10, linewidth=0)
        q_ax.axvline(0.0, color="#444", linewidth=0.9)
        t_ax.axvline(1.0, color="#444", linewidth=0.9)
        m_ax.axvline(1.0, color="#444", linewidth=0.9)
        rows = list(enumerate(reversed(arms)))
        for y, arm in rows:
            _paired_row(axes, y, analysis, arm, colors, testbed)
        _paired_frame(fig, axes, rows, base, testbed)
        _paired_limits(axes, margin)
        handles = _paired_legend(margin, alpha, testbed)
        fig.legend(handles=handles, loc="outside lower center", ncols=5)
    return fig


def _montage(images: np.ndarray, gap: int = 1) -> np.ndarray:
    """[n, H, W] side by side in one [H, n·(W + gap) − gap] image, the gaps at +1 (white)."""
    n, h, w = images.shape
    out = np.ones((h, n * (w + gap) - gap), dtype=np.float64)
    for i in range(n):
        out[:, i * (w + gap) : i * (w + gap) + w] = images[i]
    return out


def plot_samples(
    rows: Sequence[tuple[str, np.ndarray]],
    colors: Mapping[str, str],
    column_titles: Sequence[str] | None = None,
) -> Figure:
    """One row of images per (name, images [n, H, W]) pair, every row of the same shape, pixels
    in [−1, 1] (clipped) shown in grey from black (−1) to white (+1); a row's name labels it, in
    the arm's colour when ``colors`` has one. ``column_titles`` (one per image) head the top
    row."""
    if not rows:
        raise ValueError("rows: expected at least one row of images")
    shapes = {images.shape for _, images in rows}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3:
        raise ValueError(f"rows: expected images of one shape [n, H, W], got {sorted(shapes)}")
    n, _, w = next(iter(shapes))
    with plot_style():
        fig = Figure(figsize=(0.5 * n + 1.8, 0.55 * len(rows) + 0.35), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
        for ax, (name, images) in zip(axes, rows, strict=True):
            ax.imshow(
                _montage(np.clip(images, -1.0, 1.0)),
                cmap="gray",
                vmin=-1.0,
                vmax=1.0,
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.set_ylabel(
                name, rotation=0, ha="right", va="center", color=colors.get(name, "black")
            )
        for i, title in enumerate(list(column_titles or [])[:n]):
            axes[0].text(
                i * (w + 1) + (w - 1) / 2,
                -1.0,
                title,
                ha="center",
                va="bottom",
                fontsize=7,
                color="#59636e",
            )
    return fig


@dataclass(frozen=True)
class HealthPanel:
    """One column of the norm-health figure: the ``health`` statistic ``stat`` (read through
    :func:`normlab.analysis.health.health_value`), its column ``title``, its colour bar's
    ``label``, a log colour scale or not, and ``kind`` to show only layers of that kind."""

    stat: str
    title: str
    label: str
    log: bool = False
    kind: str | None = None


HEALTH_PANELS: tuple[HealthPanel, ...] = (
    HealthPanel("in_rms", "input RMS", "√mean(x²) entering the norm (log scale)", log=True),
    HealthPanel("gain_mean", "gain: mean", "mean(g)"),
    HealthPanel("gain_max_abs", "gain: largest |g|", "max |g|"),
    HealthPanel(
        "xhat_mean_rms", "RMSNorm: mean of x̂", "|mean of x̂| per token, RMS over tokens",
        kind="rmsnorm",
    ),
)  # fmt: skip
"""The columns the figure always has (one is dropped when no arm has a value for it)."""

HEALTH_FLAG_PANEL = HealthPanel(CHECKED_XHAT_MS, "mean(x̂²) off 1", "mean(x̂²): 1 in a correct norm")
"""The column added only when some layer's mean(x̂²) breaks the tolerance."""


def plot_norm_health(
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    colors: Mapping[str, str],
    tolerance: float = HEALTH_TOLERANCE,
) -> Figure:
    """Norm health of one run per arm (``records``: arm → that run's ``metrics.jsonl``
    records; only ``health`` records are read): a row per arm and a column per statistic of
    :data:`HEALTH_PANELS`, each a heatmap of norm layers (rows) by evaluation step (columns),
    on one colour scale per column (shared by the arms, its bar below it; grey where a layer
    has no value). The :data:`HEALTH_FLAG_PANEL` column, mean(x̂²) on a blue–white–red scale
    centred on 1, is added only when some value lies more than ``tolerance`` from 1. The axes
    of each heatmap carry the gid ``"STAT:ARM"``."""
    if not records:
        raise ValueError("records: expected at least one arm")
    arms = list(records)
    grids = {
        panel: {arm: health_matrix(records[arm], panel.stat, panel.kind) for arm in arms}
        for panel in (*HEALTH_PANELS, HEALTH_FLAG_PANEL)
    }
    panels = [p for p in HEALTH_PANELS if p.stat == "in_rms" or _finite(grids[p]).size]
    flagged = [v for v in _finite(grids[HEALTH_FLAG_PANEL]) if xhat_ms_off(float(v), tolerance)]
    if flagged:
        panels.append(HEALTH_FLAG_PANEL)
    n_layers = max(len(grids[panels[0]][arm][0]) for arm in arms)
    names = [layer for arm in arms for layer in grids[panels[0]][arm][0]]
    label_width = max((len(n) for n in names), default=4)
    with plot_style():
        width = 1.0 + 0.06 * label_width + 2.3 * len(panels)
        height = 1.4 + len(arms) * (0.55 + 0.13 * max(n_layers, 3))
        fig, flat = _figure(width, height, ncols=len(panels), nrows=len(arms))
        axes = np.asarray(flat, dtype=object).reshape(len(arms), len(panels))
        for j, panel in enumerate(panels):
            scale = _health_scale(panel, grids[panel], tolerance)
            cmap = _health_cmap(panel is HEALTH_FLAG_PANEL)
            image = None
            for i, arm in enumerate(arms):
                layers, steps, values = grids[panel][arm]
                image = _health_heatmap(axes[i, j], layers, steps, values, cmap, scale)
                axes[i, j].set_gid(f"{panel.stat}:{arm}")
                if i == 0:
                    axes[i, j].set_title(panel.title, fontsize=9)
                if j == 0:
                    _health_row_labels(axes[i, j], layers, arm, colors)
                else:
                    axes[i, j].set_yticks([])
                if i == len(arms) - 1:
                    axes[i, j].set_xlabel("step", fontsize=8)
            _health_bar(fig, image, list(axes[:, j]), panel, scale)
        _title(fig, "Norm health: what enters each norm layer, and its gain, at each evaluation")
    return fig


def _finite(grid: Mapping[str, tuple[Sequence[str], Sequence[int], Sequence[Sequence[float]]]]):
    values = [np.asarray(m[2], dtype=np.float64).ravel() for m in grid.values()]
    flat = np.concatenate(values) if values else np.zeros(0)
    return flat[np.isfinite(flat)]


def _health_scale(
    panel: HealthPanel,
    grid: Mapping[str, tuple[Sequence[str], Sequence[int], Sequence[Sequence[float]]]],
    tolerance: float,
) -> Normalize:
    """One colour scale for a column over every arm's finite values: logarithmic for a log
    panel (positive values), centred on 1 for the flag column (at least 1 ± 2·tolerance
    wide), linear otherwise; widened where all values are equal so the scale has a span."""
    values = _finite(grid)
    if panel is HEALTH_FLAG_PANEL:
        half = max(2 * tolerance, float(np.max(np.abs(values - 1.0))) if values.size else 0.0)
        return TwoSlopeNorm(1.0, 1.0 - half, 1.0 + half)
    if panel.log:
        values = values[values > 0]
    lo, hi = (float(values.min()), float(values.max())) if values.size else (1.0, 1.0)
    if panel.log:
        if hi <= lo * 1.01:
            lo, hi = lo / 1.1, hi * 1.1
        return LogNorm(lo, hi)
    if hi - lo <= 1e-6 * max(abs(lo), abs(hi), 1e-12):
        pad = max(0.05 * abs(lo), 1e-3)
        lo, hi = lo - pad, hi + pad
    return Normalize(lo, hi)


def _health_heatmap(ax: Axes, layers, steps, values, cmap, scale):  # -> AxesImage
    data = np.asarray(values, dtype=np.float64).reshape(len(layers), -1)
    if isinstance(scale, LogNorm):
        data = np.where(data > 0, data, np.nan)
    image = ax.imshow(
        np.ma.masked_invalid(data), aspect="auto", cmap=cmap, norm=scale, interpolation="nearest"
    )
    ax.grid(False)
    if not np.isfinite(data).any():
        ax.text(0.5, 0.5, "no value", transform=ax.transAxes, ha="center", va="center",
                fontsize=8, color="#59636e")  # fmt: skip
    n_steps = len(steps)
    shown = sorted({int(k) for k in np.linspace(0, n_steps - 1, min(n_steps, 4)).round()})
    ax.set_xticks(shown)
    ax.set_xticklabels([str(steps[k]) for k in shown], fontsize=7)
    return image


def _health_row_labels(ax: Axes, layers: Sequence[str], arm: str, colors: Mapping[str, str]):
    """Layer names on the rows (every k-th past 24 layers, so 7-point labels never touch) and
    the arm's name, in its colour, left of them."""
    every = max(1, math.ceil(len(layers) / 24))
    rows = list(range(0, len(layers), every))
    ax.set_yticks(rows)
    ax.set_yticklabels([layers[r] for r in rows], fontsize=7)
    ax.set_ylabel(_wrap_name(arm, 24), color=colors.get(arm, "black"), fontsize=9)


def _health_bar(fig: Figure, image, axes: list[Axes], panel: HealthPanel, scale) -> None:
    if image is None:
        return
    bar = fig.colorbar(image, ax=axes, location="bottom", shrink=0.95, aspect=22, pad=0.02)
    bar.set_label(panel.label, fontsize=7)
    bar.ax.tick_params(labelsize=7)
    if panel.log:  # a few plain numbers: a narrow log range gets no decade ticks to label
        ticks = np.geomspace(scale.vmin, scale.vmax, 4)
        bar.ax.xaxis.set_major_locator(FixedLocator(ticks))
        bar.ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        bar.ax.xaxis.set_minor_formatter(NullFormatter())
        bar.ax.xaxis.set_minor_locator(FixedLocator([]))
    else:
        bar.ax.xaxis.set_major_locator(MaxNLocator(4))


def _health_cmap(diverging: bool = False):  # -> matplotlib.colors.Colormap
    """Viridis (blue–white–red when ``diverging``), with grey for masked cells (no value)."""
    from matplotlib import colormaps

    return colormaps["RdBu_r" if diverging else "viridis"].with_extremes(bad="#d0d7de")


def _ladder_band(rec: Mapping[str, Any], grid: np.ndarray) -> tuple[np.ndarray, ...]:
    """The single-training and trend intervals of ``rec`` (one arm's ladder record) at each N
    of ``grid``, recomputed from its rungs with the record's own bootstrap settings."""
    rungs = [
        Rung(r["setting"], r["n_params"], tuple(r["diffs"]), tuple(r["seeds"]))
        for r in rec["rungs"]
    ]
    pred = rec["prediction"]
    rows = []
    for n in grid:
        p = predict_ladder(
            rungs,
            float(n),
            confidence=float(pred["confidence"]),
            n_boot=int(pred["n_boot"]),
            sd_floor=float(rec["fit"]["sd_floor"]),
            seed=int(pred["seed"]),
        )
        rows.append((p.single.low, p.single.high, p.trend.low, p.trend.high))
    return tuple(np.array(col) for col in zip(*rows, strict=True))


def plot_ladder(ladder: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """A size ladder (summary.json's ``ladder``): per arm, the paired difference against the
    parameter count on a log axis, each rung's mean with its t-interval, the weighted line
    d = a + b·log10 N, the prediction bands from the largest rung to the target (the trend's,
    and outside it the rest of one training's), and the target with its single-training
    interval. The legend draws each entry in the colour of every arm it stands for."""
    arms = list(ladder["arms"])
    shown = [colors.get(arm, _LADDER_COLOR) for arm in arms]
    with plot_style():
        fig, axes = _figure(7.5, 1.2 + 3.4 * max(1, len(arms)), 1, nrows=max(1, len(arms)))
        for ax, arm, color in zip(axes, arms, shown, strict=True):
            _ladder_panel(ax, arm, ladder["arms"][arm], color)
        _title(fig, "The paired difference against model size, extrapolated to the target")
        conf = round(100 * float(ladder["arms"][arms[-1]]["prediction"]["confidence"]))
        entries = {
            f"rung mean, {conf}% CI": lambda c: Line2D(
                [], [], marker="o", color=c, markeredgecolor="black", markeredgewidth=0.6,
                linestyle="none"),
            "weighted fit a + b·log10 N": lambda c: Line2D([], [], color=c, linewidth=1.4),
            f"trend, {conf}% interval": lambda c: Patch(color=c, alpha=_TREND_ALPHA, linewidth=0),
            f"one training, {conf}% prediction": lambda c: Patch(
                color=c, alpha=_SINGLE_ALPHA, linewidth=0),
            "target": lambda c: Line2D(
                [], [], marker="*", color=c, markeredgecolor="black", markeredgewidth=0.6,
                markersize=11, linestyle="none"),
        }  # fmt: skip
        _swatch_legend(fig, {label: [make(c) for c in shown] for label, make in entries.items()})
    return fig


_LADDER_COLOR = "#0072B2"
"""An arm's colour in the ladder's figures when ``colors`` has none for it."""
_TREND_ALPHA, _SINGLE_ALPHA = 0.25, 0.12
"""The opacity of the trend's band and of the rest of one training's band."""


def _swatch_legend(fig: Figure, entries: Mapping[str, Sequence[Any]]) -> None:
    """The legend below the panels: per label, its handles side by side (one per arm, each in
    that arm's colour), up to three entries a row."""
    from matplotlib.legend_handler import HandlerTuple

    handles = [tuple(h) for h in entries.values()]
    widest = max((len(h) for h in handles), default=1)
    fig.legend(
        handles,
        list(entries),
        loc="outside lower center",
        ncols=min(3, len(handles)),
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0.3)},
        handlelength=2.0 + 1.2 * (widest - 1),
    )


def _ladder_panel(ax: Axes, arm: str, rec: Mapping[str, Any], color: str) -> None:
    """One arm's panel of :func:`plot_ladder`: the bands from the largest rung to the target
    (the trend's, and one training's either side of it, so no area is shaded twice), the
    fitted line, the rungs (:func:`_ladder_rungs`) and the target's prediction."""
    pred, fit, target = rec["prediction"], rec["fit"], rec["target"]
    ns = np.array([r["n_params"] for r in rec["rungs"]], dtype=np.float64)
    nt = float(target["n_params"])
    ax.axhline(0.0, color="#444", linewidth=0.9)
    grid = np.geomspace(ns.max(), nt, 12) if nt > ns.max() else np.array([ns.max()])
    s_lo, s_hi, t_lo, t_hi = _ladder_band(rec, grid)
    ax.fill_between(grid, np.minimum(s_lo, t_lo), t_lo, color=color, alpha=_SINGLE_ALPHA,
                    linewidth=0)  # fmt: skip
    ax.fill_between(grid, t_hi, np.maximum(s_hi, t_hi), color=color, alpha=_SINGLE_ALPHA,
                    linewidth=0)  # fmt: skip
    ax.fill_between(grid, t_lo, t_hi, color=color, alpha=_TREND_ALPHA, linewidth=0)
    line_n = np.geomspace(ns.min(), nt, 50)
    ax.plot(line_n, fit["a"] + fit["b"] * np.log10(line_n), color=color, linewidth=1.4)
    _ladder_rungs(ax, rec, ns, color)
    single = pred["single"]
    ax.errorbar(
        [nt],
        [single["estimate"]],
        yerr=[[single["estimate"] - single["low"]], [single["high"] - single["estimate"]]],
        fmt="*",
        markersize=11,
        color=color,
        markeredgecolor="black",
        markeredgewidth=0.6,
        capsize=4,
        zorder=6,
    )
    ax.axvline(nt, color="#777", linewidth=0.9, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlim(ns.min() / 1.6, nt * 1.6)
    ax.set_title(
        f"{arm} − {rec['baseline']}: {pred['word']} at the target", loc="left", fontsize=10
    )
    ax.set_xlabel(f"parameters (target {nt:.3g}, {target['extrapolation']:.3g}× beyond)")
    direction = "lower is better" if rec["lower_is_better"] else "higher is better"
    ax.set_ylabel(f"Δ {rec['metric']} ({rec['unit']}, {direction})")


def _ladder_rungs(ax: Axes, rec: Mapping[str, Any], ns: np.ndarray, color: str) -> None:
    """Each rung's mean paired difference with its interval, at its parameter count ``ns``."""
    means = np.array([r["mean"] for r in rec["rungs"]])
    lows = np.array([r["low"] for r in rec["rungs"]])
    highs = np.array([r["high"] for r in rec["rungs"]])
    ax.errorbar(
        ns,
        means,
        yerr=np.vstack([means - lows, highs - means]),
        fmt="o",
        color=color,
        markeredgecolor="black",
        markeredgewidth=0.6,
        capsize=3,
        zorder=5,
    )


def plot_ladder_losses(
    losses: Mapping[str, Sequence[tuple[float, Sequence[float]]]],
    colors: Mapping[str, str],
    label: str,
) -> Figure:
    """Each arm's quality metric against model size: ``losses`` is {arm: [(the rung's
    parameter count, the values of its seeds)]}; per rung each seed as a dot and the mean ◆
    with its 95 % t-interval (unpaired: it holds the seed-to-seed variation the paired
    difference cancels), the means of an arm joined by a line; the arms sit side by side at a
    rung, shifted by a few percent in N; ``label`` names the axis."""
    arms = list(losses)
    shown = {arm: colors.get(arm, _LADDER_COLOR) for arm in arms}
    with plot_style():
        fig, axes = _figure(7.5, 4.4)
        ax = axes[0]
        for i, arm in enumerate(arms):
            shift = 10 ** (0.025 * (i - (len(arms) - 1) / 2))
            _ladder_losses_arm(ax, losses[arm], shown[arm], shift)
        ax.set_xscale("log")
        ax.set_xlabel("parameters (each rung's, the baseline's count)")
        ax.set_ylabel(label)
        _title(fig, "Each arm against model size")
        _swatch_legend(
            fig,
            {
                arm: [Line2D([], [], color=c, marker="D", markersize=6, linewidth=1.3)]
                for arm, c in shown.items()
            },
        )
    return fig


def _ladder_losses_arm(
    ax: Axes, points: Sequence[tuple[float, Sequence[float]]], color: str, shift: float
) -> None:
    """One arm of :func:`plot_ladder_losses`: its seeds, means and intervals at N · ``shift``."""
    ns, means = [], []
    for n, values in points:
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            continue
        x = float(n) * shift
        ax.scatter(np.full(v.size, x), v, s=16, color=color, alpha=0.6, edgecolors="white",
                   linewidths=0.5, zorder=3)  # fmt: skip
        ci, mean = t_interval(v, 0.95), float(v.mean())
        low = ci.low if ci.low is not None else mean
        high = ci.high if ci.high is not None else mean
        ax.errorbar([x], [mean], yerr=[[mean - low], [high - mean]], fmt="D", color=color,
                    markersize=6, capsize=4, linewidth=1.3, zorder=4)  # fmt: skip
        ns.append(x)
        means.append(mean)
    ax.plot(ns, means, color=color, linewidth=1.3, zorder=2)


_EDGE_NOTE_CHARS = 40
"""Characters per line of a learning-rate panel's edge note (a 4-inch panel's width at the
title's size, with room to spare)."""


def plot_lr_sweep(learning_rates: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """A learning-rate sweep (summary.json's ``ladder.learning_rates``): one panel per setting
    (width), per arm the mean loss over tuning seeds against the rate (log axis) with its
    t-interval as a band, the chosen best rate starred, and rates where a tuning seed diverged
    marked with an x at the top of the panel; a panel whose best rate lies at the sweep's edge
    names those arms under its title."""
    settings = list(learning_rates["settings"])
    n = max(1, len(settings))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    with plot_style():
        fig, axes = _figure(4.0 * ncols + 0.6, 1.4 + 3.0 * nrows, ncols, nrows=nrows)
        arms_seen: list[str] = []
        for ax, setting in zip(axes, settings, strict=False):
            by_arm = learning_rates["settings"][setting]
            arms_seen += [arm for arm in by_arm if arm not in arms_seen]
            _lr_panel(ax, setting, by_arm, colors)
        for ax in axes[len(settings) :]:
            ax.set_visible(False)
        axes[0].set_ylabel("loss on tuning seeds (mean, 95% CI)")
        _title(fig, "Loss against learning rate per arm; the star is each arm's chosen rate")
        _swatch_legend(fig, _lr_legend(learning_rates, arms_seen, colors))
    return fig


def _lr_legend(
    learning_rates: Mapping[str, Any], arms: Sequence[str], colors: Mapping[str, str]
) -> dict[str, list[Any]]:
    """The entries of :func:`plot_lr_sweep`'s legend, each drawn as the panels draw it: every
    arm's curve, the best rate's star in each arm's colour, and the x of a diverged tuning seed
    in the colour of each arm that had one (only when one had)."""
    shown = {a: colors.get(a, _LADDER_COLOR) for a in arms}
    entries: dict[str, list[Any]] = {
        a: [Line2D([], [], color=c, marker="o", markersize=4, linewidth=1.3)]
        for a, c in shown.items()
    }
    entries["best rate"] = [
        Line2D([], [], marker="*", color=c, markeredgecolor="black", markeredgewidth=0.6,
               markersize=13, linestyle="none")
        for c in shown.values()
    ]  # fmt: skip
    diverged = {
        arm
        for by_arm in learning_rates["settings"].values()
        for arm, curve in by_arm.items()
        if any(p["n_diverged"] for p in curve["points"])
    }
    if diverged:
        entries["a tuning seed diverged"] = [
            Line2D([], [], marker="x", color=c, markersize=7, markeredgewidth=1.8,
                   linestyle="none")
            for a, c in shown.items()
            if a in diverged
        ]  # fmt: skip
    return entries


def _lr_panel(ax: Axes, setting: str, by_arm: Mapping[str, Any], colors: Mapping[str, str]) -> None:
    """One setting's panel of :func:`plot_lr_sweep`: each arm's curve (:func:`_lr_curve`), the
    arms whose best rate is at the sweep's edge under the title, and an x at the top of the
    panel for each rate where a tuning seed diverged."""
    diverged: list[tuple[float, str]] = []
    for arm, curve in by_arm.items():
        color = colors.get(arm, "#0072B2")
        _lr_curve(ax, curve, color)
        diverged += [(p["rate"], color) for p in curve["points"] if p["n_diverged"]]
    ax.set_xscale("log")
    edges = [a for a, c in by_arm.items() if c["edge"]]
    title = setting
    if edges:  # wrapped under the setting, so that neighbouring titles never meet
        note = "best at the sweep's edge: " + ", ".join(edges)
        title += "\n" + textwrap.fill(note, width=_EDGE_NOTE_CHARS)
    ax.set_title(title, loc="left", fontsize=9.5)
    ax.set_xlabel("learning rate")
    if diverged:
        top = ax.get_ylim()[1]
        for rate, color in diverged:
            ax.plot([rate], [top], marker="x", color=color, markersize=7,
                    markeredgewidth=1.8, linestyle="none", clip_on=False)  # fmt: skip


def _lr_curve(ax: Axes, curve: Mapping[str, Any], color: str) -> None:
    """One arm's mean loss against the rate with its interval as a band (a missing bound at
    the mean), and its best rate starred."""
    pts = [p for p in curve["points"] if p["mean"] is not None]
    rates = np.array([p["rate"] for p in pts])
    mean = np.array([p["mean"] for p in pts])
    lo = np.array([p["low"] if p["low"] is not None else p["mean"] for p in pts])
    hi = np.array([p["high"] if p["high"] is not None else p["mean"] for p in pts])
    ax.fill_between(rates, lo, hi, color=color, alpha=0.15, linewidth=0)
    ax.plot(rates, mean, marker="o", markersize=4, color=color, linewidth=1.3)
    ax.plot(
        [curve["best"]],
        [curve["best_mean"]],
        marker="*",
        markersize=13,
        color=color,
        markeredgecolor="black",
        markeredgewidth=0.6,
        linestyle="none",
        zorder=6,
    )
