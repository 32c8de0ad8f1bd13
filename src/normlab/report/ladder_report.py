"""``build_ladder_report``: a ladder folder's analysis on disk (its summary.json, under
``ladder`` with ladder.json under ``plan``, written by the study that trained it:
:func:`normlab.study.ladder.analyse_ladder`) → from the folder's files alone
(:func:`write_ladder_report`), its figures (``plots/ladder.png``, ``plots/ladder_losses.png``
and, when the ladder holds a learning-rate sweep, ``plots/lr_sweep.png``), report.md and
report.html, all written atomically. The report draws the analysis, it computes none. The two
reports are one content (:mod:`normlab.report.ladder_content`) laid out twice, with the compare
report's styles. Each rung keeps its own compare report in its own folder, which the ladder's
links; nothing is trained. With a sweep, the report says in words which rate each arm ran at in
each rung, flags a best rate at the sweep's edge and, when an arm was swept at several widths
(μP), whether its optimum lines up (:func:`normlab.analysis.lr_sweep.sweep_lines`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab._io import write_bytes_atomic, write_text_atomic
from normlab.report.content import Plot
from normlab.report.html import render_ladder_html
from normlab.report.ladder_content import (
    LADDER_PLOT,
    LOSSES_PLOT,
    LadderFolder,
    arm_values,
    build_ladder_content,
    read_ladder_folder,
)
from normlab.report.markdown import render_ladder_markdown
from normlab.report.plots import figure_png, plot_ladder, plot_ladder_losses, plot_lr_sweep
from normlab.report.sections import LR_SWEEP_PLOT
from normlab.report.style import arm_colors
from normlab.run_format import REPORT_HTML_FILE, REPORT_MD_FILE, plot_path

__all__ = ["LADDER_PLOTS", "build_ladder_report", "prediction_lines", "write_ladder_report"]

LADDER_PLOTS = (LADDER_PLOT, LOSSES_PLOT, LR_SWEEP_PLOT)
"""The file stems of every figure a ladder's report may hold."""


def prediction_lines(ladder: dict[str, Any]) -> list[str]:
    """One sentence per arm: its prediction at the target with the extrapolation factor
    (``record["prediction"]["sentence"]``)."""
    return [str(rec["prediction"]["sentence"]) for rec in ladder["arms"].values()]


def build_ladder_report(out: Path) -> dict[str, Path]:
    """Draw the ladder folder ``out``'s analysis (summary.json: {``ladder``: …, ``plan``:
    ladder.json}) as the figures, report.md and report.html (:func:`write_ladder_report`);
    returns {relative path: path}. ``OSError`` or ``ValueError`` when the analysis is absent or
    damaged."""
    return write_ladder_report(Path(out))


def write_ladder_report(out: Path) -> dict[str, Path]:
    """The figures, report.md and report.html of the ladder folder ``out``, from its
    summary.json and its rungs' files (:func:`normlab.report.ladder_content.read_ladder_folder`);
    a figure this build leaves out is removed. Returns {relative path: path}."""
    out = Path(out)
    folder = read_ladder_folder(out)
    plots = _plots(folder)
    content = build_ladder_content(folder, plots)
    written: dict[str, Path] = {}
    for p in plots.values():
        written[p.relpath] = write_bytes_atomic(out / p.relpath, p.png)
    for name in LADDER_PLOTS:
        if plot_path(name) not in written:
            (out / plot_path(name)).unlink(missing_ok=True)
    written[REPORT_MD_FILE] = write_text_atomic(
        out / REPORT_MD_FILE, render_ladder_markdown(content)
    )
    written[REPORT_HTML_FILE] = write_text_atomic(
        out / REPORT_HTML_FILE, render_ladder_html(content)
    )
    return written


def _plots(f: LadderFolder) -> dict[str, Plot]:
    """The ladder's figures by file stem, each with its title and caption: the difference
    against size, each arm against size (when a rung's summary.json has values) and the
    learning-rate sweep (when there is one)."""
    colors = arm_colors([f.first["baseline"], *f.records])
    conf = f.confidence
    plots = {
        LADDER_PLOT: Plot(
            LADDER_PLOT,
            "The difference against model size, extrapolated to the target",
            f"One panel per arm: the paired difference arm − baseline against the parameter "
            f"count (log axis); each rung's mean with its {conf}% t-interval (dots), the "
            f"weighted line a + b·log10 N, from the largest rung to the target the trend's "
            f"{conf}% interval (darker band) and either side of it the rest of one training's "
            f"{conf}% prediction interval (lighter band), and at the target (star, dotted line) "
            "the prediction for one training with its interval.",
            figure_png(plot_ladder(f.ladder, colors)),
        )
    }
    losses = arm_values(f)
    if any(values for points in losses.values() for _, values in points):
        label = f"{f.testbed.quality_label} ({f.first['unit']})"
        plots[LOSSES_PLOT] = Plot(
            LOSSES_PLOT,
            "Each arm against model size",
            f"Per arm and rung, the {f.testbed.quality_label} of each seed (dots) and their mean "
            "(diamond) with its 95% t-interval, at the rung's parameter count (the "
            "baseline's; the arms are shifted a few percent apart so none hides another). "
            "These intervals include the seed-to-seed variation that the paired difference "
            "cancels, so overlapping bars do not mean 'no difference'.",
            figure_png(plot_ladder_losses(losses, colors, label)),
        )
    if f.ladder.get("learning_rates"):
        plots[LR_SWEEP_PLOT] = Plot(
            LR_SWEEP_PLOT,
            "Loss against learning rate",
            f"One panel per swept rung: per arm the mean {f.first['metric']} over the tuning "
            "seeds at each rate (log axis) with its 95% t-interval as a band; the star is the "
            "rate the arm's comparison ran at, an x at the top of a panel a rate where a "
            "tuning seed diverged.",
            figure_png(plot_lr_sweep(f.ladder["learning_rates"], colors)),
        )
    return plots
