"""``compare --until-decided``: train paired seeds in rounds until the question is decided.

The look schedule ``looks`` is given, fixed before the first look: after n_1 = the seeds asked
for, then every 2 more, and at ``--max-seeds`` (:func:`normlab.analysis.sequential.look_schedule`,
where its default lives with the α-spending it sets). Round k trains the grid with the first n_k
seeds by :func:`train_grid` into the same ``out``, so every run already finished there (from
an earlier round, or an earlier command) is reused; after it trains, while the folder is still
locked, the ``looker`` looks at the runs (the decision rule lives on the analysis side; the CLI
passes it in, since this package does not import the analysis) and its state is written to
``sequential.json``.

The rounds stop when the looker says every arm is decided, after the last planned look, or
when the next round would overrun ``max_time_s`` (counted from the call): its duration is
estimated as (new runs) × (median training time of the runs so far × 1.25 + 2 s start-up) /
``parallel``. A run that is already on disk costs nothing, so the same command run again after
a time stop continues where it stopped. The ``finish`` step (the report) runs once, on the last
round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.runner import AfterTraining, train_grid
from normlab.run_format import folder as run_folder

__all__ = [
    "DEFAULT_MAX_TIME_S",
    "Looker",
    "round_seconds",
    "run_until_decided",
    "seed_sequence",
]

DEFAULT_MAX_TIME_S = 360.0
"""No round of ``--until-decided`` starts that would end later than this, by default."""
RUN_OVERHEAD_S = 2.0
"""Seconds a run costs besides its training time (process start, model build)."""


class Looker(Protocol):
    """The decision side of the rounds (:class:`normlab.analysis.rounds.SequentialTracker`)."""

    def look(
        self, n_seeds: int, summaries: Mapping[str, Mapping[str, Any]], elapsed_s: float = 0.0
    ) -> bool: ...

    def stop(self, reason: str, n_seeds: int) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...


def seed_sequence(cfg: ExperimentConfig, n: int) -> list[int]:
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


def run_until_decided(
    cfg: ExperimentConfig,
    out: Path,
    looker: Looker,
    looks: tuple[int, ...],
    *,
    max_time_s: float | None = None,
    console: Console | None = None,
    show_progress: bool = True,
    finish: AfterTraining | None = None,
    train: Callable[..., dict[str, dict[str, Any]]] = train_grid,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Train in rounds at the seed counts ``looks`` until ``looker`` decides (module
    docstring). Returns the last round's {run_id: summary} and the looker's final state (also
    written to ``out/````sequential.json``). ``train`` is :func:`train_grid` (or a
    stand-in with its signature, for tests)."""
    console = console or Console()
    out = Path(out)
    started = clock()
    n_arms = len(cfg.arm_names())
    stop: dict[str, Any] = {}

    def after(k: int) -> AfterTraining:
        n = looks[k]

        def step(folder: Path, summaries: dict[str, dict[str, Any]]) -> None:
            elapsed = clock() - started
            decided = looker.look(n, summaries, elapsed)
            reason = None
            if decided:
                reason = "decided"
            elif k == len(looks) - 1:
                reason = "max-seeds"
            elif max_time_s is not None:
                more = round_seconds(summaries, (looks[k + 1] - n) * n_arms, cfg.parallel)
                if elapsed + more > max_time_s:
                    reason = "max-time"
            if reason is not None:
                looker.stop(reason, n)
                stop["reason"] = reason
            run_folder.write_sequential(folder, looker.to_dict())
            verdicts = looker.to_dict().get("verdicts", {})
            shown = ", ".join(f"{arm} {v}" for arm, v in verdicts.items())
            console.print(
                f"look {k + 1} of {len(looks)} after {n} seeds ({elapsed:.0f} s): {shown}"
                + (f"; stopping: {looker.to_dict()['stopped']['words']}" if reason else "")
            )
            if reason is not None and finish is not None:
                finish(folder, summaries)

        return step

    summaries: dict[str, dict[str, Any]] = {}
    for k, n in enumerate(looks):
        cfg_k = cfg.model_copy(update={"seeds": seed_sequence(cfg, n)})
        console.print(f"round {k + 1}: seeds {', '.join(map(str, cfg_k.seed_list()))}")
        summaries = train(
            cfg_k, out, console=console, show_progress=show_progress, after_training=after(k)
        )
        if stop:
            break
    return summaries, looker.to_dict()
