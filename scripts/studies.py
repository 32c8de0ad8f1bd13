"""Run the known-result studies of examples/studies/ and write docs/studies.md.

    python scripts/studies.py                      # every study, into normlab-out/studies/
    python scripts/studies.py --quick --only aa_gain --out /tmp/q --doc /tmp/q/studies.md

Each study is one ``normlab compare --config examples/studies/<study>.yaml --out <out>/<study>``
(resumable: a re-run skips finished runs). Its folder is then analysed with
:func:`normlab.analysis.analyze` (what the report writes to the folder's ``summary.json``) and,
per arm against the baseline, the literature's expected direction is set beside the report's
verdict on the testbed's quality metric (val bpb for the GPT, the validation flow-matching loss
for the DiT) with its interval: ``agree`` when the verdict is the expected one, ``undecided``
when it is ``inconclusive`` or ``unclear size``, ``disagree`` otherwise; an arm that failed to
learn counts as ``worse``. A study may also expect one arm to be the worst; that is checked on
the mean paired differences, the baseline counting as 0.

The A/A studies (the same function twice: ``aa_gain`` on the GPT, ``aa_dit`` on the DiT)
measure the harness's resolution on their testbed: the spread of the paired differences is the
noise of one seed at the default budget, and the testbed's default equivalence margin is set
against it with the paired seeds that showing equivalence within the margin would take at that
spread (:func:`normlab.analysis.seeds_needed`).

Budget: 122 runs at the least (pre_post_high_lr, layernorm_rmsnorm, dyt_layernorm: 3 seeds × 2
arms × 600 steps; aa_gain: 8 seeds × 2 arms × 600 steps; aa_dit: 8 seeds × 2 arms × 2400
steps, two at a time; dit_conditioning: 18 seeds × 4 arms × 2400 steps, two at a time), about
95 minutes of training on one core (2026-12-01: the GPT runs 18–29 s each, the DiT runs
44–63 s), about 70 minutes of wall time on 2 cores; layernorm_rmsnorm runs
``--until-decided`` and may add up to 13 seeds (26 runs, about 9 more minutes).
docs/studies.md records each study's training time.

``--quick`` runs every chosen study with a tiny model and a few steps (into its own folder,
never mixed with real runs) to check the pipeline end to end; its document says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from normlab._io import write_text_atomic
from normlab._version import source_commit
from normlab.analysis import analyze, load_compare_folder, seeds_needed
from normlab.analysis.comparison import compare_paired
from normlab.analysis.sequential import DEFAULT_MAX_SEEDS
from normlab.analysis.wording import Smallest, judge
from normlab.run_format import EXPERIMENT_FILE, RUNS_DIR, SUMMARY_FILE

ROOT = Path(__file__).resolve().parent.parent
STUDY_DIR = ROOT / "examples" / "studies"

AGREE, DISAGREE, UNDECIDED = "agree", "disagree", "undecided"
DEFAULT_MARGINS = {"margin_bpb": 0.02, "margin_val_loss": 0.002}
"""The default runs' equivalence margins (``examples/default.yaml``, ``examples/dit.yaml``)."""
AA_STUDIES = ("aa_gain", "aa_dit")
"""The A/A study of each testbed (the GPT's, the DiT's): the same function twice."""
ROUNDING_ONLY = 1000
"""An A/A spread below margin / ROUNDING_ONLY is read as rounding not amplified by training."""
DEFAULT_SEEDS = 3
"""Paired seeds of the default runs."""
AFFORDABLE_SEEDS = 100
"""Beyond this many paired seeds per comparison, a margin is called unaffordable to show."""


@dataclass(frozen=True)
class Study:
    """A known result: the config, the literature, and the verdict expected for each arm
    against the baseline (the config's first arm)."""

    name: str
    source: str
    claim: str
    expected: dict[str, str]
    worst: str | None = None
    quick: dict[str, Any] = field(default_factory=dict)
    shown: tuple[str, ...] = ()
    """Secondary summary fields whose per-arm means the document shows beside the quality."""
    until_decided: tuple[int, int] | None = None
    """(max seeds, max seconds) for a study run with ``--until-decided``; None: fixed seeds."""
    note: str = ""
    """A pointer the document prints under the study (where its settings were chosen)."""

    @property
    def config(self) -> Path:
        return STUDY_DIR / f"{self.name}.yaml"


QUICK_GPT: dict[str, Any] = {
    "seeds": 2,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"steps": 6, "batch_size": 4, "eval_interval": 3, "eval_windows": 8, "warmup": 1},
    "data": {"max_bytes": 65536},
}
QUICK_MAX_SEEDS = 4
"""A sequential study's most seeds in quick mode."""
QUICK_DIT: dict[str, Any] = {
    "seeds": 2,
    "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
    "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
    "train": {"steps": 6, "batch_size": 4, "eval_interval": 3, "warmup": 1},
}

STUDIES: tuple[Study, ...] = (
    Study(
        "pre_post_high_lr",
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture",
        "at a high learning rate without warm-up Pre-LN trains, Post-LN stalls or diverges",
        {"layernorm-post": "worse"},
        quick=QUICK_GPT,
    ),
    Study(
        "layernorm_rmsnorm",
        "Zhang & Sennrich 2019, Root Mean Square Layer Normalization",
        "RMSNorm matches LayerNorm's quality",
        {"rmsnorm-pre": "equivalent"},
        quick=QUICK_GPT,
        until_decided=(16, 1500),
    ),
    Study(
        "aa_gain",
        "A/A control: the same function (LLaMA gain w vs Gemma gain 1 + w, float32)",
        "no difference beyond floating-point rounding",
        {"rmsnorm_gemma-pre": "equivalent"},
        quick=QUICK_GPT,
    ),
    Study(
        "dyt_layernorm",
        "Zhu et al. 2025, Transformers without Normalization",
        "DyT matches LayerNorm when alpha0 is tuned",
        {"dyt-pre": "equivalent"},
        quick=QUICK_GPT,
        note=(
            "the recipe (LLaMA's SwiGLU and untied head, a scalar after the embedding, alpha0 "
            "per position) and how the gap moves with the shared learning rate and the budget: "
            '[results.md, "DyT in the GPT testbed"](results.md#dyt-in-the-gpt-testbed)'
        ),
    ),
    Study(
        "aa_dit",
        "A/A control on the DiT: the same function (adaLN-Zero vs adaLN-Zero with the 1 of "
        "1 + scale held in its modulation's bias, float32)",
        "no difference beyond floating-point rounding",
        {"adaln_zero_unit-pre": "equivalent"},
        quick=QUICK_DIT,
        shown=("final_sample_class_acc", "final_sample_fd", "final_sample_sw2"),
    ),
    Study(
        "dit_conditioning",
        "Peebles & Xie 2023, Scalable Diffusion Models with Transformers, Fig. 5",
        "adaLN-Zero best (FID 19.47), then adaLN 25.21, cross-attention 26.14, in-context 35.24",
        {"adaln-pre": "worse", "cross_attention-pre": "worse", "in_context-pre": "worse"},
        worst="in_context-pre",
        quick=QUICK_DIT,
        shown=("final_sample_class_acc", "final_sample_fd", "final_sample_sw2"),
    ),
)
STUDY_NAMES = tuple(s.name for s in STUDIES)


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it, section by section (a new dict)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def agreement(expected: str, verdict: str) -> str:
    """``agree`` when the measured verdict is the expected one, ``undecided`` when it is
    ``inconclusive`` or ``unclear size`` (significant, but not shown to reach the margin),
    ``disagree`` otherwise."""
    if verdict == expected:
        return AGREE
    return UNDECIDED if verdict in ("inconclusive", "unclear size") else DISAGREE


def rank_worst(diffs: dict[str, float], baseline: str, lower_is_better: bool) -> list[str]:
    """The arms from worst to best by their mean paired difference to the baseline, the
    baseline itself counting as 0 (when every arm beats it, the baseline is the worst)."""
    sign = 1.0 if lower_is_better else -1.0
    candidates = {baseline: 0.0, **diffs}
    return sorted(candidates, key=lambda a: sign * candidates[a], reverse=True)


def worst_check(
    seed_diffs: dict[str, dict[int, float]],
    baseline: str,
    expected: str,
    lower_is_better: bool,
    margin: float,
) -> dict[str, Any]:
    """Is ``expected`` the worst arm? ``seed_diffs[arm][seed]`` is arm − baseline per seed (the
    baseline is an arm too, at 0); arms without a result are left out, and the seeds used are
    those where every other arm has one. The measured worst is the worst mean
    (:func:`rank_worst`); it is then compared, paired by seed, with the arm it must beat: the
    runner-up when it is the expected arm, else the expected arm. ``agree``: the expected arm is
    the worst and worse than the runner-up (the report's rule: interval excludes 0 and the
    difference reaches ``margin``); ``disagree``: another arm is worse than the expected one by
    that rule; ``undecided`` otherwise (the two cannot be told apart at these seeds, or the
    expected arm has no result)."""
    present = {a: d for a, d in seed_diffs.items() if d}
    seeds = sorted(set.intersection(*(set(d) for d in present.values()))) if present else []
    if expected not in (*present, baseline) or not seeds:
        return {"expected": expected, "measured": None, "agreement": UNDECIDED}
    per_arm = {baseline: [0.0] * len(seeds)}
    per_arm.update({a: [d[k] for k in seeds] for a, d in present.items()})
    means = {a: sum(v) / len(v) for a, v in per_arm.items() if a != baseline}
    ranked = rank_worst(means, baseline, lower_is_better)
    measured = ranked[0]
    other = ranked[1] if measured == expected else expected
    c = compare_paired(
        per_arm[measured], per_arm[other], lower_is_better=lower_is_better, margin=margin
    )
    word = judge(
        c,
        "quality",
        lower_is_better=lower_is_better,
        smallest=Smallest("absolute", margin),
        primary=True,
    ).word
    agreement = UNDECIDED  # the two cannot be told apart
    if word == "worse":
        agreement = AGREE if measured == expected else DISAGREE
    return {
        "expected": expected,
        "measured": measured,
        "against": other,
        "mean_diff": c.mean_diff,
        "ci": (c.ci_low, c.ci_high),
        "word": word,
        "agreement": agreement,
        "seeds_needed": c.seeds_needed if agreement == UNDECIDED else None,
    }


def measured_verdict(verdict: dict[str, Any]) -> tuple[str, str]:
    """The study's reading of one arm's report verdict (``analysis["verdicts"][arm]``): its
    quality word, except that an arm that failed to learn (most runs diverged, stalled or did
    not learn) is ``worse`` whatever its few finished runs say; and the report's stability
    sentence, which says why."""
    failed = verdict["reason"].endswith("failed to learn")
    return ("worse" if failed else verdict["quality"]), verdict["stability_text"]


def compare_command(
    config: Path, out: Path, until_decided: tuple[int, int] | None = None
) -> list[str]:
    """The ``normlab compare`` command of one study (this Python's normlab); with
    ``until_decided`` = (max seeds, max seconds), a sequential run that adds paired seeds until
    every arm is decided."""
    cmd = [sys.executable, "-m", "normlab", "compare", "--config", str(config), "--out", str(out)]
    if until_decided is not None:
        seeds, seconds = until_decided
        cmd += ["--until-decided", "--max-seeds", str(seeds), "--max-time", str(seconds)]
    return cmd


def shown_command(cmd: Sequence[str]) -> str:
    """``cmd`` as a reader would type it: ``normlab …`` with paths under the checkout made
    relative to it."""

    def rel(arg: str) -> str:
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(ROOT):
            return str(path.relative_to(ROOT))
        return arg

    args = list(cmd)
    if args[1:3] == ["-m", "normlab"]:
        args = ["normlab", *args[3:]]
    return " ".join(rel(a) for a in args)


def quick_config(study: Study, work: Path) -> Path:
    """The study's config with its ``quick`` overrides laid over it, written under ``work``."""
    data = yaml.safe_load(study.config.read_text(encoding="utf-8"))
    path = work / f"{study.name}.quick.yaml"
    write_text_atomic(path, yaml.safe_dump(deep_merge(data, study.quick), sort_keys=False))
    return path


def run_study(study: Study, out: Path, quick: bool) -> tuple[list[str], float]:
    """Run (or resume) one study into ``out / study.name``; returns its command and seconds."""
    config = quick_config(study, out) if quick else study.config
    sequential = study.until_decided
    if quick and sequential is not None:  # a pipeline check: two looks at most
        sequential = (min(sequential[0], QUICK_MAX_SEEDS), sequential[1])
    cmd = compare_command(config, out / study.name, sequential)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return cmd, time.perf_counter() - start


def run_seconds(folder: Path) -> tuple[float, int]:
    """The summed wall time (``wall_s``) of the study's runs that wrote a summary, and how
    many they are: the training time, whichever call or process ran them."""
    total, n = 0.0, 0
    for path in sorted((folder / RUNS_DIR).glob(f"*/{SUMMARY_FILE}")):
        wall = json.loads(path.read_text(encoding="utf-8")).get("wall_s")
        if isinstance(wall, (int, float)):
            total, n = total + float(wall), n + 1
    return total, n


def _by_seed(stats: dict[str, Any]) -> dict[int, float]:
    """An arm's values of one metric keyed by seed (``analysis["arms"][arm][metric]``)."""
    return dict(zip(stats.get("seeds", []), stats.get("values", []), strict=True))


def study_result(study: Study, folder: Path) -> dict[str, Any]:
    """The analysis of one study's folder, reduced to what docs/studies.md shows."""
    analysis = analyze(load_compare_folder(folder))
    quality = analysis["quality_metric"]
    margin_key = next(k for k in DEFAULT_MARGINS if k in analysis)
    arms = {}
    for arm, expected in study.expected.items():
        if arm not in analysis["comparisons"]:
            raise ValueError(
                f"{study.name}: arm {arm!r} is not in {folder}; expected one of "
                f"{', '.join(analysis['comparisons'])}"
            )
        c = analysis["comparisons"][arm][quality]
        verdict, stability = measured_verdict(analysis["verdicts"][arm])
        arms[arm] = {
            **c,
            "verdict": verdict,
            "stability": stability,
            "expected": expected,
            "agreement": agreement(expected, verdict),
        }
    fields = (quality, *study.shown)
    means = {
        arm: {f: analysis["arms"][arm].get(f, {}).get("mean") for f in fields}
        for arm in analysis["arm_order"]
    }
    base_values = _by_seed(analysis["arms"][analysis["baseline_arm"]][quality])
    seed_diffs = {}
    for arm in analysis["comparisons"]:
        values = _by_seed(analysis["arms"][arm][quality])
        seed_diffs[arm] = {k: v - base_values[k] for k, v in values.items() if k in base_values}
    result: dict[str, Any] = {
        "interval": "repeated 95% CI" if analysis.get("sequential") else "95% CI",
        "seed_diffs": seed_diffs,
        "run_seconds": run_seconds(folder),
        "baseline": analysis["baseline_arm"],
        "means": means,
        "fields": {f: analysis["metrics"][f] for f in fields if f in analysis["metrics"]},
        "quality": quality,
        "unit": analysis["metrics"][quality]["unit"],
        "margin_key": margin_key,
        "margin": analysis[margin_key],
        "arms": arms,
    }
    if study.worst is not None:
        lower = analysis["metrics"][quality]["lower_is_better"]
        result["worst"] = worst_check(
            seed_diffs, result["baseline"], study.worst, lower, result["margin"]
        )
    return result


def margin_reach(needed: int | None) -> str:
    """Which run can show equivalence within a margin that needs ``needed`` paired seeds (None:
    more than 1000): ``default`` (the default 3 seeds), ``until-decided`` (within
    ``--until-decided``'s default ``--max-seeds``), ``longer`` (more seeds than that, but at
    most 100) or ``unaffordable``."""
    if needed is None or needed > AFFORDABLE_SEEDS:
        return "unaffordable"
    if needed <= DEFAULT_SEEDS:
        return "default"
    return "until-decided" if needed <= DEFAULT_MAX_SEEDS else "longer"


def noise_floor(aa: dict[str, Any]) -> dict[str, Any]:
    """The A/A comparison's resolution: its mean difference, interval, half-width (the floor)
    and, per default margin in the A/A's unit, whether it lies above the floor and how many
    paired seeds TOST would need at the A/A's spread (true difference 0)."""
    (arm, c), *_ = aa["arms"].items()
    half = (c["ci_high"] - c["ci_low"]) / 2 if c["ci_low"] is not None else math.nan
    margin = DEFAULT_MARGINS[aa["margin_key"]]
    sd = c["sd_diff"]
    need = seeds_needed(0.0, sd, margin) if sd and sd > 0 else 2
    return {
        "seed_diffs": aa["seed_diffs"][arm],
        "reach": margin_reach(need),
        "arm": arm,
        "mean_diff": c["mean_diff"],
        "ci": (c["ci_low"], c["ci_high"]),
        "half_width": half,
        "sd_diff": sd,
        "n_pairs": c["n_pairs"],
        "margin_key": aa["margin_key"],
        "margin": margin,
        "above_floor": margin > half,
        "seeds_needed": need,
    }


def _num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def _paired_spreads(results: dict[str, dict[str, Any]]) -> list[str]:
    """One line per arm outside the A/A studies: the spread (sd) of its paired differences to
    its baseline; for an arm expected equivalent also the paired seeds that showing equivalence
    within its margin would take at that spread if the true difference were 0 (fixed-sample
    TOST, 80% power)."""
    lines = []
    for name, r in results.items():
        if name in AA_STUDIES:
            continue
        for arm, a in r["arms"].items():
            sd = a.get("sd_diff")
            if not sd:
                continue
            line = (
                f"- {name}, {arm} vs {r['baseline']}: sd {_num(sd)} {r['unit']} over "
                f"{a['n_pairs']} pairs"
            )
            if a["expected"] == "equivalent":
                need = seeds_needed(0.0, sd, r["margin"])
                need_text = "more than 1000" if need is None else f"about {need}"
                line += f"; {need_text} paired seeds for {r['margin_key']} = {r['margin']}"
            lines.append(line + ".")
    return lines


def _worst_line(r: dict[str, Any]) -> str:
    """The document's line for a study's worst-arm check."""
    w = r["worst"]
    if w["measured"] is None:
        return (
            f"- Worst arm: expected {w['expected']}; it, or a seed with a result in every arm, "
            "is missing: **undecided**."
        )
    return (
        f"- Worst arm: expected {w['expected']}, measured {w['measured']} (the worst "
        f"mean paired difference to the baseline, which counts as 0); {w['measured']} "
        f"− {w['against']} {_num(w['mean_diff'])} {r['unit']}, 95% CI "
        f"[{_num(w['ci'][0])}, {_num(w['ci'][1])}]: {w['word']} "
        f"(margin {r['margin']}{_settle(w)}): **{w['agreement']}**."
    )


def _settle(w: dict[str, Any]) -> str:
    """``; about N paired seeds would likely settle it`` for an undecided worst-arm check."""
    if w["agreement"] != UNDECIDED:
        return ""
    n = w.get("seeds_needed")
    if n is None:
        return "; no affordable number of seeds is likely to settle it at this spread"
    return f"; about {n} paired seeds would likely settle it"


def _timing(name: str, seconds: dict[str, float], r: dict[str, Any]) -> str:
    """The study's training time, and this call's wall time when this call ran it."""
    total, n = r["run_seconds"]
    trained = f"its {n} runs trained for {total:.0f} s in all"
    if name not in seconds:
        return trained
    return f"{seconds[name]:.0f} s this call, 0 when every run was already finished; {trained}"


def _means_table(r: dict[str, Any]) -> list[str]:
    """Each arm's mean over its seeds of the quality metric and the study's shown fields."""
    fields = [f for f in r["fields"] if any(m.get(f) is not None for m in r["means"].values())]
    head = [f"{r['fields'][f].get('label', f)} ({r['fields'][f].get('unit', '')})" for f in fields]
    lines = ["| arm (mean over seeds) | " + " | ".join(head) + " |"]
    lines.append("|---|" + "---|" * len(fields))
    for arm, m in r["means"].items():
        lines.append(f"| {arm} | " + " | ".join(_num(m.get(f)) for f in fields) + " |")
    return lines


def _floor_lines(name: str, f: dict[str, Any]) -> list[str]:
    """The document's paragraphs on one A/A study's noise floor and its default margin."""
    lines = [
        f"### {name}",
        "",
        f"The A/A arms compute the same function, so every difference between them is the "
        f"harness's own noise: {f['arm']} − baseline per seed "
        + ", ".join(f"{_num(d, 3)} (seed {k})" for k, d in sorted(f["seed_diffs"].items()))
        + f"; mean {_num(f['mean_diff'])}, 95% CI [{_num(f['ci'][0])}, {_num(f['ci'][1])}] "
        f"over {f['n_pairs']} pairs. The spread of the paired differences, sd "
        f"{_num(f['sd_diff'])}, is the resolution of one seed at this budget; the "
        f"interval's half-width at {f['n_pairs']} pairs is {_num(f['half_width'])}.",
        "",
    ]
    need, margin = f["seeds_needed"], f"{f['margin_key']} = {f['margin']}"
    side = "above" if f["above_floor"] else "**below**"
    reach = {
        "default": (
            f"at the A/A's spread (true difference 0) the default {DEFAULT_SEEDS} paired "
            f"seeds show equivalence within it with at least 80% power ({need} would do)"
        ),
        "until-decided": (
            f"showing equivalence within it takes about {need} paired seeds (80% power at "
            f"the A/A's spread, true difference 0), more than the default {DEFAULT_SEEDS} "
            f"but within `--until-decided`'s default `--max-seeds {DEFAULT_MAX_SEEDS}`"
        ),
        "longer": (
            f"showing equivalence within it takes about {need} paired seeds (80% power at "
            f"the A/A's spread, true difference 0): more than the default {DEFAULT_SEEDS} "
            f"and more than `--until-decided`'s default `--max-seeds {DEFAULT_MAX_SEEDS}`, "
            f"so no default run can show it; an undecided verdict between two arms whose "
            f"true difference is well inside the margin is the expected outcome of a "
            f"default run at this budget"
        ),
        "unaffordable": (
            "equivalence within it cannot be shown with any affordable number of seeds "
            f"at this budget (more than {AFFORDABLE_SEEDS} paired seeds at the A/A's "
            "spread)"
        ),
    }[f["reach"]]
    lines += [
        f"The default {margin} lies {side} the half-width at {f['n_pairs']} pairs; {reach}.",
        "",
    ]
    if f["sd_diff"] is not None and f["sd_diff"] < f["margin"] / ROUNDING_ONLY:
        lines += [
            f"The spread is below 1/{ROUNDING_ONLY} of the margin: at this budget the "
            "testbed's training does not amplify a rounding-level difference between the "
            "arms, so this floor is the rounding itself. It bounds the harness's own noise, "
            "not the spread between arms that differ (below).",
            "",
        ]
    return lines


def render(
    results: dict[str, dict[str, Any]],
    commands: dict[str, list[str]],
    seconds: dict[str, float],
    commit: str,
    quick: bool,
    argv: Sequence[str],
) -> str:
    """docs/studies.md: per study the expected direction, the measured verdict with its
    interval and the agreement; the noise floor from the A/A study."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Known results: does the harness reproduce them?",
        "",
        f"Generated by `python scripts/studies.py {' '.join(argv)}`".rstrip() + f" on {now}, "
        f"commit `{commit}`. Each study is one `normlab compare` run over paired seeds; the "
        "verdict is the report's (paired t-interval, TOST against the margin), on the "
        "testbed's quality metric, for each arm against the study's baseline (the first arm).",
        "",
    ]
    if quick:
        lines += [
            "**Quick mode**: tiny models trained for a few steps; this checks the pipeline, not "
            "the literature. Do not read the verdicts below as results.",
            "",
        ]
    tally = [a["agreement"] for r in results.values() for a in r["arms"].values()]
    tally += [r["worst"]["agreement"] for r in results.values() if "worst" in r]
    lines += [
        f"Of {len(tally)} expectations (one per arm, and the worst arm where a study names "
        f"one): {tally.count(AGREE)} agree, {tally.count(UNDECIDED)} undecided, "
        f"{tally.count(DISAGREE)} disagree.",
        "",
        "| study | arm vs baseline | expected | measured | mean diff [95% CI] | agreement |",
        "|---|---|---|---|---|---|",
    ]
    by_name = {s.name: s for s in STUDIES}
    for name, r in results.items():
        for arm, a in r["arms"].items():
            ci = f"{_num(a['mean_diff'])} [{_num(a['ci_low'])}, {_num(a['ci_high'])}] {r['unit']}"
            lines.append(
                f"| {name} | {arm} vs {r['baseline']} | {a['expected']} | {a['verdict']} "
                f"| {ci} | {a['agreement']} |"
            )
    lines.append("")
    for name, r in results.items():
        s = by_name[name]
        lines += [
            f"## {name}",
            "",
            f"- Literature: {s.source}: {s.claim}.",
            f"- Command: `{shown_command(commands[name])}` ({_timing(name, seconds, r)}).",
            *([f"- Settings: {s.note}."] if s.note else []),
            f"- Quality metric: {r['quality']} ({r['unit']}); equivalence margin "
            f"{r['margin_key']} = {r['margin']}.",
        ]
        for arm, a in r["arms"].items():
            settle = ""
            if a["verdict"] in ("inconclusive", "unclear size"):
                n = a.get("seeds_needed")
                settle = (
                    f"; about {n} paired seeds would likely settle it"
                    if n is not None
                    else "; no affordable number of seeds is likely to settle it at this spread"
                )
            lines.append(
                f"- {arm}: expected {a['expected']}, measured {a['verdict']} "
                f"({a['n_pairs']} pairs, mean diff {_num(a['mean_diff'])}, {r['interval']} "
                f"[{_num(a['ci_low'])}, {_num(a['ci_high'])}]{settle}): **{a['agreement']}**. "
                f"{a['stability']}"
            )
        if "worst" in r:
            lines.append(_worst_line(r))
        lines += ["", *_means_table(r), ""]
    floors = [name for name in AA_STUDIES if name in results]
    if floors:
        lines += ["## Noise floor (from the A/A studies)", ""]
        for name in floors:
            lines += _floor_lines(name, noise_floor(results[name]))
        spreads = _paired_spreads(results)
        if spreads:
            lines += [
                "Arms that compute different functions part further than an A/A's rounding "
                "does, so their own paired spread, not the A/A's, sets the seeds a question "
                "about them needs:",
                "",
                *spreads,
                "",
            ]
    return "\n".join(lines)


KEPT_MARKER = "<!-- kept:"


def kept_sections(old: str) -> str:
    """The tail of an earlier docs/studies.md from its ``<!-- kept: …`` marker on: sections
    written from their own commands (e.g. benchmarks/ladder_coverage.py), which a regeneration
    must not drop. Empty when the marker is absent."""
    at = old.find(KEPT_MARKER)
    return "" if at < 0 else old[at:]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen studies (all by default), then write the document."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "normlab-out" / "studies")
    p.add_argument("--doc", type=Path, default=None, help="default: docs/studies.md")
    p.add_argument("--only", nargs="+", choices=STUDY_NAMES, default=list(STUDY_NAMES))
    p.add_argument("--quick", action="store_true", help="tiny models, a few steps")
    p.add_argument("--no-run", action="store_true", help="analyse finished folders only")
    args = p.parse_args(args_list)
    out: Path = args.out / "quick" if args.quick else args.out
    doc: Path = args.doc or ROOT / "docs" / "studies.md"
    if args.quick and args.doc is None:
        p.error("--quick needs --doc (its document must not replace docs/studies.md)")
    out.mkdir(parents=True, exist_ok=True)
    studies = [s for s in STUDIES if s.name in args.only]
    commands: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    results: dict[str, dict[str, Any]] = {}
    for s in studies:
        folder = out / s.name
        if args.no_run:
            if not (folder / EXPERIMENT_FILE).exists():
                p.error(f"--no-run: {folder} holds no compare run")
            commands[s.name] = compare_command(s.config, folder, s.until_decided)
        else:
            commands[s.name], seconds[s.name] = run_study(s, out, args.quick)
            print(f"{s.name}: {seconds[s.name]:.0f} s", flush=True)
        results[s.name] = study_result(s, folder)
    text = render(results, commands, seconds, source_commit(), args.quick, args_list)
    kept = kept_sections(doc.read_text(encoding="utf-8")) if doc.exists() else ""
    write_text_atomic(doc, text.rstrip("\n") + ("\n\n" + kept if kept else "\n"))
    print(f"wrote {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
