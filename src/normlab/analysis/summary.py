"""The whole analysis of a compare folder as one JSON-ready dict (the top-level summary.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from normlab._plural import counted
from normlab.analysis.comparison import PairedComparison, compare_paired, decide_by_sign_test
from normlab.analysis.cost_folder import decision_cost
from normlab.analysis.families import FACTOR_DEFAULTS, comparison_families
from normlab.analysis.lr_sweep_folder import compare_sweep
from normlab.analysis.recommendation import (
    ADD_IMPORTED_SEEDS,
    ADD_SEEDS,
    Recommendation,
    recommend,
)
from normlab.analysis.rounds import read_state, sequential_comparison
from normlab.analysis.runs import CompareFolder, RunResult
from normlab.analysis.stability import arm_stability, stability_verdict
from normlab.analysis.stats import describe, holm_adjust
from normlab.analysis.training_budget import budget_record
from normlab.analysis.verdicts import ArmVerdict, arm_verdict
from normlab.analysis.wording import is_decided
from normlab.run_format import LR_SWEEP_KEY, MetricSpec, TestbedFormat, testbed_format
from normlab.run_format.budget import BUDGET_KEY
from normlab.run_format.imported import import_record

__all__ = ["analyze", "compare_metric", "run_outcome"]

_ENV_RUN_FIELDS = (
    "device",
    "torch_version",
    "threads",
    "peak_memory_kind",
    "data_fingerprint",
    "ptq_fp8_method",  # "simulated" where the device has no FP8 matmul
)


def _values(runs: list[RunResult], spec: MetricSpec) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in runs:
        v = r.value(spec.name)
        if r.status in spec.statuses and v is not None:
            out[r.seed] = v
    return out


def _reach_order(
    spec: MetricSpec, arm_runs: list[RunResult], base_runs: list[RunResult]
) -> tuple[list[float], int]:
    """For a censored metric: sign(x_k − y_k) per seed where both runs count, with a run that
    never reached the target (null) slower than one that did and two such runs tied; and the
    number of seeds where exactly one of the two reached it."""
    arm = {r.seed: r.value(spec.name) for r in arm_runs if r.status in spec.statuses}
    base = {r.seed: r.value(spec.name) for r in base_runs if r.status in spec.statuses}
    signs, one_sided = [], 0
    for seed in sorted(set(arm) & set(base)):
        x, y = arm[seed], base[seed]
        if x is None or y is None:
            one_sided += (x is None) != (y is None)
            signs.append(float(x is None) - float(y is None))
        else:
            signs.append(float((x > y) - (x < y)))
    return signs, one_sided


def _censored(
    c: PairedComparison,
    spec: MetricSpec,
    arm_runs: list[RunResult],
    base_runs: list[RunResult],
    alpha: float,
) -> PairedComparison:
    """``c``, or, when some seed has only one arm reaching the target, the sign test on who
    reached it first over every seed (dropping those seeds would bias the comparison towards
    the arm that missed)."""
    signs, one_sided = _reach_order(spec, arm_runs, base_runs)
    if one_sided == 0:
        return c
    note = (
        f"{counted(one_sided, 'paired seed')} where only one arm reached the target count in "
        f"the sign test on who reached it first; the ratio and its interval use the "
        f"{counted(c.n_pairs, 'seed')} where both did"
    )
    return decide_by_sign_test(
        c,
        signs,
        lower_is_better=spec.lower_is_better,
        alpha=alpha,
        test="exact sign test on which arm reached the target first",
        note=note,
    )


def compare_metric(
    spec: MetricSpec,
    arm_runs: list[RunResult],
    base_runs: list[RunResult],
    margin: float | None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> PairedComparison:
    """Pair ``arm_runs`` with ``base_runs`` by seed on ``spec`` and compare them.

    Only seeds with a usable value in both arms are paired. ``margin`` is the experiment's
    equivalence margin in its testbed's quality unit (GPT: bits per byte; DiT: validation MSE;
    None: a script's runs without ``--margin``); the metric's margin is
    ``margin · spec.margin_factor`` (None when either is None). Counts
    (``spec.discrete``) are decided by the sign test; for a censored metric, seeds where only
    one arm reached the target are counted by the sign test on who reached it first.
    """
    xs, ys = _values(arm_runs, spec), _values(base_runs, spec)
    if spec.scale == "ratio":
        xs = {s: v for s, v in xs.items() if v > 0}
        ys = {s: v for s, v in ys.items() if v > 0}
    seeds = sorted(set(xs) & set(ys))
    metric_margin = (
        None if spec.margin_factor is None or margin is None else margin * spec.margin_factor
    )
    c = compare_paired(
        [xs[s] for s in seeds],
        [ys[s] for s in seeds],
        seeds=seeds,
        lower_is_better=spec.lower_is_better,
        margin=metric_margin,
        scale=spec.scale,
        alpha=alpha,
        power=power,
        discrete=spec.discrete,
    )
    return _censored(c, spec, arm_runs, base_runs, alpha) if spec.censored else c


def _add_holm(comparisons: dict[str, dict[str, Any]]) -> None:
    """Give each of one arm's comparisons ``p_holm``: its p-value adjusted by Holm–Bonferroni
    over every metric of that arm with a p-value (None for the others). The verdicts keep the
    unadjusted tests; the adjusted value tells how much a single small p means among many."""
    tested = [name for name, c in comparisons.items() if c["p_value"] is not None]
    adjusted = holm_adjust([comparisons[name]["p_value"] for name in tested])
    for c in comparisons.values():
        c["p_holm"] = None
    for name, p in zip(tested, adjusted, strict=True):
        comparisons[name]["p_holm"] = p


def run_outcome(run: RunResult) -> str:
    """A short human reason for a run's status (empty for a finished run)."""
    if run.status == "diverged":
        at = run.value("diverged_at")
        return f"diverged at step {int(at)}" if at is not None else "diverged"
    if run.status == "crashed":
        err = str(run.summary.get("error") or "no error message").strip().splitlines()
        return f"crashed: {err[-1] if err else 'no error message'}"
    if run.status == "unfinished":
        return "unfinished: no summary.json (still running, or killed)"
    return ""


def _arm_info(folder: CompareFolder, arm: str) -> dict[str, Any]:
    runs = folder.runs_of(arm)
    ranked = sorted(runs, key=lambda r: (not r.done, not r.summary))  # done runs first
    first = ranked[0] if ranked else None
    done_seeds = sorted(r.seed for r in runs if r.done)
    info: dict[str, Any] = {
        "norm": (first.summary.get("norm") or first.config.get("norm")) if first else None,
        "placement": (first.summary.get("placement") or first.config.get("placement"))
        if first
        else None,
        "precision": (
            first.summary.get("precision")
            or first.config.get("precision")
            or FACTOR_DEFAULTS["precision"]
        )
        if first
        else None,
        "n_params": first.value("n_params") if first else None,
        "n_norm_params": first.value("n_norm_params") if first else None,
        "seeds_done": done_seeds,
        "seeds_missing": [s for s in folder.seeds if s not in done_seeds],
        "stability": arm_stability(runs).to_dict(),
    }
    for key in ("n_params", "n_norm_params"):
        if info[key] is not None:
            info[key] = int(info[key])
    return info


def _environment(folder: CompareFolder) -> dict[str, Any]:
    env: dict[str, Any] = dict(folder.experiment.get("environment") or {})
    if folder.data.get("fingerprint") is not None:
        env["data_fingerprint"] = folder.data["fingerprint"]
    for key in ("source", "n_train_tokens", "n_val_tokens"):
        if folder.data.get(key) is not None:
            env[f"data_{key}"] = folder.data[key]
    for key in _ENV_RUN_FIELDS:
        seen = sorted({str(r.summary[key]) for r in folder.runs if r.summary.get(key) is not None})
        if seen:
            env[f"runs_{key}"] = seen
    return env


def _no_result(runs: list[RunResult]) -> str:
    """Why an arm has no finished or diverged run ("3 crashed", "1 crashed, 2 unfinished",
    "no run folder"), or "" when it has one."""
    info = arm_stability(runs)
    if info.n_done:
        return ""
    counts = [(info.n_crashed, "crashed"), (info.n_unfinished, "unfinished")]
    return ", ".join(f"{n} {word}" for n, word in counts if n) or "no run folder"


def _arm_statistics(folder: CompareFolder, metrics: tuple[MetricSpec, ...]) -> dict[str, Any]:
    """{arm: {metric: mean, sample sd, n, the values and their seeds}}."""
    stats: dict[str, Any] = {}
    for arm in folder.arms:
        runs = folder.runs_of(arm)
        stats[arm] = {}
        for spec in metrics:
            values = _values(runs, spec)
            d = describe(list(values.values()))
            stats[arm][spec.name] = {
                "mean": d.mean,
                "std": d.std,
                "n": d.n,
                "values": list(values.values()),
                "seeds": list(values),
            }
    return stats


@dataclass
class _ArmResults:
    """Every non-baseline arm's comparisons (as dicts, with Holm's p), verdicts, and the
    quality and speed comparisons the recommendation ranks by."""

    comparisons: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdicts: dict[str, Any] = field(default_factory=dict)
    arm_verdicts: dict[str, ArmVerdict] = field(default_factory=dict)
    quality: dict[str, PairedComparison] = field(default_factory=dict)
    speed: dict[str, PairedComparison] = field(default_factory=dict)


def _judge_arms(
    folder: CompareFolder,
    testbed: TestbedFormat,
    sequential: dict[str, Any] | None,
    alpha: float,
    power: float,
) -> _ArmResults:
    """Compare every arm with the baseline on every metric (the quality metric as the
    sequential procedure decided it, after ``--until-decided``), and give its verdict."""
    out = _ArmResults()
    base = folder.baseline_arm
    base_runs = folder.runs_of(base)
    for arm in folder.arms:
        if arm == base:
            continue
        runs = folder.runs_of(arm)
        results = {
            spec.name: compare_metric(spec, runs, base_runs, folder.margin, alpha, power)
            for spec in testbed.metrics
        }
        decided = _sequential_decision(sequential, arm, testbed.quality)
        if decided is not None:
            results[testbed.quality] = sequential_comparison(results[testbed.quality], decided)
        out.comparisons[arm] = {name: c.to_dict() for name, c in results.items()}
        _add_holm(out.comparisons[arm])
        stab = stability_verdict(runs, base_runs, alpha)
        out.quality[arm], out.speed[arm] = results[testbed.quality], results["tokens_per_s"]
        v = arm_verdict(
            arm,
            base,
            out.quality[arm],
            out.speed[arm],
            results["peak_memory_bytes"],
            stab,
            what=testbed.quality_name,
            unit=testbed.short_unit,
        )
        out.arm_verdicts[arm] = v
        out.verdicts[arm] = {**v.to_dict(), "stability_detail": stab.to_dict()}
    return out


def _recommend(folder: CompareFolder, judged: _ArmResults) -> Recommendation:
    """The recommendation from the arms' verdicts; arms (or a baseline) without any result say
    why instead."""
    problems = {arm: _no_result(folder.runs_of(arm)) for arm in judged.arm_verdicts}
    return recommend(
        folder.baseline_arm,
        judged.arm_verdicts,
        judged.quality,
        judged.speed,
        baseline_problem=_no_result(folder.runs_of(folder.baseline_arm)),
        arm_problems={arm: why for arm, why in problems.items() if why},
        add_seeds=ADD_SEEDS if import_record(folder.experiment) is None else ADD_IMPORTED_SEEDS,
    )


def _runs_table(folder: CompareFolder) -> list[dict[str, Any]]:
    """One row per run: its id, arm, seed, status and the reason for that status."""
    return [
        {
            "run_id": r.run_id,
            "arm": r.arm,
            "seed": r.seed,
            "status": r.status,
            "reason": run_outcome(r),
        }
        for r in folder.runs
    ]


def _metric_info(metrics: tuple[MetricSpec, ...]) -> dict[str, dict[str, Any]]:
    """{metric: its label, unit, direction and scale}."""
    return {
        s.name: {
            "label": s.label,
            "unit": s.unit,
            "lower_is_better": s.lower_is_better,
            "scale": s.scale,
        }
        for s in metrics
    }


def analyze(folder: CompareFolder, alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """Statistics, comparisons, verdicts and the recommendation for a loaded compare folder.

    Per arm and metric: mean and sample sd over seeds. Per non-baseline arm and metric: the
    paired comparison against the baseline (matched by seed). Per arm: verdicts and decision.
    When several factors vary (norm × precision, …), also ``families``: each factor's levels
    compared with the others held fixed (:func:`normlab.analysis.families.comparison_families`).
    Tests use level ``alpha``; ``power`` sets how sure the seeds-needed estimate aims to be.
    The metrics, the quality metric and the margin's key follow the folder's testbed
    (:data:`normlab.run_format.TESTBED_FORMATS`). A folder swept by ``compare --lr-sweep`` also
    gets its learning-rate sweep under ``learning_rates``
    (:func:`normlab.analysis.lr_sweep_folder.compare_sweep`); other folders have no such key.
    ``budget``: the runs' tokens per parameter and whether they are early training
    (:func:`normlab.analysis.training_budget.budget_record`).
    When some arm's quality verdict is open, ``decision_cost`` holds what deciding it would
    cost at each training budget (:func:`normlab.analysis.cost_folder.decision_cost`).
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must lie in (0, 1), got {power!r}")
    testbed = testbed_format(folder.testbed)
    arms_stats = _arm_statistics(folder, testbed.metrics)
    sequential = read_state(folder.path)
    judged = _judge_arms(folder, testbed, sequential, alpha, power)
    families = comparison_families(
        folder,
        testbed.metrics,
        lambda spec, runs, base_runs: compare_metric(
            spec, runs, base_runs, folder.margin, alpha, power
        ),
    )
    rec = _recommend(folder, judged)
    runs_table = _runs_table(folder)
    return {
        "baseline_arm": folder.baseline_arm,
        testbed.margin_key: folder.margin,
        "alpha": alpha,
        "power": power,
        "arm_order": list(folder.arms),
        "metrics": _metric_info(testbed.metrics),
        "arms": arms_stats,
        "arm_info": {arm: _arm_info(folder, arm) for arm in folder.arms},
        "comparisons": judged.comparisons,
        "families": families,
        "verdicts": judged.verdicts,
        "recommendation": rec.to_dict(),
        "runs": runs_table,
        "excluded": [row for row in runs_table if row["status"] in ("crashed", "unfinished")],
        "ignored_runs": list(folder.ignored_runs),
        "environment": _environment(folder),
        "target_val_loss": folder.experiment.get("target_val_loss"),
        "quality_metric": testbed.quality,
        "testbed": testbed.name,
        "sequential": sequential,
        BUDGET_KEY: budget_record(folder),
        **_sweep(folder),
        **_decision_cost(folder, judged, alpha, power),
    }


def _sweep(folder: CompareFolder) -> dict[str, Any]:
    """{``learning_rates``: the sweep record} of a folder with tuning folders beside it, else {}."""
    ran = folder.experiment.get("learning_rates")
    record = compare_sweep(folder.path, ran if isinstance(ran, dict) else None)
    return {} if record is None else {LR_SWEEP_KEY: record}


def _decision_cost(
    folder: CompareFolder, judged: _ArmResults, alpha: float, power: float
) -> dict[str, Any]:
    """{``decision_cost``: the price of a decision per arm whose quality verdict is not decided}
    (:func:`normlab.analysis.cost_folder.decision_cost`), or {} when there is none to give."""
    open_arms = [arm for arm, v in judged.arm_verdicts.items() if not is_decided(v.quality)]
    return decision_cost(folder, open_arms, alpha, power)


def _sequential_decision(
    state: dict[str, Any] | None, arm: str, quality: str
) -> dict[str, Any] | None:
    """The sequential decision of ``arm`` on ``quality`` in ``state`` (None without one)."""
    if not state or state.get("metric") != quality:
        return None
    decision = (state.get("final") or {}).get(arm)
    return decision if isinstance(decision, dict) else None
