"""The size ladder's evidence from real runs: the ladder sections of docs/studies.md.

    python benchmarks/ladder_studies.py               # train (resumable), analyse, write the doc
    python benchmarks/ladder_studies.py --no-run      # analyse the finished folders only
    python benchmarks/ladder_studies.py --only holdout own_rate

Every training goes through the CLI as a user would run it (``normlab compare`` and ``normlab
coord-check``, one run at a time), into ``--out`` (default ``normlab-out/ladder_studies``); a
re-run skips finished runs. The folders are then read and judged with normlab's own functions
(:mod:`normlab.analysis.ladder`, :mod:`normlab.analysis.lr_sweep`, :func:`compare_paired`,
:func:`seeds_needed`), and each study's section of docs/studies.md is written between the
``ladder-studies`` markers after the kept marker (the rest of the file is left as it is).

The studies (all on the byte-level GPT testbed, 2 layers, 2 heads, context 64, batch 8 — small
models trained briefly, so that the whole set runs in well under an hour on two CPU cores):

- ``holdout``: ``examples/ladder.yaml`` (LayerNorm vs RMSNorm at d_model 16/32/64/128, 3 seeds,
  500 steps). The fit on the three smaller rungs predicts the largest; is the measured
  difference inside the prediction interval? The same ladder gives the paired spread per rung
  and the seeds a decision within the default margin would need there (``spread``).
- ``coord``: ``normlab coord-check`` at d_model 32/64/128 under mup and sp.
- ``transfer``: the learning-rate optimum across d_model 32/64/128 under mup and sp: one
  ``compare --ladder`` per rate of :data:`RATES` (2 seeds, 120 steps), then
  :func:`select_learning_rates` per width and :func:`optimum_alignment`.
- ``own_rate``: LayerNorm, RMSNorm and DyT (the DyT study's recipe, d_model 32, 120 steps) at
  every rate of :data:`RATES` on seeds 0–4; each arm's best rate is chosen on the tuning seeds
  3, 4 (:func:`tuning_seeds`), and the paired comparisons on the evaluation seeds 0, 1, 2 are
  made at the arms' own rates and at a shared rate.

A sweep is one ``compare`` per rate (:func:`sweep_commands`) read back as {rate: folder}
(:func:`sweep_folders`). When ``compare`` takes the sweep itself (``--lr-sweep``), replace
those two functions: one command, and the rates' runs read from its folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

from normlab._io import write_text_atomic
from normlab.analysis import load_compare_folder, seeds_needed
from normlab.analysis.comparison import compare_paired
from normlab.analysis.ladder import Rung, fit_ladder, predict_ladder, rung_stats
from normlab.analysis.ladder_folder import analyze_ladder, load_rungs
from normlab.analysis.lr_sweep import (
    LrCurve,
    optimum_alignment,
    select_learning_rates,
    tuning_seeds,
)
from normlab.analysis.runs import CompareFolder
from normlab.analysis.wording import Smallest, judge
from normlab.cli.errors import EXIT_FAILED
from normlab.run_format import SUMMARY_FILE, testbed_format

ROOT = Path(__file__).resolve().parent.parent
LADDER_EXAMPLE = ROOT / "examples" / "ladder.yaml"
BEGIN = "<!-- ladder-studies:begin (written by benchmarks/ladder_studies.py) -->"
END = "<!-- ladder-studies:end -->"
KEPT_MARKER = "<!-- kept:"

MARGIN = 0.02
"""The GPT testbed's default equivalence margin (margin_bpb), in bits per byte."""
RATES = (0.0025, 0.005, 0.01, 0.02, 0.04)
"""The swept peak learning rates: factors of 2 around compare's default 0.005."""
SHARED_RATE = 0.005
"""The shared rate of the own-rate study: compare's default peak learning rate."""
EVAL_SEEDS = (0, 1, 2)
"""The own-rate study's evaluation seeds; its tuning seeds follow them (3, 4)."""
N_TUNING = 2
WIDTHS = (32, 64, 128)
"""The transfer study's and the coordinate check's widths (the smallest is μP's base)."""

SMALL_MODEL: dict[str, Any] = {"n_layers": 2, "n_heads": 2, "context": 64}
SMALL_TRAIN: dict[str, Any] = {
    "steps": 120,
    "batch_size": 8,
    "warmup": 12,
    "eval_interval": 60,
    "eval_windows": 64,
}
TRANSFER_CONFIG: dict[str, Any] = {
    "norms": ["layernorm", "rmsnorm"],
    "placements": ["pre"],
    "seeds": 2,
    "ladder": {"d_model": list(WIDTHS)},
    "model": SMALL_MODEL,
    "train": SMALL_TRAIN,
}
OWN_RATE_CONFIG: dict[str, Any] = {
    "norms": ["layernorm", "rmsnorm", "dyt"],
    "placements": ["pre"],
    "seeds": len(EVAL_SEEDS) + N_TUNING,
    "margin_bpb": MARGIN,
    "model": {
        **SMALL_MODEL,
        "d_model": 32,
        "mlp": "swiglu",
        "tie_embeddings": False,
        "dyt_alpha_attn": 2.0,
        "dyt_alpha_mlp": 1.0,
        "dyt_alpha_final": 1.0,
        "dyt_embed_scale": 50.0,
    },
    "train": SMALL_TRAIN,
}
"""The DyT study's recipe (examples/studies/dyt_layernorm.yaml) for all three arms, small."""
STUDY_NAMES = ("holdout", "coord", "transfer", "own_rate")


# ---- commands --------------------------------------------------------------------------------


def normlab(*args: str) -> list[str]:
    """A command of this Python's normlab."""
    return [sys.executable, "-m", "normlab", *args]


def shown(cmd: Sequence[str]) -> str:
    """``cmd`` as a reader types it: ``normlab …``, paths under the checkout relative to it."""
    args = list(cmd)
    if args[1:3] == ["-m", "normlab"]:
        args = ["normlab", *args[3:]]
    out = []
    for a in args:
        p = Path(a)
        out.append(str(p.relative_to(ROOT)) if p.is_absolute() and p.is_relative_to(ROOT) else a)
    return " ".join(out)


def rate_name(rate: float) -> str:
    """The folder name of one rate of a sweep: ``lr=0.005``."""
    return f"lr={rate:g}"


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a study's experiment config (YAML) under the output folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(dict(config), sort_keys=False))
    return path


def sweep_commands(
    config: Path, out: Path, rates: Sequence[float], extra: Sequence[str] = ()
) -> dict[float, list[str]]:
    """One ``normlab compare --config CONFIG --lr r --out OUT/lr=r`` per rate."""
    return {
        r: normlab(
            "compare",
            "--config",
            str(config),
            *extra,
            "--lr",
            f"{r:g}",
            "--out",
            str(out / rate_name(r)),
        )
        for r in rates
    }


def sweep_folders(out: Path, rates: Sequence[float]) -> dict[float, Path]:
    """{rate: its compare (or ladder) folder} of a sweep made by :func:`sweep_commands`."""
    return {r: out / rate_name(r) for r in rates}


def plan(out: Path) -> dict[str, list[list[str]]]:
    """Every study's commands, in the order they run."""
    transfer = write_config(out / "transfer.yaml", TRANSFER_CONFIG)
    own = write_config(out / "own_rate.yaml", OWN_RATE_CONFIG)
    cmds: dict[str, list[list[str]]] = {
        "holdout": [
            normlab("compare", "--config", str(LADDER_EXAMPLE), "--out", str(out / "holdout"))
        ],
        "coord": [
            normlab(
                "coord-check",
                "--ladder",
                "d_model=" + ",".join(map(str, WIDTHS)),
                "--parametrization",
                p,
                "--n-layers",
                "2",
                "--n-heads",
                "2",
                "--out",
                str(out / f"coord_{p}"),
            )
            for p in ("mup", "sp")
        ],
        "own_rate": list(sweep_commands(own, out / "own_rate", RATES).values()),
        "transfer": [
            cmd
            for r in RATES
            for p in ("mup", "sp")
            for cmd in sweep_commands(
                transfer, out / f"transfer_{p}", [r], ("--parametrization", p)
            ).values()
        ],
    }
    return cmds


def run_order(cmds: Mapping[str, list[list[str]]], only: Sequence[str]) -> list[list[str]]:
    """The chosen studies' commands in the order they train: the hold-out and the coordinate
    checks first, then the own-rate sweep, then the transfer sweep, each from the middle of
    :data:`RATES` outwards (the transfer's mup and sp rate by rate), so that a sweep stopped
    early has its central rates. A coordinate check whose ``coord_check.json`` exists is not
    run again."""
    order = [c for name in ("holdout", "coord") if name in only for c in cmds[name]]
    order = [
        c
        for c in order
        if not (c[3] == "coord-check" and (Path(c[-1]) / "coord_check.json").exists())
    ]
    middle = len(RATES) // 2
    by_distance = sorted(range(len(RATES)), key=lambda i: (abs(i - middle), i))
    if "own_rate" in only:
        order += [cmds["own_rate"][i] for i in by_distance]
    if "transfer" in only:
        order += [c for i in by_distance for c in cmds["transfer"][2 * i : 2 * i + 2]]
    return order


def run_all(commands: Sequence[Sequence[str]]) -> float:
    """Run ``commands`` one after another; the wall seconds. A coordinate check that is not
    flat exits 3 (failed: the README's table of exit statuses) and is still a result; any
    other failure stops."""
    start = time.perf_counter()
    for cmd in commands:
        print("$", shown(cmd), flush=True)
        rc = subprocess.run(cmd, check=False).returncode
        if rc != 0 and not (cmd[3] == "coord-check" and rc == EXIT_FAILED):
            raise SystemExit(f"{shown(cmd)} exited {rc}")
    return time.perf_counter() - start


# ---- reading the folders --------------------------------------------------------------------


def seed_values(folder: CompareFolder, arm: str, seeds: Sequence[int]) -> list[float | None]:
    """The quality metric of ``arm`` per seed of ``seeds``: None for a run that diverged or is
    missing (only runs whose status counts for the metric give a value)."""
    fmt = testbed_format(folder.testbed)
    spec = fmt.metric(fmt.quality)
    got = {
        run.seed: run.value(fmt.quality) if run.status in spec.statuses else None
        for run in folder.runs_of(arm)
    }
    return [got.get(s) for s in seeds]


def complete(folder: CompareFolder) -> bool:
    """Every planned run of the folder finished or diverged."""
    runs = {(r.arm, r.seed) for r in folder.runs if r.done}
    return all((a, s) in runs for a in folder.arms for s in folder.seeds)


def train_seconds(folders: Sequence[CompareFolder]) -> tuple[float, int]:
    """The summed ``wall_s`` of the folders' runs, and how many runs they are."""
    walls = [r.summary.get("wall_s") for f in folders for r in f.runs]
    walls = [float(w) for w in walls if isinstance(w, (int, float))]
    return sum(walls), len(walls)


def run_dates(folders: Sequence[CompareFolder]) -> str:
    """The UTC dates the folders' runs finished (their summaries were written), as
    ``2026-12-02`` or ``2026-12-01 to 2026-12-02``; empty without a finished run."""
    stamps = []
    for f in folders:
        for r in f.runs:
            path = r.path / SUMMARY_FILE
            if path.exists():
                stamps.append(path.stat().st_mtime)
    if not stamps:
        return ""
    days = [
        dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")
        for t in (min(stamps), max(stamps))
    ]
    return days[0] if days[0] == days[1] else f"{days[0]} to {days[1]}"


def machine() -> str:
    """The CPU model and count of this machine."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores (shared), {platform.system()}"


# ---- hold-out and spread --------------------------------------------------------------------


def sd_interval(sd: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The χ² interval of a normal sd from n values: s·√((n−1)/χ²_{(1±c)/2, n−1})."""
    df = n - 1
    lo = sd * math.sqrt(df / stats.chi2.ppf((1 + confidence) / 2, df))
    hi = sd * math.sqrt(df / stats.chi2.ppf((1 - confidence) / 2, df))
    return lo, hi


def holdout(rungs: Sequence[Rung], n_boot: int = 4000) -> dict[str, Any]:
    """Fit the ladder without its largest rung and predict that rung: the calibrated intervals
    for one training, for the mean of the rung's seeds and for the trend, and the plain
    bootstrap's for contrast; then whether the measured values lie inside."""
    ordered = sorted(rungs, key=lambda r: r.n_params)
    fit_on, last = ordered[:-1], ordered[-1]
    k = len(last.diffs)
    pred = predict_ladder(fit_on, last.n_params, target_seeds=k, n_boot=n_boot)
    plain = predict_ladder(fit_on, last.n_params, target_seeds=k, n_boot=n_boot, calibrated=False)
    fit = fit_ladder(fit_on)
    measured = float(np.mean(last.diffs))
    s = pred.single
    return {
        "fit": fit,
        "prediction": pred,
        "plain": plain,
        "held_out": last,
        "measured_mean": measured,
        "mean_inside": pred.mean_of_seeds.low <= measured <= pred.mean_of_seeds.high,
        "trend_inside": pred.trend.low <= measured <= pred.trend.high,
        "plain_inside": plain.single.low <= measured <= plain.single.high,
        "singles_inside": sum(s.low <= d <= s.high for d in last.diffs),
        "plain_singles_inside": sum(plain.single.low <= d <= plain.single.high for d in last.diffs),
    }


def spread(rungs: Sequence[Rung]) -> dict[str, Any]:
    """Per rung the paired mean and sd with the sd's χ² interval and the paired seeds that
    showing equivalence within :data:`MARGIN` would take at that sd (true difference 0, 80 %
    power); and the slope of log₁₀ sd against log₁₀ N."""
    rows = []
    for r in rung_stats(rungs):
        rows.append(
            {
                "stats": r,
                "sd_ci": sd_interval(r.sd, r.n),
                "need": seeds_needed(0.0, r.sd, MARGIN) if r.sd > 0 else 2,
            }
        )
    x = np.log10([r["stats"].n_params for r in rows])
    y = np.log10([max(r["stats"].sd, 1e-12) for r in rows])
    slope = float(np.polyfit(x, y, 1)[0])
    return {"rows": rows, "slope": slope}


def ladder_rungs(folder: Path) -> tuple[str, str, list[Rung], dict[str, Any]]:
    """The arm, the baseline, the rungs of a finished ladder folder (its first non-baseline
    arm) and that arm's full ladder record (what the folder's summary.json holds)."""
    record = analyze_ladder(folder)
    arm, rec = next(iter(record["arms"].items()))
    rungs = [
        Rung(x["setting"], float(x["n_params"]), tuple(x["diffs"]), tuple(x["seeds"]))
        for x in rec["rungs"]
    ]
    return arm, rec["baseline"], rungs, rec


# ---- learning rates -------------------------------------------------------------------------


def sweep_losses(
    folders: Mapping[float, Path], seeds: Sequence[int] | None = None
) -> dict[str, dict[str, dict[float, list[float | None]]]]:
    """{setting: {arm: {rate: [quality per seed]}}} from a sweep's finished folders (a ladder
    folder per rate, or a plain compare folder: setting ``""``); rates whose folder is missing
    or unfinished are left out. ``seeds``: which seeds (default: the folder's)."""
    out: dict[str, dict[str, dict[float, list[float | None]]]] = {}
    for rate, path in sorted(folders.items()):
        if (path / "ladder.json").exists():
            try:
                _, rungs = load_rungs(path)
            except ValueError:
                continue
        elif (path / "experiment.json").exists():
            rungs = {"": load_compare_folder(path)}
        else:
            continue
        if not rungs or not all(complete(f) for f in rungs.values()):
            continue
        for setting, f in rungs.items():
            for arm in f.arms:
                values = seed_values(f, arm, f.seeds if seeds is None else seeds)
                out.setdefault(setting, {}).setdefault(arm, {})[rate] = values
    return out


def sweep_curves(
    losses: Mapping[str, Mapping[str, Mapping[float, Sequence[float | None]]]],
) -> dict[str, dict[str, LrCurve]]:
    """{setting: {arm: curve}} by :func:`select_learning_rates` (settings with one rate left
    out: no choice to make yet)."""
    return {
        s: select_learning_rates(by_arm)
        for s, by_arm in losses.items()
        if all(len(v) >= 2 for v in by_arm.values())
    }


PAIRS = (("rmsnorm-pre", "layernorm-pre"), ("dyt-pre", "layernorm-pre"))
"""The own-rate study's comparisons: arm − baseline."""


def paired(
    losses: Mapping[str, Mapping[float, Sequence[float | None]]],
    arm: str,
    arm_rate: float,
    base: str,
    base_rate: float,
    seeds: Sequence[int],
) -> dict[str, Any]:
    """arm at ``arm_rate`` − base at ``base_rate`` on ``seeds`` (positions in the lists of
    ``losses``, which hold every seed 0 … n−1): :func:`compare_paired` and the report's word."""
    x = [losses[arm][arm_rate][s] for s in seeds]
    y = [losses[base][base_rate][s] for s in seeds]
    keep = [i for i in range(len(seeds)) if x[i] is not None and y[i] is not None]
    c = compare_paired(
        [x[i] for i in keep],
        [y[i] for i in keep],
        seeds=[seeds[i] for i in keep],
        lower_is_better=True,
        margin=MARGIN,
    )
    word = judge(
        c, "quality", lower_is_better=True, smallest=Smallest("absolute", MARGIN), primary=True
    ).word
    return {"c": c, "word": word, "arm_rate": arm_rate, "base_rate": base_rate}


def own_rate(losses: Mapping[str, Mapping[float, Sequence[float | None]]]) -> dict[str, Any]:
    """Each arm's best rate on the tuning seeds, then every pair of :data:`PAIRS` on the
    evaluation seeds at one shared rate (compare's default; the baseline's best) and at the
    arms' own best rates."""
    tune = tuning_seeds(N_TUNING, EVAL_SEEDS)
    curves = select_learning_rates(
        {a: {r: [v[s] for s in tune] for r, v in by_rate.items()} for a, by_rate in losses.items()}
    )
    rows = []
    for arm, base in PAIRS:
        if arm not in losses or base not in losses:
            continue
        b_best = curves[base].best
        rows.append(
            {
                "arm": arm,
                "base": base,
                "shared": paired(losses, arm, SHARED_RATE, base, SHARED_RATE, EVAL_SEEDS),
                "base_best": paired(losses, arm, b_best, base, b_best, EVAL_SEEDS),
                "own": paired(losses, arm, curves[arm].best, base, b_best, EVAL_SEEDS),
            }
        )
    return {"tuning_seeds": tune, "curves": curves, "rows": rows, "losses": losses}


# ---- the document ---------------------------------------------------------------------------


def _n(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{digits}f}".replace("-", "\u2212")


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _ci(lo: float | None, hi: float | None, digits: int = 3) -> str:
    return f"[{_n(lo, digits)}, {_n(hi, digits)}]"


def _flow(config: Mapping[str, Any]) -> str:
    """A config as one line of YAML (flow style)."""
    return yaml.safe_dump(
        dict(config), default_flow_style=True, sort_keys=False, width=10**6
    ).strip()


def _cmds(commands: Sequence[Sequence[str]]) -> list[str]:
    return ["```", *(shown(c) for c in commands), "```"]


def _header(
    commands: Sequence[Sequence[str]], folders: Sequence[CompareFolder], ctx: dict
) -> list[str]:
    total, n = train_seconds(folders)
    return [
        f"- Reproduce: `python benchmarks/ladder_studies.py --only {ctx['study']}` "
        f"(these commands, then the analysis below):",
        "",
        *_cmds(commands),
        "",
        f"- Trained {run_dates(folders) or ctx['date']}, analysed {ctx['date']} at commit "
        f"`{ctx['commit']}`, on {ctx['machine']}; its {n} runs "
        f"trained for {total:.0f} s in all (one at a time, one thread each, at nice 10 "
        "beside other work: the times are upper bounds).",
    ]


def render_holdout(
    h: dict[str, Any],
    sp: dict[str, Any],
    arm: str,
    base: str,
    rec: dict,
    commands: Sequence[Sequence[str]],
    folders: Sequence[CompareFolder],
    ctx: dict,
) -> list[str]:
    """The hold-out section and the paired-spread section."""
    pred, plain, fit, last = h["prediction"], h["plain"], h["fit"], h["held_out"]
    k = len(last.diffs)
    d = f"{arm} − {base}"
    lines = [
        "## Ladder: hold-out on the GPT testbed",
        "",
        f"Does the ladder's prediction interval hold on real runs? `examples/ladder.yaml` ({d}, "
        "final validation bits per byte, paired by seed) is fitted on its three smaller rungs "
        "and predicts the largest, which was trained too.",
        "",
        *_header(commands, folders, {**ctx, "study": "holdout"}),
        f"- Small on purpose (the example's settings: 2 layers, 500 steps of 8 × 64 bytes): "
        f"{rec['rungs'][0]['n_params']:,.0f} to {rec['rungs'][-1]['n_params']:,.0f} "
        f"parameters. The largest rung is only {pred.extrapolation:.2g}× the size of the one "
        "below it, so this tests the interval over a short step, at a budget where no model is "
        "near trained.",
        "",
        "| rung | N (parameters) | per-seed differences | mean [95% CI] | mean bpb "
        f"{base} / {arm} |",
        "|---|---:|---|---|---|",
    ]
    for r in rec["rungs"]:
        diffs = ", ".join(_n(v, 4) for v in r["diffs"])
        means_cell = " / ".join(_f(v) for v in ctx["means"].get(r["setting"], (None, None)))
        lines.append(
            f"| {r['setting']} | {r['n_params']:,.0f} | {diffs} | {_n(r['mean'], 4)} "
            f"{_ci(r['low'], r['high'], 4)} | {means_cell} |"
        )
    s, m, t = pred.single, pred.mean_of_seeds, pred.trend
    lines += [
        "",
        f"Fit on the three smaller rungs: d = {_n(fit.a, 4)} {_n(fit.b, 4)}·log10 N (slope "
        f"± {fit.b_se:.4f} per tenfold), pooled paired sd {fit.pooled_sd:.4f} bpb "
        f"(ν = {fit.df}), lack-of-fit p = {fit.lack_of_fit_p:.2f}. Prediction at "
        f"N = {last.n_params:,.0f} ({pred.extrapolation:.2f}× the largest fitted rung), 95 %:",
        "",
        "| what is predicted | estimate | interval | measured | inside |",
        "|---|---:|---|---:|---|",
        f"| one training | {_n(s.estimate, 4)} | {_ci(s.low, s.high, 4)} | each seed: "
        + ", ".join(_n(v, 4) for v in last.diffs)
        + f" | {h['singles_inside']} of {k} |",
        f"| mean of {k} seeds | {_n(m.estimate, 4)} | {_ci(m.low, m.high, 4)} | "
        f"{_n(h['measured_mean'], 4)} | {'yes' if h['mean_inside'] else '**no**'} |",
        f"| trend (no seed noise) | {_n(t.estimate, 4)} | {_ci(t.low, t.high, 4)} | "
        f"{_n(h['measured_mean'], 4)} (mean) | {'yes' if h['trend_inside'] else 'no'} |",
        f"| plain bootstrap, one training | {_n(plain.single.estimate, 4)} | "
        f"{_ci(plain.single.low, plain.single.high, 4)} | each seed | "
        f"{h['plain_singles_inside']} of {k} |",
        "",
    ]
    width = (m.high - m.low) / 2
    reading = (
        f"Reading: the measured mean of the held-out rung, {_n(h['measured_mean'], 4)}, "
        + ("lies inside" if h["mean_inside"] else "**lies outside**")
        + f" the interval predicted for the mean of {k} seeds (half-width {width:.4f} bpb)"
    )
    reading += (
        f", and {h['singles_inside']} of its {k} single trainings inside the one-training "
        "interval. "
    )
    if h["mean_inside"]:
        reading += (
            "The interval held here, but one hold-out is one draw: the simulation above, not "
            "this, measures its coverage. "
        )
    else:
        reading += (
            "This did not hold: the difference at the largest rung is not what the smaller "
            "rungs' straight line in log N said. "
        )
    zero_in = m.low <= 0 <= m.high
    reading += (
        f"That interval {'includes' if zero_in else 'excludes'} 0 and is "
        f"{width / MARGIN:.1f}× as wide as the default margin's band ±{MARGIN}: with "
        f"{len(last.diffs)} seeds per rung a ladder this small predicts the next rung's "
        "difference only to within the rungs' own seed noise, which is larger than the "
        "margin."
    )
    if h["plain_singles_inside"] < k:
        reading += (
            f" The plain bootstrap's interval, {_ci(plain.single.low, plain.single.high, 4)}, "
            f"holds {h['plain_singles_inside']} of the {k} single trainings."
        )
    means = list(ctx["means"].values())
    if len(means) >= 2 and None not in (means[-1][0], means[-2][0]):  # noqa: SIM102
        if means[-1][0] >= means[-2][0]:
            reading += (
                f" Note also that the largest rung's {base} ({means[-1][0]:.3f} bpb) is no "
                f"better than the rung below it ({means[-2][0]:.3f}): at one fixed rate and "
                "budget for every size (sp), the widest model is not the best trained, so the "
                "rungs do not lie on one scaling curve, and the difference's trend in N mixes "
                "size with how well each size is tuned."
            )
    lines += [reading, ""]
    full = rec["prediction"]
    lines += [
        f"The whole ladder's own headline (the report's last line, all four rungs, at "
        f"{rec['target']['n_params']:,.0f} parameters): {full['sentence']}",
        "",
    ]
    # the spread
    n = sp["rows"][0]["stats"].n
    lo_f, hi_f = sd_interval(1.0, n)
    lines += [
        "## Ladder: paired spread per rung",
        "",
        f"From the same ladder: the sd of the paired differences {d} per rung ({n} seeds, so "
        f"its 95 % χ² interval spans {lo_f:.2f}× to {hi_f:.1f}× the estimate), and how many "
        f"paired seeds it would take to show equivalence within margin_bpb = {MARGIN} at that "
        "sd if the true difference were 0 (fixed-sample TOST, 80 % power, "
        "`normlab.analysis.seeds_needed`).",
        "",
        "| rung | N | paired sd (bpb) | 95 % interval of the sd | seeds needed |",
        "|---|---:|---:|---|---:|",
    ]
    for row in sp["rows"]:
        r = row["stats"]
        need = "more than 1000" if row["need"] is None else str(row["need"])
        lines.append(
            f"| {r.setting} | {r.n_params:,.0f} | {r.sd:.4f} | "
            f"[{row['sd_ci'][0]:.4f}, {row['sd_ci'][1]:.4f}] | {need} |"
        )
    sds = [row["stats"].sd for row in sp["rows"]]
    trend = "shrinks" if sp["slope"] < 0 else "grows"
    lines += [
        "",
        f"Reading: the least-squares slope of log10 sd on log10 N is {sp['slope']:+.2f} (the "
        f"sd {trend} by a factor {10 ** abs(sp['slope']):.2f} per tenfold in N; from "
        f"{sds[0]:.4f} at the smallest rung to {sds[-1]:.4f} at the largest). With {n} seeds per "
        f"rung each sd is uncertain by a factor of about {hi_f / lo_f:.0f} from end to end of "
        "its interval. "
        + _spread_words(sp)
        + " The seeds a decision needs scale with sd²: read the column as an order of "
        "magnitude, not a plan.",
        "",
    ]
    return lines


def _spread_words(sp: dict[str, Any]) -> str:
    """Whether the rungs' sd intervals tell the rungs apart, and whether the sd is monotone."""
    rows = sp["rows"]
    lo = min(rows, key=lambda r: r["stats"].sd)
    hi = max(rows, key=lambda r: r["stats"].sd)
    sds = [r["stats"].sd for r in rows]
    steps = list(itertools.pairwise(sds))
    monotone = all(a <= b for a, b in steps) or all(a >= b for a, b in steps)
    if lo["sd_ci"][1] >= hi["sd_ci"][0]:
        text = (
            "Every rung's interval overlaps every other's, so these runs cannot show that the "
            "seed noise of the difference moves with size."
        )
    else:
        text = (
            f"The smallest sd ({lo['stats'].setting}, {lo['stats'].sd:.4f}) and the largest "
            f"({hi['stats'].setting}, {hi['stats'].sd:.4f}) have intervals that do not overlap, "
            "so the spread does differ between rungs"
        )
        text += (
            ", and it moves one way with size."
            if monotone
            else ", but not one way with size: these runs do not show the seed noise "
            "shrinking (or growing) as the models grow."
        )
    return text


def _partial(curves: Mapping[str, Mapping[str, LrCurve]]) -> list[str]:
    """A warning paragraph when the sweep lacks some of :data:`RATES` (it stopped early)."""
    done = sorted({p.rate for c in curves.values() for a in c.values() for p in a.points})
    missing = [r for r in RATES if r not in done]
    if not missing:
        return []
    return [
        f"**Partial sweep**: the rates {', '.join(f'{r:g}' for r in missing)} had not finished "
        "when this was written (the machine was shared and the runs were slow); the same "
        "command resumes it. A best rate at the edge of the finished rates says nothing about "
        "the rates beyond it.",
        "",
    ]


def _curve_table(curves: Mapping[str, Mapping[str, LrCurve]], label: str) -> list[str]:
    rates = sorted({p.rate for c in curves.values() for a in c.values() for p in a.points})
    lines = [
        f"| {label} | arm | " + " | ".join(f"{r:g}" for r in rates) + " | best |",
        "|---|---|" + "---:|" * len(rates) + "---|",
    ]
    for setting, by_arm in curves.items():
        for arm, c in by_arm.items():
            cells = []
            for r in rates:
                p = next((q for q in c.points if q.rate == r), None)
                if p is None or p.mean is None:
                    cells.append("diverged" if p is not None else "")
                    continue
                cell = f"{p.mean:.3f}" + (f" ± {p.sd:.3f}" if p.sd is not None else "")
                if p.n_diverged:
                    cell += f" ({p.n_diverged} diverged)"
                cells.append(f"**{cell}**" if r == c.best else cell)
            edge = f" (at the {c.edge} edge)" if c.edge else ""
            lines.append(f"| {setting} | {arm} | " + " | ".join(cells) + f" | {c.best:g}{edge} |")
    return lines


def render_transfer(
    coord: dict[str, dict],
    curves: dict[str, dict],
    same_base: float | None,
    commands: Sequence[Sequence[str]],
    folders: Sequence[CompareFolder],
    ctx: dict,
) -> list[str]:
    """The μP section: the coordinate check and the optimum across widths."""
    lines = [
        "## μP: the coordinate check and the learning-rate optimum across widths",
        "",
        "Under μP a rate tuned at the base width should stay best at every width; under sp "
        "(Adam) the best rate should fall as the width grows. The same small GPT as the "
        f"hold-out (2 layers, 2 heads), d_model {'/'.join(map(str, WIDTHS))}, base width "
        f"{WIDTHS[0]}; the sweep trains LayerNorm and RMSNorm for 120 steps at each rate, 2 "
        "seeds (the quality is the final validation bpb).",
        "",
        *_header(commands, folders, {**ctx, "study": "coord transfer"}),
        f"- `transfer.yaml`, written by the script (`TRANSFER_CONFIG`): "
        f"`{_flow(TRANSFER_CONFIG)}`.",
        "",
        "Coordinate check (`normlab coord-check`, 10 Adam steps at lr 0.01, 2 seeds): the "
        "largest judged slope of log mean|x| against log d_model, and each layer's slope at "
        f"step 10 (with its sizes at d_model {' / '.join(map(str, WIDTHS))}):",
        "",
    ]
    for p, data in coord.items():
        if not data:
            lines += [f"- {p}: not run.", ""]
            continue
        w = data["worst"]
        last = ", ".join(
            f"{layer} {row[-1]:+.2f} (mean |x| "
            + " / ".join(f"{v:.3g}" for v in data["sizes"][layer][-1])
            + ")"
            for layer, row in data["slopes"].items()
        )
        lines.append(
            f"- {p}: {'flat' if data['flat'] else '**not flat**'} (largest {w['slope']:+.2f}, "
            f"{w['layer']} at step {w['step']}; threshold ±{data['threshold']}); at step "
            f"{data['steps']}: {last}."
        )
    lines += ["", _coord_reading(coord), ""]
    for p, by_setting in curves.items():
        if not by_setting:
            lines += [f"Learning-rate sweep, {p}: not finished.", ""]
            continue
        lines += [
            *_partial(by_setting),
            f"Learning-rate sweep, **{p}** (final validation bpb, mean ± sd over the 2 seeds; "
            "bold: the best rate):",
            "",
            *_curve_table(by_setting, "width"),
            "",
        ]
        for a in optimum_alignment(by_setting):
            best = ", ".join(f"{s}: {r:g}" for s, r in a.best.items())
            lines.append(
                f"- {a.arm}: best rates {best}; {a.steps} sweep step(s) apart. Within the "
                "seeds' sd of the best: "
                + "; ".join(f"{s}: {', '.join(f'{r:g}' for r in t)}" for s, t in a.tied.items())
                + (
                    f"; a rate within noise of the best at every width: "
                    f"{', '.join(f'{r:g}' for r in a.common)}"
                    if a.common
                    else "; no rate is within noise of the best at every width"
                )
                + f": {'aligned' if a.aligned else '**not aligned**'}."
            )
        lines.append("")
    if same_base is not None:
        lines += [
            f"At the base width d_model={WIDTHS[0]} mup and sp are the same model: the largest "
            f"difference between their final bpb over every rate, arm and seed is "
            f"{same_base:.3g}.",
            "",
        ]
    if curves.get("mup") and curves.get("sp"):
        arms = [a for a in next(iter(curves["mup"].values()))]
        best_lines = []
        for arm in arms:
            cells = [
                f"{setting} {curves['mup'][setting][arm].best_mean:.3f} / "
                f"{curves['sp'][setting][arm].best_mean:.3f}"
                for setting in curves["mup"]
                if setting in curves["sp"] and arm in curves["sp"][setting]
            ]
            best_lines.append(f"{arm}: {', '.join(cells)}")
        widest = list(curves["mup"])[-1]
        sp_better = widest in curves["sp"] and all(
            curves["sp"][widest][a].best_mean < curves["mup"][widest][a].best_mean - MARGIN
            for a in arms
        )
        lines += [
            "The best mean bpb of each arm per width, mup / sp (each at its own best rate): "
            + "; ".join(best_lines)
            + "."
            + (
                f" At {widest} sp at its own best rate ends lower than mup at its own, by more "
                "than the margin, in every arm: a rate that carries across widths is not the "
                "same as a better-trained wide model, and at 120 steps on 2 seeds which "
                "parametrisation trains these small models better is not what this sweep is "
                "built to settle."
                if sp_better
                else ""
            ),
            "",
        ]
    lines += [_transfer_reading(curves), ""]
    return lines


def _common_tied(by_setting: Mapping[str, Mapping[str, LrCurve]]) -> bool:
    """Whether every arm has a rate within noise of its best at every setting."""
    return all(a.common for a in optimum_alignment(by_setting))


def _coord_reading(coord: Mapping[str, Mapping[str, Any]]) -> str:
    """Whether μP's coordinate check passed, and how it compares with sp's."""
    mup, sp = coord.get("mup") or {}, coord.get("sp") or {}
    if not mup or not sp:
        return "Reading: the coordinate checks have not both run."
    wm, ws = abs(mup["worst"]["slope"]), abs(sp["worst"]["slope"])
    if mup["flat"]:
        text = (
            f"Reading: flat under mup (largest |slope| {wm:.2f}), growing under sp ({ws:.2f}): "
            "the check μP must pass, passed on this model."
        )
    else:
        text = (
            f"Reading: **this did not hold** on this model: under mup the largest |slope| is "
            f"{wm:.2f}, beyond the ±{mup['threshold']} rule, against {ws:.2f} under sp. μP "
            f"removes most of sp's growth (a factor {ws / max(wm, 1e-12):.1f} in the slope), "
            "but the block outputs of the widest model fall behind within the ten steps. "
            "docs/mup.md's check of the default GPT (4 layers, 4 heads, d_model 32–256, the "
            "same rate) passed with +0.13; this 2-layer, 2-head model does not. docs/mup.md "
            "('A shallow model at small widths') traces it: every parameter's rate and "
            "initial scale match μP's table, the fall comes from block0's attention and MLP "
            "outputs at small widths and fades as the rungs widen (8 seeds: −0.33 at d_model "
            "32/64/128, −0.15 at 128/256/512, −0.05 at 256/512/1024), and with 2 seeds the "
            "verdict is noisy: a finite-width drift of this shallow, tied-head model, not a "
            "defect of the parametrisation."
        )
    return text


def _transfer_reading(curves: Mapping[str, Mapping[str, Mapping[str, LrCurve]]]) -> str:
    parts = []
    for p, by_setting in curves.items():
        if len(by_setting) < 2:
            continue
        al = optimum_alignment(by_setting)
        words = ", ".join(
            f"{a.arm} {'aligned' if a.aligned else 'not aligned'} (best rates {a.steps} "
            "step(s) apart)"
            for a in al
        )
        edges = [
            f"{a} at {s}" for s, by_arm in by_setting.items() for a, c in by_arm.items() if c.edge
        ]
        part = f"under {p}: {words}"
        if edges:
            part += f"; best at the sweep's edge: {', '.join(edges)}"
        parts.append(part)
    if not parts:
        return "Reading: the sweep has not finished."
    done = {p: c for p, c in curves.items() if len(c) >= 2}
    if set(done) != {"mup", "sp"}:
        return "Reading: " + "; ".join(parts) + ". Only part of the sweep has finished."
    argmin = {p: all(a.steps <= 1 for a in optimum_alignment(c)) for p, c in done.items()}
    common = {p: _common_tied(c) for p, c in done.items()}
    if common["mup"] and not common["sp"]:
        verdict = (
            "Within the seeds' noise μP's prediction holds: under mup every arm has a rate "
            "within noise of its best at every width, under sp no arm has one (its best moves "
            "with the width)."
        )
    elif common["mup"] and common["sp"]:
        verdict = (
            "**Not shown either way**: every arm has a rate within its seeds' noise of the "
            "best at every width under mup and under sp alike, so at 2 seeds and this budget "
            "the sweep cannot tell the two parametrisations apart."
        )
    else:
        verdict = (
            "**This did not hold**: under mup some arm has no rate within noise of its best "
            "at every width."
        )
    verdict += (
        f" By the argmin alone (aligned when the best rates lie at most one sweep step apart, "
        f"a factor 2 here) mup would be {'aligned' if argmin['mup'] else 'not aligned'} and "
        f"sp {'aligned' if argmin['sp'] else 'not aligned'}: with 2 seeds and 120 steps "
        "neighbouring rates often differ by less than the seeds' spread, so the argmin jumps "
        "within the noise, and a best rate at the sweep's edge makes the step count a lower "
        "bound. This is why `optimum_alignment` (and `compare --lr-sweep`'s report) judges "
        "the optimum by the rates within the seeds' spread of the best."
    )
    return "Reading: " + "; ".join(parts) + ". " + verdict


def render_own_rate(
    o: dict[str, Any],
    commands: Sequence[Sequence[str]],
    folders: Sequence[CompareFolder],
    ctx: dict,
) -> list[str]:
    """The own-rate section."""
    curves = o["curves"]
    lines = [
        "## Each arm at its own best rate vs one shared rate",
        "",
        "A comparison at one shared learning rate is partly a comparison of learning rates. "
        "LayerNorm, RMSNorm and DyT (the DyT study's recipe for all three: SwiGLU, untied head, "
        "DyT α0 2 / 1 / 1 and embedding scale 50, chosen at d_model 64), d_model 32, 2 "
        "layers, 120 steps, every rate on "
        f"seeds 0–4. Each arm's best rate is chosen on the tuning seeds "
        f"{', '.join(map(str, o['tuning_seeds']))} (`select_learning_rates`); the comparisons use "
        f"the evaluation seeds {', '.join(map(str, EVAL_SEEDS))}, disjoint from them, so the "
        "choice does not bias them.",
        "",
        *_header(commands, folders, {**ctx, "study": "own_rate"}),
        f"- `own_rate.yaml`, written by the script (`OWN_RATE_CONFIG`): "
        f"`{_flow(OWN_RATE_CONFIG)}`.",
        "",
        *_partial({"": curves}),
        "Tuning curves (final validation bpb, mean ± sd over the tuning seeds; bold: best):",
        "",
        *_curve_table({"d_model=32": curves}, "width"),
        "",
        f"Paired comparisons on the evaluation seeds (arm − baseline, bpb, 95 % CI; the "
        f"report's verdict with margin_bpb = {MARGIN}):",
        "",
        "| comparison | rates (arm / baseline) | mean diff [95% CI] | verdict |",
        "|---|---|---|---|",
    ]
    for row in o["rows"]:
        for key, what in (
            ("shared", f"shared {SHARED_RATE:g} (compare's default)"),
            ("base_best", "shared: the baseline's best"),
            ("own", "each at its own best"),
        ):
            q = row[key]
            c = q["c"]
            lines.append(
                f"| {row['arm']} vs {row['base']}, {what} | {q['arm_rate']:g} / "
                f"{q['base_rate']:g} | {_n(c.mean_diff, 4)} {_ci(c.ci_low, c.ci_high, 4)} | "
                f"{q['word']} |"
            )
    lines += ["", _own_reading(o), ""]
    return lines


def _own_reading(o: dict[str, Any]) -> str:
    parts = []
    for row in o["rows"]:
        sh, own = row["shared"], row["own"]
        change = (
            "the same verdict"
            if sh["word"] == own["word"]
            else f"the verdict changes from {sh['word']} to {own['word']}"
        )
        parts.append(
            f"{row['arm']} − {row['base']} moves from {_n(sh['c'].mean_diff, 3)} at the shared "
            f"{SHARED_RATE:g} to {_n(own['c'].mean_diff, 3)} at the own rates: {change}"
        )
    edges = [f"{a} ({c.edge})" for a, c in o["curves"].items() if c.edge]
    text = "Reading: " + "; ".join(parts) + "."
    if edges:
        text += (
            " Best rates at the sweep's edge, so the optimum may lie beyond it: "
            + ", ".join(edges)
            + "."
        )
    wide = []
    for arm, c in o["curves"].items():
        values = [v for v in o["losses"][arm][c.best] if v is not None]
        if values and max(values) - min(values) > 10 * MARGIN:
            wide.append(f"{arm} at {c.best:g} from {min(values):.3f} to {max(values):.3f} bpb")
    if wide:
        text += (
            " The seeds of one arm at one rate spread far wider than the margin ("
            + "; ".join(wide)
            + f" over seeds 0–{len(EVAL_SEEDS) + N_TUNING - 1}): at this budget one seed says "
            "little about another, and a best rate chosen on two seeds is itself noisy."
        )
    text += (
        " Three evaluation seeds decide only large differences; at 120 steps the gaps are "
        "those of barely trained models, so read the change between the rows, not the verdicts, "
        "as the finding."
    )
    return text


def git_commit() -> str:
    """The checkout's commit, as scripts/studies.py records it for its own sections (its
    function, loaded from that file: one definition of what a study document calls its
    commit)."""
    spec = importlib.util.spec_from_file_location("normlab_studies", ROOT / "scripts/studies.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name) or importlib.util.module_from_spec(spec)
    if spec.name not in sys.modules:
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return str(module.git_commit())


def _means(
    folders: Mapping[str, CompareFolder], base: str, arm: str
) -> dict[str, tuple[float | None, float | None]]:
    """Per rung the mean quality over seeds of the baseline and of the arm."""
    out = {}
    for setting, f in folders.items():
        pair = []
        for a in (base, arm):
            v = [x for x in seed_values(f, a, f.seeds) if x is not None]
            pair.append(float(np.mean(v)) if v else None)
        out[setting] = (pair[0], pair[1])
    return out


def document(out: Path, cmds: Mapping[str, list[list[str]]]) -> list[str]:
    """Every study's section from the finished folders under ``out`` (a study whose folders
    are missing is said to be not run)."""
    ctx = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "machine": machine(),
    }
    lines = [BEGIN, ""]
    hold = out / "holdout"
    if (hold / "ladder.json").exists():
        arm, base, rungs, rec = ladder_rungs(hold)
        _, folders = load_rungs(hold)
        h = holdout(rungs)
        lines += render_holdout(
            h,
            spread(rungs),
            arm,
            base,
            rec,
            cmds["holdout"],
            list(folders.values()),
            {**ctx, "means": _means(folders, base, arm)},
        )
    else:
        lines += ["## Ladder: hold-out on the GPT testbed", "", "Not run yet.", ""]
    coord = {}
    for p in ("mup", "sp"):
        f = out / f"coord_{p}" / "coord_check.json"
        coord[p] = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
    curves, transfer_folders, raw = {}, [], {}
    for p in ("mup", "sp"):
        folders = sweep_folders(out / f"transfer_{p}", RATES)
        raw[p] = sweep_losses(folders)
        curves[p] = sweep_curves(raw[p])
        for path in folders.values():
            try:
                transfer_folders += list(load_rungs(path)[1].values())
            except (OSError, ValueError):  # not started, or a rung not yet begun
                continue
    base = f"d_model={WIDTHS[0]}"
    same = None
    if base in raw["mup"] and base in raw["sp"]:
        gaps = [
            abs(a - b)
            for arm, by_rate in raw["mup"][base].items()
            for r, vals in by_rate.items()
            if r in raw["sp"][base].get(arm, {})
            for a, b in zip(vals, raw["sp"][base][arm][r], strict=True)
            if a is not None and b is not None
        ]
        same = max(gaps) if gaps else None
    lines += render_transfer(
        coord, curves, same, cmds["coord"] + cmds["transfer"], transfer_folders, ctx
    )
    own_folders = sweep_folders(out / "own_rate", RATES)
    losses = sweep_losses(own_folders).get("", {})
    if losses and all(len(v) >= 2 for v in losses.values()):
        done = [
            load_compare_folder(p) for p in own_folders.values() if (p / "experiment.json").exists()
        ]
        lines += render_own_rate(own_rate(losses), cmds["own_rate"], done, ctx)
    else:
        lines += ["## Each arm at its own best rate vs one shared rate", "", "Not run yet.", ""]
    lines.append(END)
    return lines


def place(old: str, section: str) -> str:
    """``old`` with the text between :data:`BEGIN` and :data:`END` replaced by ``section``
    (appended after the kept marker's sections when absent; the marker is added when the
    document has none, so that scripts/studies.py keeps the section)."""
    start, stop = old.find(BEGIN), old.find(END)
    if start >= 0 and stop > start:
        return old[:start] + section + old[stop + len(END) :]
    body = old.rstrip("\n")
    if KEPT_MARKER not in body:
        body += (
            "\n\n<!-- kept: the sections below are written from their own commands; "
            "scripts/studies.py keeps them when it regenerates the file -->"
        )
    return body + "\n\n" + section + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen studies (all by default), then write their sections of the document."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "normlab-out" / "ladder_studies")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "studies.md")
    p.add_argument("--only", nargs="+", choices=STUDY_NAMES, default=list(STUDY_NAMES))
    p.add_argument("--no-run", action="store_true", help="analyse finished folders only")
    p.add_argument("--no-doc", action="store_true", help="train only")
    args = p.parse_args(args_list)
    args.out.mkdir(parents=True, exist_ok=True)
    cmds = plan(args.out)
    if not args.no_run:
        seconds = run_all(run_order(cmds, args.only))
        print(f"trained in {seconds:.0f} s", flush=True)
    if args.no_doc:
        return 0
    text = "\n".join(document(args.out, cmds))
    old = args.doc.read_text(encoding="utf-8") if args.doc.exists() else ""
    write_text_atomic(args.doc, place(old, text))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
