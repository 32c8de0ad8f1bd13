"""``compare --until-decided``: train paired seeds in rounds until the question is decided.

The look schedule is fixed before the first look: after n_1 = the seeds asked for, then every 2
more, and at ``--max-seeds`` (:func:`normlab.analysis.sequential.look_schedule`, where its
default lives with the α-spending it sets). Round k trains the grid with the first n_k seeds
into the same ``out``, so every run already finished there (from an earlier round, or an
earlier command) is reused; after it trains, while the folder is still locked, the looker
(:class:`normlab.analysis.rounds.SequentialTracker`, :func:`sequential_tracker`) looks at the
runs and its state is written to ``sequential.json``.

The rounds stop when the looker says every arm is decided, after the last planned look, or
when the next round would overrun ``max_time_s`` (counted from the call): its duration is
estimated as (new runs) × (median training time of the runs so far × 1.25 + 2 s start-up) /
``parallel``. A run that is already on disk costs nothing, so the same command run again after
a time stop continues where it stopped. The ``finish`` step (the report) runs once, on the last
round.

Before the first round, when ``out`` already holds finished runs of the same experiment (a
pilot: the same arms, baseline, testbed and settings but for the seeds and how many runs train
at once), :func:`pilot_forecast` says what a decision would cost at the current training budget
and at the cheapest (:func:`normlab.analysis.cost_folder.decision_cost`, from the pilot's
analysis; nothing is written).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from normlab._plural import counted
from normlab.analysis.answer import cost_lines
from normlab.analysis.rounds import SequentialTracker
from normlab.analysis.runs import CompareFolder, CompareFolderError, load_compare_folder
from normlab.analysis.sequential import look_schedule, plan_for
from normlab.analysis.summary import analyze
from normlab.experiment.execution.runner import AfterTraining
from normlab.run_format import folder as run_folder
from normlab.run_format import testbed_format
from normlab.study.spec import DEFAULT_MAX_TIME_S, GridConfig, RoundsSpec

__all__ = [
    "DEFAULT_MAX_TIME_S",
    "Looker",
    "pilot_forecast",
    "round_seconds",
    "run_until_decided",
    "seed_sequence",
    "sequential_tracker",
    "train_rounds",
]

RUN_OVERHEAD_S = 2.0
"""Seconds a run costs besides its training time (process start, model build)."""
HOW_KEYS = ("seeds", "parallel", "log_to")
"""Config keys that may differ between a pilot and the rounds that continue it: which seeds,
and how the runs are trained and exported, not what they train."""


class Looker(Protocol):
    """The decision side of the rounds (:class:`normlab.analysis.rounds.SequentialTracker`)."""

    def look(
        self, n_seeds: int, summaries: Mapping[str, Mapping[str, Any]], elapsed_s: float = 0.0
    ) -> bool: ...

    def stop(self, reason: str, n_seeds: int) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...


def seed_sequence(cfg: GridConfig, n: int) -> list[int]:
    """The first ``n`` seeds: the config's seeds, then the next integers not among them."""
    seeds = cfg.seed_list()[:n]
    k = 0
    while len(seeds) < n:
        if k not in seeds:
            seeds.append(k)
        k += 1
    return seeds


def round_seconds(
    summaries: Mapping[str, Mapping[str, Any]], new_runs: int, parallel: int = 1
) -> float:
    """Estimated seconds to train ``new_runs`` more runs (module docstring); 0 without any
    timed run to go by."""
    walls = [float(s["wall_s"]) for s in summaries.values() if s.get("wall_s")]
    if not walls or new_runs <= 0:
        return 0.0
    per_run = statistics.median(walls) * 1.25 + RUN_OVERHEAD_S
    return new_runs * per_run / max(1, parallel)


class _Rounds:
    """The rounds of one :func:`run_until_decided`: :meth:`look` is the step run on the folder
    after round ``k`` (its ``after_training``): look, decide whether to stop, write
    ``sequential.json``, say so, and on the last round run ``finish``."""

    def __init__(
        self,
        cfg: GridConfig,
        looker: Looker,
        looks: tuple[int, ...],
        max_time_s: float | None,
        console: Console,
        finish: AfterTraining | None,
        clock: Callable[[], float],
    ) -> None:
        self.looker, self.looks, self.max_time_s = looker, looks, max_time_s
        self.console, self.finish, self.clock = console, finish, clock
        self.n_arms, self.parallel = len(cfg.arm_names()), cfg.parallel
        self.started = clock()
        self.stopped: str | None = None

    def _reason(self, k: int, summaries: dict[str, dict[str, Any]], elapsed: float) -> str | None:
        """Why the rounds stop after round ``k``, or None to go on."""
        n = self.looks[k]
        if self.looker.look(n, summaries, elapsed):
            return "decided"
        if k == len(self.looks) - 1:
            return "max-seeds"
        if self.max_time_s is not None:
            more = round_seconds(summaries, (self.looks[k + 1] - n) * self.n_arms, self.parallel)
            if elapsed + more > self.max_time_s:
                return "max-time"
        return None

    def look(self, k: int, folder: Path, summaries: dict[str, dict[str, Any]]) -> None:
        n, elapsed = self.looks[k], self.clock() - self.started
        reason = self._reason(k, summaries, elapsed)
        if reason is not None:
            self.looker.stop(reason, n)
            self.stopped = reason
        state = self.looker.to_dict()
        run_folder.write_sequential(folder, state)
        shown = ", ".join(f"{arm} {v}" for arm, v in state.get("verdicts", {}).items())
        self.console.print(
            f"look {k + 1} of {len(self.looks)} after {counted(n, 'seed')} "
            f"({elapsed:.0f} s): {shown}"
            + (f"; stopping: {state['stopped']['words']}" if reason else "")
        )
        if reason is not None and self.finish is not None:
            self.finish(folder, summaries)


def run_until_decided(
    cfg: GridConfig,
    out: Path,
    looker: Looker,
    looks: tuple[int, ...],
    *,
    train: Callable[..., dict[str, dict[str, Any]]],
    max_time_s: float | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    finish: AfterTraining | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Train in rounds at the seed counts ``looks`` until ``looker`` decides (module
    docstring), each round by ``train`` (a grid's train:
    :func:`normlab.experiment.execution.runner.run_experiment`'s signature). Returns the last
    round's {run_id: summary} and the looker's final state (also written to
    ``out/sequential.json``)."""
    console = console or Console()
    out = Path(out)
    rounds = _Rounds(cfg, looker, looks, max_time_s, console, finish, clock)
    summaries: dict[str, dict[str, Any]] = {}
    for k, n in enumerate(looks):
        cfg_k = cfg.model_copy(update={"seeds": seed_sequence(cfg, n)})
        console.print(f"round {k + 1}: seeds {', '.join(map(str, cfg_k.seed_list()))}")
        summaries = train(
            cfg_k,
            out,
            console=console,
            show_progress=show_progress,
            after_training=partial(rounds.look, k),
        )
        if rounds.stopped:
            break
    return summaries, looker.to_dict()


def sequential_tracker(
    cfg: GridConfig, spec: RoundsSpec
) -> tuple[SequentialTracker, tuple[int, ...]]:
    """The looker of ``cfg``'s rounds and their look schedule: the testbed's quality metric,
    its direction and the config's margin, looks after the seeds given, every 2 more and at
    ``spec.max_seeds``; ``ValueError`` naming ``--max-time`` or ``--max-seeds`` when the plan
    cannot run."""
    fmt = testbed_format(cfg.testbed)
    looks = look_schedule(len(cfg.seed_list()), spec.max_seeds)
    plan = plan_for(
        fmt.quality,
        lower_is_better=fmt.metric(fmt.quality).lower_is_better,
        margin=cfg.margin(),
        looks=looks,
        testbed=cfg.testbed,
    )
    base = cfg.baseline_arm()
    arms = [a for a in cfg.arm_names() if a != base]
    tracker = SequentialTracker(plan, arms, base, fmt.quality, fmt.short_unit, spec.max_time)
    return tracker, looks


def _pilot(cfg: GridConfig, out: Path) -> CompareFolder | None:
    """The compare folder ``out`` when it holds finished runs of ``cfg``'s experiment (module
    docstring), else None; reads only."""
    if not run_folder.has_experiment(out):
        return None
    try:
        folder = load_compare_folder(out)
    except (CompareFolderError, OSError):
        return None
    recorded = folder.experiment.get("config")
    if not isinstance(recorded, dict):
        return None

    def what(config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in config.items() if k not in HOW_KEYS}

    same = (folder.arms, folder.baseline_arm, folder.testbed) == (
        cfg.arm_names(),
        cfg.baseline_arm(),
        cfg.testbed,
    )
    return folder if same and what(recorded) == what(cfg.dump()) else None


def pilot_forecast(cfg: GridConfig, out: Path, console: Console) -> list[str]:
    """Say, before the rounds train anything, what a decision would cost when ``out`` holds a
    pilot of ``cfg``'s experiment whose quality question is open (module docstring); returns
    the lines said (none without a pilot or a price)."""
    folder = _pilot(cfg, out)
    if folder is None:
        return []
    lines = cost_lines(analyze(folder))
    if lines:
        seeds = {r.seed for r in folder.runs if r.done}
        console.print(
            f"pilot: {out} holds {counted(len(seeds), 'seed')} of this experiment; before "
            "training more:",
            highlight=False,
            markup=False,
        )
        for line in lines:
            console.print(f"  {line}", highlight=False, markup=False)
    return lines


def train_rounds(
    cfg: GridConfig,
    out: Path,
    spec: RoundsSpec,
    *,
    train: Callable[..., dict[str, dict[str, Any]]],
    console: Console,
    finish: AfterTraining,
) -> dict[str, dict[str, Any]]:
    """``--until-decided`` on the grid ``cfg`` into ``out``: say the plan, then
    :func:`run_until_decided` with the :func:`sequential_tracker`, each round by ``train``;
    returns the last round's {run_id: summary}."""
    tracker, looks = sequential_tracker(cfg, spec)
    fmt = testbed_format(cfg.testbed)
    margin = f"margin ±{cfg.margin():g} {fmt.short_unit}" if cfg.margin() else "no margin"
    console.print(
        f"until decided: looks after {', '.join(map(str, looks))} seeds on {fmt.quality}, "
        f"{margin}, at most {spec.max_time:g} s"
    )
    pilot_forecast(cfg, out, console)
    summaries, _ = run_until_decided(
        cfg, out, tracker, looks, max_time_s=spec.max_time, console=console, finish=finish,
        train=train,
    )  # fmt: skip
    return summaries
