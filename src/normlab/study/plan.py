"""``compare --plan`` and ``compare --run RUN_ID``: a grid prepared here, trained elsewhere.

``--plan`` prepares the folder (data, ``experiment.json``, a ``run.json`` per run not done) and
prints one self-contained command per run on standard output (:func:`plan_commands`; all else
goes to standard error, so the output can be piped to a scheduler). ``--run`` trains one such
run by its id (:func:`train_planned`); a ladder's run id is ``<setting>/<run_id>``, in the
rung's compare folder. What follows a planned run is :func:`after_planned_run`: a script's
pairing guard once its seed is complete, and the export of what is settled.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rich.console import Console

from normlab._plural import counted
from normlab.experiment.execution.kinds import recorded_kind
from normlab.experiment.execution.lock import FolderLockedError
from normlab.experiment.execution.runner import run_planned
from normlab.run_format import DONE_STATUSES
from normlab.run_format import folder as run_folder
from normlab.study.errors import NoResult, Refused
from normlab.study.grid import grid_of
from normlab.study.spec import GridConfig
from normlab.trackers.exporting import Exporter

__all__ = [
    "after_planned_run",
    "emit_plan",
    "plan_commands",
    "plan_grid",
    "train_planned",
]


def plan_commands(out: Path, run_ids: list[str]) -> list[str]:
    """One self-contained shell command per run: ``normlab compare --out OUT --run RUN_ID``
    (OUT absolute, so it runs from any folder)."""
    folder = shlex.quote(str(Path(out).absolute()))
    return [f"normlab compare --out {folder} --run {shlex.quote(r)}" for r in run_ids]


def emit_plan(out: Path, run_ids: list[str], console: Console, what: str) -> None:
    """Print the runs' commands on standard output, one a line, then (on ``console``) how
    many runs ``what`` holds and what to do next."""
    for command in plan_commands(out, run_ids):
        print(command, flush=True)
    console.print(
        f"plan: {counted(len(run_ids), 'run')}{what} to train in {out}; run each command above "
        f"(any order, any number at once), then: normlab report {out}"
    )


def plan_grid(cfg: GridConfig, out: Path, console: Console) -> list[str]:
    """Prepare the grid ``cfg`` in ``out`` for running one run at a time; the ids of the runs
    still to train. :class:`Refused` for a locked folder or a refused check."""
    try:
        return grid_of(cfg).plan(cfg, out, console=console)
    except (FolderLockedError, ValueError) as err:
        raise Refused(err) from None


def train_planned(out: Path, run_id: str, console: Console) -> dict[str, Any]:
    """``--run RUN_ID``: train that planned run of ``out`` (its run.json says how), then what
    follows it (:func:`after_planned_run`); returns its summary. :class:`Refused` when the run
    or the folder is not there, is locked or holds a damaged file it reads, :class:`NoResult`
    (nothing more to say) when the run neither finished nor diverged."""
    rung = run_folder.split_ladder_run_id(run_id)
    if rung is not None:  # a ladder's run: <setting>/<run_id>, in the rung's compare folder
        out, run_id = run_folder.rung_path(out, rung[0]), rung[1]
    try:
        summary = run_planned(out, run_id, console=console)
        summary = after_planned_run(out, run_id, summary, console)
    except (FolderLockedError, ValueError) as err:
        raise Refused(err) from None
    if summary.get("status") not in DONE_STATUSES:
        raise NoResult(None)
    return summary


def after_planned_run(
    out: Path, run_id: str, summary: dict[str, Any], console: Console
) -> dict[str, Any]:
    """What follows a planned run (``--run``) in the folder ``out``: what its kind of grid
    checks then (:meth:`GridKind.after_planned_run` of the kind that wrote experiment.json,
    :func:`~normlab.experiment.execution.kinds.recorded_kind`: for a script's run, the pairing
    guard of its seed once every arm of the seed has a result); then the export of
    what is settled to the trackers that the planning command's ``--log-to`` recorded. Returns
    the run's summary as it now stands; ``ValueError`` naming a damaged ``experiment.json`` or
    summary of the seed (the guard is never skipped in silence)."""
    experiment = run_folder.read_experiment(out)  # checked by run_planned: never skipped
    settled = recorded_kind(experiment).after_planned_run(out, run_id, console)
    summary = run_folder.read_summary(run_folder.run_dir(out, run_id)) or summary
    config = experiment.get("config")
    kinds = config.get("log_to") if isinstance(config, dict) else None
    if kinds and settled:
        exporter = Exporter(out, tuple(kinds), console.print)
        try:
            exporter.export(settled)
        finally:
            exporter.close()
    return summary
