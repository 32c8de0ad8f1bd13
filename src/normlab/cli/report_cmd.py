"""``normlab report OUT``: rebuild the report of a compare folder from disk, without training."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from normlab.analysis.runs import CompareFolderError
from normlab.cli.answer import print_answer
from normlab.cli.app import app
from normlab.run_format import ANALYSIS_FILE, REPORT_HTML_FILE, REPORT_MD_FILE, RUNS_CSV_FILE


@app.command()
def report(
    out: Annotated[
        Path,
        typer.Argument(help="The output folder of `normlab compare` (holds experiment.json)."),
    ],
) -> None:
    """Rebuild the verdict and report of a compare folder from its files, without training.

    Writes summary.json, runs.csv, report.md, report.html and plots/*.png into OUT.
    """
    from normlab.report import build_report  # matplotlib is imported only when needed

    try:
        written = build_report(out)
    except CompareFolderError as err:
        typer.echo(f"normlab report: error: {err}", err=True)
        raise typer.Exit(code=2) from err
    summary = written[ANALYSIS_FILE]
    console = Console()
    console.print(f"Report: {written[REPORT_HTML_FILE]}")
    console.print(f"        {written[REPORT_MD_FILE]}")
    console.print(f"Data:   {summary}, {written[RUNS_CSV_FILE]}")
    print_answer(console, out)
