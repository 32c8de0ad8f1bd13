"""``build_report``: compare folder on disk → summary.json, runs.csv, report.md, report.html and
plots/*.png, all written atomically. Nothing is trained; only the folder's files are read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from normlab._io import write_bytes_atomic, write_text_atomic
from normlab.analysis.runs import CompareFolder, RunResult, load_compare_folder
from normlab.analysis.summary import analyze
from normlab.report.content import Plot, build_content, confidence_pct, tost_pct
from normlab.report.curves import RunCurves, load_run_curves
from normlab.report.decision_cost import decision_cost_section
from normlab.report.html import render_html
from normlab.report.markdown import render_markdown
from normlab.report.plots import (
    figure_png,
    plot_final_metrics,
    plot_grad_norm,
    plot_paired_comparison,
    plot_samples,
    plot_training_loss,
    plot_validation,
)
from normlab.report.runs_csv import runs_csv_text
from normlab.report.sections import (
    HEALTH_PLOT,
    LR_SWEEP_PLOT,
    factor_section,
    health_section,
    lr_sweep_section,
)
from normlab.report.style import arm_colors
from normlab.run_format import (
    ANALYSIS_FILE,
    DEFAULT_TESTBED,
    FINISHED,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
    RUNS_CSV_FILE,
    TESTBED_FORMATS,
    TestbedFormat,
    plot_path,
    testbed_format,
)
from normlab.run_format import folder as run_folder

__all__ = ["build_report"]

_PLOT_NAMES = (
    "paired_comparison",
    "training_loss",
    *dict.fromkeys(t.curve for t in TESTBED_FORMATS.values()),  # val_bpb, val_loss
    "grad_norm",
    "final_metrics",
    "samples",
    HEALTH_PLOT,
    LR_SWEEP_PLOT,
)
_CLIP_KEYS = ("grad_clip", "clip_grad_norm", "grad_clip_norm", "max_grad_norm", "clip_grad")


def _find_number(obj: Any, keys: tuple[str, ...]) -> float | None:
    """The first positive finite number stored under one of ``keys`` (a dotted key's last part
    counts), searching nested dicts depth-first."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            name = str(k).rsplit(".", 1)[-1]
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            if name in keys and ok and math.isfinite(v) and v > 0:
                return float(v)
        for v in obj.values():
            found = _find_number(v, keys)
            if found is not None:
                return found
    return None


def _memory_kind(folder: CompareFolder) -> str | None:
    kinds = sorted(
        {
            str(r.summary["peak_memory_kind"])
            for r in folder.runs
            if r.summary.get("peak_memory_kind")
        }
    )
    return ", ".join(kinds) or None


def _read_images(run: RunResult, path: Path) -> np.ndarray | None:
    """A finished run's image file (``samples.npy``, ``reference.npy``) as [n, H, W] floats, or
    None when absent or unreadable."""
    if run.status != FINISHED or not path.is_file():
        return None
    try:
        images = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    ok = images.ndim == 3 and images.shape[0] > 0 and np.issubdtype(images.dtype, np.floating)
    return images.astype(np.float64) if ok else None


def _read_samples(run: RunResult) -> np.ndarray | None:
    """A finished run's generated images (``samples.npy``)."""
    return _read_images(run, run.samples_path)


def _n_classes(run: RunResult) -> int:
    dit, data, model = (run.config.get(k) for k in ("dit", "data", "model"))
    if isinstance(dit, dict) and isinstance(data, dict):  # run.json with a dit section
        n = len(data.get("classes") or []) if dit.get("class_conditional") else 0
    else:  # run.json written before: the DiT's resolved config under model
        n = model.get("n_classes") if isinstance(model, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _cfg_scale(run: RunResult) -> float | None:
    """The classifier-free guidance scale w the run's samples used: the summary's
    ``sample_cfg_scale``, else the ``cfg_scale`` in its run.json's section of the testbed's
    settings (:attr:`normlab.run_format.TestbedFormat.settings`); None when neither says (a
    folder written before guidance existed, whose samples are unguided)."""
    testbed = TESTBED_FORMATS.get(run.config.get("testbed", DEFAULT_TESTBED))
    section = testbed.settings if testbed is not None else None
    settings = run.config.get(section) if section is not None else None
    for value in (
        run.summary.get("sample_cfg_scale"),
        settings.get("cfg_scale") if isinstance(settings, dict) else None,
    ):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _guidance_words(run: RunResult, n_classes: int) -> str:
    """How the samples were guided, for the Samples caption ("" without labels)."""
    w = _cfg_scale(run)
    if not n_classes:
        return ""
    if w is None or w == 1:
        return ", no guidance"
    return f", classifier-free guidance w = {w:g}"


def _reference_images(run: RunResult, n: int) -> np.ndarray | None:
    """The first ``n`` validation images with the labels of the run's samples, as the worker
    stored them (``reference.npy``); None when absent or too few."""
    images = _read_images(run, run.reference_path)
    return images[:n] if images is not None and images.shape[0] >= n else None


def _samples_plot(folder: CompareFolder, colors: Mapping[str, str]) -> Plot | None:
    """The "Samples" figure: for one seed (the first whose every arm finished with samples, else
    the one with most such arms), a row of each arm's first generated images, all from the same
    noises, and a row of validation images with the same labels; None without samples."""
    by_seed: dict[int, list[tuple[str, np.ndarray, RunResult]]] = {}
    for seed in folder.seeds:
        for arm in folder.arms:
            run = next((r for r in folder.runs_of(arm) if r.seed == seed), None)
            images = _read_samples(run) if run is not None else None
            if images is not None:
                by_seed.setdefault(seed, []).append((arm, images, run))
    if not by_seed:
        return None
    seed = max(by_seed, key=lambda k: (len(by_seed[k]), -folder.seeds.index(k)))
    found = by_seed[seed]
    n = min(images.shape[0] for _, images, _ in found)
    size = {images.shape[1:] for _, images, _ in found}
    if len(size) != 1:
        return None
    rows = [(arm, images[:n]) for arm, images, _ in found]
    n_classes = _n_classes(found[0][2])
    reference = _reference_images(found[0][2], n)
    if reference is not None and reference.shape[1:] == next(iter(size)):
        rows.append(("validation", reference))
    classes = folder.data.get("classes")
    titles = (
        [str(classes[i % n_classes]) for i in range(n)]
        if n_classes and isinstance(classes, list) and len(classes) >= n_classes
        else None
    )
    missing = [arm for arm in folder.arms if arm not in {a for a, _, _ in found}]
    caption = (
        f"Seed {seed}: the first {n} images each arm generated at the end of training (Euler "
        f"sampler, 32 steps{_guidance_words(found[0][2], n_classes)}), every arm from the same "
        "noises"
        + (" and labels" if n_classes else "")
        + "; the column is the noise, so images in a column differ only by the model."
        + (
            " Bottom row: validation images of the same classes, for reference."
            if rows[-1][0] == "validation"
            else ""
        )
        + " Pixels from −1 (black) to +1 (white), clipped."
        + (f" No samples for {', '.join(missing)} at this seed." if missing else "")
    )
    png = figure_png(plot_samples(rows, colors, titles))
    return Plot("samples", "Samples", caption, png)


def _plots(
    folder: CompareFolder, analysis: dict[str, Any], curves: Mapping[str, list[RunCurves]]
) -> tuple[Plot, list[Plot]]:
    """The verdict's figure, and the others in the report's order: the curves the runs logged
    (:func:`_curve_plots`), the final metrics per arm, and the samples where runs saved some."""
    colors = arm_colors(folder.arms)
    testbed = testbed_format(analysis.get("testbed"))
    clip = _find_number(folder.experiment.get("fixed"), _CLIP_KEYS)
    if clip is None:
        clip = _find_number(folder.experiment.get("config"), _CLIP_KEYS)
    verdict = _paired_plot(analysis, colors, testbed)
    plots = _curve_plots(curves, colors, testbed, clip)
    plots.append(
        Plot(
            "final_metrics",
            f"{testbed.quality_label.capitalize()}, throughput and peak memory per arm",
            "Dots are seeds (finished runs), ◆ the mean with its 95% t-interval. These "
            "per-arm intervals include the seed-to-seed variation that the paired comparison "
            "above cancels, so overlapping bars do not mean 'no difference'.",
            figure_png(plot_final_metrics(analysis, colors, _memory_kind(folder))),
        )
    )
    samples = _samples_plot(folder, colors)
    if samples is not None:
        plots.append(samples)
    return verdict, plots


def _paired_plot(
    analysis: dict[str, Any], colors: Mapping[str, str], testbed: TestbedFormat
) -> Plot:
    """The verdict's figure: each arm against the baseline, seed by seed."""
    base = analysis["baseline_arm"]
    ci, ci_tost = confidence_pct(analysis), tost_pct(analysis)
    band = (
        "inside the green band the arms are equivalent"
        if analysis.get(testbed.margin_key)
        else "no margin was given, so there is no band of equivalence"
    )
    return Plot(
        "paired_comparison",
        "Each arm against the baseline, seed by seed",
        f"Left: {testbed.quality_label} minus {base}'s, per paired seed (dots), their mean (◆), "
        f"the {ci}% t-interval (thin) and the {ci_tost}% interval that TOST uses (thick); "
        f"{band}. Middle and right: throughput and peak-memory "
        f"ratios to the baseline with {ci}% intervals of the paired log ratio.",
        figure_png(plot_paired_comparison(analysis, colors)),
    )


def _curve_plots(
    curves: Mapping[str, list[RunCurves]],
    colors: Mapping[str, str],
    testbed: TestbedFormat,
    clip: float | None,
) -> list[Plot]:
    """The per-step figures the runs' records allow: the training loss and the gradient norm
    (with train records), the validation curve (with eval records), in that order."""
    has_train = any(c.train_steps.size for runs in curves.values() for c in runs)
    has_eval = any(c.eval_steps.size for runs in curves.values() for c in runs)
    plots = []
    if has_train:
        plots.append(
            Plot(
                "training_loss",
                "Training loss",
                "Mean over seeds per arm with the min–max band; × marks a detected loss spike, "
                "▼ the last finite loss of a diverged run. Right: the second half of training, "
                "zoomed in.",
                figure_png(plot_training_loss(curves, colors, testbed.train_unit)),
            )
        )
    if has_eval:
        plots.append(
            Plot(
                testbed.curve,
                testbed.curve_title,
                "Mean over seeds at each evaluation with the min–max band.",
                figure_png(plot_validation(curves, colors, testbed)),
            )
        )
    if has_train:
        plots.append(
            Plot(
                "grad_norm",
                "Gradient norm",
                "Global L2 norm of the gradient before clipping, log scale; × marks a detected "
                "gradient spike.",
                figure_png(plot_grad_norm(curves, colors, clip)),
            )
        )
    return plots


def build_report(out_dir: Path) -> dict[str, Path]:
    """Analyse the compare folder ``out_dir`` and write the report files into it.

    Writes ``summary.json`` (the analysis), ``runs.csv``, ``report.md``, ``report.html`` (one
    self-contained file) and ``plots/*.png``, each atomically. Returns {relative path: path}.
    Raises :class:`normlab.analysis.CompareFolderError` (a ValueError) when ``out_dir`` is not
    a compare folder or holds no finished or diverged run.
    """
    folder = load_compare_folder(out_dir)
    out = folder.path
    analysis = analyze(folder)
    curves = {
        arm: [load_run_curves(r) for r in folder.runs_of(arm) if r.done] for arm in folder.arms
    }
    verdict_plot, plots = _plots(folder, analysis, curves)
    colors = arm_colors(folder.arms)
    sections = [
        s
        for s in (
            factor_section(analysis),
            health_section(folder, colors),
            lr_sweep_section(analysis, colors),
            decision_cost_section(analysis),
        )
        if s is not None
    ]
    problems = [
        f"{c.run.run_id}: {c.problem}" for runs in curves.values() for c in runs if c.problem
    ]
    content = build_content(folder, analysis, verdict_plot, plots, sections, problems)

    written: dict[str, Path] = {}
    for p in [verdict_plot, *plots, *(p for s in sections for p in s.plots)]:
        written[p.relpath] = write_bytes_atomic(out / p.relpath, p.png)
    for name in _PLOT_NAMES:  # a plot left out this time must not linger from an older build
        if plot_path(name) not in written:
            (out / plot_path(name)).unlink(missing_ok=True)
    written[ANALYSIS_FILE] = run_folder.write_analysis(out, analysis)
    csv_text = runs_csv_text(folder.runs, folder.testbed)
    written[RUNS_CSV_FILE] = write_text_atomic(out / RUNS_CSV_FILE, csv_text)
    written[REPORT_MD_FILE] = write_text_atomic(out / REPORT_MD_FILE, render_markdown(content))
    written[REPORT_HTML_FILE] = write_text_atomic(out / REPORT_HTML_FILE, render_html(content))
    return written
