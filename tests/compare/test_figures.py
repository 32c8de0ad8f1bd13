"""The report's figures read cleanly at 2, 3 and 6 arms with long names: no two text boxes
overlap and no legend covers a plotted point, measured with matplotlib's own text extents.
:func:`_legend_mismatches` finds a legend swatch in a colour nothing is drawn in (the ladder's
and the learning-rate sweep's figures are held to it in test_ladder.py and test_lr_sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from normlab import run_format
from normlab.analysis import analyze, load_compare_folder
from normlab.report.curves import load_run_curves
from normlab.report.plots import (
    plot_final_metrics,
    plot_grad_norm,
    plot_paired_comparison,
    plot_training_loss,
    plot_validation,
)
from normlab.report.style import arm_colors

LONG_ARMS = [
    "layernorm-pre",
    "rmsnorm-pre-gemma-zero-centred",
    "dyt-pre-alpha0.5-learnable",
    "layernorm-post-with-warmup-2000",
    "rmsnorm-sandwich-peri-ln",
    "adarms-pre-conditioned-on-everything",
]
STEPS = 300


def _write_folder(root: Path, arms: list[str], seeds: int = 3) -> Path:
    rng = np.random.default_rng(0)
    exp = {"arms": arms, "baseline_arm": arms[0], "seeds": list(range(seeds)), "margin_bpb": 0.02}
    root.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps(exp))
    steps = np.arange(1, STEPS + 1)
    for i, arm in enumerate(arms):
        for seed in range(seeds):
            run_id = f"{arm}__s{seed}"
            run = root / "runs" / run_id
            run.mkdir(parents=True)
            loss = 5.5 * np.exp(-steps / 40) + 2.3 + 0.02 * i + 0.02 * rng.standard_normal(STEPS)
            grad = np.exp(0.3 * rng.standard_normal(STEPS)) * (1.0 + 0.1 * i)
            records = [
                {"type": "train", "step": int(s), "loss": float(v), "grad_norm": float(g)}
                for s, v, g in zip(steps, loss, grad, strict=True)
            ]
            for s in range(25, STEPS + 1, 25):
                bpb = 3.4 + 0.01 * i + 2.0 * np.exp(-s / 60) + 0.005 * rng.standard_normal()
                records.append({"type": "eval", "step": s, "val_bpb": bpb, "val_loss": bpb * 0.69})
            for s in (40 + 30 * i, 200 + 10 * seed):  # gradient and loss spikes to mark
                grad[s - 1] *= 8.0
                records.append(
                    {
                        "type": "anomaly",
                        "step": s,
                        "kind": "grad_spike",
                        "value": float(grad[s - 1]),
                    }
                )
                records.append(
                    {
                        "type": "anomaly",
                        "step": s,
                        "kind": "loss_spike",
                        "value": float(loss[s - 1]),
                    }
                )
            summary = {
                "run_id": run_id,
                "arm": arm,
                "seed": seed,
                "norm": arm.split("-")[0],
                "placement": arm.split("-")[1],
                "status": "finished",
                "diverged_at": None,
                "steps": STEPS,
                "n_params": 1000,
                "n_norm_params": 100,
                "final_val_bpb": 3.4 + 0.01 * i + 0.003 * seed,
                "best_val_bpb": 3.4 + 0.01 * i + 0.003 * seed,
                "final_train_loss": 2.3 + 0.02 * i,
                "tokens_per_s": 30_000.0 * (1 + 0.05 * i) * (1 + 0.004 * seed),
                "peak_memory_bytes": int(2**29 * (1 + 0.02 * i) + 1000 * seed),
                "n_loss_spikes": 2,
                "n_grad_spikes": 2,
                "n_clipped": 0,
            }
            (run / "run.json").write_text(json.dumps({"run_id": run_id, "arm": arm, "seed": seed}))
            (run / "summary.json").write_text(json.dumps(summary))
            (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return root


def _texts(fig: Figure) -> list[Text]:
    """Every text the figure draws: visible, non-empty, and (tick labels) inside the view."""
    out = []
    skip = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                inside = loc is not None and lo - 1e-9 <= loc <= hi + 1e-9
                for label in (tick.label1, tick.label2):
                    if not inside or not label.get_visible():
                        skip.add(id(label))
    for t in fig.findobj(Text):
        if id(t) in skip or not t.get_visible() or not t.get_text().strip():
            continue
        out.append(t)
    return out


def _overlapping_texts(fig: Figure) -> list[tuple[str, str]]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    clashes = []
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1 :]:
            if a.width > 0 and b.width > 0 and a.overlaps(b):
                inter_w = min(a.x1, b.x1) - max(a.x0, b.x0)
                inter_h = min(a.y1, b.y1) - max(a.y0, b.y0)
                if inter_w > 1.0 and inter_h > 1.0:  # more than a pixel either way
                    clashes.append((ta, tb))
    return clashes


def _points(fig: Figure) -> np.ndarray:
    """Display coordinates of every plotted marker (scatter points and line markers)."""
    pts = []
    for ax in fig.axes:
        for coll in ax.collections:
            if isinstance(coll, PathCollection) and len(coll.get_offsets()):
                pts.append(coll.get_offset_transform().transform(coll.get_offsets()))
        for line in ax.get_lines():
            if line.get_marker() not in (None, "", "None", " ") and len(line.get_xydata()):
                pts.append(line.get_transform().transform(line.get_xydata()))
    return np.concatenate(pts) if pts else np.zeros((0, 2))


def _legend_covers(fig: Figure) -> int:
    """How many plotted points lie under a legend's box."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    pts = _points(fig)
    covered = 0
    for leg in legends:
        if isinstance(leg, Legend):
            box = leg.get_window_extent(renderer)
            inside = (
                (pts[:, 0] >= box.x0)
                & (pts[:, 0] <= box.x1)
                & (pts[:, 1] >= box.y0)
                & (pts[:, 1] <= box.y1)
            )
            covered += int(inside.sum())
    return covered


def _rgba(color) -> tuple[float, ...]:
    return tuple(round(float(c), 3) for c in to_rgba(color))


def _drawn(fig: Figure) -> tuple[set, set, set]:
    """What the panels draw, by colour: fill colours (RGBA, with their alpha) of areas and
    patches; (colour, line style) of lines; (marker, face colour) of markers, lines' and
    scatter points' alike."""
    fills, lines, markers = set(), set(), set()
    for ax in fig.axes:
        for coll in ax.collections:
            faces = [_rgba(c) for c in coll.get_facecolors()]
            if isinstance(coll, PathCollection):
                markers.update(("scatter", f) for f in faces)
            else:
                fills.update(faces)
        fills.update(_rgba(p.get_facecolor()) for p in ax.patches)
        for line in ax.get_lines():
            if line.get_linestyle() not in ("None", "none", " ", ""):
                lines.add((_rgba(line.get_color()), line.get_linestyle()))
            if line.get_marker() not in (None, "", "None", " ", "none"):
                markers.add((line.get_marker(), _rgba(line.get_markerfacecolor())))
    return fills, lines, markers


def _legend_mismatches(fig: Figure) -> list[str]:
    """Every legend swatch (a patch, a line, a marker) whose colour nothing in the panels is
    drawn in: a band's swatch must have the band's colour and opacity, a line's its colour and
    style, a marker's its shape and face colour (or a scatter's face colour)."""
    fig.canvas.draw()
    fills, lines, markers = _drawn(fig)
    scatter = {f for kind, f in markers if kind == "scatter"}
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    wrong = []
    for leg in (x for x in legends if isinstance(x, Legend)):
        for art in leg.findobj(lambda a: isinstance(a, Rectangle | Line2D)):
            if isinstance(art, Rectangle):
                if art.get_visible() and art is not leg.legendPatch and art.get_width() > 0:
                    face = _rgba(art.get_facecolor())
                    if face[3] > 0 and face not in fills:
                        wrong.append(f"patch {face}")
                continue
            style = art.get_linestyle()
            if style not in ("None", "none", " ", "") and (
                (_rgba(art.get_color()), style) not in lines
            ):
                wrong.append(f"line {art.get_color()} {style}")
            marker = art.get_marker()
            face = _rgba(art.get_markerfacecolor())
            if marker not in (None, "", "None", " ", "none") and (
                (marker, face) not in markers and face not in scatter
            ):
                wrong.append(f"marker {marker} {face}")
    return wrong


def _figures(tmp_path: Path, arms: list[str]) -> dict[str, Figure]:
    folder = load_compare_folder(_write_folder(tmp_path / "o", arms))
    a = analyze(folder)
    colors = arm_colors(folder.arms)
    curves = {arm: [load_run_curves(r) for r in folder.runs_of(arm)] for arm in folder.arms}
    return {
        "training_loss": plot_training_loss(curves, colors),
        "validation": plot_validation(curves, colors, run_format.testbed_format("gpt")),
        "grad_norm": plot_grad_norm(curves, colors, clip=1.0),
        "final_metrics": plot_final_metrics(a, colors, "max_rss"),
        "paired_comparison": plot_paired_comparison(a, colors),
    }


@pytest.mark.parametrize("n_arms", [2, 3, 6])
def test_no_text_overlaps_and_no_legend_over_data(tmp_path, n_arms):
    figs = _figures(tmp_path, LONG_ARMS[:n_arms])
    for name, fig in figs.items():
        assert _overlapping_texts(fig) == [], name
        assert _legend_covers(fig) == 0, name


def test_the_checks_can_fail(tmp_path):
    """The measurements catch what they look for: crowded labels and a legend over data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.scatter([0.5, 0.9], [0.9, 0.9], label="points")
    ax.set_xticks(range(6), [f"a-very-long-arm-name-{i}" for i in range(6)])
    ax.set_xlim(-0.5, 5.5)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    assert _overlapping_texts(fig)
    assert _legend_covers(fig) > 0
    assert _legend_mismatches(fig) == []  # the points' swatch is their colour


def test_the_swatch_check_can_fail():
    """A band drawn orange whose legend swatch is grey, a line drawn dashed whose swatch is
    solid, a marker drawn in one colour keyed in another: each is named."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import Patch

    fig = Figure(figsize=(4, 3))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.fill_between([0, 1], [0, 0], [1, 1], color="#D55E00", alpha=0.25)
    ax.plot([0, 1], [0, 1], color="#0072B2", linestyle="--")
    ax.plot([0.5], [0.5], marker="*", color="#D55E00", linestyle="none")
    handles = [
        Patch(color="#555", alpha=0.35, label="band"),
        Line2D([], [], color="#0072B2", label="line"),
        Line2D([], [], marker="*", color="#555", linestyle="none", label="star"),
    ]
    fig.legend(handles=handles, loc="outside lower center")
    assert len(_legend_mismatches(fig)) == 3
    right = Figure(figsize=(4, 3))
    FigureCanvasAgg(right)
    ax = right.subplots()
    ax.fill_between([0, 1], [0, 0], [1, 1], color="#D55E00", alpha=0.25)
    right.legend(handles=[Patch(color="#D55E00", alpha=0.25, label="band")])
    assert _legend_mismatches(right) == []
