"""A grid of a user's own training script (``normlab compare --script``).

The kind of grid of a :class:`normlab.experiment.config.ScriptConfig`
(:mod:`normlab.experiment.execution.kinds`). The grid is the same as for normlab's own runs (arm
× seed, an arm being norm × placement × precision); each run's ``run.json`` holds the script's
command, and the worker runs it (:func:`normlab.experiment.execution.script_run.run_script`).
normlab cannot build the user's model before training, so the pairing of the arms is checked
afterwards (:func:`check_script_pairing`): for every seed, the fingerprints the runs recorded
(``normlab.track``'s ``Run.fingerprint``: digests of the initial parameters outside the norm
modules and of the first batch) must agree between the arms; a seed where they do not is
refused: each of its runs is recorded ``crashed`` with the parameter or the batch that differs,
so the analysis leaves the seed out and the report names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from normlab._plural import counted
from normlab.experiment.config import ScriptConfig
from normlab.experiment.execution.environment import default_threads, environment
from normlab.experiment.execution.run_loop import is_done
from normlab.run_format import FACTORS, run_id
from normlab.run_format.experiment_record import experiment_record
from normlab.run_format.folder import (
    has_run_config,
    read_experiment,
    read_fingerprint,
    read_run_config,
    read_summary,
    run_dir,
)
from normlab.run_format.summary import record_crash

__all__ = [
    "PAIRING_ERROR",
    "ScriptGrid",
    "check_planned_seed",
    "check_script_pairing",
    "fingerprint_difference",
    "plan_script_runs",
    "settled_runs",
]

PAIRING_ERROR = "pairing guard"
"""How the error of a run refused by :func:`check_script_pairing` begins."""


class ScriptGrid:
    """How a grid of a user's script is checked, planned and recorded, and its pairing
    checked after training (the interface of
    :class:`normlab.experiment.execution.kinds.GridKind`)."""

    exports_each_run = False
    """A run is exported once its seed's pairing is checked (:meth:`settled`), not as it
    ends."""

    def __init__(self, cfg: ScriptConfig) -> None:
        self.cfg = cfg
        self.threads = 0

    def check(self, out: Path) -> None:
        """Nothing to check before the folder is written but the threads each script gets
        (the command was checked with the config)."""
        self.threads = self.cfg.threads or default_threads()

    def plan(self, out: Path, console: Console) -> list[dict[str, Any]]:
        """Every run's config (:func:`plan_script_runs`); there is no data to prepare."""
        return plan_script_runs(self.cfg, self.threads)

    def describe(self, runs: list[dict[str, Any]], console: Console) -> None:
        """Print what the grid pairs and when its pairing is checked."""
        cfg = self.cfg
        console.print(
            f"paired: {counted(len(runs), 'run')} of {cfg.command!r} "
            f"({counted(len(cfg.seed_list()), 'seed')} × {counted(len(cfg.arm_names()), 'arm')}), "
            f"judged on {cfg.metric} "
            f"({'lower' if cfg.lower_is_better else 'higher'} is better); the pairing is "
            "checked from each run's fingerprint after it trains"
        )

    def record(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """``experiment.json``: the fields the analysis reads, as for normlab's own runs; the
        settings held fixed are the script's command and metric, and the device is the
        script's to choose."""
        cfg = self.cfg
        return experiment_record(
            **cfg.grid_fields(),
            settings={"script.command": cfg.command, "script.metric": cfg.metric},
            environment=environment("cpu", self.threads) | {"device": "chosen by the script"},
            runs=[r["run_id"] for r in runs],
        )

    def after_training(
        self, runs: list[dict[str, Any]], out: Path, console: Console
    ) -> dict[str, dict[str, Any]]:
        """The pairing guard (:func:`check_script_pairing`): {run_id: crashed summary} of the
        runs of every seed it refused."""
        return check_script_pairing(runs, out, console)

    def paths(self) -> dict[str, Any]:
        """Nothing: the script reads what it reads."""
        return {}

    def settled(self, summaries: dict[str, dict[str, Any]]) -> list[str]:
        """The runs whose seed's pairing has been checked on every arm
        (:func:`settled_runs`)."""
        return settled_runs(summaries)

    @staticmethod
    def after_planned_run(out: Path, run_id: str, console: Console) -> list[str]:
        """The pairing guard of the seed of ``run_id`` once every arm of it has a result
        (:func:`check_planned_seed`); the seed's runs that keep a result."""
        return check_planned_seed(out, run_id, console)


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
    pairing could not be checked) and one naming each damaged ``fingerprint.json``."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for spec in runs:
        by_seed.setdefault(spec["seed"], []).append(spec)
    refused: dict[str, dict[str, Any]] = {}
    unchecked: list[str] = []
    damaged: dict[str, str] = {}
    for seed, specs in by_seed.items():
        prints = {s["run_id"]: _fingerprint(out, s["run_id"], damaged) for s in specs}
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
            summary = record_crash(run_dir(out, spec["run_id"]), spec, error, "")
            refused[spec["run_id"]] = summary
    recorded = [r for r in unchecked if r not in damaged]
    if recorded:
        console.print(
            f"note: {counted(len(recorded), 'run')} recorded no fingerprint "
            f"(run.fingerprint(model, batch) was not called), so their pairing was not checked: "
            f"{', '.join(recorded)}"
        )
    if damaged:
        console.print(
            f"[red]note: {counted(len(damaged), 'run')} left a damaged fingerprint, so their "
            f"pairing was not checked: {escape('; '.join(damaged.values()))}[/]"
        )
    return refused


def _fingerprint(out: Path, run: str, damaged: dict[str, str]) -> dict[str, Any] | None:
    """The run's fingerprint, or None when it has none or a damaged one (then
    ``damaged[run]`` says why, for the note that names the file)."""
    try:
        return read_fingerprint(run_dir(out, run))
    except ValueError as err:
        damaged[run] = f"{run}: {err}"
        return None


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
