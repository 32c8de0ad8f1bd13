"""The report's sections beyond the main comparison: the comparisons by factor (when several
factors vary, e.g. norm × precision), norm health over training and, for a folder swept by
``compare --lr-sweep``, the learning rates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from normlab._io import read_jsonl
from normlab.analysis.format import fmt_ratio, fmt_signed
from normlab.analysis.health import HEALTH_TOLERANCE, health_flags
from normlab.analysis.lr_sweep import sweep_lines, tuning_seed_words
from normlab.analysis.runs import CompareFolder, RunResult
from normlab.report.content import Plot, Section, Table, confidence_pct
from normlab.report.plots import figure_png, plot_lr_sweep, plot_norm_health
from normlab.run_format import HEALTH_RECORD, LR_SWEEP_DIR, LR_SWEEP_KEY, testbed_format

__all__ = ["HEALTH_PLOT", "LR_SWEEP_PLOT", "factor_section", "health_section", "lr_sweep_section"]

HEALTH_PLOT = "norm_health"
"""The file stem of the norm-health figure."""
LR_SWEEP_PLOT = "lr_sweep"
"""The file stem of the loss-against-learning-rate figure."""
MAX_FLAG_LINES = 20


def _interval(c: Mapping[str, Any]) -> str:
    if c.get("ci_low") is None:
        return fmt_signed(c.get("mean_diff"))
    return f"{fmt_signed(c['mean_diff'])} [{fmt_signed(c['ci_low'])}, {fmt_signed(c['ci_high'])}]"


def _ratio(c: Mapping[str, Any]) -> str:
    if c.get("ratio_ci_low") is None:
        return fmt_ratio(c.get("ratio"))
    return (
        f"{fmt_ratio(c['ratio'])} [{fmt_ratio(c['ratio_ci_low'])}, {fmt_ratio(c['ratio_ci_high'])}]"
    )


def factor_section(a: Mapping[str, Any]) -> Section | None:
    """ "Comparisons by factor": one table per comparison family of the analysis (see
    :mod:`normlab.analysis.families`), or None when one factor varies."""
    families = a.get("families") or []
    if not families:
        return None
    testbed = testbed_format(a.get("testbed"))
    ci = confidence_pct(dict(a))
    tables = []
    for fam in families:
        fixed = ", ".join(f"{k} = {v}" for k, v in fam["fixed"].items())
        caption = f"{fam['factor']} at {fixed}" if fixed else str(fam["factor"])
        rows = []
        for arm in fam["arms"][1:]:
            c = fam["comparisons"][arm]
            q, t = c[testbed.quality], c["tokens_per_s"]
            skipped = c.get("n_skipped_steps", {})
            rows.append(
                [
                    arm,
                    fam["baseline"],
                    _interval(q),
                    q["verdict"],
                    _ratio(t),
                    t["verdict"],
                    fmt_signed(skipped.get("mean_diff")) if skipped else "—",
                ]
            )
        table = Table(
            columns=[
                "arm",
                "against",
                f"Δ {testbed.short_label} [{ci}% CI]",
                "quality",
                f"throughput ratio [{ci}% CI]",
                "speed",
                "Δ skipped fp16 steps",
            ],
            rows=rows,
            align=["left", "left", "right", "left", "right", "left", "right"],
            badges=(3, 5),
        ).drop_empty((6,))
        tables.append((caption, table))
    return Section(
        anchor="factors",
        title="Comparisons by factor",
        paragraphs=[
            "Several factors vary, so each is compared with the others held fixed: norms within "
            "each precision (against the baseline norm at that precision), precisions within "
            "each norm (against fp32), placements likewise; paired by seed as above. The "
            "verdict table above compares every arm with the single baseline arm."
        ],
        tables=tables,
    )


def _health_records(run: RunResult) -> list[dict[str, Any]]:
    try:
        return [r for r in read_jsonl(run.metrics_path) if r.get("type") == HEALTH_RECORD]
    except (OSError, ValueError):  # missing or damaged: the curves' note names the run
        return []


def health_section(folder: CompareFolder, colors: Mapping[str, str]) -> Section | None:
    """ "Norm health": the figure of what enters each norm layer and its gain over training
    (:func:`normlab.report.plots.plot_norm_health`, one row per arm, its first seed with health
    records) and the layers flagged in any run (see
    :func:`normlab.analysis.health.health_flags`); None when no run recorded health."""
    shown: dict[str, list[dict[str, Any]]] = {}
    seeds: dict[str, int] = {}
    lines: list[str] = []
    for arm in folder.arms:
        for run in folder.runs_of(arm):
            if not run.done:
                continue
            records = _health_records(run)
            if not records:
                continue
            if arm not in shown:
                shown[arm], seeds[arm] = records, run.seed
            lines += [f"{run.run_id}: {f.describe()}" for f in health_flags(records)]
    if not shown:
        return None
    pct = f"{100 * HEALTH_TOLERANCE:g} %"
    if lines:
        kept = lines[:MAX_FLAG_LINES]
        more = len(lines) - len(kept)
        flags = [
            f"Flagged (mean(x̂²) more than {pct} from 1, or output more than {pct} from the "
            "layer's own formula; ε dominating the statistic, or a bug):",
            *kept,
            *([f"… and {more} more."] if more else []),
        ]
    else:
        flags = [
            f"No layer flagged: in every run, at every evaluation, mean(x̂²) stayed within {pct} "
            f"of 1 and every output within {pct} of its layer's formula (layers of unknown "
            "formula are not judged)."
        ]
    which = ", ".join(f"{arm} seed {seed}" for arm, seed in seeds.items())
    plot = Plot(
        HEALTH_PLOT,
        "Norm health over training",
        "At every evaluation, on a fixed validation batch, per norm layer (rows) of one run per "
        "arm: the RMS of its input (the residual stream's growth, log scale), the mean and the "
        "largest |value| of its gain, and for RMSNorm how far its inputs are from zero-mean "
        "(the mean of x̂ per token, RMS over tokens; LayerNorm removes the mean, so it has "
        "none). Grey: no value (an unknown formula, no gain). mean(x̂²) is 1 by construction in "
        f"a correct norm, so it gets a column only when it leaves 1 by more than {pct} "
        f"(white is 1). Runs shown: {which}.",
        figure_png(plot_norm_health(shown, colors)),
    )
    return Section(anchor="health", title="Norm health", paragraphs=flags, plots=[plot])


def lr_sweep_section(a: Mapping[str, Any], colors: Mapping[str, str]) -> Section | None:
    """ "Learning rates": how each arm's rate was chosen, the sweep in words
    (:func:`normlab.analysis.lr_sweep.sweep_lines`) and the loss against the rate per arm
    (:func:`normlab.report.plots.plot_lr_sweep`, the ladder report's figure), from the
    analysis's ``learning_rates``; None without a sweep."""
    record = a.get(LR_SWEEP_KEY)
    if not record:
        return None
    metric = str(a.get("quality_metric") or testbed_format(a.get("testbed")).quality)
    curves = [c for by_arm in record["settings"].values() for c in by_arm.values()]
    rates = sorted({p["rate"] for c in curves for p in c["points"]})
    head = (
        f"Each arm at its own best rate: every arm was trained at each rate of "
        f"{', '.join(f'{r:g}' for r in rates)} on {tuning_seed_words(record['tuning_seeds'])} "
        f"(apart from the evaluation seeds; the runs are in {LR_SWEEP_DIR}/); its best rate has "
        f"the lowest mean {metric} among the rates where no tuning seed diverged, and the "
        "comparison above runs each arm at its best rate."
    )
    plot = Plot(
        LR_SWEEP_PLOT,
        "Loss against learning rate",
        f"Per arm the mean {metric} over the tuning seeds at each rate (log axis) with its "
        "95% t-interval as a band; the star is the rate the comparison ran the arm at, an x at "
        "the top of the panel a rate where a tuning seed diverged.",
        figure_png(plot_lr_sweep(record, colors)),
    )
    return Section(
        anchor="learning-rates",
        title="Learning rates",
        paragraphs=[head, *sweep_lines(record, metric)],
        plots=[plot],
    )
