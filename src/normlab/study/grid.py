"""The study's one way to a grid of arms × seeds, whoever trains it: normlab's own testbeds
(:mod:`normlab.experiment.execution.runner`) or a user's ``--script``
(:mod:`normlab.experiment.execution.script_grid`).

Everything the study does to a grid goes through :class:`Grid`: train it (with the step to run
on the finished, still locked folder), prepare it for ``--plan``, and which of its runs are
settled enough to export. :func:`grid_of` is the one place that tells the two kinds apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from normlab.experiment.config import ScriptConfig
from normlab.experiment.execution import executors, runner, script_grid
from normlab.experiment.execution.executors import Executor
from normlab.study.spec import GridConfig

__all__ = ["Grid", "grid_of", "make_executor"]

Summaries = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Grid:
    """One kind of grid: ``train(cfg, out, console=, show_progress=, after_training=,
    executor=)`` → {run_id: summary}; ``plan(cfg, out, console=)`` → the ids of the runs to
    train; ``settled(summaries)``: the runs whose result is final (a script's runs once their
    seed's pairing is checked); ``exports_each_run``: whether a run can be exported as soon as
    it ends; ``paths(cfg)``: {option: path} of what the grid reads and names in its report."""

    train: Callable[..., Summaries]
    plan: Callable[..., list[str]]
    settled: Callable[[Summaries], list[str]]
    exports_each_run: bool
    paths: Callable[[Any], dict[str, Any]]


def _own_grid() -> Grid:
    # looked up at each call, so that a stand-in for the runner (in tests) is the one used
    return Grid(
        train=lambda *a, **k: runner.run_experiment(*a, **k),
        plan=lambda *a, **k: runner.plan_experiment(*a, **k),
        settled=list,
        exports_each_run=True,
        paths=lambda cfg: {"data": cfg.data.path},
    )


def _script_grid() -> Grid:
    return Grid(
        train=lambda *a, **k: script_grid.run_script_experiment(*a, **k),
        plan=lambda *a, **k: script_grid.plan_script_experiment(*a, **k),
        settled=script_grid.settled_runs,
        exports_each_run=False,
        paths=lambda cfg: {},
    )


def grid_of(cfg: GridConfig) -> Grid:
    """The :class:`Grid` that trains ``cfg``."""
    return _script_grid() if isinstance(cfg, ScriptConfig) else _own_grid()


def make_executor(cfg: GridConfig, on_result: Callable[[str], None] | None = None) -> Executor:
    """The executor of ``cfg.scale`` (``local`` or ``ray``), calling ``on_result(run_id)`` as
    each run ends; ``ValueError`` naming ``--executor``."""
    return executors.make_executor(cfg.scale, on_result=on_result)
