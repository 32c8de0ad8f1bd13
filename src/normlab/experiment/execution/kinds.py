"""The kinds of grid behind one interface, chosen by the config itself.

Every grid is arms × seeds, planned, locked, recorded and trained the same way
(:mod:`normlab.experiment.execution.runner`); what differs between the kinds sits behind
:class:`GridKind`: what is checked before anything is written, how the runs are planned (their
``run.json``: whose ``script`` section, if any, tells the worker to run the user's command
instead of normlab's loop), what the terminal is told of the pairing, what ``experiment.json``
holds, what is checked after training (and after one planned run, ``compare --run``, where
only the folder is known: :func:`recorded_kind` tells the kind from ``experiment.json``). A
config names its kind (``grid_kind``, a class
attribute of :class:`normlab.experiment.config.GridConfig`) and :data:`GRID_KINDS` maps the
name to the class that implements it:

- :class:`~normlab.experiment.execution.own_grid.OwnGrid` (``own``): normlab's own runs of a
  registered testbed, checked paired before training;
- :class:`~normlab.experiment.execution.script_grid.ScriptGrid` (``script``): a user's script,
  whose pairing is checked after training from the fingerprints the runs recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from normlab.experiment.config import OWN_GRID, SCRIPT_GRID, GridConfig
from normlab.experiment.execution.own_grid import OwnGrid
from normlab.experiment.execution.script_grid import ScriptGrid
from normlab.run_format.testbeds import parse_script_testbed

__all__ = ["GRID_KINDS", "GridKind", "grid_kind", "recorded_kind"]


class GridKind(Protocol):
    """What differs between kinds of grid, for one config; the runner calls the methods in
    this order: :meth:`check`, then, holding the folder's lock, :meth:`plan`,
    :meth:`describe`, :meth:`record`, and after training :meth:`after_training`."""

    exports_each_run: bool
    """True when a run may be exported to the trackers as soon as it ends; else only the runs
    :meth:`settled` names are final."""

    def check(self, out: Path) -> None:
        """Check what can be checked before ``out`` is created or written; raise
        ``ValueError`` naming the option."""
        ...

    def plan(self, out: Path, console: Console) -> list[dict[str, Any]]:
        """Prepare what the runs need in ``out`` (the data) and return every run's config
        (``run.json``), seed-major; raise ``ValueError`` for a grid that cannot be paired."""
        ...

    def describe(self, runs: list[dict[str, Any]], console: Console) -> None:
        """Print what the grid pairs and what it costs."""
        ...

    def record(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """The content of ``experiment.json``."""
        ...

    def after_training(
        self, runs: list[dict[str, Any]], out: Path, console: Console
    ) -> dict[str, dict[str, Any]]:
        """Check the trained runs (a pairing that could not be checked before); return
        {run_id: summary} of the runs it rewrote."""
        ...

    def settled(self, summaries: dict[str, dict[str, Any]]) -> list[str]:
        """The runs of ``summaries`` whose result is final (no later check can refuse it)."""
        ...

    def paths(self) -> dict[str, Any]:
        """{option: path} of what the grid reads from disk besides its folder (checked to be
        UTF-8 before training)."""
        ...

    @staticmethod
    def after_planned_run(out: Path, run_id: str, console: Console) -> list[str]:
        """After ``compare --run run_id`` trained a planned run of ``out``: check what can be
        checked now, and return the runs whose result is now final (to export)."""
        ...


GRID_KINDS: dict[str, type[OwnGrid] | type[ScriptGrid]] = {
    OWN_GRID: OwnGrid,
    SCRIPT_GRID: ScriptGrid,
}
"""The kinds of grid, by the name a config gives as ``grid_kind``."""


def grid_kind(cfg: GridConfig) -> GridKind:
    """The :class:`GridKind` of ``cfg``, as its ``grid_kind`` names it."""
    return GRID_KINDS[cfg.grid_kind](cfg)


def recorded_kind(experiment: Mapping[str, Any]) -> type[OwnGrid] | type[ScriptGrid]:
    """The kind of grid that wrote ``experiment`` (an ``experiment.json``): a script's runs
    record their testbed as ``script:<metric>:min|max``, every other testbed is normlab's own.
    Where a command has only the folder (``compare --run``), the kind is told here, once."""
    script = parse_script_testbed(experiment.get("testbed")) is not None
    return GRID_KINDS[SCRIPT_GRID if script else OWN_GRID]
