"""What the report says, independent of its format: the text, tables and plots, in order.

:func:`build_content` turns the analysis dict and the loaded folder into a
:class:`ReportContent`; the Markdown and HTML writers only lay it out, so the two formats
always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from normlab._plural import counted
from normlab.analysis.comparison import EXACT_TEST
from normlab.analysis.format import fmt_bytes, fmt_p, fmt_ratio, fmt_signed
from normlab.analysis.lr_sweep import tuning_seed_words
from normlab.analysis.power import SPREAD_CONFIDENCE, forecast_range
from normlab.analysis.runs import CompareFolder
from normlab.analysis.smallest import smallest_for
from normlab.analysis.wording import badge_in_analysis, judge_in_analysis
from normlab.report.imported import import_paragraphs
from normlab.report.norm_swaps import norm_swap_paragraphs
from normlab.run_format import LR_SWEEP_DIR, TestbedFormat, plot_path, testbed_format
from normlab.run_format import folder as run_folder
from normlab.run_format.budget import ALL_PARAMS, BUDGET_KEY, budget_words, fmt_tokens_per_param

__all__ = [
    "Link",
    "Plot",
    "ReportContent",
    "Section",
    "Table",
    "budget_notes",
    "budget_text",
    "build_content",
    "confidence_pct",
    "fmt_value",
    "tost_pct",
]

_PRETTY_NORMS = {
    "layernorm": "LayerNorm",
    "rmsnorm": "RMSNorm",
    "dyt": "DyT",
    "adaln_zero": "adaLN-Zero",
    "adarms": "AdaRMS",
}


def _testbed(a: dict[str, Any]) -> TestbedFormat:
    """The testbed of the analysis (``gpt`` for analyses written before the DiT testbed)."""
    return testbed_format(a.get("testbed"))


def _margin(a: dict[str, Any]) -> float | None:
    """The equivalence margin of the analysis; None when none was given (``compare --script``
    without ``--margin``: no equivalence test)."""
    return a.get(_testbed(a).margin_key)


NO_MARGIN = "no equivalence margin was given (--margin), so no arm can be called equivalent"
"""What the report says in place of the margin when there is none."""


def _margin_text(a: dict[str, Any], unit: str) -> str:
    margin = _margin(a)
    return f"equivalence margin ±{margin:g} {unit}" if margin else NO_MARGIN


@dataclass(frozen=True)
class Table:
    """A table of strings. ``align`` holds "left" / "right" per column; ``badges`` the indices
    of columns whose cells are verdict words; ``row_class`` a CSS class per row ("" for none)."""

    columns: list[str]
    rows: list[list[str]]
    align: list[str]
    badges: tuple[int, ...] = ()
    row_class: list[str] = field(default_factory=list)

    def drop_empty(self, optional: tuple[int, ...]) -> Table:
        """This table without those ``optional`` columns whose cells are all empty or "—"."""
        drop = {j for j in optional if all(row[j] in ("", "—") for row in self.rows)}
        keep = [j for j in range(len(self.columns)) if j not in drop]
        return Table(
            columns=[self.columns[j] for j in keep],
            rows=[[row[j] for j in keep] for row in self.rows],
            align=[self.align[j] for j in keep],
            badges=tuple(keep.index(j) for j in self.badges if j in keep),
            row_class=list(self.row_class),
        )


@dataclass(frozen=True)
class Plot:
    """One PNG plot: file stem, title, caption and the image bytes."""

    name: str
    title: str
    caption: str
    png: bytes

    @property
    def relpath(self) -> str:
        """Path of the PNG relative to the report."""
        return plot_path(self.name)


@dataclass(frozen=True)
class Link:
    """A link to another report: its text, and its target relative to this report in each
    format (``md`` from report.md, ``html`` from report.html)."""

    text: str
    md: str
    html: str

    @staticmethod
    def href(path: str) -> str:
        """``path`` as a link's target: percent-encoded but for letters, digits and
        ``/ = . - _ ~ + ,`` (so ``d_model=64/report.html`` reads as it is)."""
        return quote(path, safe="/=.-_~+,")


@dataclass(frozen=True)
class Section:
    """A section of its own (after the curves): a title, paragraphs, captioned settings (a
    two-column table of name and value, laid out as a grid in HTML), captioned tables, links
    and plots, in that order; ``anchor`` is its HTML id."""

    anchor: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[str, Table]] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    settings: list[tuple[str, Table]] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)


@dataclass(frozen=True)
class ReportContent:
    """Everything the report shows, in reading order."""

    title: str
    subtitle: str
    status: str
    headline: str
    arm_details: list[tuple[str, str, str]]
    verdict_table: Table
    verdict_plot: Plot | None
    varied: list[tuple[str, str]]
    fixed: Table
    params: Table
    plots: list[Plot]
    curves_note: str
    stats_table: Table
    runs_table: Table
    excluded: list[str]
    environment: Table
    method: list[str]
    sections: list[Section] = field(default_factory=list)
    """Sections shown after the curves (comparisons by factor, norm health), when there is
    something to show."""
    budget: str = ""
    """How long each run trained, in steps, tokens and tokens per parameter (shown with what
    was compared; "" when the analysis does not say)."""
    verdict_notes: list[str] = field(default_factory=list)
    """Notes shown right after the verdict's table (early training)."""


def _fmt_metric(testbed: TestbedFormat, field: str, v: float | None, unit: bool = True) -> str:
    """A summary field's value as the run format's display of the field says."""
    return testbed.display(field).format(v, unit)


def _display_unit(testbed: TestbedFormat, field: str, unit: str) -> str:
    """The unit a table header shows: the display's suffix (e.g. MiB), else ``unit``."""
    return testbed.display(field).suffix.strip() or unit


def fmt_value(v: Any) -> str:
    """A setting's value as the report shows it: a float in ``g`` format, a dict or list as
    compact JSON, None as an em dash, anything else as ``str``."""
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "))
    return "—" if v is None else str(v)


def _title(folder: CompareFolder) -> str:
    varied = folder.experiment.get("varied") or {}
    norms = varied.get("norm") if isinstance(varied, dict) else None
    if isinstance(norms, list) and len(norms) >= 2 and all(isinstance(n, str) for n in norms):
        title = " vs ".join(_PRETTY_NORMS.get(n, n) for n in norms)
        others = [
            f"{k}: {', '.join(map(str, v))}"
            for k, v in varied.items()
            if k != "norm" and isinstance(v, list) and len(v) > 1
        ]
        return " · ".join([title, *others])
    return " vs ".join(folder.arms) if len(folder.arms) <= 3 else counted(len(folder.arms), "arm")


def confidence_pct(a: dict[str, Any]) -> int:
    """The two-sided interval level of the analysis in percent: 100 · (1 − α)."""
    return round(100 * (1 - a["alpha"]))


def tost_pct(a: dict[str, Any]) -> int:
    """The level of the interval that TOST at α uses, in percent: 100 · (1 − 2α)."""
    return round(100 * (1 - 2 * a["alpha"]))


def _verdict_table(a: dict[str, Any]) -> Table:
    testbed = _testbed(a)
    rows = []
    for arm in a["arm_order"]:
        if arm == a["baseline_arm"]:
            continue
        v, q = a["verdicts"][arm], a["comparisons"][arm][testbed.quality]
        t = a["comparisons"][arm]["tokens_per_s"]
        diff = (
            f"{fmt_signed(q['mean_diff'])} [{fmt_signed(q['ci_low'])}, {fmt_signed(q['ci_high'])}]"
            if q["ci_low"] is not None
            else fmt_signed(q["mean_diff"])
        )
        speed = (
            f"{fmt_ratio(t['ratio'])} [{fmt_ratio(t['ratio_ci_low'])}, "
            f"{fmt_ratio(t['ratio_ci_high'])}]"
            if t["ratio_ci_low"] is not None
            else fmt_ratio(t["ratio"])
        )
        needed = forecast_range(v["seeds_needed"], v.get("seeds_needed_high", v["seeds_needed"]))
        rows.append(
            [
                arm,
                diff,
                v["quality"],
                speed,
                v["throughput"],
                v["memory"],
                v["stability"],
                needed,
                badge_in_analysis(a, arm),
            ]
        )
    return Table(
        columns=[
            "arm",
            f"Δ {testbed.short_label} [{_quality_interval(a)}]",
            "quality",
            f"throughput ratio [{confidence_pct(a)}% CI]",
            "speed",
            "memory",
            "stability",
            "seeds needed",
            "in the recommendation",
        ],
        rows=rows,
        align=["left", "right", "left", "right", "left", "left", "left", "right", "left"],
        badges=(2, 4, 5, 6, 8),
    ).drop_empty((7,))


def _quality_interval(a: dict[str, Any]) -> str:
    """What the quality interval is: the t-interval, or after ``--until-decided`` the repeated
    interval of the sequential decision (:func:`normlab.analysis.rounds.sequential_comparison`)."""
    if a.get("sequential"):
        return "repeated interval, see Method"
    return f"{confidence_pct(a)}% CI"


def learning_rate_row(folder: CompareFolder) -> tuple[str, str] | None:
    """The row "learning rate" of what was varied when the arms trained at their own rates
    (experiment.json's ``learning_rates``), saying where the rates were chosen when a
    learning-rate sweep did it: the sweep beside the folder (``lr-sweep/``), or the sweep of
    the ladder the folder is a rung of (its ladder.json's ``lr_sweep``); None otherwise."""
    rates = folder.experiment.get("learning_rates")
    if not isinstance(rates, dict) or not rates:
        return None
    shown = ", ".join(f"{arm} {fmt_value(r)}" for arm, r in rates.items())
    ladder_out, setting = folder.path.parent, folder.path.name
    sweep = None
    if run_folder.has_ladder_plan(ladder_out):
        sweep = run_folder.read_ladder_plan(ladder_out).get("lr_sweep")
    if isinstance(sweep, dict) and setting in sweep.get("chosen_at", {}):
        at = sweep["chosen_at"][setting]
        seeds = tuning_seed_words(sweep.get("tuning_seeds", []))
        where = "this rung" if at == setting else at
        text = (
            f"each arm at its own best rate ({shown}), chosen at {where} by the learning-rate "
            f"sweep on {seeds} (see the ladder's report)"
        )
    elif (folder.path / LR_SWEEP_DIR).is_dir():
        text = (
            f"each arm at its own best rate ({shown}), chosen by the learning-rate sweep in "
            f"{LR_SWEEP_DIR}/ on tuning seeds apart from these"
        )
    else:
        text = f"each arm at its own rate ({shown})"
    return "learning rate", text


def _fixed_table(folder: CompareFolder) -> Table:
    fixed = folder.experiment.get("fixed") or {}
    rows = [[str(k), fmt_value(v)] for k, v in fixed.items()] if isinstance(fixed, dict) else []
    return Table(["setting", "value"], rows, ["left", "left"])


def _params_table(a: dict[str, Any]) -> Table:
    rows = []
    for arm in a["arm_order"]:
        info = a["arm_info"][arm]
        n, n_norm = info["n_params"], info["n_norm_params"]
        share = f"{100 * n_norm / n:.2f} %" if n and n_norm is not None else "—"
        rows.append(
            [
                arm,
                fmt_value(info["norm"]),
                fmt_value(info["placement"]),
                f"{n:,}" if n is not None else "—",
                f"{n_norm:,}" if n_norm is not None else "—",
                share,
                ", ".join(map(str, info["seeds_done"])) or "—",
                ", ".join(map(str, info["seeds_missing"])) or "none",
            ]
        )
    return Table(
        [
            "arm",
            "norm",
            "placement",
            "parameters",
            "in norms",
            "norm share",
            "seeds with a result",
            "seeds missing",
        ],
        rows,
        ["left", "left", "left", "right", "right", "right", "left", "left"],
    )


def _test_cell(c: dict[str, Any]) -> str:
    """The p-value of a comparison, named "sign test" when the exact sign test decided it."""
    if c.get("test") == EXACT_TEST:
        return "exact (same in every seed)"
    sign = str(c.get("test", "")).startswith("exact sign test")
    if c["p_value"] is None or (c["n_pairs"] < 2 and not sign):
        return "—"
    cell = f"sign test {fmt_p(c['p_value'])}" if sign else fmt_p(c["p_value"])
    if c.get("p_holm") is not None:
        cell += f" (Holm {fmt_p(c['p_holm']).removeprefix('p ')})"
    return cell


def _has_test(a: dict[str, Any], metric: str, arm: str) -> bool:
    """Whether a comparison on ``metric`` involving ``arm`` has a p-value: an arm with no value
    to average (it never reached the target) can still have a verdict from the sign test."""
    comps = a["comparisons"]
    arms = list(comps) if arm == a["baseline_arm"] else [arm]
    return any(comps[o][metric]["p_value"] is not None for o in arms if o in comps)


def _stats_table(a: dict[str, Any]) -> Table:
    rows, classes = [], []
    base = a["baseline_arm"]
    testbed = _testbed(a)
    for spec in testbed.metrics:
        first = True
        for arm in a["arm_order"]:
            s = a["arms"][arm][spec.name]
            if s["n"] == 0 and not _has_test(a, spec.name, arm):
                continue
            show = testbed.display(spec.name)
            sd = "" if s["std"] is None else f" ± {show.format(s['std'], False)}"
            mean = f"{show.format(s['mean'], False)}{sd}"
            if arm == base:
                diff, p, verdict = "baseline", "", ""
            else:
                c = a["comparisons"][arm][spec.name]
                if spec.scale == "ratio":
                    diff = fmt_ratio(c["ratio"])
                    if c["ratio_ci_low"] is not None:
                        diff += (
                            f" [{fmt_ratio(c['ratio_ci_low'])}, {fmt_ratio(c['ratio_ci_high'])}]"
                        )
                else:
                    digits = show.digits
                    diff = fmt_signed(c["mean_diff"], digits)
                    if c["ci_low"] is not None:
                        diff += (
                            f" [{fmt_signed(c['ci_low'], digits)}, "
                            f"{fmt_signed(c['ci_high'], digits)}]"
                        )
                p = _test_cell(c)
                if c["tost_p"] is not None:
                    p += f"; TOST {fmt_p(c['tost_p'])}"
                verdict = judge_in_analysis(a, arm, spec.name).word
            unit = _display_unit(testbed, spec.name, spec.unit)
            label = f"{spec.label} ({unit})" if first else ""
            rows.append([label, arm, mean, str(s["n"]), diff, p, verdict])
            classes.append("group-start" if first else "")
            first = False
    return Table(
        [
            "metric",
            "arm",
            "mean ± sd",
            "n",
            f"vs baseline: Δ or ratio [{confidence_pct(a)}% CI]",
            "test",
            "verdict",
        ],
        rows,
        ["left", "left", "right", "right", "right", "left", "left"],
        badges=(6,),
        row_class=classes,
    )


def _runs_table(folder: CompareFolder, a: dict[str, Any]) -> Table:
    testbed = _testbed(a)
    extra_metrics = [name for name, _ in testbed.run_columns]
    reasons = {r["run_id"]: r["reason"] for r in a["runs"]}
    rows, classes = [], []
    for r in sorted(folder.runs, key=lambda r: (a["arm_order"].index(r.arm), r.seed)):
        spikes = (
            f"{int(r.value('n_loss_spikes') or 0)} / {int(r.value('n_grad_spikes') or 0)}"
            if r.summary
            else "—"
        )
        clipped = r.value("n_clipped")
        extra = [_fmt_metric(testbed, m, r.value(m)) for m in extra_metrics]
        rows.append(
            [
                r.arm,
                str(r.seed),
                r.status,
                reasons[r.run_id],
                fmt_value(r.summary.get("steps")) if r.summary else "—",
                _fmt_metric(testbed, testbed.quality, r.value(testbed.quality)),
                *extra,
                _fmt_metric(testbed, "final_train_loss", r.value("final_train_loss")),
                _fmt_metric(testbed, "tokens_per_s", r.value("tokens_per_s")),
                fmt_bytes(r.value("peak_memory_bytes")),
                spikes,
                "—" if clipped is None else str(int(clipped)),
                _fmt_metric(testbed, "time_to_target_s", r.value("time_to_target_s")),
                _fmt_metric(testbed, "wall_s", r.value("wall_s")),
            ]
        )
        classes.append(r.status if r.status != "finished" else "")
    return Table(
        [
            "arm",
            "seed",
            "status",
            "note",
            "steps",
            testbed.short_label,
            *(header for _, header in testbed.run_columns),
            "final train loss",
            "tokens/s",
            "peak memory",
            "spikes (loss / grad)",
            "clipped steps",
            "time to target",
            "wall time",
        ],
        rows,
        ["left", "right", "left", "left"] + ["right"] * (9 + len(extra_metrics)),
        badges=(2,),
        row_class=classes,
    ).drop_empty((3,))


def _environment_table(a: dict[str, Any]) -> Table:
    env = a["environment"]
    labels = {
        "normlab_version": "normlab",
        "torch_version": "torch",
        "python_version": "Python",
        "device": "device",
        "threads": "CPU threads",
        "platform": "platform",
        "data_source": "data source",
        "data_fingerprint": "data fingerprint (SHA-256)",
        "data_n_train_tokens": "training tokens",
        "data_n_val_tokens": "validation tokens",
        "runs_device": "devices used by runs",
        "runs_torch_version": "torch in runs",
        "runs_threads": "threads in runs",
        "runs_peak_memory_kind": "peak-memory measure",
        "runs_data_fingerprint": "data fingerprints seen by runs",
    }
    rows = []
    for key, value in env.items():
        same = env.get(key.removeprefix("runs_"))
        if key.startswith("runs_") and isinstance(value, list) and [str(same)] == value:
            continue  # every run agrees with the experiment-level value
        text = ", ".join(map(str, value)) if isinstance(value, list) else fmt_value(value)
        if isinstance(value, int) and not isinstance(value, bool) and "tokens" in key:
            text = f"{value:,}"
        rows.append([labels.get(key, key), text])
    return Table(["", ""], rows, ["left", "left"])


def _method(a: dict[str, Any], note: list[str] | None = None) -> list[str]:
    """The method section; ``note`` replaces the testbed's own note when given (an imported
    folder says where its runs came from instead)."""
    alpha = a["alpha"]
    testbed = _testbed(a)
    paired = (
        "Runs are paired: seed k of every arm starts from the same initial values and sees the "
        "same batches, so each comparison uses the per-seed differences d_k = arm − baseline."
    )
    if note:  # imported: the pairing is the seed rule's, its start was not seen
        paired = (
            "Runs are paired by seed: each comparison uses the per-seed differences d_k = arm − "
            "baseline, with seed k as the import's seed rule read it; that the runs of a seed "
            "started alike is assumed (see the pairing checks above)."
        )
    else:
        note = [testbed.method_note] if testbed.method_note else []
    return [
        *note,
        paired,
        f"Intervals are Student-t intervals of the mean difference, d̄ ± t(1 − α/2, n − 1)·s/√n "
        f"with α = {alpha:g}. Throughput and memory use the log ratio ln(arm / baseline), "
        "reported as a geometric-mean ratio.",
        (
            f"Equivalence: two one-sided t-tests (TOST) against the margin ±{_margin(a):g} "
            f"{testbed.unit}; equivalent when both reject at α = {alpha:g}, i.e. when the "
            f"{tost_pct(a)}% interval lies inside the margin. Equivalence is "
            "checked before superiority, so a detectable but negligible difference reads "
            "'equivalent'."
            if _margin(a)
            else f"Equivalence: not tested, since {NO_MARGIN}: a quality difference is better "
            "or worse, or not determined."
        ),
        f"Better / worse: the {confidence_pct(a)}% interval of the difference excludes zero. "
        "Otherwise the result "
        f"is inconclusive and 'seeds needed' is the smallest n at which, if the observed "
        f"difference and spread were the truth, the question would be settled with "
        f"{round(100 * a['power'])}% probability (noncentral-t power), then the same n at the top "
        f"of the spread's {round(100 * SPREAD_CONFIDENCE)}% chi-square interval: with 3–5 seeds "
        "the spread itself is uncertain, and the count at the true spread lies below the upper "
        "end about 9 times in 10.",
        "Spike counts are small integers, so their verdicts (and the stability verdict) use the "
        "exact two-sided sign test on the paired differences, ties dropped: equal counts in "
        "every pair give a zero-width t-interval without being certain. A seed where only one "
        "arm reached the target loss counts in a sign test on which arm reached it first.",
        "A metric that does not depend on the seed (the bytes saved for the backward) differs "
        "by the same amount in every pair: that difference is exact, so its verdict follows its "
        "sign and the test column reads 'exact' instead of a p-value.",
        "Every metric is tested, so one small p among many can be chance: the test column "
        "also gives each p-value adjusted by Holm–Bonferroni over all the metrics compared for "
        "that arm (Holm = 0.03 means the result survives a family-wise error rate of 5%). A "
        "result is called better or worse only when its Holm-adjusted p is below α and the "
        "difference is at least the smallest that matters (" + _smallest_words(a) + "); an "
        "interval that excludes zero without that "
        "reads 'unconfirmed' or 'unclear size'. The quality metric, tested first, uses its "
        "unadjusted test. An arm that failed to learn (most runs stalled, did not learn or "
        "diverged) shows its secondary metrics as 'not comparable'. The recommendation rests "
        "on quality, speed, memory and stability only.",
        "Quality, throughput and memory use finished runs; a diverged run is a result, and "
        "counts against its arm's stability; crashed or unfinished runs are excluded and listed.",
        *_fp8_note(a),
        *_sequential_method(a),
    ]


def _fp8_note(a: dict[str, Any]) -> list[str]:
    """A line saying the FP8 PTQ numbers were simulated, when some run's were."""
    methods = (a.get("environment") or {}).get("runs_ptq_fp8_method") or []
    if "simulated" not in methods:
        return []
    return [
        "FP8 PTQ degradation was SIMULATED in "
        + ("every run" if methods == ["simulated"] else "some runs (see runs.csv)")
        + ": this device has no FP8 matrix multiply, so every nn.Linear's weight (one scale per "
        "output channel) and input (one scale per token) were rounded through "
        "torch.float8_e4m3fn and multiplied in float32; the rounding is FP8's, the arithmetic "
        "is not."
    ]


def _smallest_words(a: dict[str, Any]) -> str:
    """The smallest difference that matters of each compared metric, as the field declarations
    give it (:func:`normlab.analysis.smallest.smallest_for`): ``label δ``, metrics with the same
    δ together."""
    testbed = str(a.get("testbed") or "gpt")
    groups: dict[str, list[str]] = {}
    compared = {
        name
        for by_metric in (a.get("comparisons") or {}).values()
        for name, c in by_metric.items()
        if isinstance(c, dict) and c.get("n_pairs")
    }
    for name, info in a["metrics"].items():
        if name not in compared:  # a metric no run recorded has no row, so no δ either
            continue
        spec = smallest_for(name, testbed)
        if spec.value is None:
            factor = f" × {spec.margin_factor:.3g}" if spec.margin_factor != 1 else ""
            margin = _margin(a)
            delta = f"the margin ±{margin:g}{factor}" if margin else "none (no margin)"
        elif spec.kind == "relative":
            delta = f"{100 * spec.value:g}%"
        else:
            delta = f"{spec.value:g} {info['unit']}"
        groups.setdefault(delta, []).append(str(info["label"]))
    return "; ".join(f"{delta} for {', '.join(labels)}" for delta, labels in groups.items())


def _sequential_method(a: dict[str, Any]) -> list[str]:
    """The method paragraph of ``compare --until-decided`` (none without its state): which
    procedure, the looks planned, each look's decisions, how many seeds it took and why it
    stopped."""
    state = a.get("sequential")
    if not state:
        return []
    plan = state["plan"]
    alpha = float(plan["alpha"])
    looks = ", ".join(str(n) for n in plan["looks"])
    budget = f" and a time budget of {plan['max_time_s']:g} s" if plan.get("max_time_s") else ""
    margin = f"±{plan['margin']:g}" if plan.get("margin") else "none"
    done = []
    for look in state.get("looks", []):
        words = ", ".join(f"{arm} {d['verdict']}" for arm, d in look["arms"].items())
        done.append(f"after {counted(look['n_seeds'], 'seed')}: {words or 'no open arm'}")
    stopped = (state.get("stopped") or {}).get("words", "the rounds were interrupted")
    return [
        f"Seeds were added in rounds until decided (--until-decided): a {state['procedure']} "
        f"({state['citation']}). The looks were fixed before the first one: after {looks} seeds "
        f"(the last is the most seeds planned){budget}. At each look the paired differences of "
        f"{state['metric']} are tested against boundaries that spend α = {alpha:g} over the "
        f"looks: equivalent when the repeated {round(100 * (1 - 2 * alpha))}% interval lies "
        f"inside the margin ({margin}), better or worse when the repeated "
        f"{round(100 * (1 - alpha))}% interval excludes zero, so the error rates hold however "
        "many looks are made. An arm keeps its decision once made; at the last look an open "
        "arm is inconclusive. The quality verdicts above are these sequential decisions, with "
        "their repeated intervals. Looks: " + "; ".join(done) + f". It stopped because {stopped}.",
    ]


def build_content(
    folder: CompareFolder,
    analysis: dict[str, Any],
    verdict_plot: Plot | None,
    plots: list[Plot],
    sections: list[Section] | None = None,
    curve_problems: list[str] | None = None,
) -> ReportContent:
    """Assemble the report's sections from the loaded folder, the analysis and the plots;
    ``sections`` come after the curves; ``curve_problems`` ("run: why") name the runs whose
    curves are left out."""
    a = analysis
    rec = a["recommendation"]
    details = [
        (arm, badge_in_analysis(a, arm), a["verdicts"][arm]["justification"])
        for arm in a["arm_order"]
        if arm in a["verdicts"]
    ]
    varied_rows = _varied_rows(folder)
    curves_note = _curves_note(a, plots, curve_problems)
    return ReportContent(
        title=_title(folder),
        subtitle=_subtitle(folder, a),
        status=rec["status"],
        headline=rec["headline"],
        arm_details=details,
        verdict_table=_verdict_table(a),
        verdict_plot=verdict_plot,
        varied=varied_rows,
        fixed=_fixed_table(folder),
        params=_params_table(a),
        plots=plots,
        curves_note=curves_note,
        stats_table=_stats_table(a),
        runs_table=_runs_table(folder, a),
        excluded=_excluded(a),
        environment=_environment_table(a),
        method=_method(a, import_paragraphs(folder.experiment))
        + norm_swap_paragraphs(folder.experiment),
        sections=list(sections or []),
        budget=budget_text(a),
        verdict_notes=budget_notes(a),
    )


def budget_text(a: dict[str, Any]) -> str:
    """The runs' length from the analysis's ``budget``
    (:func:`normlab.analysis.training_budget.budget_record`): "Each run trained 600 steps,
    614,400 tokens: 2.87 tokens per parameter of the baseline arm's 214,144 parameters, all",
    and with a budget of tokens per parameter that it was given as one; "" without the
    record or its numbers."""
    b = a.get(BUDGET_KEY) or {}
    x, n = b.get("tokens_per_param"), b.get("n_params")
    if x is None:
        return ""
    length = [counted(int(b["steps"]), "step")] if b.get("steps") else []
    length += [f"{int(b['tokens']):,} tokens"] if b.get("tokens") else []
    per_param = (
        budget_words(x, n, b.get("param_count") or ALL_PARAMS)
        if n
        else f"{fmt_tokens_per_param(x)} tokens per parameter of the baseline arm"
    )
    trained = f"Each run trained {', '.join(length)}: " if length else "Each run trained "
    given = " (the budget given, the same tokens for every arm)" if b.get("given") else ""
    return f"{trained}{per_param}{given}."


def budget_notes(a: dict[str, Any]) -> list[str]:
    """The note shown with the verdict when the runs are early training (the analysis's
    ``budget.note``), else none."""
    note = (a.get(BUDGET_KEY) or {}).get("note")
    return [f"{note[:1].upper()}{note[1:]}."] if note else []


def _varied_rows(folder: CompareFolder) -> list[tuple[str, str]]:
    """What was varied (experiment.json's ``varied``: name → value, a list joined by commas),
    and the learning rate when the arms trained at their own (:func:`learning_rate_row`)."""
    varied = folder.experiment.get("varied") or {}
    rows = (
        [
            (str(k), ", ".join(map(str, v)) if isinstance(v, list) else str(v))
            for k, v in varied.items()
        ]
        if isinstance(varied, dict)
        else []
    )
    rate_row = learning_rate_row(folder)
    if rate_row is not None:
        rows.append(rate_row)
    return rows


def _curves_note(a: dict[str, Any], plots: list[Plot], problems: list[str] | None) -> str:
    """The note above the curves: that the training loss or validation curve is missing (no
    run logged its records), and the runs whose curves are left out ("run: why")."""
    curve_names = {p.name for p in plots}
    note = (
        ""
        if {"training_loss", _testbed(a).curve} <= curve_names
        else "Some per-step curves are missing: no run with a result has train or eval records "
        "in its metrics.jsonl."
    )
    if problems:
        note = " ".join([note, "Curves left out:", "; ".join(problems) + "."]).strip()
    return note


def _subtitle(folder: CompareFolder, a: dict[str, Any]) -> str:
    """Arms × seeds, the runs with a result, the baseline, the margin and the folder's name."""
    n_done = sum(r.done for r in folder.runs)
    return (
        f"{counted(len(folder.arms), 'arm')} × {counted(len(folder.seeds), 'seed')}, {n_done} "
        f"of {counted(len(folder.runs), 'run')} with a result · baseline {a['baseline_arm']} · "
        f"{_margin_text(a, _testbed(a).short_unit)} · folder {folder.path.resolve().name}"
    )


def _excluded(a: dict[str, Any]) -> list[str]:
    """The runs left out of the statistics with the reason, then those in runs/ that
    experiment.json does not list."""
    return [f"{r['run_id']}: {r['reason']}" for r in a["excluded"]] + [
        f"{name}: in runs/ but not part of this experiment (experiment.json does not list it)"
        for name in a.get("ignored_runs", [])
    ]
