"""``normlab report OUT``: rebuild the report of a compare folder from disk, without training."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from normlab._plural import counted
from normlab.cli.answer import print_answer
from normlab.cli.app import app
from normlab.cli.errors import EXIT_REFUSED, EXIT_USAGE, exit_status_help, is_usage_error
from normlab.run_format import (
    ANALYSIS_FILE,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
    RUNS_CSV_FILE,
)
from normlab.run_format import folder as run_folder

REPORT_HELP = (
    "Rebuild the verdict and report of a compare folder from its files, without training; or "
    "judge runs that a tracker already holds (--import)."
    "\n\n"
    "Writes summary.json, runs.csv, report.md, report.html and plots/*.png into OUT, holding the "
    "folder's lock (as `normlab compare` does)."
    "\n\n"
    "normlab report --import KIND:PATH --arm-from REGEX --seed-from REGEX --metric NAME [--margin "
    "X] --out OUT: read the runs of a TensorBoard log folder (tensorboard), an MLflow file store "
    "(mlflow), W&B offline run folders (wandb), or CSV / JSON Lines files with columns run, "
    "step and one per metric, or run, step, metric, value (csv, jsonl); take each run's arm and "
    "seed from its name (the regex's first group; MLflow also param:KEY[=REGEX] and "
    "tag:KEY[=REGEX], W&B config:KEY[=REGEX]); write them to OUT as a compare folder (replacing "
    "OUT only when it holds an earlier import of the same source), then build its report, which "
    "says which pairing checks could be made. A run whose tracker file is damaged or cut short "
    "is named and left out of the verdict, and so, unless --compare-unequal-steps, is a run "
    "that ended at an earlier step than another arm of its seed. See docs/own-loop.md."
    "\n\n"
    + exit_status_help(
        ok="when the report is built",
        refused="when OUT is not a readable compare folder (missing, damaged), is locked by a "
        "running command, or a file cannot be read or written (e.g. a full disk); or when an "
        "import's source cannot be used (a PATH that does not exist, no runs, damage that "
        "cannot be pinned on one run, rules that match no run, fewer than two arms, a metric "
        "no run logged, an --out that holds something else)",
        usage="when an option is missing, does not go with the others, or is malformed (an "
        "unknown KIND, a regex that does not compile, a --margin that is not > 0)",
    )
)
"""The help of ``normlab report``: one line per paragraph (Typer rewraps each)."""


_IMPORT_ONLY = {
    "arm_from": "--arm-from",
    "seed_from": "--seed-from",
    "metric": "--metric",
    "margin": "--margin",
    "baseline": "--baseline",
    "out_dir": "--out",
}
"""The options of ``--import`` only (with ``--lower-is-better/--higher-is-better`` and
``--compare-unequal-steps``): {parameter: option}."""


@app.command(help=REPORT_HELP)
def report(
    out: Annotated[
        Path | None,
        typer.Argument(
            metavar="OUT",
            help="The output folder of `normlab compare` (holds experiment.json); with --import, "
            "--out gives it instead.",
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--import",
            help="KIND:PATH of runs a tracker holds, KIND one of tensorboard, mlflow, wandb, "
            "csv, jsonl: import them into --out and report on them.",
        ),
    ] = None,
    arm_from: Annotated[
        str | None,
        typer.Option(
            help="With --import: a regex on each run's name whose first group (or whole match) "
            "is its arm, e.g. '^(.+)_s\\d+$' (MLflow: or param:KEY[=REGEX], tag:KEY[=REGEX]; "
            "W&B: or config:KEY[=REGEX])."
        ),
    ] = None,
    seed_from: Annotated[
        str | None,
        typer.Option(help="With --import: the same for the seed (an integer), e.g. '_s(\\d+)$'."),
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(help="With --import: the logged metric that decides quality."),
    ] = None,
    lower_is_better: Annotated[
        bool,
        typer.Option(
            "--lower-is-better/--higher-is-better", help="With --import: the metric's direction."
        ),
    ] = True,
    margin: Annotated[
        float | None,
        typer.Option(
            help="With --import: the difference in the metric that does not matter (the "
            "equivalence margin, in the metric's unit). Without it the verdict is better, "
            "worse or not determined, never equivalent."
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="With --import: the arm the others are compared with (default: the "
            "first in name order)."
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="With --import: the compare folder to write."),
    ] = None,
    compare_unequal_steps: Annotated[
        bool,
        typer.Option(
            "--compare-unequal-steps",
            help="With --import: compare a run that ended at an earlier step than another arm "
            "of its seed on its last value (e.g. early stopping). Default: such a run is left "
            "out of the verdict and listed, as cut short.",
        ),
    ] = False,
) -> None:
    """Rebuild the report; what it does is :data:`REPORT_HELP` (its ``--help``)."""
    from normlab.cli.errors import print_error

    def fail(message: str, code: int) -> typer.Exit:
        print_error("report", message)
        return typer.Exit(code=code)

    flags = {k: v for k, v in locals().items() if k in _IMPORT_ONLY}
    if source is None:
        given = [_IMPORT_ONLY[k] for k, v in flags.items() if v is not None]
        if not lower_is_better:
            given.append("--higher-is-better")
        if compare_unequal_steps:
            given.append("--compare-unequal-steps")
        if given:
            raise fail(
                f"{given[0]}: an option of --import; expected normlab report OUT, or normlab "
                "report --import KIND:PATH … --out OUT",
                EXIT_USAGE,
            )
        if out is None:
            raise fail(
                "OUT: expected the output folder of normlab compare (normlab report OUT), or "
                "--import KIND:PATH … --out OUT",
                EXIT_USAGE,
            )
        _build(out, fail)
        return
    if out is not None:
        raise fail(
            f"OUT: with --import the folder is given by --out; got {str(out)!r} as well",
            EXIT_USAGE,
        )
    written = _import(
        source,
        {
            "arm_from": arm_from,
            "seed_from": seed_from,
            "metric": metric,
            "lower_is_better": lower_is_better,
            "margin": margin,
            "baseline": baseline,
            "compare_unequal_steps": compare_unequal_steps,
        },
        out_dir,
        fail,
    )
    _build(written, fail)


def _status(err: BaseException) -> int:
    """The exit status of a refusal: :data:`EXIT_USAGE` for an option as written (a malformed
    ``--import`` option), else :data:`EXIT_REFUSED` (a folder, file or source that cannot be
    used: missing, damaged, locked, not UTF-8, runs that do not fit the options)."""
    return EXIT_USAGE if is_usage_error(err) else EXIT_REFUSED


_IMPORT_NEEDS = {
    "arm_from": "--arm-from: expected a regex whose first group is each run's arm, e.g. "
    "--arm-from '^(.+)_s\\d+$'",
    "seed_from": "--seed-from: expected a regex whose first group is each run's seed, e.g. "
    "--seed-from '_s(\\d+)$'",
    "metric": "--metric: expected the name of the logged metric that decides quality, e.g. "
    "--metric val_loss",
}


def _import(
    source: str,
    options: dict[str, Any],
    out: Path | None,
    fail: Callable[[str, int], typer.Exit],
) -> Path:
    """``--import``: check the options, read and check the tracker's runs, write them to ``out``
    (holding its lock) and print what was imported and which pairing checks could be made.
    Returns the folder."""
    from normlab.cli.errors import check_utf8_path, describe_error
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report.imported import pairing_lines
    from normlab.trackers.importing import check_out, parse_source, plan_import, write_import

    for key, message in _IMPORT_NEEDS.items():
        if not options[key]:
            raise fail(message, EXIT_USAGE)
    if out is None:
        raise fail("--out: expected the folder to write the imported runs to", EXIT_USAGE)
    created = not out.exists()
    try:
        check_utf8_path(out, "--out")
        kind, path = parse_source(source)
        check_out(out, kind, path)
        plan = plan_import(source, **options)
        with OutputLock(out):
            check_out(out, kind, path)
            written = write_import(plan, out)
    except FolderLockedError as err:
        raise fail(str(err), EXIT_REFUSED) from None
    except (ValueError, OSError, MemoryError, UnicodeError) as err:
        if created:  # the lock made the folder; nothing was imported into it
            shutil.rmtree(out, ignore_errors=True)
        raise fail(describe_error(err) or str(err), _status(err)) from None
    console = Console()
    arms = ", ".join(plan.arms)
    console.print(
        escape(
            f"imported {counted(len(plan.runs), 'run')} from {plan.source} into {written}: "
            f"arms {arms} (baseline {plan.arms[0]}), seeds {', '.join(map(str, plan.seeds))}, "
            f"judged on {plan.metric} ({'lower' if plan.lower_is_better else 'higher'} is better)"
        ),
        highlight=False,
        soft_wrap=True,
    )
    for left in plan.skipped:
        which = f" (arm {left['arm']}, seed {left['seed']})" if "arm" in left else ""
        line = f"left out {left['run']}{which}: {left['reason']}"
        console.print(escape(line), highlight=False, soft_wrap=True)
    for line in pairing_lines(run_folder.read_experiment(written)):
        console.print(escape(f"pairing: {line}"), highlight=False, soft_wrap=True)
    return written


def _build(out: Path, fail: Callable[[str, int], typer.Exit]) -> None:
    """Build the report of the compare (or ladder) folder ``out`` and print where it is."""
    from normlab.cli.errors import check_utf8_path, describe_error
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report import build_report  # matplotlib is imported only when needed

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
        raise fail(str(err), EXIT_REFUSED) from None
    except (ValueError, OSError, MemoryError, UnicodeError) as err:  # CompareFolderError too
        raise fail(describe_error(err) or str(err), _status(err)) from None
    summary = written[ANALYSIS_FILE]
    console = Console()
    console.print(f"Report: {written[REPORT_HTML_FILE]}")
    console.print(f"        {written[REPORT_MD_FILE]}")
    console.print(f"Data:   {summary}, {written[RUNS_CSV_FILE]}")
    print_answer(console, out)


def _ladder_report(out: Path, fail: Callable[[str, int], typer.Exit]) -> None:
    """A ladder folder (``compare --ladder``): every rung's report, then the ladder's analysis
    (:func:`normlab.study.ladder.analyse_ladder`) and report, its fit and prediction lines
    last."""
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report import build_report
    from normlab.report.ladder_report import build_ladder_report
    from normlab.study.ladder import analyse_ladder, ladder_lines

    console = Console()
    try:
        plan = run_folder.read_ladder_plan(out)
        for setting in plan.get("rungs", []):
            rung = run_folder.rung_path(out, setting)
            with OutputLock(rung):
                build_report(rung)
            console.print(f"rung {setting}: {rung / REPORT_MD_FILE}")
        with OutputLock(out):
            ladder = analyse_ladder(out)
            written = build_ladder_report(out)
    except FolderLockedError as err:
        raise fail(str(err), EXIT_REFUSED) from None
    except (ValueError, OSError, KeyError) as err:  # CompareFolderError too
        raise fail(str(err), _status(err)) from None
    console.print(f"Report: {written[REPORT_HTML_FILE]}")
    console.print(f"        {written[REPORT_MD_FILE]}")
    for line in ladder_lines(ladder):
        console.print(escape(line), soft_wrap=True, highlight=False)
