"""``build_ladder_report``: a ladder folder's analysis on disk (its summary.json, under
``ladder``, written by the study that trained it: :func:`normlab.study.ladder.analyse_ladder`)
→ ``plots/ladder.png`` (and ``plots/lr_sweep.png`` when the ladder holds a learning-rate
sweep), report.md and report.html, all written atomically. The report draws the analysis, it
computes none. Each rung keeps its own compare report in its own folder; nothing is trained.
With a sweep, the report says in words which rate each arm ran at in each rung, flags a best
rate at the sweep's edge and, when an arm was swept at several widths (μP), whether its optimum
lines up (:func:`normlab.analysis.lr_sweep.sweep_lines`)."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from normlab._io import write_bytes_atomic, write_text_atomic
from normlab.analysis.lr_sweep import sweep_lines, tuning_seed_words
from normlab.report.plots import figure_png, plot_ladder, plot_lr_sweep
from normlab.report.sections import LR_SWEEP_PLOT
from normlab.report.style import arm_colors
from normlab.run_format import REPORT_HTML_FILE, REPORT_MD_FILE, plot_path
from normlab.run_format import folder as run_folder

__all__ = ["LADDER_PLOTS", "build_ladder_report", "prediction_lines"]

LADDER_PLOTS = ("ladder", LR_SWEEP_PLOT)


def prediction_lines(ladder: dict[str, Any]) -> list[str]:
    """One sentence per arm: its prediction at the target with the extrapolation factor
    (``record["prediction"]["sentence"]``)."""
    return [str(rec["prediction"]["sentence"]) for rec in ladder["arms"].values()]


def _rung_table(ladder: dict[str, Any]) -> list[str]:
    lines = ["| arm | rung | parameters | seeds | mean difference | 95 % interval | sd |"]
    lines.append("|---|---|---|---|---|---|---|")
    for arm, rec in ladder["arms"].items():
        unit = rec["unit"]
        for r in rec["rungs"]:
            lines.append(
                f"| {arm} | {r['setting']} | {r['n_params']:,.0f} | {r['n']} | "
                f"{r['mean']:+.4f} {unit} | {r['low']:+.4f} to {r['high']:+.4f} | "
                f"{r['sd']:.4f} |"
            )
    return lines


def _rate_lines(ladder: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The sweep in words (:func:`normlab.analysis.lr_sweep.sweep_lines`) after one line on how
    the rates were chosen; [] without a sweep."""
    record = ladder.get("learning_rates")
    if not record:
        return []
    first = next(iter(ladder["arms"].values()))
    sweep = plan.get("lr_sweep") or {}
    rates = ", ".join(f"{r:g}" for r in sweep.get("rates", []))
    how = (
        "under μP the rates are chosen at the smallest rung and checked at the largest"
        if len(set(record["chosen_at"].values())) == 1 and len(record["chosen_at"]) > 1
        else "each rung's rates are chosen at that rung"
    )
    head = (
        f"Each arm at its own best rate: every arm was trained at each rate of {rates} on "
        f"{tuning_seed_words(record['tuning_seeds'])} (apart from the evaluation seeds); its "
        f"best rate has the lowest mean {first['metric']} among the rates where no tuning seed "
        f"diverged; {how}."
    )
    return [head, *sweep_lines(record, first["metric"])]


def build_ladder_report(out: Path) -> dict[str, Path]:
    """Draw the ladder folder ``out``'s analysis (summary.json: {``ladder``: …, ``plan``:
    ladder.json}, :func:`normlab.run_format.folder.read_ladder_analysis`) as the figures,
    report.md and report.html; returns {relative path: path}. ``OSError`` or ``ValueError``
    when the analysis is absent or damaged."""
    out = Path(out)
    ladder, plan = run_folder.read_ladder_analysis(out)
    first = next(iter(ladder["arms"].values()))
    colors = arm_colors([first["baseline"], *ladder["arms"]])
    figures = {"ladder": plot_ladder(ladder, colors)}
    if ladder.get("learning_rates"):
        figures[LR_SWEEP_PLOT] = plot_lr_sweep(ladder["learning_rates"], colors)
    written: dict[str, Path] = {}
    pngs = {}
    for name, fig in figures.items():
        pngs[name] = figure_png(fig)
        written[plot_path(name)] = write_bytes_atomic(out / plot_path(name), pngs[name])
    for name in LADDER_PLOTS:
        if name not in figures:
            (out / plot_path(name)).unlink(missing_ok=True)
    sentences = prediction_lines(ladder)
    rungs = ", ".join(plan["rungs"])
    rates = _rate_lines(ladder, plan)
    md = [
        "# normlab compare --ladder",
        "",
        *sentences,
        "",
        f"Rungs: {rungs} ({plan.get('parametrization', 'sp')}; {plan.get('steps', '')}); each "
        "rung's own report is in its folder.",
        "",
        *_rung_table(ladder),
        "",
        *(["## Learning rates", "", *(f"- {line}" for line in rates), ""] if rates else []),
        *(f"![{name}]({plot_path(name)})" for name in figures),
        "",
    ]
    written[REPORT_MD_FILE] = write_text_atomic(out / REPORT_MD_FILE, "\n".join(md))
    images = "".join(
        f'<p><img alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"></p>'
        for name, png in pngs.items()
    )
    body = "".join(f"<p>{html.escape(s)}</p>" for s in sentences)
    rate_html = (
        "<h2>Learning rates</h2><ul>"
        + "".join(f"<li>{html.escape(line)}</li>" for line in rates)
        + "</ul>"
        if rates
        else ""
    )
    page = (
        '<!doctype html><html><head><meta charset="utf-8"><title>normlab ladder</title>'
        f"</head><body><h1>normlab compare --ladder</h1>{body}"
        f"<p>Rungs: {html.escape(rungs)}</p>{rate_html}{images}</body></html>\n"
    )
    written[REPORT_HTML_FILE] = write_text_atomic(out / REPORT_HTML_FILE, page)
    return written
