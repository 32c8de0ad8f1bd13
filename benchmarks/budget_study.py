"""Where the noise of a paired comparison comes from, how it falls with the training budget, and
what a decided LayerNorm-vs-RMSNorm answer costs: the budget section of docs/studies.md, from
real runs.

  python benchmarks/budget_study.py --out normlab-out/budget-study        # train, then write
  python benchmarks/budget_study.py --out normlab-out/budget-study --no-run

Every training is a ``normlab compare`` command (the configs are in benchmarks/budget_study/,
each a copy of the default GPT's recipe with only what the study varies set), run as a
subprocess at ``nice 10``; every reading goes through the run format (``normlab.run_format``)
and the numbers through normlab's own analysis (``normlab.analysis.power``, ``.cost``,
``.sequential``). The studies, all LayerNorm vs RMSNorm on the default GPT (214,144 parameters
in the LayerNorm arm, 1,024 tokens a step), under a warm-up–stable–decay schedule (cooldown
over the last 20 % of the steps, 1 − √ shape, to 10 % of the peak):

- ``base``: 3 tokens per parameter (628 steps), 8 paired seeds, with the A/A arm RMSNorm-Gemma
  (the same function, another rounding), each run also evaluated on the whole validation split
  (``train.full_val``) and with the average of its last 10 % of weights
  (``train.average_last``);
- ``init_only`` / ``data_only``: the same, with the batch order (``train.data_seed: 0``) or the
  initial weights (``train.init_seed: 0``) held across seeds (8 and 6 seeds);
- ``budget10`` / ``budget10b``: seeds 0–2 / 8–10 trained to 10 tokens per parameter (2,092
  steps) with cooldowns branched at 1 and 3 (210, 628 steps), one folder per process (the two
  trained side by side). A branch equals a separate run of its budget bit for bit (checked below
  on seeds 0–2 against ``base``), so budgets 1 and 10 have 6 seeds and 3 has 11 (``base``'s
  0–7 and the branches of 8–10);
- ``cosine_default``: ``normlab compare``'s own default recipe (cosine decay to 10 % of the
  peak, 600 steps, about 2.9 tokens per parameter, 128 evaluation windows), 6 seeds: the
  schedule the study's warm-up–stable–decay runs are weighed against at the same budget.

The section is written between the ``budget-study`` markers of the document (``--doc``,
default docs/studies.md).
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from normlab._version import source_commit
from normlab.analysis.cost import (
    BudgetSpread,
    SeedCost,
    cheapest,
    fit_spread_law,
    price_decisions,
    train_flops,
)
from normlab.analysis.power import sd_interval, seeds_needed
from normlab.analysis.sequential import SequentialPlan, look_decisions, look_schedule
from normlab.run_format import folder as run_folder

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "budget_study"
BEGIN = "<!-- budget-study:begin (written by benchmarks/budget_study.py) -->"
END = "<!-- budget-study:end -->"
LN, RMS, GEMMA = "layernorm-pre", "rmsnorm-pre", "rmsnorm_gemma-pre"
MARGIN = 0.02
N_PARAMS = 214_144
TOKENS_PER_STEP = 1024
BUDGETS = {1: 210, 3: 628, 10: 2092}
"""Tokens per parameter → steps (⌈b · 214,144 / 1,024⌉)."""
BUDGET_FOLDERS = ("budget10", "budget10b")
"""The folders whose runs end at :data:`BUDGET_END` steps with cooldowns branched below it."""
BUDGET_END = 2092
SEPARATE_STEPS = 628
"""The budget ``base`` trains as separate runs (3 tokens per parameter)."""
STUDIES = {
    "base": "--config benchmarks/budget_study/base.yaml",
    "init_only": "--config benchmarks/budget_study/init_only.yaml",
    "data_only": "--config benchmarks/budget_study/data_only.yaml --seeds 6",
    "budget10": "--config benchmarks/budget_study/budget10.yaml --seeds 0,1,2",
    "budget10b": "--config benchmarks/budget_study/budget10.yaml --seeds 8,9,10",
    "cosine_default": "--seeds 6",
}
"""Each study's ``normlab compare`` options, by its folder under the study's OUT."""

Runs = dict[tuple[str, int], dict[str, Any]]
Value = Callable[[dict[str, Any]], float | None]


def commands(out: Path) -> dict[str, str]:
    """The command of every study, by its folder name under ``out``."""
    return {
        name: f"normlab compare {options} --no-report --out {out / name}"
        for name, options in STUDIES.items()
    }


def run_all(out: Path) -> None:
    """Train every study not yet finished (a folder that holds its runs is resumed)."""
    for name, command in commands(out).items():
        print(f"== {name}: {command}", flush=True)
        done = subprocess.run(["nice", "-n", "10", *command.split()], cwd=ROOT, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name}: exit status {done.returncode}")


def load(folder: Path) -> Runs:
    """{(arm, seed): summary} of the finished runs of a compare folder ({} if absent)."""
    runs: Runs = {}
    if not folder.is_dir():
        return runs
    for run in run_folder.run_folders(folder):
        s = run_folder.read_summary(run)
        if s is not None and s.get("status") == "finished":
            runs[(s["arm"], int(s["seed"]))] = s
    return runs


def metric(field: str = "final_val_bpb", branch: int | None = None) -> Value:
    """A run's quality: ``field`` of the run's end, or of its cooldown branched at ``branch``
    steps (a branch records final_val_bpb only)."""

    def value(s: dict[str, Any]) -> float | None:
        if branch is None:
            v = s.get(field)
        else:
            v = ((s.get("branches") or {}).get(str(branch)) or {}).get(field)
        return float(v) if v is not None else None

    return value


def paired(runs: Runs, a: str, b: str, value: Value) -> tuple[list[int], np.ndarray]:
    """(seeds, b − a) over the seeds where both arms have a value."""
    seeds = sorted({k for arm, k in runs if arm == a} & {k for arm, k in runs if arm == b})
    pairs = [(k, value(runs[(a, k)]), value(runs[(b, k)])) for k in seeds]
    kept = [(k, y - x) for k, x, y in pairs if x is not None and y is not None]
    return [k for k, _ in kept], np.array([d for _, d in kept])


def arm_values(runs: Runs, arm: str, value: Value) -> np.ndarray:
    return np.array([v for (a, _), s in sorted(runs.items()) if a == arm and (v := value(s))
                     is not None])  # fmt: skip


@dataclass(frozen=True)
class Point:
    """One budget of the study: its runs (merged from the folders that hold it) and how its
    quality is read from each run."""

    budget: int
    runs: Runs
    value: Value


def load_all(root: Path, names: Sequence[str]) -> Runs:
    """:func:`load` of several folders of one design (disjoint seeds), merged."""
    merged: Runs = {}
    for name in names:
        merged.update(load(root / name))
    return merged


def budget_points(root: Path) -> list[Point]:
    """Each budget's runs, from the :data:`BUDGET_FOLDERS` (their branches at 1 and 3 tokens per
    parameter, their end at 10) and, at 3, ``base``'s separate runs too."""
    runs = load_all(root, BUDGET_FOLDERS)
    separate = load(root / "base")
    points = []
    for budget, steps in BUDGETS.items():
        v = metric() if steps == BUDGET_END else metric(branch=steps)
        kept = {k: {"_value": v(s), **s} for k, s in runs.items() if v(s) is not None}
        if steps == SEPARATE_STEPS:
            kept |= {k: {"_value": s["final_val_bpb"], **s} for k, s in separate.items()}
        points.append(Point(budget, kept, metric("_value")))
    return points


def _fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _sd_cell(d: np.ndarray) -> str:
    if d.size < 2:
        return "—"
    s = float(np.std(d, ddof=1))
    low, high = sd_interval(s, int(d.size))
    return f"{s:.4f} [{low:.4f}, {high:.4f}]"


def _mean_cell(d: np.ndarray) -> str:
    if d.size < 2:
        return "—"
    from scipy import stats

    m, se = float(np.mean(d)), float(np.std(d, ddof=1) / math.sqrt(d.size))
    h = float(stats.t.isf(0.025, d.size - 1)) * se
    return f"{m:+.4f} [{m - h:+.4f}, {m + h:+.4f}]"


def _correlation(runs: Runs, value: Value) -> float | None:
    seeds, _ = paired(runs, LN, RMS, value)
    if len(seeds) < 3:
        return None
    a = [value(runs[(LN, k)]) for k in seeds]
    b = [value(runs[(RMS, k)]) for k in seeds]
    return float(np.corrcoef(np.array(a, dtype=float), np.array(b, dtype=float))[0, 1])


def spread_row(label: str, runs: Runs, value: Value) -> str:
    """A row of the spread-against-budget table."""
    _, d = paired(runs, LN, RMS, value)
    ln, rms = arm_values(runs, LN, value), arm_values(runs, RMS, value)
    sds = [f"{float(np.std(x, ddof=1)):.4f}" if x.size > 1 else "—" for x in (ln, rms)]
    r = _correlation(runs, value)
    return (
        f"| {label} | {d.size} | {_fmt(float(np.mean(ln)) if ln.size else None, 3)} / "
        f"{_fmt(float(np.mean(rms)) if rms.size else None, 3)} | {sds[0]} / {sds[1]} | "
        f"{_mean_cell(d)} | {_sd_cell(d)} | {_fmt(r, 2)} |"
    )


def spread_table(root: Path, points: list[Point]) -> list[str]:
    lines = [
        "| budget (tokens per parameter, steps) | paired seeds | mean bpb, LayerNorm / RMSNorm "
        "| sd across seeds, LayerNorm / RMSNorm | paired difference RMSNorm − LayerNorm, mean "
        "[95 % CI] | paired sd [80 % interval] | correlation of the arms |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(spread_row(f"{p.budget} ({BUDGETS[p.budget]:,}), wsd", p.runs, p.value))
    cosine = load(root / "cosine_default")
    if cosine:
        lines.append(spread_row("2.9 (600), cosine (the default recipe)", cosine, metric()))
    return lines


def last_evals(run: dict[str, Any], k: int = 3) -> float | None:
    """The mean validation bpb of the run's last ``k`` evaluations (read from metrics.jsonl)."""
    evals = run_folder.read_records(run["_dir"], "eval")
    values = [e["val_bpb"] for e in evals[-k:] if e.get("val_bpb") is not None]
    return statistics.fmean(values) if len(values) == k else None


def with_dirs(folder: Path) -> Runs:
    """:func:`load`, each summary with its run folder under ``_dir``."""
    runs = load(folder)
    for s in runs.values():
        s["_dir"] = run_folder.run_dir(folder, s["run_id"])
    return runs


def _difference_of(runs: Runs, v1: Value, v2: Value) -> np.ndarray:
    """Per seed, (RMS − LN under v1) − (RMS − LN under v2): what the change of estimator moves
    the paired difference by."""
    s1, d1 = paired(runs, LN, RMS, v1)
    s2, d2 = paired(runs, LN, RMS, v2)
    common = sorted(set(s1) & set(s2))
    a = dict(zip(s1, d1, strict=True))
    b = dict(zip(s2, d2, strict=True))
    return np.array([a[k] - b[k] for k in common])


def sources_table(root: Path) -> list[str]:
    """The paired spread at 3 tokens per parameter split into its sources."""
    base = with_dirs(root / "base")
    init_only, data_only = load(root / "init_only"), load(root / "data_only")
    final, full = metric(), metric("full_val_bpb")
    _, total = paired(base, LN, RMS, final)
    var_total = float(np.var(total, ddof=1)) if total.size > 1 else math.nan
    rows = [
        ("everything a seed draws (initial weights and batch order), the default", total),
        ("initial weights only (every seed on seed 0's batches)", paired(init_only, LN, RMS,
                                                                          final)[1]),
        ("batch order only (every seed from seed 0's weights)", paired(data_only, LN, RMS,
                                                                        final)[1]),
        ("the evaluation's 128 windows: difference between the 128-window and the whole-split "
         "reading", _difference_of(base, final, full)),
        ("what is left on the whole validation split", paired(base, LN, RMS,
                                                                               full)[1]),
        ("the last steps: the average of the last 10 % of weights", paired(base, LN, RMS,
                                                                            metric("avg_val_bpb"))[1]),
        ("the last steps: the mean of the last 3 evaluations (steps 550, 600, 628)",
         paired(base, LN, RMS, last_evals)[1]),
        ("rounding: the A/A pair RMSNorm-Gemma − RMSNorm (the same function)",
         paired(base, RMS, GEMMA, final)[1]),
    ]  # fmt: skip
    lines = [
        "| source | paired seeds | paired sd [80 % interval] | variance, share of the default's |",
        "|---|---|---|---|",
    ]
    for label, d in rows:
        share = float(np.var(d, ddof=1)) / var_total if d.size > 1 else math.nan
        lines.append(f"| {label} | {d.size} | {_sd_cell(d)} | {_fmt(100 * share, 0)} % |")
    return lines


def identity_check(root: Path) -> str:
    """Whether the cooldowns branched at 628 steps equal ``base``'s separate 628-step runs, bit
    for bit (final validation bpb)."""
    base, branch = load(root / "base"), metric(branch=SEPARATE_STEPS)
    pairs = [(branch(s), base[key]["final_val_bpb"])
             for key, s in load_all(root, BUDGET_FOLDERS).items() if key in base]  # fmt: skip
    same = sum(a == b for a, b in pairs)
    return (
        f"Of the {len(pairs)} runs of the 3-tokens-per-parameter budget that `base` also trained "
        f"as separate 628-step runs, {same} gave the same final validation bpb bit for bit "
        "(the branched cooldown is the separate run)."
    )


def robust_z(d: np.ndarray) -> np.ndarray:
    """(d − median) / (1.4826 · MAD): how far each seed's difference lies from the typical one,
    in units that equal the sd for Gaussian values."""
    med = float(np.median(d))
    mad = 1.4826 * float(np.median(np.abs(d - med)))
    return (d - med) / mad if mad > 0 else np.zeros_like(d)


def _phase_gaps(ln: dict[str, Any], rms: dict[str, Any], steps: int) -> tuple[float, ...]:
    """RMSNorm − LayerNorm training loss, averaged over the first 100 steps, the middle third
    and the last tenth of the run (from metrics.jsonl)."""

    def loss(run: dict[str, Any]) -> np.ndarray:
        records = run_folder.read_records(run["_dir"], "train")
        return np.array([r["loss"] for r in records][:steps], dtype=float)

    a, b = loss(ln), loss(rms)
    n = min(a.size, b.size)
    d = b[:n] - a[:n]
    return (
        float(np.mean(d[:100])),
        float(np.mean(d[n // 3 : 2 * n // 3])),
        float(np.mean(d[-max(1, n // 10) :])),
    )


def tail_lines(label: str, runs: Runs, value: Value, steps: int) -> list[str]:
    """The seeds whose paired difference lies more than 3 robust sd from the median, and what
    their runs show beside the other seeds'."""
    seeds, d = paired(runs, LN, RMS, value)
    if d.size < 5:
        return []
    z = robust_z(d)
    far = [(k, dk, zk) for k, dk, zk in zip(seeds, d, z, strict=True) if abs(zk) > 3]
    head = (
        f"{label}: {len(far)} of {d.size} seeds lie more than 3 robust sd from the median "
        f"difference {float(np.median(d)):+.4f} (largest |z| {float(np.max(np.abs(z))):.1f}; "
        f"a Gaussian sample of {d.size} would show one beyond 3 in "
        f"{100 * (1 - (1 - 0.0027) ** d.size):.0f} % of studies)."
    )
    lines = [head]
    if not far or "_dir" not in next(iter(runs.values())):
        return lines
    gaps = {k: _phase_gaps(runs[(LN, k)], runs[(RMS, k)], steps) for k in seeds}
    typical = [float(np.median([g[i] for g in gaps.values()])) for i in range(3)]
    for k, dk, zk in far:
        g = gaps[k]
        spikes = [runs[(arm, k)].get("n_loss_spikes") for arm in (LN, RMS)]
        lines.append(
            f"- seed {k}: difference {dk:+.4f} (z {zk:+.1f}); training-loss gap RMSNorm − "
            f"LayerNorm over the first 100 steps {g[0]:+.4f} (median seed {typical[0]:+.4f}), "
            f"the middle third {g[1]:+.4f} ({typical[1]:+.4f}), the last tenth {g[2]:+.4f} "
            f"({typical[2]:+.4f}); loss spikes LayerNorm / RMSNorm {spikes[0]} / {spikes[1]}."
        )
    return lines


def throughput(root: Path) -> float:
    """The training throughput of one thread, tokens/s: the 90th percentile over every run of
    the study (the runs shared the machine with other work at nice 10, so the slower ones
    measure their share of it, not their cost)."""
    rates = [
        s["tokens_per_s"]
        for s in load_all(root, [n for n in STUDIES if n != "cosine_default"]).values()
        if s.get("tokens_per_s")
    ]
    return float(np.quantile(rates, 0.9))


def spreads(points: list[Point]) -> list[BudgetSpread]:
    found = []
    for p in points:
        _, d = paired(p.runs, LN, RMS, p.value)
        if d.size >= 2:
            found.append(BudgetSpread(float(p.budget), int(d.size), float(np.mean(d)),
                                      float(np.std(d, ddof=1))))  # fmt: skip
    return found


def run_overhead(root: Path, tokens_per_s: float) -> float:
    """Seconds a run spends outside its training steps (start-up, the evaluations every 50
    steps, the end's readings: 128 windows, the whole split, the averaged weights): the median
    of wall time − tokens / ``tokens_per_s`` over the separate 628-step runs that trained at
    least at 90 % of that throughput (the quiet ones)."""
    quiet = [
        s["wall_s"] - s["tokens"] / tokens_per_s
        for s in load_all(root, ("base", "init_only", "data_only")).values()
        if s.get("wall_s") and s.get("tokens") and s.get("tokens_per_s", 0) >= 0.9 * tokens_per_s
    ]
    return max(0.0, statistics.median(quiet)) if quiet else 0.0


def seed_cost(tokens_per_s: float, overhead_s: float = 0.0) -> SeedCost:
    """A seed (both arms) at b tokens per parameter: 2 · (``overhead_s`` + b · N tokens at
    ``tokens_per_s``), in core-seconds (one thread a run); FLOPs 6 · N_arm · D summed over the
    arms (LayerNorm 214,144 and RMSNorm 213,568 parameters)."""
    tokens = N_PARAMS  # per unit of budget
    flops = train_flops(N_PARAMS, tokens) + train_flops(213_568, tokens)
    return SeedCost(2 * overhead_s, 2 * tokens / tokens_per_s, flops)


def _count(n: int | None) -> str:
    return "more than 1000" if n is None else str(n)


def price_table(points: list[Point], cost: SeedCost) -> tuple[list[str], Any]:
    """The price of a decided answer (equivalence within ±0.02 bpb or a difference) at each
    measured budget: seeds (at the measured spread, and at its 80 % interval's top) × a seed's
    core-seconds and FLOPs. Returns the table's lines and the cheapest price."""
    measured = spreads(points)
    if not measured:
        return [], None
    prices = price_decisions(measured, cost, [s.budget for s in measured], MARGIN)
    lines = [
        "| budget (tokens per parameter) | paired seeds measured | paired sd | seeds a decision "
        "needs (measured sd – 80 % top) | core-hours per seed | core-hours for a decision | "
        "PFLOPs for a decision |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, p in zip(measured, prices, strict=True):
        per_seed = cost.core_s(p.budget) / 3600
        hours = [None if x is None else x / 3600 for x in (p.core_s, p.core_s_high)]
        pflops = [None if x is None else x / 1e15 for x in (p.flops, p.flops_high)]
        lines.append(
            f"| {p.budget:g} | {s.n_seeds} | {p.sd:.4f} | {_count(p.seeds)} – "
            f"{_count(p.seeds_high)} | {per_seed:.3f} | {_fmt(hours[0], 2)} – "
            f"{_fmt(hours[1], 2)} | {_fmt(pflops[0], 3)} – {_fmt(pflops[1], 3)} |"
        )
    return lines, cheapest(prices)


def law_line(points: list[Point]) -> tuple[str, Any]:
    measured = spreads(points)
    if not measured:
        return "No budget holds two paired seeds yet.", None
    law = fit_spread_law(measured)
    return (
        f"Fitted across the measured budgets (weighted least squares of log s on log b, "
        f"weights ν = n − 1): σ(b) = {law.ref_sd:.4f} · (b / {law.ref_budget:g})^−k with "
        f"k = {law.exponent:.2f} (80 % interval {law.exponent_low:.2f} to "
        f"{law.exponent_high:.2f}). Seeds needed grow as σ², a seed's cost as b: longer training "
        f"pays when k > 0.5.",
        law,
    )


def _truth(runs: Runs, value: Value) -> int | None:
    """The paired seeds a decision needs at the spread and mean of every seed measured."""
    _, d = paired(runs, LN, RMS, value)
    return seeds_needed(float(np.mean(d)), float(np.std(d, ddof=1)), MARGIN)


def forecast_check(pilot: Point, target: Point, k: int = 3) -> str | None:
    """Every ``k``-seed subset of ``pilot``'s seeds as the runs a user already has: the seeds
    ``normlab compare`` would forecast at ``target``'s budget (:func:`price_decisions`, from
    the pilot's own spread when the budgets agree, else through the spread law's prior
    exponent) against the count that all of ``target``'s seeds need."""
    _, d = paired(pilot.runs, LN, RMS, pilot.value)
    _, dt = paired(target.runs, LN, RMS, target.value)
    if d.size < k + 2 or dt.size < 3:
        return None
    truth = _truth(target.runs, target.value) or 10**6
    unit = SeedCost(0.0, 1.0, 1.0)
    inside = below_top = total = 0
    ratios = []
    for idx in itertools.combinations(range(d.size), k):
        sub = d[list(idx)]
        if float(np.std(sub, ddof=1)) == 0:
            continue
        spread = BudgetSpread(float(pilot.budget), k, float(np.mean(sub)),
                              float(np.std(sub, ddof=1)))  # fmt: skip
        price = price_decisions([spread], unit, [float(target.budget)], MARGIN)[0]
        point = price.seeds or 10**6
        top = price.seeds_high or 10**6
        total += 1
        inside += point <= truth <= top
        below_top += truth <= top
        ratios.append(point / truth)
    return (
        f"| {pilot.budget} | {target.budget} | {_count(None if truth == 10**6 else truth)} "
        f"({dt.size} seeds) | {total} | {100 * inside / total:.0f} % | "
        f"{100 * below_top / total:.0f} % | {statistics.median(ratios):.2f} |"
    )


def forecast_table(points: list[Point], k: int = 3) -> list[str]:
    """:func:`forecast_check` for every pilot budget and every target budget."""
    rows = [forecast_check(a, b, k) for a in points for b in points]
    return [
        f"| pilot budget ({k} seeds) | forecast at budget | seeds a decision needs there, "
        "from every seed | pilots | forecast range (plug-in – upper end) holds it | upper end "
        "reaches it | median plug-in / needed |",
        "|---|---|---|---|---|---|---|",
        *filter(None, rows),
    ]


ESTIMATORS = {
    "final bpb, 128 windows (the default)": metric(),
    "whole validation split": metric("full_val_bpb"),
    "average of the last 10 % of weights": metric("avg_val_bpb"),
    "averaged weights, whole split": metric("avg_full_val_bpb"),
}


def estimator_table(root: Path) -> list[str]:
    """The paired sd under each way of reading a run, at each budget whose runs end there (the
    extra evaluations are made at a run's end, not at its branches), and the A/A pair's."""
    studies = {
        "3 (base, 8 seeds)": load(root / "base"),
        "10 (the budget folders' ends, 8 seeds)": load_all(root, BUDGET_FOLDERS),
    }
    lines = [
        "| reading | " + " | ".join(f"paired sd at {k}" for k in studies)
        + " | A/A sd at 3 |",
        "|---|" + "---|" * (len(studies) + 1),
    ]  # fmt: skip
    base = studies["3 (base, 8 seeds)"]
    for label, value in ESTIMATORS.items():
        cells = [_sd_cell(paired(runs, LN, RMS, value)[1]) for runs in studies.values()]
        aa = _sd_cell(paired(base, RMS, GEMMA, value)[1])
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {aa} |")
    return lines


def robust_lines(runs: Runs, value: Value) -> list[str]:
    """The median and the 20 %-trimmed mean of the paired differences, each with a bootstrap
    95 % interval: a second estimand, beside the mean, never in its place."""
    _, d = paired(runs, LN, RMS, value)
    if d.size < 5:
        return []
    rng = np.random.default_rng(0)
    draws = d[rng.integers(0, d.size, size=(20_000, d.size))]
    from scipy import stats

    def trimmed(x: np.ndarray, axis: int | None = None) -> np.ndarray:
        return stats.trim_mean(x, 0.2, axis=axis)

    out = []
    for name, f in (("median", np.median), ("20 %-trimmed mean", trimmed)):
        boot = f(draws, axis=1)
        lo, hi = np.quantile(boot, [0.025, 0.975])
        out.append(f"{name} {float(f(d)):+.4f} [{lo:+.4f}, {hi:+.4f}]")
    return [
        f"Robust second estimands of the same {d.size} differences (bootstrap 95 % intervals): "
        + "; ".join(out)
        + f". The mean, which the verdict uses, is {float(np.mean(d)):+.4f}."
    ]


def sequential_error_rates(runs: Runs, value: Value, sims: int = 20_000) -> list[str]:
    """The sequential plan's error rates when each seed's difference is drawn from the study's
    own differences (centred, then shifted to the true difference), heavy tail and all: P(called
    equivalent | true difference at the margin) and P(called better | none) against α = 0.05
    and α/2."""
    _, d = paired(runs, LN, RMS, value)
    if d.size < 5:
        return []
    centred = d - np.mean(d)
    plan = SequentialPlan(looks=look_schedule(3, 20), alpha=0.05, margin=MARGIN)
    rng = np.random.default_rng(1)
    rates = {}
    for truth in (MARGIN, 0.0):
        x = truth + centred[rng.integers(0, d.size, size=(sims, plan.max_seeds))]
        alive = np.ones(sims, dtype=bool)
        called = {"equivalent": np.zeros(sims, bool), "better": np.zeros(sims, bool)}
        for n in plan.looks:
            r = look_decisions(x[:, :n], plan)
            for key in called:
                called[key] |= r[key] & alive
            alive &= ~(r["equivalent"] | r["better"] | r["worse"])
        rates[truth] = called
    return [
        f"The sequential plan (looks at 3, 5, …, 19, 20 seeds) on differences resampled from "
        f"these {d.size} seeds: called equivalent at a true difference equal to the margin in "
        f"{100 * rates[MARGIN]['equivalent'].mean():.1f} % of {sims:,} simulated experiments "
        f"(α = 5 %), called better at a true difference of 0 in "
        f"{100 * rates[0.0]['better'].mean():.1f} % (α/2 = 2.5 %)."
    ]


def section(root: Path) -> list[str]:
    """The document's section (between the markers), from the folders under ``root``."""
    points = budget_points(root)
    rate = throughput(root)
    overhead = run_overhead(root, rate)
    cost = seed_cost(rate, overhead)
    law_text, _ = law_line(points)
    prices, best = price_table(points, cost)
    base = with_dirs(root / "base")
    lines = [
        BEGIN,
        "",
        "## Budgets and the sources of noise (LayerNorm vs RMSNorm on the default GPT)",
        "",
        f"Generated by `python benchmarks/budget_study.py --no-run` at commit "
        f"`{source_commit() or 'unknown'}`; the runs were trained by the commands below (one "
        "thread each, two runs at a time, at nice 10 on a shared 2-core VM).",
        "",
        *(f"- `{c}`" for c in commands(Path("OUT")).values()),
        "",
        "### The paired spread against the budget",
        "",
        *spread_table(root, points),
        "",
        identity_check(root),
        "",
        law_text,
        "",
        "### Where the noise comes from (3 tokens per parameter, 8 seeds)",
        "",
        *sources_table(root),
        "",
        "### The heavy tail",
        "",
    ]
    for p in points:
        lines += tail_lines(f"{p.budget} tokens per parameter", p.runs, p.value, BUDGETS[p.budget])
    lines += tail_lines("3 tokens per parameter (base)", base, metric(), BUDGETS[3])
    lines += [
        "",
        "### The price of a decision",
        "",
        "A seed's cost: both arms, each its training tokens at the study's throughput (the 90th "
        f"percentile of its runs, {rate:,.0f} tokens/s on one thread) plus {overhead:.0f} s "
        "of start-up and evaluation (the study's quiet 628-step runs), in core-seconds (this "
        "machine), and 6·N·D FLOPs (any machine). "
        "Seeds: `normlab.analysis.power.seeds_needed` at 80 % power, α = 0.05, margin ±0.02 bpb "
        "(the default's), the measured mean difference taken as true.",
        "",
        *prices,
        "",
        f"The cheapest measured budget: {best.budget:g} "
        f"{'token' if best.budget == 1 else 'tokens'} per parameter."
        if best
        else "",
        "",
        "### Is a 3-seed forecast right? (held-out check)",
        "",
        "Every 3-seed subset of a budget's seeds taken as a pilot, priced by "
        "`normlab.analysis.cost.price_decisions` (what `normlab compare` prints as the cost of a "
        "decision): at its own budget from its own spread, at the others through the spread "
        "law's prior exponent. The forecast aims its upper end at about 90 % of pilots.",
        "",
        *forecast_table(points),
        "",
        "### Readings that may cut the noise",
        "",
        *estimator_table(root),
        "",
        *robust_lines(base, metric()),
        "",
        *sequential_error_rates(base, metric()),
        "",
        END,
    ]
    return lines


def replace_section(old: str, section: list[str]) -> str:
    """``old`` with the text between the markers replaced by ``section`` (appended when the
    markers are absent)."""
    text = "\n".join(section)
    start, stop = old.find(BEGIN), old.find(END)
    if start >= 0 and stop > start:
        return old[:start] + text + old[stop + len(END) :]
    return old.rstrip("\n") + "\n\n" + text + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the folder of the studies' runs")
    p.add_argument("--no-run", action="store_true", help="write the section from the folders")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "studies.md")
    args = p.parse_args(argv)
    if not args.no_run:
        run_all(args.out.absolute())
    doc = args.doc
    old = doc.read_text(encoding="utf-8") if doc.exists() else ""
    doc.write_text(replace_section(old, section(args.out)), encoding="utf-8")
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
