"""``normlab report OUT``: rebuild the report of a compare folder from disk, without training."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from normlab.analysis.runs import CompareFolderError
from normlab.cli.answer import print_answer
from normlab.cli.app import app
from normlab.run_format import (
    ANALYSIS_FILE,
    LADDER_KEY,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
    RUNS_CSV_FILE,
)
from normlab.run_format import folder as run_folder

REPORT_HELP = (
    "Rebuild the verdict and report of a compare folder from its files, without training."
    "\n\n"
    "Writes summary.json, runs.csv, report.md, report.html and plots/*.png into OUT, holding the "
    "folder's lock (as `normlab compare` does)."
    "\n\n"
    "Exit status: 0 when built; 1 when the folder is locked by a running command, or a file "
    "cannot be read or written (e.g. a full disk, a damaged metrics.jsonl); 2 when OUT is not a "
    "readable compare folder."
)
"""The help of ``normlab report``: one line per paragraph (Typer rewraps each)."""


@app.command(help=REPORT_HELP)
def report(
    out: Annotated[
        Path,
        typer.Argument(help="The output folder of `normlab compare` (holds experiment.json)."),
    ],
) -> None:
    """Rebuild the report; what it does is :data:`REPORT_HELP` (its ``--help``)."""
    from normlab.cli.errors import check_utf8_path, describe_error, print_error
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report import build_report  # matplotlib is imported only when needed

    def fail(message: str, code: int) -> typer.Exit:
        print_error("report", message)
        return typer.Exit(code=code)

    if run_folder.has_ladder_plan(out):
        _ladder_report(out, fail)
        return
    try:
        check_utf8_path(out, "OUT")
        if run_folder.has_experiment(out):
            with OutputLock(out):
                written = build_report(out)
        else:  # not a compare folder: build_report says so, and no lock file is created
            written = build_report(out)
    except FolderLockedError as err:
        raise fail(str(err), 1) from None
    except CompareFolderError as err:
        raise fail(str(err), 2) from None
    except (ValueError, OSError, MemoryError, UnicodeError) as err:
        raise fail(describe_error(err) or str(err), 1) from None
    summary = written[ANALYSIS_FILE]
    console = Console()
    console.print(f"Report: {written[REPORT_HTML_FILE]}")
    console.print(f"        {written[REPORT_MD_FILE]}")
    console.print(f"Data:   {summary}, {written[RUNS_CSV_FILE]}")
    print_answer(console, out)


def _ladder_report(out: Path, fail: Callable[[str, int], typer.Exit]) -> None:
    """A ladder folder (``compare --ladder``): every rung's report, then the ladder's, its
    prediction sentences last."""
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report import build_report
    from normlab.report.ladder_report import build_ladder_report, prediction_lines

    console = Console()
    try:
        plan = run_folder.read_ladder_plan(out)
        for setting in plan.get("rungs", []):
            rung = run_folder.rung_path(out, setting)
            with OutputLock(rung):
                build_report(rung)
            console.print(f"rung {setting}: {rung / REPORT_MD_FILE}")
        with OutputLock(out):
            written = build_ladder_report(out)
        ladder = run_folder.read_analysis(out)[LADDER_KEY]
    except FolderLockedError as err:
        raise fail(str(err), 1) from None
    except CompareFolderError as err:
        raise fail(str(err), 2) from None
    except (ValueError, OSError, KeyError) as err:
        raise fail(str(err), 1) from None
    console.print(f"Report: {written[REPORT_HTML_FILE]}")
    console.print(f"        {written[REPORT_MD_FILE]}")
    for line in prediction_lines(ladder):
        console.print(escape(line), soft_wrap=True, highlight=False)
