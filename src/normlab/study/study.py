"""The :class:`Study`: what one ``normlab compare`` does, from its :class:`StudySpec` to the
trained folder.

A study is a plan of grids made by transforms: a plain compare is one grid; ``--lr-sweep``
first trains one tuning grid per rate and gives each arm its best rate
(:mod:`normlab.study.sweep`); ``--ladder`` makes one compare per model size
(:mod:`normlab.study.ladder`); ``--until-decided`` trains a grid in rounds of seeds
(:mod:`normlab.study.rounds`); ``--plan`` prepares the grids instead of training them
(:mod:`normlab.study.plan`). Every grid is trained by :meth:`Study.train`, through its
:class:`~normlab.study.grid.Grid`, with one step on the trained folder while it is still locked
(:class:`Finish`: the command recorded, the runs exported, the report built). A study stops
short with a :class:`~normlab.study.errors.StudyError`, which the command turns into its exit
status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from normlab.experiment.execution.runner import check_out_contents, check_out_path
from normlab.run_format import DONE_STATUSES, REPORT_HTML_FILE, REPORT_MD_FILE
from normlab.run_format import folder as run_folder
from normlab.study.errors import NoResult, Refused, ReportNotBuilt, training_errors
from normlab.study.grid import grid_of, make_executor
from normlab.study.ladder import run_ladder
from normlab.study.plan import emit_plan, plan_grid
from normlab.study.rounds import train_rounds
from normlab.study.spec import GridConfig, RoundsSpec, StudySpec
from normlab.study.sweep import sweep_one
from normlab.trackers.exporting import Exporter, check_installed

__all__ = ["Finish", "Study", "status_counts"]

Summaries = dict[str, dict[str, Any]]


def status_counts(summaries: Summaries) -> dict[str, int]:
    """{status: number of runs} over the runs' summaries."""
    counts: dict[str, int] = {}
    for summary in summaries.values():
        status = str(summary.get("status", "?"))
        counts[status] = counts.get(status, 0) + 1
    return counts


class Finish:
    """The step run on a trained grid's folder while it is still locked (a grid's
    ``after_training``): record the command's flags (``args``) for the settling command, remove
    the sequential state an earlier ``--until-decided`` left unless this grid is ``sequential``,
    export the settled runs to the trackers (``exporter``), and build the report (``report``)
    when a run finished or diverged."""

    def __init__(
        self,
        console: Console,
        args: tuple[str, ...],
        *,
        sequential: bool,
        report: bool,
        exporter: Exporter | None,
        settled: Callable[[Summaries], list[str]],
    ) -> None:
        self.console, self.args, self.sequential = console, args, sequential
        self.report, self.exporter, self.settled = report, exporter, settled

    def __call__(self, out: Path, summaries: Summaries) -> None:
        run_folder.write_command(out, self.args)
        if not self.sequential:
            run_folder.clear_sequential(out)
        if self.exporter is not None:
            self.exporter.export(self.settled(summaries))
        if not self.report:
            return
        if not any(s.get("status") in DONE_STATUSES for s in summaries.values()):
            self.console.print("report: not built, since no run finished or diverged")
            return
        try:
            build_report(out, self.console)
        except (ValueError, OSError, MemoryError, UnicodeError) as err:
            raise ReportNotBuilt(out, err) from err


def build_report(out: Path, console: Console) -> bool:
    """Build the report of the compare folder ``out`` (:func:`normlab.report.build_report`)
    and say where it is; returns whether it ran (False, saying why, when the report's module
    cannot be imported)."""
    try:
        from normlab.report import build_report as build  # its figures: imported when needed
    except ImportError as err:
        console.print(f"report: not built ({escape(str(err))}); the runs are in {out}")
        return False
    build(Path(out))
    console.print(f"report: {Path(out) / REPORT_MD_FILE} and {Path(out) / REPORT_HTML_FILE}")
    return True


class Study:
    """One ``normlab compare`` (module docstring): ``spec`` says what, ``console`` is where it
    says so, ``started`` when the command began (for the closing line's duration)."""

    def __init__(
        self, spec: StudySpec, console: Console | None = None, started: float | None = None
    ) -> None:
        self.spec = spec
        self.console = console or Console()
        self.started = time.perf_counter() if started is None else started

    def run(self) -> Path | None:
        """Run the study; returns the compare folder whose answer the command prints (None
        for a ladder or a plan, which say their own)."""
        spec = self.spec
        try:
            check_installed(spec.grid.log_to)
        except ValueError as err:
            raise Refused(err) from None
        if spec.ladder is not None:
            run_ladder(self, spec.ladder)
            return None
        if spec.plan:
            console = Console(stderr=True)
            emit_plan(spec.out, plan_grid(spec.grid, spec.out, console), console, "")
            return None
        cfg = spec.grid
        if spec.sweep is not None:
            try:
                check_out_path(spec.out)
                check_out_contents(spec.out)
            except ValueError as err:
                raise Refused(err) from None
            cfg = sweep_one(self, cfg, spec.sweep)
        summaries = self.train(cfg, spec.out, report=spec.report, rounds=spec.rounds)
        self.check_results(summaries, spec.out)
        return spec.out

    def train(
        self, cfg: GridConfig, out: Path, *, report: bool, rounds: RoundsSpec | None
    ) -> Summaries:
        """Train the grid ``cfg`` into ``out`` (in ``--until-decided`` rounds with ``rounds``)
        with the :class:`Finish` step; returns {run_id: summary}. What stops it early is a
        :class:`~normlab.study.errors.StudyError`."""
        grid = grid_of(cfg)
        log_to = tuple(cfg.log_to)
        exporter = Exporter(out, log_to, self.console.print) if log_to else None
        # normlab's own runs are exported as each ends; a script's once its seed is checked
        each = exporter.export_one if exporter is not None and grid.exports_each_run else None
        try:
            executor = make_executor(cfg, each)
        except ValueError as err:
            raise Refused(err) from None
        finish = Finish(
            self.console,
            self.spec.args,
            sequential=rounds is not None,
            report=report,
            exporter=exporter,
            settled=grid.settled,
        )
        try:
            with training_errors():
                if rounds is not None:
                    train = partial(grid.train, executor=executor)
                    return train_rounds(
                        cfg, out, rounds, train=train, console=self.console, finish=finish
                    )
                return grid.train(
                    cfg, out, console=self.console, after_training=finish, executor=executor
                )
        finally:
            if exporter is not None:
                exporter.close()

    def check_results(self, summaries: Summaries, out: Path) -> None:
        """Say how the runs ended; :class:`NoResult` when none finished or diverged."""
        counts = status_counts(summaries)
        shown = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        elapsed = time.perf_counter() - self.started
        self.console.print(f"done in {elapsed:.0f} s: {shown}; results in {out}")
        if not counts.get("finished") and not counts.get("diverged"):
            where = run_folder.summary_path(run_folder.runs_path(out) / "<run>")
            raise NoResult(f"no run finished or diverged; each run's error is in {where}")
