"""The size ladder's evidence from real runs: the ladder sections of docs/studies.md.

    python benchmarks/ladder_studies.py               # train (resumable), analyse, write the doc
    python benchmarks/ladder_studies.py --no-run      # write the doc from the finished folders
    python benchmarks/ladder_studies.py --only holdout own_rate
    python benchmarks/ladder_studies.py --smoke --out /tmp/ls --doc /tmp/ls/studies.md

Every training is a public command run as a user would type it (``normlab compare`` with
``--ladder``, ``--lr-sweep``, ``--tuning-seeds``, ``--parametrization``, ``--lr``, ``--config``,
``--out``, and ``normlab coord-check``), one after another, into ``--out`` (default
``normlab-out/ladder_studies``); a re-run skips finished runs. Every reading goes through the
run format: the folders' ``summary.json`` as the commands' reports wrote them
(:func:`normlab.run_format.folder.read_analysis`: the ladder record, each arm's verdict, the
sweep's curves and choice), the tuning runs' values (:func:`normlab.analysis.lr_sweep_folder.
sweep_losses` of :func:`normlab.run_format.folder.tuning_folders`) and the runs' summaries.
The hold-out refits the ladder's rungs with :mod:`normlab.analysis.ladder`. Each study's
section of docs/studies.md is written between the ``ladder-studies`` markers after the kept
marker (the rest of the file is left as it is).

The studies (all on the byte-level GPT testbed, 2 layers, 2 heads, context 64, batch 8 — small
models, all but the last trained briefly, so that those run in about an hour on two CPU cores):

- ``holdout``: ``examples/ladder.yaml`` (LayerNorm vs RMSNorm at d_model 16/32/64/128, 3 seeds,
  500 steps). The fit on the three smaller rungs predicts the largest; is the measured
  difference inside the prediction interval? The same ladder gives the paired spread per rung
  and the seeds a decision within the default margin would need there (``spread``).
- ``coord``: ``normlab coord-check`` at d_model 32/64/128 under mup and sp.
- ``transfer``: the learning-rate optimum across d_model 32/64/128: ``compare --ladder
  --lr-sweep`` under mup (the smallest width chooses, the largest checks) and under sp (every
  width its own), 2 tuning seeds, 120 steps; the ladder's sweep record holds the curves and
  :func:`normlab.analysis.lr_sweep.optimum_alignment`'s verdict.
- ``own_rate``: LayerNorm, RMSNorm and DyT (the DyT study's recipe, d_model 32, 120 steps):
  ``compare --lr-sweep`` chooses each arm's best rate on the tuning seeds 3, 4 and compares the
  arms at their own rates on the evaluation seeds 0, 1, 2; ``compare --lr`` compares them on
  the same seeds at one shared rate (compare's default, and the baseline's best).
- ``holdout_trained``: the hold-out again on rungs trained in proportion to their size:
  ``examples/ladder.yaml`` at ``--tokens-per-param`` 10 under ``--parametrization mup``, each
  arm at its own rate, swept (``--lr-sweep``, 2 tuning seeds) on the ladder d_model 16/32 (the
  smallest chooses, the next checks; the hold-out ladder's own sweep would also sweep its
  largest rung) and written into the ladder's config as ``train.arm_lr``. Its section says
  each arm's bpb per rung and whether it falls with size, the rungs' budgets, whether the
  held-out difference is covered and the width of the prediction at 100× against the
  fixed-step ladder's. About half an hour on one core; its section has its own markers, so
  ``--only holdout_trained`` leaves the others as they are.

``--smoke`` runs the same commands on tiny settings (:data:`SMOKE`: 4 steps, or 0.05 tokens per
parameter for the trained hold-out, two rates, one tuning seed, fewer widths) to check the
pipeline end to end; it needs ``--doc`` (its document must not replace docs/studies.md) and
says so at its top.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

from normlab._io import write_text_atomic
from normlab._version import source_commit
from normlab.analysis import seeds_needed
from normlab.analysis.ladder import Rung, fit_ladder, predict_ladder, rung_stats
from normlab.analysis.lr_sweep import PLAIN_SWEEP_SETTING, tuning_seed_words
from normlab.analysis.lr_sweep_folder import sweep_losses
from normlab.cli.coord_check_cmd import JSON_FILE as COORD_CHECK_FILE
from normlab.cli.errors import EXIT_FAILED
from normlab.run_format import LADDER_KEY, LR_SWEEP_KEY
from normlab.run_format import folder as run_folder

ROOT = Path(__file__).resolve().parent.parent
LADDER_EXAMPLE = ROOT / "examples" / "ladder.yaml"
BEGIN = "<!-- ladder-studies:begin (written by benchmarks/ladder_studies.py) -->"
END = "<!-- ladder-studies:end -->"
TRAINED_BEGIN = (
    "<!-- ladder-studies-trained:begin (written by benchmarks/ladder_studies.py --only "
    "holdout_trained) -->"
)
TRAINED_END = "<!-- ladder-studies-trained:end -->"
"""The trained hold-out's own markers: its section is written apart from the others, so that
training it alone leaves theirs as they are."""
KEPT_MARKER = "<!-- kept:"

MARGIN = 0.02
"""The GPT testbed's default equivalence margin (margin_bpb), in bits per byte."""
RATES = (0.0025, 0.005, 0.01, 0.02, 0.04)
"""The swept peak learning rates: factors of 2 around compare's default 0.005."""
SHARED_RATE = 0.005
"""The shared rate of the own-rate study: compare's default peak learning rate."""
WIDTHS = (32, 64, 128)
"""The transfer study's and the coordinate check's widths (the smallest is μP's base)."""
PARAMETRIZATIONS = ("mup", "sp")

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
    "model": SMALL_MODEL,
    "train": SMALL_TRAIN,
}
OWN_RATE_CONFIG: dict[str, Any] = {
    "norms": ["layernorm", "rmsnorm", "dyt"],
    "placements": ["pre"],
    "seeds": 3,
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
TRAINED_TOKENS_PER_PARAM = 10.0
"""The trained hold-out's budget: tokens per parameter of each rung's baseline arm (half the
compute-optimal 20 of Hoffmann et al. 2022, twice the early-training floor of
:mod:`normlab.run_format.budget`; the most the largest rung's runs allow in about half an hour
on one core)."""
TRAINED_RATES = (0.005, 0.01, 0.02, 0.04)
"""The trained hold-out's learning-rate sweep, at the base width (0.04 added when the first three
put LayerNorm's best at 0.02, their highest)."""
TRAINED_SWEEP_LADDER = "d_model=16,32"
"""The ladder the trained hold-out's rates are swept on under mup: its smallest rung (the base
width, also the hold-out ladder's) chooses each arm's rate, the next width checks it one
doubling up. The hold-out ladder's own ``--lr-sweep`` would also sweep its largest rung, at a
cost as large as that rung's comparison."""
FIXED_STEP_100X = (-0.342, 0.2015)
"""The fixed-step hold-out's one-training interval at 100× its largest rung (the ladder's
headline in docs/studies.md, trained at commit 6126343): the width the trained ladder's is
compared with."""
FIXED_STEP_SD = (0.0247, 0.0038, 0.0230, 0.0945)
"""The fixed-step ladder's paired sd per rung, d_model 16/32/64/128 (its paired-spread section
in docs/studies.md, trained at commit 6126343)."""
STUDY_NAMES = ("holdout", "coord", "own_rate", "transfer", "holdout_trained")
"""The studies, in the order they train."""


@dataclass(frozen=True)
class Scale:
    """How large the studies are: the rates swept, the tuning seeds per arm and rate, the
    widths of the transfer study and the coordinate check, the options added to every
    ``compare`` at fixed steps (``compare``), to the hold-out's (``holdout``, also the trained
    hold-out's ladder) and to ``coord-check``'s, and the trained hold-out's budget, rates and
    options (``tokens_per_param``, ``trained_rates``, ``trained``)."""

    name: str
    rates: tuple[float, ...]
    tuning_seeds: int
    widths: tuple[int, ...]
    compare: tuple[str, ...] = ()
    holdout: tuple[str, ...] = ()
    coord: tuple[str, ...] = ()
    tokens_per_param: float = TRAINED_TOKENS_PER_PARAM
    trained_rates: tuple[float, ...] = TRAINED_RATES
    trained: tuple[str, ...] = ()


FULL = Scale("full", RATES, 2, WIDTHS)
SMOKE = Scale(
    "smoke",
    (0.005, 0.01),
    1,
    (16, 32),
    compare=("--seeds", "2", "--steps", "4", "--warmup", "1", "--batch-size", "4"),
    holdout=("--ladder", "d_model=16,32,64"),
    coord=("--steps", "2", "--batch-size", "2", "--seeds", "1"),
    tokens_per_param=0.05,
    trained_rates=(0.005, 0.01),
    trained=("--seeds", "2", "--warmup", "1"),
)
"""A check of the pipeline: every command of the studies, tiny (numbers that mean nothing)."""


# ---- commands --------------------------------------------------------------------------------


def _arg(path: Path) -> str:
    """A path as a command shows it: relative to the checkout when it lies under it."""
    path = Path(path)
    return (
        str(path.relative_to(ROOT))
        if path.is_absolute() and path.is_relative_to(ROOT)
        else str(path)
    )


def compare(config: Path, out: Path, *flags: str) -> list[str]:
    """``normlab compare --config CONFIG FLAGS… --out OUT`` as a reader types it (paths
    relative to the checkout)."""
    return ["normlab", "compare", "--config", _arg(config), *flags, "--out", _arg(out)]


def _rates(rates: Sequence[float]) -> str:
    return ",".join(f"{r:g}" for r in rates)


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a study's experiment config (YAML) under the output folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(dict(config), sort_keys=False))
    return path


def sweep_flags(scale: Scale) -> tuple[str, ...]:
    """``--lr-sweep`` over the scale's rates with its tuning seeds."""
    return ("--lr-sweep", _rates(scale.rates), "--tuning-seeds", str(scale.tuning_seeds))


def coord_commands(out: Path, scale: Scale) -> list[list[str]]:
    """``normlab coord-check`` under each parametrisation at the scale's widths."""
    widths = ("--ladder", "d_model=" + ",".join(map(str, scale.widths)))
    model = ("--n-layers", "2", "--n-heads", "2", *scale.coord)
    return [
        ["normlab", "coord-check", *widths, "--parametrization", p, *model, "--out", out_p]
        for p, out_p in ((p, _arg(out / f"coord_{p}")) for p in PARAMETRIZATIONS)
    ]


def own_rate_commands(out: Path, scale: Scale) -> list[list[str]]:
    """The own-rate study: the sweep with its comparison at each arm's best rate, the
    comparison at :data:`SHARED_RATE`, and, once the sweep has chosen (its summary.json holds
    the choice) and the baseline's best rate is another, the comparison at that rate."""
    config = write_config(out / "own_rate.yaml", OWN_RATE_CONFIG)
    cmds = [
        compare(config, out / "own_rate", *sweep_flags(scale), *scale.compare),
        compare(config, out / "own_rate_shared", "--lr", f"{SHARED_RATE:g}", *scale.compare),
    ]
    best = baseline_best(out)
    if best is not None and best != SHARED_RATE:
        rate = ("--lr", f"{best:g}")
        cmds.append(compare(config, out / "own_rate_baseline_best", *rate, *scale.compare))
    return cmds


def trained_rates(out: Path) -> dict[str, float] | None:
    """{arm: rate} that the trained hold-out's sweep chose at its base width (the rung every
    rung takes its rates from), None before it has chosen."""
    record = (analysis(out / "holdout_trained_sweep") or {}).get(LADDER_KEY) or {}
    sweep = record.get(LR_SWEEP_KEY)
    if not sweep:
        return None
    base = next(iter(sweep["chosen_at"].values()))
    return {arm: float(rate) for arm, rate in sweep["chosen"][base].items()}


def trained_config(rates: Mapping[str, float]) -> dict[str, Any]:
    """``examples/ladder.yaml`` with each arm at its own peak rate (``train.arm_lr``)."""
    config = yaml.safe_load(LADDER_EXAMPLE.read_text(encoding="utf-8"))
    config["train"] = {**config["train"], "arm_lr": {a: float(r) for a, r in rates.items()}}
    return config


def holdout_trained_commands(out: Path, scale: Scale) -> list[list[str]]:
    """The trained hold-out: the sweep under mup on :data:`TRAINED_SWEEP_LADDER` at the
    scale's budget, then, once it has chosen, ``examples/ladder.yaml`` at the same budget
    with each arm at its chosen rate (``holdout_trained.yaml``, written then)."""
    budget = ("--tokens-per-param", f"{scale.tokens_per_param:g}", "--parametrization", "mup")
    sweep = ("--lr-sweep", _rates(scale.trained_rates), "--tuning-seeds", str(scale.tuning_seeds))
    cmds = [
        compare(
            LADDER_EXAMPLE,
            out / "holdout_trained_sweep",
            *("--ladder", TRAINED_SWEEP_LADDER, *budget, *sweep, *scale.trained),
        )
    ]
    rates = trained_rates(out)
    if rates is not None:
        config = write_config(out / "holdout_trained.yaml", trained_config(rates))
        flags = (*budget, *scale.trained, *scale.holdout)
        cmds.append(compare(config, out / "holdout_trained", *flags))
    return cmds


def plan(out: Path, scale: Scale) -> dict[str, list[list[str]]]:
    """Every study's commands, in the order they train (the own-rate study's last command is
    known once its sweep has chosen)."""
    transfer = write_config(out / "transfer.yaml", TRANSFER_CONFIG)
    width_ladder = ("--ladder", "d_model=" + ",".join(map(str, scale.widths)))
    return {
        "holdout": [compare(LADDER_EXAMPLE, out / "holdout", *scale.compare, *scale.holdout)],
        "coord": coord_commands(out, scale),
        "own_rate": own_rate_commands(out, scale),
        "transfer": [
            compare(
                transfer,
                out / f"transfer_{p}",
                *("--parametrization", p, *width_ladder, *sweep_flags(scale), *scale.compare),
            )
            for p in PARAMETRIZATIONS
        ],
        "holdout_trained": holdout_trained_commands(out, scale),
    }


def _done_coord_check(cmd: Sequence[str]) -> bool:
    """A coordinate check whose ``coord_check.json`` exists (it does not resume: not rerun)."""
    return cmd[1] == "coord-check" and (ROOT / cmd[-1] / COORD_CHECK_FILE).exists()


def run_one(cmd: Sequence[str]) -> None:
    """Run one command with this Python's normlab, from the checkout (paths in ``cmd`` are
    relative to it). A coordinate check that is not flat exits 3 (failed: the README's table
    of exit statuses) and is still a result; any other failure stops."""
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, check=False).returncode
    if rc != 0 and not (cmd[1] == "coord-check" and rc == EXIT_FAILED):
        raise SystemExit(f"{' '.join(cmd)} exited {rc}")


def run_studies(out: Path, scale: Scale, only: Sequence[str]) -> float:
    """Train the chosen studies, command after command, planning again after each (a command
    may depend on what the one before it chose); the wall seconds."""
    start = time.perf_counter()
    ran: list[list[str]] = []
    for name in (n for n in STUDY_NAMES if n in only):
        while True:
            todo = [c for c in plan(out, scale)[name] if c not in ran and not _done_coord_check(c)]
            if not todo:
                break
            run_one(todo[0])
            ran.append(todo[0])
    return time.perf_counter() - start


# ---- reading the folders --------------------------------------------------------------------


def analysis(folder: Path) -> dict[str, Any] | None:
    """The folder's ``summary.json`` (its report's analysis), or None when it has none yet."""
    try:
        return run_folder.read_analysis(folder)
    except (OSError, ValueError):
        return None


def compare_folders(out: Path) -> list[Path]:
    """Every compare folder of a study's folder ``out``: a ladder's rungs and a sweep's tuning
    folders, or a plain compare and its tuning folders ([] when nothing is there)."""
    if run_folder.has_ladder_plan(out):
        ladder = run_folder.read_ladder_plan(out)
        rungs = [run_folder.rung_path(out, s) for s in ladder.get("rungs", [])]
        swept = (ladder.get("lr_sweep") or {}).get("swept", [])
        return rungs + [p for s in swept for p in run_folder.tuning_folders(out, s).values()]
    if not run_folder.has_experiment(out):
        return []
    return [out, *run_folder.tuning_folders(out).values()]


def run_summaries(folders: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """(run folder, its summary.json) of every run of ``folders`` that wrote one."""
    out = []
    for folder in folders:
        for run in run_folder.run_folders(folder):
            summary = run_folder.read_summary(run)
            if summary is not None:
                out.append((run, summary))
    return out


def train_seconds(folders: Sequence[Path]) -> tuple[float, int]:
    """The summed ``wall_s`` of the folders' runs, and how many runs they are."""
    walls = [s.get("wall_s") for _, s in run_summaries(folders)]
    walls = [float(w) for w in walls if isinstance(w, (int, float))]
    return sum(walls), len(walls)


def run_dates(folders: Sequence[Path]) -> str:
    """The UTC dates the folders' runs finished (their summaries were written), as
    ``2026-12-02`` or ``2026-12-01 to 2026-12-02``; empty without a finished run."""
    stamps = [run_folder.summary_path(run).stat().st_mtime for run, _ in run_summaries(folders)]
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


def tuning_values(out: Path, setting: str | None = None) -> dict[str, dict[float, list]]:
    """{arm: {rate: [quality per tuning seed]}} (None: diverged) of the sweep in ``out`` (at
    the rung ``setting`` of a ladder); {} when it has no finished tuning folder."""
    try:
        return sweep_losses(run_folder.tuning_folders(out, setting))[1]
    except (OSError, ValueError):
        return {}


def baseline_best(out: Path) -> float | None:
    """The own-rate sweep's best rate of its baseline arm, None before it has chosen."""
    own = analysis(out / "own_rate")
    if own is None or LR_SWEEP_KEY not in own:
        return None
    return float(own[LR_SWEEP_KEY]["chosen"][PLAIN_SWEEP_SETTING][own["baseline_arm"]])


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
    measured = float(np.mean(last.diffs))
    s = pred.single
    return {
        "fit": fit_ladder(fit_on),
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


def ladder_rungs(record: Mapping[str, Any]) -> tuple[str, dict[str, Any], list[Rung]]:
    """The first non-baseline arm of a ladder record (summary.json's ``ladder``), that arm's
    record and its rungs."""
    arm, rec = next(iter(record["arms"].items()))
    rungs = [
        Rung(x["setting"], float(x["n_params"]), tuple(x["diffs"]), tuple(x["seeds"]))
        for x in rec["rungs"]
    ]
    return arm, rec, rungs


def rung_means(folder: Path, rec: Mapping[str, Any]) -> dict[str, tuple]:
    """Per rung of the ladder folder the mean quality of the baseline and of the arm of
    ``rec`` (an arm's ladder record), from each rung's summary.json."""
    out = {}
    for r in rec["rungs"]:
        arms = (analysis(run_folder.rung_path(folder, r["setting"])) or {}).get("arms", {})
        out[r["setting"]] = tuple(
            (arms.get(a, {}).get(rec["metric"]) or {}).get("mean")
            for a in (rec["baseline"], rec["arm"])
        )
    return out


# ---- the own-rate comparisons ---------------------------------------------------------------


def comparison(summary: Mapping[str, Any], arm: str) -> dict[str, Any]:
    """``arm`` against the baseline in a compare folder's summary.json: the paired comparison
    on the quality metric (``mean_diff``, ``ci_low``, ``ci_high``) and the report's word."""
    c = summary["comparisons"][arm][summary["quality_metric"]]
    return {
        "mean_diff": c["mean_diff"],
        "ci_low": c["ci_low"],
        "ci_high": c["ci_high"],
        "word": summary["verdicts"][arm]["quality"],
    }


def own_rate(out: Path) -> dict[str, Any] | None:
    """The own-rate study from its folders' summary.json: the sweep's record, the tuning
    values, and per non-baseline arm the comparison at the shared rate, at the baseline's best
    and at the arms' own best rates. None until every comparison has its summary."""
    own = analysis(out / "own_rate")
    shared = analysis(out / "own_rate_shared")
    best = baseline_best(out)
    if own is None or shared is None or best is None:
        return None
    base_best = shared if best == SHARED_RATE else analysis(out / "own_rate_baseline_best")
    if base_best is None:
        return None
    record = own[LR_SWEEP_KEY]
    chosen = record["chosen"][PLAIN_SWEEP_SETTING]
    base = own["baseline_arm"]
    rows = [
        {
            "arm": arm,
            "base": base,
            "shared": {**comparison(shared, arm), "rates": (SHARED_RATE, SHARED_RATE)},
            "base_best": {**comparison(base_best, arm), "rates": (best, best)},
            "own": {**comparison(own, arm), "rates": (chosen[arm], chosen[base])},
        }
        for arm in own["arm_order"]
        if arm != base
    ]
    return {
        "record": record,
        "curves": record["settings"][PLAIN_SWEEP_SETTING],
        "evaluation_seeds": run_folder.read_experiment(out / "own_rate")["seeds"],
        "losses": tuning_values(out / "own_rate"),
        "rows": rows,
    }


# ---- the document: numbers ------------------------------------------------------------------


def _n(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:+.{digits}f}".replace("-", "\u2212")


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _p(p: float | None) -> str:
    """A p-value to two places; "n/a" where there is none (a fit on two rungs has no
    lack-of-fit test)."""
    return "n/a" if p is None else f"{p:.2f}"


def _ci(lo: float | None, hi: float | None, digits: int = 3) -> str:
    return f"[{_n(lo, digits)}, {_n(hi, digits)}]"


def _flow(config: Mapping[str, Any]) -> str:
    """A config as one line of YAML (flow style)."""
    return yaml.safe_dump(
        dict(config), default_flow_style=True, sort_keys=False, width=10**6
    ).strip()


def _header(commands: Sequence[Sequence[str]], folders: Sequence[Path], ctx: dict) -> list[str]:
    total, n = train_seconds(folders)
    return [
        f"- Reproduce: `python benchmarks/ladder_studies.py --only {ctx['study']}` "
        f"(these commands, then the analysis below):",
        "",
        "```",
        *(" ".join(c) for c in commands),
        "```",
        "",
        f"- Trained {run_dates(folders) or ctx['date']}, analysed {ctx['date']} at commit "
        f"`{ctx['commit']}`, on {ctx['machine']}; its {n} runs "
        f"trained for {total:.0f} s in all (one at a time, one thread each, at nice 10 "
        "beside other work: the times are upper bounds).",
    ]


def _curve_table(curves: Mapping[str, Mapping[str, Mapping[str, Any]]], label: str) -> list[str]:
    """{setting: {arm: a curve of the sweep record}} as a table of mean ± sd per rate."""
    rates = sorted({p["rate"] for c in curves.values() for a in c.values() for p in a["points"]})
    lines = [
        f"| {label} | arm | " + " | ".join(f"{r:g}" for r in rates) + " | best |",
        "|---|---|" + "---:|" * len(rates) + "---|",
    ]
    for setting, by_arm in curves.items():
        for arm, c in by_arm.items():
            points = {p["rate"]: p for p in c["points"]}
            cells = [_curve_cell(points.get(r), r == c["best"]) for r in rates]
            edge = f" (at the {c['edge']} edge)" if c["edge"] else ""
            lines.append(
                f"| {setting} | {arm} | " + " | ".join(cells) + f" | {c['best']:g}{edge} |"
            )
    return lines


def _curve_cell(p: Mapping[str, Any] | None, best: bool) -> str:
    if p is None:
        return ""
    if p["mean"] is None:
        return "diverged"
    cell = f"{p['mean']:.3f}" + (f" ± {p['sd']:.3f}" if p["sd"] is not None else "")
    if p["n_diverged"]:
        cell += f" ({p['n_diverged']} diverged)"
    return f"**{cell}**" if best else cell


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds))


# ---- the document: hold-out and spread ------------------------------------------------------


def render_holdout(folder: Path, commands: Sequence[Sequence[str]], ctx: dict) -> list[str]:
    """The hold-out section and the paired-spread section of the ladder folder ``folder``
    (its summary.json's ladder record), or a line saying it has not run."""
    title = "## Ladder: hold-out on the GPT testbed"
    record = (analysis(folder) or {}).get(LADDER_KEY)
    if record is None:
        return [title, "", "Not run yet.", ""]
    arm, rec, rungs = ladder_rungs(record)
    h = holdout(rungs)
    means = rung_means(folder, rec)
    d = f"{arm} − {rec['baseline']}"
    lines = [
        title,
        "",
        f"Does the ladder's prediction interval hold on real runs? `examples/ladder.yaml` ({d}, "
        "final validation bits per byte, paired by seed) is fitted on its three smaller rungs "
        "and predicts the largest, which was trained too.",
        "",
        *_header(commands, compare_folders(folder), {**ctx, "study": "holdout"}),
        f"- Small on purpose (the example's settings: 2 layers, 500 steps of 8 × 64 bytes): "
        f"{rec['rungs'][0]['n_params']:,.0f} to {rec['rungs'][-1]['n_params']:,.0f} "
        f"parameters. The largest rung is only {h['prediction'].extrapolation:.2g}× the size of "
        "the one below it, so this tests the interval over a short step, at a budget where no "
        "model is near trained.",
        "",
        "| rung | N (parameters) | per-seed differences | mean [95% CI] | mean bpb "
        f"{rec['baseline']} / {arm} |",
        "|---|---:|---|---|---|",
    ]
    for r in rec["rungs"]:
        diffs = ", ".join(_n(v, 4) for v in r["diffs"])
        pair = " / ".join(_f(v) for v in means.get(r["setting"], (None, None)))
        lines.append(
            f"| {r['setting']} | {r['n_params']:,.0f} | {diffs} | {_n(r['mean'], 4)} "
            f"{_ci(r['low'], r['high'], 4)} | {pair} |"
        )
    lines += ["", *_holdout_table(h), _holdout_reading(h, rec["baseline"], means), ""]
    lines += [
        f"The whole ladder's own headline (the report's last line, all "
        f"{len(rec['rungs'])} rungs, at {rec['target']['n_params']:,.0f} parameters): "
        f"{rec['prediction']['sentence']}",
        "",
    ]
    return lines + render_spread(spread(rungs), d)


def _holdout_table(h: dict[str, Any]) -> list[str]:
    """The fit on the smaller rungs and its intervals at the held-out rung, with the measured
    values beside them."""
    pred, plain, fit, last = h["prediction"], h["plain"], h["fit"], h["held_out"]
    k = len(last.diffs)
    s, m, t = pred.single, pred.mean_of_seeds, pred.trend
    return [
        f"Fit on the smaller rungs: d = {_n(fit.a, 4)} {_n(fit.b, 4)}·log10 N (slope "
        f"± {fit.b_se:.4f} per tenfold), pooled paired sd {fit.pooled_sd:.4f} bpb "
        f"(ν = {fit.df}), lack-of-fit p = {_p(fit.lack_of_fit_p)}. Prediction at "
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


def _holdout_reading(h: dict[str, Any], base: str, means: Mapping[str, tuple]) -> str:
    """The hold-out in words: inside or outside, the interval against the margin, and whether
    the largest rung's baseline is better trained than the one below it."""
    m, plain, k = h["prediction"].mean_of_seeds, h["plain"], len(h["held_out"].diffs)
    width = (m.high - m.low) / 2
    text = (
        f"Reading: the measured mean of the held-out rung, {_n(h['measured_mean'], 4)}, "
        + ("lies inside" if h["mean_inside"] else "**lies outside**")
        + f" the interval predicted for the mean of {k} seeds (half-width {width:.4f} bpb), "
        f"and {h['singles_inside']} of its {k} single trainings inside the one-training "
        "interval. "
    )
    text += (
        "The interval held here, but one hold-out is one draw: the simulation above, not "
        "this, measures its coverage. "
        if h["mean_inside"]
        else "This did not hold: the difference at the largest rung is not what the smaller "
        "rungs' straight line in log N said. "
    )
    text += (
        f"That interval {'includes' if m.low <= 0 <= m.high else 'excludes'} 0 and is "
        f"{width / MARGIN:.1f}× as wide as the default margin's band ±{MARGIN}: with {k} seeds "
        "per rung a ladder this small predicts the next rung's difference only to within the "
        "rungs' own seed noise, which is larger than the margin."
    )
    if h["plain_singles_inside"] < k:
        text += (
            f" The plain bootstrap's interval, {_ci(plain.single.low, plain.single.high, 4)}, "
            f"holds {h['plain_singles_inside']} of the {k} single trainings."
        )
    pairs = list(means.values())
    if (
        len(pairs) >= 2
        and None not in (pairs[-1][0], pairs[-2][0])
        and pairs[-1][0] >= pairs[-2][0]
    ):
        text += (
            f" Note also that the largest rung's {base} ({pairs[-1][0]:.3f} bpb) is no "
            f"better than the rung below it ({pairs[-2][0]:.3f}): at one fixed rate and "
            "budget for every size (sp), the widest model is not the best trained, so the "
            "rungs do not lie on one scaling curve, and the difference's trend in N mixes "
            "size with how well each size is tuned."
        )
    return text


def render_spread(sp: dict[str, Any], d: str) -> list[str]:
    """The paired-spread section: per rung the sd of the differences ``d``, its χ² interval
    and the seeds an equivalence decision would need at that sd."""
    n = sp["rows"][0]["stats"].n
    lo_f, hi_f = sd_interval(1.0, n)
    lines = [
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
    return [
        *lines,
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


def _spread_words(sp: dict[str, Any]) -> str:
    """Whether the rungs' sd intervals tell the rungs apart, and whether the sd is monotone."""
    rows = sp["rows"]
    lo = min(rows, key=lambda r: r["stats"].sd)
    hi = max(rows, key=lambda r: r["stats"].sd)
    steps = list(itertools.pairwise(r["stats"].sd for r in rows))
    monotone = all(a <= b for a, b in steps) or all(a >= b for a, b in steps)
    if lo["sd_ci"][1] >= hi["sd_ci"][0]:
        return (
            "Every rung's interval overlaps every other's, so these runs cannot show that the "
            "seed noise of the difference moves with size."
        )
    return (
        f"The smallest sd ({lo['stats'].setting}, {lo['stats'].sd:.4f}) and the largest "
        f"({hi['stats'].setting}, {hi['stats'].sd:.4f}) have intervals that do not overlap, "
        "so the spread does differ between rungs"
        + (
            ", and it moves one way with size."
            if monotone
            else ", but not one way with size: these runs do not show the seed noise "
            "shrinking (or growing) as the models grow."
        )
    )


# ---- the document: μP -----------------------------------------------------------------------


def transfer(out: Path) -> dict[str, Any]:
    """The μP study's readings: each coordinate check's ``coord_check.json`` ({} when not run),
    each parametrisation's sweep record (the ladder's summary.json, {} before it has one), and
    the largest difference between mup's and sp's tuning values at the base width (where both
    are the same model; None when either has not run)."""
    coord, records = {}, {}
    for p in PARAMETRIZATIONS:
        f = out / f"coord_{p}" / COORD_CHECK_FILE
        coord[p] = json.loads(f.read_text(encoding="utf-8")) if f.exists() else {}
        ladder = (analysis(out / f"transfer_{p}") or {}).get(LADDER_KEY) or {}
        records[p] = ladder.get(LR_SWEEP_KEY) or {}
    same = None
    if all(records.values()):
        base = next(iter(records["mup"]["settings"]))
        mup, sp = (tuning_values(out / f"transfer_{p}", base) for p in PARAMETRIZATIONS)
        gaps = [
            abs(a - b)
            for arm, by_rate in mup.items()
            for r, values in by_rate.items()
            for a, b in zip(values, sp.get(arm, {}).get(r, []), strict=False)
            if a is not None and b is not None
        ]
        same = (base, max(gaps)) if gaps else None
    return {"coord": coord, "records": records, "same": same}


def render_transfer(
    t: dict[str, Any], commands: Sequence[Sequence[str]], out: Path, scale: Scale, ctx: dict
) -> list[str]:
    """The μP section: the coordinate check and the optimum across widths."""
    widths = "/".join(map(str, scale.widths))
    folders = [p for x in PARAMETRIZATIONS for p in compare_folders(out / f"transfer_{x}")]
    lines = [
        "## μP: the coordinate check and the learning-rate optimum across widths",
        "",
        "Under μP a rate tuned at the base width should stay best at every width; under sp "
        "(Adam) the best rate should fall as the width grows. The same small GPT as the "
        f"hold-out (2 layers, 2 heads), d_model {widths}, base width {scale.widths[0]}. "
        "`compare --ladder --lr-sweep` trains LayerNorm and RMSNorm for 120 steps at each rate "
        f"on {_count(scale.tuning_seeds, 'tuning seed')} after the 2 evaluation seeds: under "
        "mup at the "
        "smallest width (where the rates are chosen; every rung runs them) and the largest (the "
        "check that the optimum lines up), under sp at every width (each runs its own); then "
        "each rung compares the arms at their chosen rates. The quality is the final "
        "validation bpb; the curves and the alignment are the ladder's summary.json "
        "(`ladder.learning_rates`).",
        "",
        *_header(commands, folders, {**ctx, "study": "coord transfer"}),
        f"- `transfer.yaml`, written by the script (`TRANSFER_CONFIG`): "
        f"`{_flow(TRANSFER_CONFIG)}`.",
        "",
        *_coord_lines(t["coord"], scale),
    ]
    for p, record in t["records"].items():
        lines += _sweep_lines(p, record)
    if t["same"] is not None:
        base, gap = t["same"]
        lines += [
            f"At the base width {base} mup and sp are the same model: the largest difference "
            f"between their final bpb over every rate, arm and tuning seed is {gap:.3g}.",
            "",
        ]
    if all(t["records"].values()):
        lines += [_best_means(t["records"]), ""]
    return [*lines, _transfer_reading(t["records"]), ""]


def _coord_lines(coord: Mapping[str, Mapping[str, Any]], scale: Scale) -> list[str]:
    """Each coordinate check's largest slope and its layers' slopes at the last step."""
    lines = [
        "Coordinate check (`normlab coord-check`, Adam at lr 0.01): the largest judged slope of "
        "log mean|x| against log d_model, and each layer's slope at the last step (with its "
        f"sizes at d_model {' / '.join(map(str, scale.widths))}):",
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
    return [*lines, "", _coord_reading(coord), ""]


def _coord_reading(coord: Mapping[str, Mapping[str, Any]]) -> str:
    """Whether μP's coordinate check passed, and how it compares with sp's."""
    mup, sp = coord.get("mup") or {}, coord.get("sp") or {}
    if not mup or not sp:
        return "Reading: the coordinate checks have not both run."
    wm, ws = abs(mup["worst"]["slope"]), abs(sp["worst"]["slope"])
    if mup["flat"]:
        return (
            f"Reading: flat under mup (largest |slope| {wm:.2f}), growing under sp ({ws:.2f}): "
            "the check μP must pass, passed on this model."
        )
    return (
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


def _sweep_lines(p: str, record: Mapping[str, Any]) -> list[str]:
    """One parametrisation's sweep: the curves per swept width and each arm's alignment."""
    if not record:
        return [f"Learning-rate sweep, {p}: not finished.", ""]
    lines = [
        f"Learning-rate sweep, **{p}** (final validation bpb, mean ± sd over the "
        f"{tuning_seed_words(record['tuning_seeds'])}; bold: the best rate):",
        "",
        *_curve_table(record["settings"], "width"),
        "",
    ]
    if len(record["settings"]) < 2:
        return lines
    for a in record["alignment"]:
        best = ", ".join(f"{s}: {r:g}" for s, r in a["best"].items())
        tied = "; ".join(f"{s}: {', '.join(f'{r:g}' for r in t)}" for s, t in a["tied"].items())
        common = (
            "a rate within noise of the best at every width: "
            + ", ".join(f"{r:g}" for r in a["common"])
            if a["common"]
            else "no rate is within noise of the best at every width"
        )
        lines.append(
            f"- {a['arm']}: best rates {best}; {a['steps']} sweep step(s) apart. Within the "
            f"seeds' sd of the best: {tied}; {common}: "
            f"{'aligned' if a['aligned'] else '**not aligned**'}."
        )
    return [*lines, ""]


def _best_means(records: Mapping[str, Mapping[str, Any]]) -> str:
    """Each arm's best mean per width under mup and sp, and whether sp ends better at the
    widest width swept by both."""
    mup, sp = records["mup"]["settings"], records["sp"]["settings"]
    both = [s for s in mup if s in sp]
    arms = list(mup[both[0]])
    cells = [
        f"{arm}: "
        + ", ".join(
            f"{s} {mup[s][arm]['best_mean']:.3f} / {sp[s][arm]['best_mean']:.3f}" for s in both
        )
        for arm in arms
    ]
    text = (
        "The best mean bpb of each arm per width swept under both, mup / sp (each at its own "
        "best rate): " + "; ".join(cells) + "."
    )
    widest = both[-1]
    if all(sp[widest][a]["best_mean"] < mup[widest][a]["best_mean"] - MARGIN for a in arms):
        text += (
            f" At {widest} sp at its own best rate ends lower than mup at its own, by more "
            "than the margin, in every arm: a rate that carries across widths is not the "
            "same as a better-trained wide model, and at 120 steps on 2 seeds which "
            "parametrisation trains these small models better is not what this sweep is "
            "built to settle."
        )
    return text


def _alignment_words(p: str, record: Mapping[str, Any]) -> str:
    """One parametrisation's alignment per arm, and the arms whose best is at an edge."""
    words = ", ".join(
        f"{a['arm']} {'aligned' if a['aligned'] else 'not aligned'} (best rates {a['steps']} "
        "step(s) apart)"
        for a in record["alignment"]
    )
    edges = [
        f"{arm} at {s}"
        for s, by_arm in record["settings"].items()
        for arm, c in by_arm.items()
        if c["edge"]
    ]
    return f"under {p}: {words}" + (
        f"; best at the sweep's edge: {', '.join(edges)}" if edges else ""
    )


def _transfer_reading(records: Mapping[str, Mapping[str, Any]]) -> str:
    """Whether μP's promise held within the seeds' noise, and what the argmin alone says."""
    done = {p: r for p, r in records.items() if r and len(r["settings"]) >= 2}
    if not done:
        return "Reading: the sweep has not finished."
    parts = "; ".join(_alignment_words(p, r) for p, r in done.items())
    if set(done) != set(PARAMETRIZATIONS):
        return f"Reading: {parts}. Only part of the sweep has finished."
    common = {p: all(a["common"] for a in r["alignment"]) for p, r in done.items()}
    argmin = {p: all(a["steps"] <= 1 for a in r["alignment"]) for p, r in done.items()}
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
    return (
        f"Reading: {parts}. {verdict} By the argmin alone (aligned when the best rates lie at "
        f"most one sweep step apart, a factor 2 here) mup would be "
        f"{'aligned' if argmin['mup'] else 'not aligned'} and sp "
        f"{'aligned' if argmin['sp'] else 'not aligned'}: with 2 seeds and 120 steps "
        "neighbouring rates often differ by less than the seeds' spread, so the argmin jumps "
        "within the noise, and a best rate at the sweep's edge makes the step count a lower "
        "bound. This is why `optimum_alignment` (and `compare --lr-sweep`'s report) judges "
        "the optimum by the rates within the seeds' spread of the best."
    )


# ---- the document: each arm at its own rate ------------------------------------------------


def render_own_rate(
    o: dict[str, Any] | None, commands: Sequence[Sequence[str]], out: Path, ctx: dict
) -> list[str]:
    """The own-rate section, or a line saying it has not run."""
    title = "## Each arm at its own best rate vs one shared rate"
    if o is None:
        return [title, "", "Not run yet.", ""]
    base = o["rows"][0]["base"] if o["rows"] else ""
    folders = [
        p
        for name in ("own_rate", "own_rate_shared", "own_rate_baseline_best")
        for p in compare_folders(out / name)
    ]
    lines = [
        title,
        "",
        "A comparison at one shared learning rate is partly a comparison of learning rates. "
        "LayerNorm, RMSNorm and DyT (the DyT study's recipe for all three: SwiGLU, untied head, "
        "DyT α0 2 / 1 / 1 and embedding scale 50, chosen at d_model 64), d_model 32, 2 "
        "layers, 120 steps. `compare --lr-sweep` trains every arm at every rate on the "
        f"{tuning_seed_words(o['record']['tuning_seeds'])}, chooses each arm's best rate there "
        "and compares the arms at their own best rates on the evaluation seeds "
        f"{_seeds(o['evaluation_seeds'])}, disjoint from them, so the choice does not bias "
        "the comparison; `compare --lr` compares them on the same seeds at one shared rate.",
        "",
        *_header(commands, folders, {**ctx, "study": "own_rate"}),
        f"- `own_rate.yaml`, written by the script (`OWN_RATE_CONFIG`): "
        f"`{_flow(OWN_RATE_CONFIG)}`.",
        "",
        "Tuning curves (final validation bpb, mean ± sd over the tuning seeds; bold: best):",
        "",
        *_curve_table({"d_model=32": o["curves"]}, "width"),
        "",
        f"Paired comparisons on the evaluation seeds (arm − {base}, bpb, 95 % CI; the "
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
            lines.append(
                f"| {row['arm']} vs {row['base']}, {what} | {q['rates'][0]:g} / "
                f"{q['rates'][1]:g} | {_n(q['mean_diff'], 4)} "
                f"{_ci(q['ci_low'], q['ci_high'], 4)} | {q['word']} |"
            )
    return [*lines, "", _own_reading(o), ""]


def _own_reading(o: dict[str, Any]) -> str:
    """How each arm's difference and verdict move from the shared rate to the own rates,
    the best rates at the sweep's edge, and the tuning seeds' spread at the best rate."""
    parts = []
    for row in o["rows"]:
        sh, own = row["shared"], row["own"]
        change = (
            "the same verdict"
            if sh["word"] == own["word"]
            else f"the verdict changes from {sh['word']} to {own['word']}"
        )
        parts.append(
            f"{row['arm']} − {row['base']} moves from {_n(sh['mean_diff'], 3)} at the shared "
            f"{SHARED_RATE:g} to {_n(own['mean_diff'], 3)} at the own rates: {change}"
        )
    text = "Reading: " + "; ".join(parts) + "."
    edges = [f"{a} ({c['edge']})" for a, c in o["curves"].items() if c["edge"]]
    if edges:
        text += (
            " Best rates at the sweep's edge, so the optimum may lie beyond it: "
            + ", ".join(edges)
            + "."
        )
    wide = []
    for arm, c in o["curves"].items():
        values = [v for v in o["losses"].get(arm, {}).get(c["best"], []) if v is not None]
        if values and max(values) - min(values) > 10 * MARGIN:
            wide.append(f"{arm} at {c['best']:g} from {min(values):.3f} to {max(values):.3f} bpb")
    if wide:
        text += (
            " The tuning seeds of one arm at one rate spread far wider than the margin ("
            + "; ".join(wide)
            + "): at this budget one seed says little about another, and a best rate chosen "
            "on two seeds is itself noisy."
        )
    return text + (
        f" {len(o['evaluation_seeds'])} evaluation seeds decide only large differences; at 120 "
        "steps the gaps are those of barely trained models, so read the change between the "
        "rows, not the verdicts, as the finding."
    )


# ---- the trained hold-out ------------------------------------------------------------------


def arm_curves(folder: Path, rec: Mapping[str, Any]) -> dict[str, list[tuple]]:
    """{arm: [(rung, mean, sd) per rung]} of the baseline and of the arm of ``rec`` (an arm's
    ladder record): each arm's quality metric per rung of the ladder folder, from each rung's
    summary.json (None where a rung has none)."""
    out: dict[str, list[tuple]] = {rec["baseline"]: [], rec["arm"]: []}
    for r in rec["rungs"]:
        arms = (analysis(run_folder.rung_path(folder, r["setting"])) or {}).get("arms", {})
        for a, values in out.items():
            q = arms.get(a, {}).get(rec["metric"]) or {}
            values.append((r["setting"], q.get("mean"), q.get("std")))
    return out


def falls(curve: Sequence[tuple]) -> bool:
    """Whether the means of ``curve`` ((rung, mean, sd) in increasing size) fall at every
    step (lower is better)."""
    means = [m for _, m, _ in curve]
    return None not in means and all(b < a for a, b in itertools.pairwise(means))


def holdout_trained(out: Path) -> dict[str, Any] | None:
    """The trained hold-out from its folders: the ladder's record of its first arm, the
    hold-out (:func:`holdout`), each arm's quality per rung and whether it falls with size,
    the sweep's record and the rates chosen; None until the ladder has its summary.json."""
    folder = out / "holdout_trained"
    record = (analysis(folder) or {}).get(LADDER_KEY)
    if record is None:
        return None
    arm, rec, rungs = ladder_rungs(record)
    curves = arm_curves(folder, rec)
    sweep = (analysis(out / "holdout_trained_sweep") or {}).get(LADDER_KEY) or {}
    largest = run_folder.rung_path(folder, rec["rungs"][-1]["setting"])
    return {
        "arm": arm,
        "rec": rec,
        "holdout": holdout(rungs),
        "curves": curves,
        "monotone": {a: falls(c) for a, c in curves.items()},
        "sweep": sweep.get(LR_SWEEP_KEY),
        "rates": trained_rates(out),
        "largest": train_seconds([largest]),
    }


def render_holdout_trained(
    h: dict[str, Any] | None, commands: Sequence[Sequence[str]], out: Path, ctx: dict
) -> list[str]:
    """The trained hold-out's section, or a line saying it has not run."""
    title = "## Ladder: hold-out on trained rungs"
    if h is None:
        return [title, "", "Not run yet.", ""]
    rec = h["rec"]
    folders = [
        *compare_folders(out / "holdout_trained_sweep"),
        *compare_folders(out / "holdout_trained"),
    ]
    total = train_seconds(folders)[0]
    return [
        title,
        "",
        "The hold-out on the GPT testbed (above), repeated on rungs trained in proportion to "
        "their size: "
        f"`examples/ladder.yaml` ({h['arm']} − {rec['baseline']}, final validation bits per "
        "byte, paired by seed, 3 seeds per rung) with each rung training "
        f"{_tpp(rec)} tokens per parameter of its baseline arm (`--tokens-per-param`), under "
        "μP with the smallest rung as the base width, each arm at its own peak rate (chosen "
        "once at the base width, `--lr-sweep`). Fitted on the three smaller rungs, it predicts "
        "the largest, which was trained too.",
        "",
        *_header(commands, folders, {**ctx, "study": "holdout_trained"}),
        *_trained_bullets(h, total),
        "",
        *_trained_rung_table(h),
        "",
        *_holdout_table(h["holdout"]),
        _trained_reading(h),
        "",
        *_trained_sweep_lines(h),
    ]


def _tpp(rec: Mapping[str, Any]) -> str:
    """The rungs' tokens per parameter, one value when they share it."""
    values = sorted({float(r["tokens_per_param"] or 0) for r in rec["rungs"]})
    return " / ".join(f"{v:g}" for v in values)


def _trained_bullets(h: dict[str, Any], total: float) -> list[str]:
    """The budget and why, and the rates and where they were chosen."""
    rec, rates = h["rec"], h["rates"] or {}
    steps = " / ".join(f"{r['steps']:,}" for r in rec["rungs"])
    swept = ", ".join(h["sweep"]["settings"]) if h["sweep"] else "n/a"
    return [
        f"- Budget: {_tpp(rec)} tokens per parameter of each rung's baseline arm (all its "
        f"parameters, tied weights once), {steps} steps of 8 × 64 bytes from the smallest "
        "rung to the largest: half the compute-optimal 20 (Hoffmann et al. 2022), twice "
        "normlab's early-training floor of 5, and the most that fits about 35 core-minutes "
        f"here: the largest rung's {h['largest'][1]} runs took {h['largest'][0]:.0f} s of the "
        f"study's {total:.0f} s, and each doubling of the budget doubles them.",
        f"- Rates: each arm at its own peak rate under μP, chosen by the sweep ladder "
        f"({swept}: `--lr-sweep` under mup chooses at the smallest and checks at the largest of "
        "its rungs) and written into `holdout_trained.yaml` (`examples/ladder.yaml` with "
        "`train.arm_lr`): "
        + ", ".join(f"{a} {r:g}" for a, r in rates.items())
        + ". The two widest rungs take them unswept, as μP carries a rate across widths; "
        "sweeping the largest rung would cost as much as its comparison.",
    ]


def _trained_rung_table(h: dict[str, Any]) -> list[str]:
    """Per rung: N, its budget, each arm's final bpb (mean ± sd) and the paired differences;
    then whether each arm's bpb falls with size."""
    rec, curves = h["rec"], h["curves"]
    arms = list(curves)
    lines = [
        "| rung | N (parameters) | tokens / parameter | steps | "
        + " | ".join(f"{a} bpb" for a in arms)
        + " | per-seed differences | mean [95% CI] | paired sd |",
        "|---|---:|---:|---:|" + "---:|" * len(arms) + "---|---|---:|",
    ]
    for i, r in enumerate(rec["rungs"]):
        cells = [_mean_sd(curves[a][i][1], curves[a][i][2]) for a in arms]
        diffs = ", ".join(_n(v, 4) for v in r["diffs"])
        lines.append(
            f"| {r['setting']} | {r['n_params']:,.0f} | {r['tokens'] / r['n_params']:.2f} | "
            f"{r['steps']:,} | " + " | ".join(cells) + f" | {diffs} | {_n(r['mean'], 4)} "
            f"{_ci(r['low'], r['high'], 4)} | {r['sd']:.4f} |"
        )
    words = "; ".join(
        f"{a} {' → '.join(_f(m) for _, m, _ in c)}: "
        + ("falls at every rung" if h["monotone"][a] else "**does not fall at every rung**")
        for a, c in curves.items()
    )
    every = all(h["monotone"].values())
    return [*lines, "", f"Monotone in size: **{'yes' if every else 'no'}** ({words})."]


def _mean_sd(mean: float | None, sd: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")


def _trained_reading(h: dict[str, Any]) -> str:
    """The trained hold-out in words: monotone or not, inside or outside (with the rungs'
    differences against the fitted line), then :func:`_trained_width_words`."""
    ho, rec = h["holdout"], h["rec"]
    m, s, k = ho["prediction"].mean_of_seeds, ho["prediction"].single, len(ho["held_out"].diffs)
    bad = [a for a, ok in h["monotone"].items() if not ok]
    text = "Reading: " + (
        "every arm's final bpb falls from each rung to the next. "
        if not bad
        else f"**this did not hold** for {', '.join(bad)}: its final bpb does not fall at "
        "every rung. "
    )
    inside = (
        ("lies inside", "covered") if ho["mean_inside"] else ("**lies outside**", "**not covered**")
    )
    gap = ho["measured_mean"] - m.estimate
    text += (
        f"The held-out rung's measured mean difference, {_n(ho['measured_mean'], 4)}, "
        f"{inside[0]} the interval predicted for the mean of {k} seeds, "
        f"{_ci(m.low, m.high, 4)}, and {ho['singles_inside']} of its {k} single trainings "
        f"inside the one-training interval {_ci(s.low, s.high, 4)}: {inside[1]}. The rungs' "
        "mean differences run " + " → ".join(_n(r["mean"], 3) for r in rec["rungs"]) + ": "
        f"the held-out rung's lies {abs(gap):.3f} bpb {'below' if gap < 0 else 'above'} the "
        f"smaller rungs' line ({_n(m.estimate, 3)}). "
    )
    return text + _trained_width_words(h)


def _trained_width_words(h: dict[str, Any]) -> str:
    """The whole ladder's prediction at its target against the fixed-step ladder's width, its
    fit, its pooled seed noise against the fixed-step ladder's, and its caveats (lack of fit,
    rates)."""
    rec, fit = h["rec"], h["rec"]["fit"]
    single = rec["prediction"]["single"]
    width, fixed = single["high"] - single["low"], FIXED_STEP_100X[1] - FIXED_STEP_100X[0]
    fixed_sd = math.sqrt(sum(v * v for v in FIXED_STEP_SD) / len(FIXED_STEP_SD))
    noisiest = max(rec["rungs"], key=lambda r: r["sd"])
    text = (
        f"At {rec['target']['n_params']:,.0f} parameters, 100× the largest rung, the whole "
        f"ladder (all {len(rec['rungs'])} rungs) predicts {_n(single['estimate'], 4)} bpb for "
        f"one training, 95 % interval {_ci(single['low'], single['high'], 4)}: "
        f"{width:.3f} bpb wide, against {fixed:.2f} bpb for the fixed-step ladder at the same "
        f"target ({_ci(*FIXED_STEP_100X, 4)}), {width / fixed:.2f}× its width "
        f"({'narrower' if width < fixed else '**not narrower**'}). Its fit: slope "
        f"{_n(fit['b'], 4)} ± {fit['b_se']:.4f} per tenfold, pooled paired sd "
        f"{fit['pooled_sd']:.4f} bpb (ν = {fit['df']}; the fixed-step ladder's, pooled the "
        f"same way from its paired-spread section, {fixed_sd:.4f}; the noisiest rung here is "
        f"{noisiest['setting']}, sd {noisiest['sd']:.4f}), lack-of-fit p = "
        f"{_p(fit['lack_of_fit_p'])}."
    )
    if fit["lack_of_fit_p"] is not None and fit["lack_of_fit_p"] < 0.05:
        text += (
            " The rungs' means scatter about the straight line in log N more than their seed "
            "noise allows: the line the interval extrapolates does not describe these rungs, "
            "and under a curved trend the coverage study above found every interval too "
            "narrow."
        )
    if rate_caveats(h):
        text += (
            " Not every arm ran at the best rate of the width its rate was checked at (the "
            "rates, below): the difference mixes the norm with the rate."
        )
    return text


def _trained_sweep_lines(h: dict[str, Any]) -> list[str]:
    """The sweep ladder's curves (final validation bpb per rate at each swept width) and
    whether each arm's optimum lines up across them."""
    sweep = h["sweep"]
    if not sweep:
        return []
    seeds = _seeds(sweep["tuning_seeds"])
    return [
        f"Learning-rate sweep under mup (final validation bpb, mean ± sd over the tuning seeds "
        f"{seeds}; bold: the best rate):",
        "",
        *_curve_table(sweep["settings"], "width"),
        "",
        f"Rates: {_alignment_words('mup', sweep)}." + "".join(f" {c}" for c in rate_caveats(h)),
        "",
    ]


def rate_caveats(h: dict[str, Any]) -> list[str]:
    """A sentence per arm whose rate, chosen at the base width, is not the best at the width
    the sweep checks it at: by how much it lost there on the tuning seeds, beside the
    ladder's measured difference at that rung (the difference's trend may carry the rate)."""
    sweep, rates = h["sweep"], h["rates"] or {}
    if not sweep:
        return []
    base, check = next(iter(sweep["settings"])), list(sweep["settings"])[-1]
    tied = {a["arm"]: a["tied"].get(base, []) for a in sweep["alignment"]}
    measured = {r["setting"]: r["mean"] for r in h["rec"]["rungs"]}
    out = []
    for arm, rate in rates.items():
        c = sweep["settings"][check].get(arm)
        at = {p["rate"]: p["mean"] for p in (c or {}).get("points", [])}
        if c is None or c["best"] == rate or at.get(rate) is None:
            continue
        out.append(
            f"{arm} runs at {rate:g}, its best at {base}, where "
            f"{', '.join(f'{r:g}' for r in tied.get(arm, []))} lie within its tuning seeds' "
            f"spread of the best; at {check} {c['best']:g} beat {rate:g} by "
            f"{at[rate] - c['best_mean']:.3f} bpb on the tuning seeds, and the ladder's "
            f"{h['arm']} − {h['rec']['baseline']} there is {_n(measured.get(check), 4)}: "
            "part of the difference, and of its trend with size, may be this rate rather "
            "than the norm."
        )
    return out


def trained_document(out: Path, scale: Scale) -> list[str]:
    """The trained hold-out's section between its own markers."""
    ctx = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": source_commit(),
        "machine": machine(),
    }
    cmds = holdout_trained_commands(out, scale)
    section = render_holdout_trained(holdout_trained(out), cmds, out, ctx)
    return [TRAINED_BEGIN, "", *_scale_note(scale, trained=True), *section, TRAINED_END]


# ---- the document ---------------------------------------------------------------------------


def document(out: Path, scale: Scale) -> list[str]:
    """Every study's section from the folders under ``out`` (a study whose folders are not
    finished is said to be not run)."""
    cmds = plan(out, scale)
    ctx = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": source_commit(),
        "machine": machine(),
    }
    lines = [BEGIN, "", *_scale_note(scale)]
    lines += render_holdout(out / "holdout", cmds["holdout"], ctx)
    lines += render_transfer(transfer(out), cmds["coord"] + cmds["transfer"], out, scale, ctx)
    lines += render_own_rate(own_rate(out), cmds["own_rate"], out, ctx)
    return [*lines, END]


def _scale_note(scale: Scale, trained: bool = False) -> list[str]:
    """The note that heads a smoke run's sections (none at the full scale), with the options
    and rates of the fixed-step studies or of the trained hold-out (``trained``)."""
    if scale is FULL:
        return []
    flags, rates = scale.compare, scale.rates
    if trained:
        flags = ("--tokens-per-param", f"{scale.tokens_per_param:g}", *scale.trained)
        rates = scale.trained_rates
    return [
        f"**{scale.name.capitalize()} run** (`--{scale.name}`: {' '.join(flags)}, "
        f"rates {_rates(rates)}): it checks that the studies' commands and readings "
        "run end to end; its numbers mean nothing and the readings below do not apply.",
        "",
    ]


def place(old: str, section: str, begin: str = BEGIN, end: str = END) -> str:
    """``old`` with the text between ``begin`` and ``end`` (:data:`BEGIN`, :data:`END`, or the
    trained hold-out's :data:`TRAINED_BEGIN`, :data:`TRAINED_END`) replaced by ``section``
    (appended after the kept marker's sections when absent; the marker is added when the
    document has none, so that scripts/studies.py keeps the section)."""
    start = old.find(begin)
    stop = old.find(end, start) if start >= 0 else -1
    if start >= 0 and stop > start:
        return old[:start] + section + old[stop + len(end) :]
    body = old.rstrip("\n")
    if KEPT_MARKER not in body:
        body += (
            "\n\n<!-- kept: the sections below are written from their own commands; "
            "scripts/studies.py keeps them when it regenerates the file -->"
        )
    return body + "\n\n" + section + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen studies (all by default), then write their sections of the document."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "normlab-out" / "ladder_studies")
    p.add_argument("--doc", type=Path, default=None, help="default: docs/studies.md")
    p.add_argument("--only", nargs="+", choices=STUDY_NAMES, default=list(STUDY_NAMES))
    p.add_argument("--no-run", action="store_true", help="write the doc from finished folders")
    p.add_argument("--no-doc", action="store_true", help="train only")
    p.add_argument("--smoke", action="store_true", help="tiny settings: a pipeline check")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.smoke and args.doc is None and not args.no_doc:
        p.error("--smoke needs --doc (its document must not replace docs/studies.md)")
    scale = SMOKE if args.smoke else FULL
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_run:
        seconds = run_studies(out, scale, args.only)
        print(f"trained in {seconds:.0f} s", flush=True)
    if args.no_doc:
        return 0
    doc = args.doc or ROOT / "docs" / "studies.md"
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    if set(args.only) - {"holdout_trained"}:
        text = place(text, "\n".join(document(out, scale)))
    if "holdout_trained" in args.only:
        section = "\n".join(trained_document(out, scale))
        text = place(text, section, TRAINED_BEGIN, TRAINED_END)
    write_text_atomic(doc, text)
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
