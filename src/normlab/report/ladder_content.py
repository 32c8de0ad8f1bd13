"""What a size ladder's report says, independent of its format: the text, tables, links and
plots in reading order (:class:`LadderContent`), laid out by
:func:`normlab.report.markdown.render_ladder_markdown` and
:func:`normlab.report.html.render_ladder_html`, so report.md and report.html always agree.

Everything comes from the ladder folder's files, read by :func:`read_ladder_folder`:
summary.json's ``ladder`` record and ``plan`` (ladder.json), and each rung's own summary.json
(its verdict on the quality metric, the seeds that would settle it, each arm's values) and
experiment.json (its settings). The words are the analysis's own: the prediction's word and
sentence from the ladder record, each rung's verdict from its summary.json; the colour of the
box is the tone of those words (:func:`normlab.analysis.wording.tone`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab._plural import counted, noun
from normlab.analysis.format import fmt_num, fmt_signed
from normlab.analysis.lr_sweep import sweep_lines, tuning_seed_words
from normlab.analysis.power import forecast_range
from normlab.analysis.wording import NEUTRAL, OPEN, tone
from normlab.report.content import Link, Plot, Section, Table, fmt_value
from normlab.report.sections import LR_SWEEP_PLOT
from normlab.run_format import (
    LADDER_KEY,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
    TestbedFormat,
    testbed_format,
)
from normlab.run_format import folder as run_folder
from normlab.run_format.budget import BUDGET_KEY, fmt_tokens_per_param

__all__ = [
    "BOX_LABEL",
    "LADDER_PLOT",
    "LOSSES_PLOT",
    "LadderContent",
    "LadderFolder",
    "arm_values",
    "build_ladder_content",
    "early_rungs",
    "read_ladder_folder",
    "rung_table",
]

BOX_LABEL = "Prediction at the target"
"""The title of a ladder report's verdict box."""
LADDER_PLOT = "ladder"
"""The file stem of the figure of the difference against size (the verdict's)."""
LOSSES_PLOT = "ladder_losses"
"""The file stem of the figure of each arm's quality metric against size."""


@dataclass(frozen=True)
class LadderFolder:
    """The files of a ladder folder that its report reads: the folder's ``path``, summary.json's
    ``ladder`` record and ``plan`` (ladder.json), and per rung setting (the plan's order) its
    summary.json in ``rungs`` and its experiment.json in ``experiments`` ({} where a file is
    missing or unreadable)."""

    path: Path
    ladder: dict[str, Any]
    plan: dict[str, Any]
    rungs: dict[str, dict[str, Any]]
    experiments: dict[str, dict[str, Any]]

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        """{arm: its ladder record against the baseline}."""
        return self.ladder["arms"]

    @property
    def first(self) -> dict[str, Any]:
        """The first arm's ladder record (the baseline, metric, target and confidence are the
        same in every arm's)."""
        return next(iter(self.records.values()))

    @property
    def testbed(self) -> TestbedFormat:
        """The rungs' testbed (``gpt`` when no experiment.json says)."""
        found = next((e.get("testbed") for e in self.experiments.values() if e), None)
        return testbed_format(found)

    @property
    def confidence(self) -> int:
        """The level of the rungs' intervals and of the prediction, in percent."""
        return round(100 * float(self.first["prediction"]["confidence"]))


@dataclass(frozen=True)
class LadderContent:
    """Everything a ladder's report shows, in reading order: the title and subtitle, the box
    (``status`` a tone: good / bad / open / neutral; the headline; per arm its word and
    sentence), the prediction's table and figure, the sections, the method."""

    title: str
    subtitle: str
    status: str
    headline: str
    arm_details: list[tuple[str, str, str]]
    verdict_table: Table
    verdict_plot: Plot | None
    sections: list[Section]
    method: list[str]


def _read(read: Any, path: Path) -> dict[str, Any]:
    """``read(path)``, or {} when the rung has no such file yet; a damaged one raises the
    reader's ``ValueError`` naming it (a rung is never drawn from a file that cannot be read)."""
    try:
        return read(path)
    except FileNotFoundError:
        return {}


def read_ladder_folder(out: Path) -> LadderFolder:
    """The ladder folder ``out`` as its report reads it; ``ValueError`` when its summary.json
    holds no ``ladder`` record (the report of the ladder is built after its analysis)."""
    out = Path(out)
    summary = run_folder.read_analysis(out)
    if not isinstance(summary.get(LADDER_KEY), dict):
        raise ValueError(
            f"{out}: summary.json holds no {LADDER_KEY!r} record; expected a ladder folder's "
            "analysis (normlab report OUT writes it)"
        )
    plan = summary.get("plan") or run_folder.read_ladder_plan(out)
    settings = [str(s) for s in plan.get("rungs", [])]
    return LadderFolder(
        path=out,
        ladder=summary[LADDER_KEY],
        plan=plan,
        rungs={s: _read(run_folder.read_analysis, run_folder.rung_path(out, s)) for s in settings},
        experiments={
            s: _read(run_folder.read_experiment, run_folder.rung_path(out, s)) for s in settings
        },
    )


def arm_values(f: LadderFolder) -> dict[str, list[tuple[float, list[float]]]]:
    """Per arm (the baseline first), per rung its parameter count (the ladder's N) and the
    values of the quality metric in its seeds, from the rung's summary.json (no values where
    the rung has none)."""
    metric = f.first["metric"]
    sizes = {r["setting"]: float(r["n_params"]) for r in f.first["rungs"]}
    arms = [f.first["baseline"], *f.records]
    out: dict[str, list[tuple[float, list[float]]]] = {arm: [] for arm in arms}
    for setting, n in sizes.items():
        by_arm = f.rungs.get(setting, {}).get("arms", {})
        for arm in arms:
            values = (by_arm.get(arm) or {}).get(metric) or {}
            out[arm].append((n, [float(v) for v in values.get("values", [])]))
    return out


def _interval(low: float, high: float) -> str:
    return f"[{fmt_signed(low)}, {fmt_signed(high)}]"


def _prediction_table(f: LadderFolder) -> Table:
    """Per arm: the predicted difference arm − baseline at the target, its intervals for one
    training, for the mean of k paired seeds and for the trend, the share of bootstrap draws
    below zero and the word."""
    conf = f.confidence
    k = f.first["prediction"]["mean_of_seeds"]["seeds"]
    rows = []
    for arm, rec in f.records.items():
        p = rec["prediction"]
        single, mean_k, trend = p["single"], p["mean_of_seeds"], p["trend"]
        rows.append(
            [
                arm,
                f"{fmt_signed(single['estimate'])} {rec['unit']}",
                _interval(single["low"], single["high"]),
                _interval(mean_k["low"], mean_k["high"]),
                _interval(trend["low"], trend["high"]),
                f"{100 * single['p_below']:.1f} %",
                str(p["word"]),
            ]
        )
    return Table(
        columns=[
            f"arm − {f.first['baseline']}",
            "predicted Δ",
            f"one training, {conf}% PI",
            f"mean of {counted(k, 'seed')}, {conf}% PI",
            f"trend, {conf}%",
            "draws below 0",
            "verdict",
        ],
        rows=rows,
        align=["left", "right", "right", "right", "right", "right", "left"],
        badges=(6,),
    )


def _rung_verdict(f: LadderFolder, setting: str, arm: str) -> tuple[str, str]:
    """The rung's own verdict on the quality metric and the seeds that would likely settle
    it (:func:`normlab.analysis.power.forecast_range`; "—" once settled), from its
    summary.json; ("—", "—") without one."""
    verdict = (f.rungs.get(setting, {}).get("verdicts") or {}).get(arm)
    if not isinstance(verdict, dict):
        return "—", "—"
    point = verdict.get("seeds_needed")
    return str(verdict.get("quality", "—")), forecast_range(
        point, verdict.get("seeds_needed_high", point)
    )


def rung_table(f: LadderFolder) -> Table:
    """Per arm and rung: N, tokens per parameter (a column only when the record has them),
    paired seeds, the mean difference with its t-interval, the paired sd, the seeds a decision
    there needs and the rung's verdict."""
    records = f.records.values()
    tokens = any(r.get("tokens_per_param") is not None for rec in records for r in rec["rungs"])
    rows, classes = [], []
    for arm, rec in f.records.items():
        for j, r in enumerate(rec["rungs"]):
            word, needed = _rung_verdict(f, r["setting"], arm)
            x = r.get("tokens_per_param")
            per_param = [fmt_tokens_per_param(x) if x is not None else "—"] if tokens else []
            rows.append(
                [
                    arm,
                    str(r["setting"]),
                    f"{r['n_params']:,.0f}",
                    *per_param,
                    str(r["n"]),
                    f"{fmt_signed(r['mean'])} {_interval(r['low'], r['high'])}",
                    fmt_num(r["sd"]),
                    needed,
                    word,
                ]
            )
            classes.append("group-start" if j == 0 else "")
    columns = [
        "arm",
        "rung",
        "parameters",
        *(["tokens per parameter"] if tokens else []),
        "paired seeds",
        f"Δ {f.testbed.short_label} [{f.confidence}% CI]",
        "paired sd",
        "seeds needed",
        "verdict at the rung",
    ]
    align = ["left", "left", *(["right"] * (len(columns) - 3)), "left"]
    return Table(columns, rows, align, badges=(len(columns) - 1,), row_class=classes)


def _fit_table(f: LadderFolder) -> Table:
    """Per arm: a and b of the weighted line with their standard errors, the pooled paired sd
    with its degrees of freedom, and the lack-of-fit test's p (— below three rungs)."""
    rows = []
    for arm, rec in f.records.items():
        fit = rec["fit"]
        lack = fit["lack_of_fit_p"]
        rows.append(
            [
                arm,
                f"{fmt_signed(fit['a'])} ± {fmt_num(fit['a_se'])}",
                f"{fmt_signed(fit['b'])} ± {fmt_num(fit['b_se'])}",
                f"{fmt_num(fit['pooled_sd'])} (ν = {fit['df']})",
                "— (two rungs)" if lack is None else f"p = {lack:.3f}",
            ]
        )
    return Table(
        [
            f"arm − {f.first['baseline']}",
            "a ± se",
            "b ± se (per tenfold N)",
            "pooled paired sd",
            "lack of fit",
        ],
        rows,
        ["left", "right", "right", "right", "right"],
    )


def _settings_tables(f: LadderFolder) -> tuple[Table, Table]:
    """The settings every rung's experiment.json holds with one value (held fixed), and per
    rung its parameter count, the settings the ladder's rule changed (ladder.json's
    ``changes``), any other setting that differs between the rungs (one whose name ends in a
    changed setting's, with its value, is that setting), and the arms' rates when they ran at
    their own."""
    fixed = {s: e.get("fixed") or {} for s, e in f.experiments.items() if e}
    first = next(iter(fixed.values()), {})
    same = [k for k in first if all(k in d and d[k] == first[k] for d in fixed.values())]
    differ = list(dict.fromkeys(k for d in fixed.values() for k in d if k not in same))
    counts = dict(zip(f.plan.get("rungs", []), f.plan.get("n_params", []), strict=False))
    rows = []
    for setting in f.plan.get("rungs", []):
        changes = (f.plan.get("changes") or {}).get(setting) or {}
        mine = fixed.get(setting, {})
        rates = f.experiments.get(setting, {}).get("learning_rates") or {}
        rows.append(
            [
                setting,
                f"{counts[setting]:,}" if setting in counts else "—",
                "; ".join(f"{k} = {fmt_value(v)}" for k, v in changes.items()) or "—",
                "; ".join(
                    f"{k} = {fmt_value(mine.get(k))}"
                    for k in differ
                    if changes.get(k.rsplit(".", 1)[-1], _UNSET) != mine.get(k)
                )
                or "—",
                ", ".join(f"{arm} {fmt_value(r)}" for arm, r in rates.items()) or "—",
            ]
        )
    changed = Table(
        ["rung", "parameters", "set by the ladder", "settings that differ", "learning rates"],
        rows,
        ["left", "right", "left", "left", "left"],
    ).drop_empty((3, 4))
    held = Table(["setting", "value"], [[k, fmt_value(first[k])] for k in same], ["left"] * 2)
    return held, changed


_UNSET = object()
"""A value no setting has."""


def _rung_links(f: LadderFolder) -> tuple[list[Link], list[str]]:
    """A link to each rung's own report that exists (report.md from report.md, report.html
    from report.html), and the rungs without one."""
    links, missing = [], []
    for setting in f.plan.get("rungs", []):
        rung = run_folder.rung_path(f.path, setting)
        if not (rung / REPORT_HTML_FILE).is_file():
            missing.append(setting)
            continue
        rel = rung.relative_to(f.path).as_posix()
        links.append(
            Link(f"the report of {setting}", f"{rel}/{REPORT_MD_FILE}", f"{rel}/{REPORT_HTML_FILE}")
        )
    return links, missing


def _rungs_section(f: LadderFolder, plot: Plot | None) -> Section:
    """ "The rungs": what a rung is, the per-rung table, the links to the rungs' own reports,
    and each arm against size."""
    links, missing = _rung_links(f)
    paragraphs = [
        f"Each rung is a full paired comparison of the same arms on the same seeds and data, "
        f"its model set to {f.plan.get('key', 'the key')} = the rung's value by the testbed's "
        f"rule ({f.plan.get('steps', 'the same steps in every rung')}). Per rung: the paired "
        f"differences d = arm − baseline of {f.first['metric']} at N = the baseline's parameter "
        f"count, their mean with its {f.confidence}% t-interval and sd, the seeds that would "
        "likely settle the rung's own question (— once it is settled) and the rung's verdict, "
        "as its own report gives them; that report, linked below, has every metric, curve and "
        "run at that size."
    ]
    paragraphs += early_rungs(f)
    if missing:
        paragraphs.append(
            f"No report of its own yet: {', '.join(missing)} (normlab report {f.path.name} "
            "builds every rung's report, then the ladder's)."
        )
    return Section(
        "rungs",
        "The rungs",
        paragraphs,
        tables=[("", rung_table(f))],
        plots=[plot] if plot is not None else [],
        links=links,
    )


def early_rungs(f: LadderFolder) -> list[str]:
    """The paragraph naming the rungs whose runs are early training (each rung's own analysis,
    its summary.json's ``budget``: :mod:`normlab.analysis.training_budget`), with their tokens
    per parameter; [] when none is."""
    early = []
    for setting in f.plan.get("rungs", []):
        budget = (f.rungs.get(setting) or {}).get(BUDGET_KEY) or {}
        if budget.get("early_training"):
            x = budget.get("tokens_per_param")
            shown = "" if x is None else f" ({fmt_tokens_per_param(x)} tokens per parameter)"
            early.append(f"{setting}{shown}")
    if not early:
        return []
    optimal = next(
        (b["compute_optimal"] for a in f.rungs.values() if (b := a.get(BUDGET_KEY))), None
    )
    far = f", far below the ~{optimal:g} of compute-optimal training" if optimal else ""
    return [
        f"Early training at {', '.join(early)}{far}: there the differences are about how fast "
        "the models start, and the trend through those rungs about early training, not about "
        "trained models."
    ]


def _fit_section(f: LadderFolder) -> Section:
    """ "The fit": the model, its weights, and per arm the coefficients and lack of fit."""
    fit = f.first["fit"]
    return Section(
        "fit",
        "The fit",
        [
            f"Per arm, the difference against size is the line {fit['model']} (N the parameter "
            "count, b the change per tenfold N), fitted by weighted least squares through the "
            f"rung means with the weights {fit['weights']} (sd_floor = {fit['sd_floor']:g}): a "
            "noisier rung pulls less, and a rung whose few seeds happen to agree cannot take all "
            "the weight. The standard errors of a and b come from those weights.",
            "Lack of fit (three rungs or more): F = Σ w_j r_j² / (J − 2), r_j the residual of "
            "rung j's mean, against F(J − 2, ν). A small p says the rung means scatter about "
            "the line more than their seeds allow: the trend is not straight in log N, and the "
            "prediction interval, which assumes it is, is then too narrow.",
        ],
        tables=[("", _fit_table(f))],
    )


def _rate_lines(f: LadderFolder) -> list[str]:
    """The sweep in words (:func:`normlab.analysis.lr_sweep.sweep_lines`) after one line on how
    the rates were chosen; [] without a sweep."""
    record = f.ladder.get("learning_rates")
    if not record:
        return []
    sweep = f.plan.get("lr_sweep") or {}
    rates = ", ".join(f"{r:g}" for r in sweep.get("rates", []))
    how = (
        "under μP the rates are chosen at the smallest rung and checked at the largest"
        if len(set(record["chosen_at"].values())) == 1 and len(record["chosen_at"]) > 1
        else "each rung's rates are chosen at that rung"
    )
    head = (
        f"Each arm at its own best rate: every arm was trained at each rate of {rates} on "
        f"{tuning_seed_words(record['tuning_seeds'])} (apart from the evaluation seeds); its "
        f"best rate has the lowest mean {f.first['metric']} among the rates where no tuning "
        f"seed diverged; {how}."
    )
    return [head, *sweep_lines(record, f.first["metric"])]


def _settings_section(f: LadderFolder) -> Section:
    """ "What changed per rung and what was held fixed": the ladder's rule, the settings held
    fixed, and per rung what changed (:func:`_settings_tables`)."""
    held, changed = _settings_tables(f)
    rule = f.plan.get("rule") or "not recorded"
    return Section(
        "settings",
        "What was held fixed and what changed per rung",
        [
            f"The ladder varies {f.plan.get('key', 'one setting')} by the testbed's rule: {rule} "
            f"(parametrization {f.plan.get('parametrization', 'sp')}; steps: "
            f"{f.plan.get('steps', 'not recorded')})."
        ],
        tables=[("Changed per rung", changed)],
        settings=[("Held fixed in every rung", held)],
    )


def _margin_words(f: LadderFolder) -> str:
    """The rungs' equivalence margin in words (from the first rung's summary.json)."""
    margin = next(
        (a.get(f.testbed.margin_key) for a in f.rungs.values() if a.get(f.testbed.margin_key)),
        None,
    )
    if not margin:
        return "no equivalence margin"
    return f"equivalence margin ±{margin:g} {f.first['unit']}"


def _method(f: LadderFolder) -> list[str]:
    """How the rungs, the fit, the prediction and its word are made, with this ladder's
    settings (the bootstrap's replicates, ν, k, the level)."""
    pred, fit = f.first["prediction"], f.first["fit"]
    conf, k = f.confidence, pred["mean_of_seeds"]["seeds"]
    tail = 50 * (1 + float(pred["confidence"]))
    lines = [
        "Each rung is paired: seed k of every arm starts from the same initial values and sees "
        "the same batches, so a rung gives the per-seed differences d = arm − baseline of "
        f"{f.first['metric']}, placed at N = the baseline arm's parameter count. Per rung: "
        f"their mean d̄, sd s (n − 1) and Student-t interval at {conf}%. Each rung's verdict and "
        "seeds needed are its own report's (see that report's method).",
        f"The fit: {fit['model']} by weighted least squares with the weights {fit['weights']} "
        f"(see The fit); the pooled paired sd has ν = Σ(n_j − 1) = {fit['df']} degrees of "
        "freedom.",
        f"The prediction at the target: a bootstrap over seeds within rungs ({pred['n_boot']} "
        f"replicates, random seed {pred['seed']}). Each replicate resamples every rung's seeds "
        "from its centred differences inflated by √(n/(n − 1)) and refits the line with its own "
        "weights; adds the seed noise of what would be measured at the target (the mean of k "
        f"draws from the pooled residuals: k = 1 for one training, k = {k} for the mean of "
        f"{counted(k, 'paired seed')}, none for the trend); and scales the spread by "
        "√(ν/χ²_ν), the "
        "uncertainty of the seed variance that a bootstrap of a few values cannot see. The "
        f"interval runs from the {100 - tail:.3g}% to the {tail:.3g}% quantile of the draws; "
        "'draws below / above 0' are their shares on each side of zero.",
        "On simulated ladders (3 seeds per rung, 100× beyond the largest rung) these intervals "
        "hold a fresh training at about their nominal rate, where the plain bootstrap of the "
        "fit holds it far less often (docs/studies.md, 'Ladder: coverage of the prediction "
        "interval'). The seed noise at the target is the pooled one: when the paired spread "
        "shrinks with size the interval errs on the wide side, when it grows on the narrow "
        "side. The line is assumed to hold beyond the rungs, here "
        f"{f.first['target']['words']}: the further the target, the more rests on it.",
        "The word at the target: equivalent when the whole one-training interval lies within "
        f"the margin ({_margin_words(f)}); better or worse when one sign holds at least "
        f"{tail:.3g}% of the draws (the interval excludes zero), read in the metric's "
        "direction; not determined otherwise.",
    ]
    if f.ladder.get("learning_rates"):
        lines.append(
            "Learning rates: each arm ran at its own best rate, chosen on tuning seeds apart "
            "from the evaluation seeds (see Learning rates)."
        )
    return lines


def _box(f: LadderFolder) -> tuple[str, str, list[tuple[str, str, str]]]:
    """The box's status (the tone of the words at the target: one tone when all share it,
    else open when any is open, else neutral), its headline and per arm its word and
    sentence."""
    target = f.first["target"]
    said = "; ".join(
        f"{arm} − {rec['baseline']} {rec['prediction']['word']}" for arm, rec in f.records.items()
    )
    tones = {tone(str(rec["prediction"]["word"])) for rec in f.records.values()}
    status = tones.pop() if len(tones) == 1 else OPEN if OPEN in tones else NEUTRAL
    details = [
        (arm, str(rec["prediction"]["word"]), str(rec["prediction"]["sentence"]))
        for arm, rec in f.records.items()
    ]
    return status, f"At {target['n_params']:.3g} parameters, {target['words']}: {said}", details


def _subtitle(f: LadderFolder) -> str:
    """The rungs, the paired seeds per rung, the baseline, the margin, the parametrization
    and the folder's name."""
    seeds = sorted({int(r["n"]) for rec in f.records.values() for r in rec["rungs"]})
    n = (
        counted(seeds[0], "paired seed")
        if len(seeds) == 1
        else (f"{seeds[0]}–{seeds[-1]} {noun(seeds[-1], 'paired seed')}")
    )
    values = ", ".join(str(v) for v in f.plan.get("values", []))
    rungs = counted(len(f.plan.get("rungs", [])), "rung")
    return (
        f"{rungs} of {f.plan.get('key', '?')} ({values}) × {n} "
        f"· baseline {f.first['baseline']} · {_margin_words(f)} · "
        f"{f.plan.get('parametrization', 'sp')} · folder {f.path.resolve().name}"
    )


def build_ladder_content(f: LadderFolder, plots: dict[str, Plot]) -> LadderContent:
    """The ladder's report from its files and its figures (``plots`` by file stem:
    :data:`LADDER_PLOT`, the verdict's; :data:`LOSSES_PLOT`, in the rungs' section;
    :data:`~normlab.report.sections.LR_SWEEP_PLOT`, in the learning rates' section when the
    ladder swept them)."""
    status, headline, details = _box(f)
    sections = [
        _rungs_section(f, plots.get(LOSSES_PLOT)),
        _fit_section(f),
    ]
    rates = _rate_lines(f)
    if rates:
        sweep = plots.get(LR_SWEEP_PLOT)
        sections.append(
            Section("learning-rates", "Learning rates", rates, plots=[sweep] if sweep else [])
        )
    sections.append(_settings_section(f))
    arms = [f.first["baseline"], *f.records]
    return LadderContent(
        title=f"{' vs '.join(arms)} · size ladder of {f.plan.get('key', '?')}",
        subtitle=_subtitle(f),
        status=status,
        headline=headline,
        arm_details=details,
        verdict_table=_prediction_table(f),
        verdict_plot=plots.get(LADDER_PLOT),
        sections=sections,
        method=_method(f),
    )
