"""The study's one way to a grid of arms × seeds, whoever trains it: normlab's own testbeds or a
user's ``--script`` — one runner for both (:mod:`normlab.experiment.execution.runner`), what
differs between them behind :class:`~normlab.experiment.execution.kinds.GridKind`.

Everything the study does to a grid goes through :class:`Grid`: train it (with the step to run
on the finished, still locked folder), prepare it for ``--plan``, which of its runs are settled
enough to export, and the paths it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from normlab.experiment.execution import executors, runner
from normlab.experiment.execution.executors import Executor
from normlab.experiment.execution.kinds import grid_kind
from normlab.study.spec import GridConfig

__all__ = ["Grid", "grid_of", "make_executor"]

Summaries = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Grid:
    """One grid: ``train(cfg, out, console=, show_progress=, after_training=, executor=)`` →
    {run_id: summary}; ``plan(cfg, out, console=)`` → the ids of the runs to train;
    ``settled(summaries)``: the runs whose result is final (a script's runs once their seed's
    pairing is checked); ``exports_each_run``: whether a run can be exported as soon as it
    ends; ``paths``: {option: path} of what the grid reads."""

    train: Callable[..., Summaries]
    plan: Callable[..., list[str]]
    settled: Callable[[Summaries], list[str]]
    exports_each_run: bool
    paths: dict[str, Any]


def grid_of(cfg: GridConfig) -> Grid:
    """The :class:`Grid` that trains ``cfg`` (its kind's :class:`GridKind`)."""
    kind = grid_kind(cfg)
    return Grid(
        # looked up at each call, so that a stand-in for the runner (in tests) is the one used
        train=lambda *a, **k: runner.train_grid(*a, **k),
        plan=lambda *a, **k: runner.plan_grid(*a, **k),
        settled=kind.settled,
        exports_each_run=kind.exports_each_run,
        paths=kind.paths(),
    )


def make_executor(cfg: GridConfig, on_result: Callable[[str], None] | None = None) -> Executor:
    """The executor of ``cfg.scale`` (``local`` or ``ray``), calling ``on_result(run_id)`` as
    each run ends; ``ValueError`` naming ``--executor``."""
    return executors.make_executor(cfg.scale, on_result=on_result)
