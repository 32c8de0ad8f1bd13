"""``normlab compare --script``: plan the grid of a user's script, run it with the executors,
and check the pairing of every seed from the runs' fingerprints.

The grid is the same as for normlab's own runs (arm × seed, an arm being norm × placement ×
precision, :class:`normlab.experiment.config.ScriptConfig`); each run's ``run.json`` holds the
script's command, and the worker runs it
(:func:`normlab.experiment.execution.script_run.run_script`). normlab cannot build the user's
model before training, so the pairing of the arms is checked afterwards
(:func:`check_script_pairing`): for every seed, the fingerprints the runs recorded
(``normlab.track``'s ``Run.fingerprint``: digests of the initial parameters outside the norm
modules and of the first batch) must agree between the arms; a seed where they do not is
refused: each of its runs is recorded ``crashed`` with the parameter or the batch that differs,
so the analysis leaves the seed out and the report names it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from normlab.experiment.config import ScriptConfig
from normlab.experiment.execution.environment import default_threads, environment
from normlab.experiment.execution.executors import (
    Executor,
    LocalExecutor,
    finished_runs,
    is_done,
)
from normlab.experiment.execution.lock import OutputLock
from normlab.experiment.execution.runner import (
    AfterTraining,
    _is_unused,
    check_out_contents,
    check_out_path,
    runs_not_planned,
)
from normlab.run_format import FACTORS, run_id
from normlab.run_format.folder import (
    create_run,
    has_run_config,
    read_experiment,
    read_fingerprint,
    read_run_config,
    read_summary,
    run_dir,
    runs_path,
    write_experiment,
)
from normlab.run_format.summary import record_crash

__all__ = [
    "PAIRING_ERROR",
    "check_planned_seed",
    "check_script_pairing",
    "fingerprint_difference",
    "plan_script_experiment",
    "plan_script_runs",
    "run_script_experiment",
    "settled_runs",
]

PAIRING_ERROR = "pairing guard"
"""How the error of a run refused by :func:`check_script_pairing` begins."""


def plan_script_runs(cfg: ScriptConfig, threads: int) -> list[dict[str, Any]]:
    """The run config of every (arm, seed), seed-major: identity and factors, the testbed
    (``script:<metric>:min|max``), the script's command, timeout and folder, ``train.steps``
    (for the progress bar; 1 when not given) and ``threads``."""
    script = {
        "command": cfg.command,
        "timeout_s": cfg.run_timeout,
        "cwd": str(Path(cfg.cwd).absolute()),
    }
    return [
        {
            "run_id": run_id(arm, seed),
            "arm": arm,
            "seed": seed,
            **dict(zip(FACTORS, (norm, placement, precision), strict=True)),
            "testbed": cfg.testbed,
            "script": dict(script),
            "train": {"steps": cfg.steps or 1},
            "threads": threads,
            "device": "script",
        }
        for seed in cfg.seed_list()
        for arm, norm, placement, precision in cfg.arm_factors()
    ]


def script_experiment_record(
    cfg: ScriptConfig, runs: list[dict[str, Any]], threads: int
) -> dict[str, Any]:
    """The content of ``experiment.json`` for a script grid (the fields the analysis reads, as
    for normlab's own runs)."""
    values = {"norm": cfg.norms, "placement": cfg.placements, "precision": cfg.precisions}
    varied = {f: v for f, v in values.items() if len(v) > 1} or {"norm": cfg.norms}
    fixed: dict[str, Any] = {f: v[0] for f, v in values.items() if f not in varied}
    fixed.update({"script.command": cfg.command, "script.metric": cfg.metric})
    return {
        "testbed": cfg.testbed,
        "arms": cfg.arm_names(),
        "baseline_arm": cfg.baseline_arm(),
        "seeds": cfg.seed_list(),
        "margin": cfg.margin(),
        "target_val_loss": None,
        "varied": varied,
        "fixed": fixed,
        "config": cfg.dump(),
        "environment": environment("cpu", threads) | {"device": "chosen by the script"},
        "data": {},
        "runs": [r["run_id"] for r in runs],
    }


@contextmanager
def _prepared(cfg: ScriptConfig, out: Path, console: Console) -> Iterator[list[dict[str, Any]]]:
    """Check ``out``, take its lock, write ``experiment.json`` and yield the planned runs (as
    :func:`normlab.experiment.execution.runner.run_experiment` does for normlab's runs)."""
    created = check_out_path(out)
    check_out_contents(out)
    threads = cfg.threads or default_threads()
    lock = OutputLock(out)
    try:
        lock.acquire()
        runs = plan_script_runs(cfg, threads)
        finished_runs(runs, out)  # refuses before experiment.json is touched
        console.print(
            f"paired: {len(runs)} runs of {cfg.command!r} ({len(cfg.seed_list())} seeds × "
            f"{len(cfg.arm_names())} arms), judged on {cfg.metric} "
            f"({'lower' if cfg.lower_is_better else 'higher'} is better); the pairing is "
            "checked from each run's fingerprint after it trains"
        )
        others = runs_not_planned(runs, out)
        if others:
            console.print(
                f"note: {runs_path(out)} also holds {len(others)} runs that this command does "
                f"not plan ({', '.join(others)}); they are kept, but left out of the analysis"
            )
        write_experiment(out, script_experiment_record(cfg, runs, threads))
        yield runs
    except BaseException:
        if created is not None and lock.held and _is_unused(out):
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        lock.release()


def run_script_experiment(
    cfg: ScriptConfig,
    out: Path,
    console: Console | None = None,
    show_progress: bool = True,
    after_training: AfterTraining | None = None,
    executor: Executor | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the script grid into ``out`` and return {run_id: summary}: plan it, train every run
    not done with ``executor`` (default: local worker processes), refuse the seeds whose arms'
    fingerprints disagree (:func:`check_script_pairing`), then ``after_training`` on the locked
    folder (the report). The signature is that of
    :func:`normlab.experiment.execution.runner.run_experiment`, so ``--until-decided`` runs its
    rounds through it."""
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as runs:
        summaries = (executor or LocalExecutor()).run(
            runs, out, cfg.parallel, console, show_progress
        )
        summaries.update(check_script_pairing(runs, out, console))
        if after_training is not None:
            after_training(out, summaries)
    return summaries


def plan_script_experiment(
    cfg: ScriptConfig, out: Path, console: Console | None = None
) -> list[str]:
    """``--plan``: prepare ``out`` (``experiment.json``, a ``run.json`` for every run not done)
    and return the ids of the runs to train (``normlab compare --out OUT --run RUN_ID``)."""
    console = console or Console()
    out = Path(out)
    with _prepared(cfg, out, console) as runs:
        done = finished_runs(runs, out)
        todo = [r for r in runs if r["run_id"] not in done]
        for spec in todo:
            create_run(out, spec)
    return [r["run_id"] for r in todo]


def fingerprint_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between two runs' fingerprints, in words (the first parameter in name
    order, then the batch), or None when they agree."""
    pa, pb = a.get("parameters") or {}, b.get("parameters") or {}
    for name in sorted(set(pa) | set(pb)):
        if name not in pa or name not in pb:
            return f"the parameter {name!r} outside the norms exists in one arm only"
        if pa[name] != pb[name]:
            return f"the initial values of the parameter {name!r} differ"
    if a.get("batch") != b.get("batch"):
        return "the first batch differs"
    return None


def check_script_pairing(
    runs: list[dict[str, Any]], out: Path, console: Console
) -> dict[str, dict[str, Any]]:
    """Refuse every seed whose arms' fingerprints disagree: each of its runs that produced a
    result is rewritten as ``crashed`` with an error that names the two arms and what differs
    (:func:`fingerprint_difference`). Returns {run_id: new summary} of the refused runs; prints
    one line per refused seed, and one line naming the runs that recorded no fingerprint (their
    pairing could not be checked)."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for spec in runs:
        by_seed.setdefault(spec["seed"], []).append(spec)
    refused: dict[str, dict[str, Any]] = {}
    unchecked: list[str] = []
    for seed, specs in by_seed.items():
        prints = {s["run_id"]: read_fingerprint(run_dir(out, s["run_id"])) for s in specs}
        unchecked += [r for r, p in prints.items() if p is None]
        have = [(s, prints[s["run_id"]]) for s in specs if prints[s["run_id"]] is not None]
        if len(have) < 2:
            continue
        (first, ref), reason, other = have[0], None, None
        for spec, fp in have[1:]:
            reason = fingerprint_difference(ref, fp)  # type: ignore[arg-type]
            if reason is not None:
                other = spec
                break
        if reason is None or other is None:
            continue
        error = (
            f"{PAIRING_ERROR}: seed {seed} refused, not judged: arms {first['arm']!r} and "
            f"{other['arm']!r} do not start alike ({reason}); only the norm may differ"
        )
        console.print(f"[red]{escape(error)}[/]")
        for spec in specs:
            refused[spec["run_id"]] = record_crash(run_dir(out, spec["run_id"]), spec, error, "")
    if unchecked:
        console.print(
            f"note: {len(unchecked)} runs recorded no fingerprint (run.fingerprint(model, "
            f"batch) was not called), so their pairing was not checked: {', '.join(unchecked)}"
        )
    return refused


def settled_runs(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The runs of ``summaries`` ({run_id: summary}) whose result is final: every run of their
    seed has a result (finished or diverged), so the seed's pairing check has been made on all
    its arms and a later command cannot refuse it. In the order of ``summaries``."""
    complete: dict[Any, bool] = {}
    for summary in summaries.values():
        seed = summary.get("seed")
        complete[seed] = complete.get(seed, True) and is_done(summary)
    return [r for r, s in summaries.items() if complete.get(s.get("seed")) and is_done(s)]


def check_planned_seed(out: Path, run: str, console: Console) -> list[str]:
    """After ``normlab compare --out OUT --run RUN`` trained the planned script run ``run``:
    once every run of its seed that ``experiment.json`` lists has a result, apply the pairing
    guard to that seed (:func:`check_script_pairing`, which refuses it if its arms' fingerprints
    disagree) and return the seed's runs that keep a result (:func:`settled_runs`); [] while
    another run of the seed has none. So the guard holds for runs trained one by one from any
    scheduler: the last run of each seed to end checks it."""
    out = Path(out)
    seed = read_run_config(run_dir(out, run)).get("seed")
    specs = []
    for other in read_experiment(out).get("runs", []):
        folder = run_dir(out, other)
        if has_run_config(folder):
            spec = read_run_config(folder)
            if spec.get("seed") == seed:
                specs.append(spec)
    summaries = {s["run_id"]: read_summary(run_dir(out, s["run_id"])) or {} for s in specs}
    if not all(is_done(s) for s in summaries.values()):
        return []
    summaries.update(check_script_pairing(specs, out, console))
    return settled_runs(summaries)
