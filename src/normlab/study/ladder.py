"""``compare --ladder``: one compare per model size, then the difference against the size.

:func:`run_ladder` checks the ladder (:func:`normlab.study.rungs.plan_ladder`) and ``--out``
before anything is written, writes ``ladder.json``, then with ``--lr-sweep`` the tuning runs of
the swept rungs and each arm's choice (:mod:`normlab.study.sweep`), then per rung what a compare
does (``--plan``: prepare and list its runs as ``<setting>/<run_id>``; else train it, in
``--until-decided`` rounds when asked, with its report), and last the ladder's answer:
:func:`analyse_ladder` fits each arm's difference against log N and predicts it at the target
(:func:`normlab.analysis.ladder_folder.analyze_ladder`), writes it to the ladder folder's
summary.json through :mod:`normlab.run_format.folder`, and the terminal's last lines are its
fit and prediction sentences, with or without the report, which only draws what was written
(:func:`normlab.report.ladder_report.build_ladder_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from normlab.analysis.ladder_folder import analyze_ladder
from normlab.experiment.execution.lock import FolderLockedError, OutputLock
from normlab.run_format import REPORT_HTML_FILE, REPORT_MD_FILE
from normlab.run_format import folder as run_folder
from normlab.study.errors import Invalid, Refused, Stopped
from normlab.study.grid import make_executor
from normlab.study.plan import emit_plan, plan_grid
from normlab.study.rungs import (
    LadderPlan,
    check_ladder_out,
    plan_ladder,
    prepare_ladder,
    record_rung_budget,
)
from normlab.study.spec import LadderSpec, Trainer
from normlab.study.sweep import ladder_sweep_record, sweep_ladder

__all__ = ["analyse_ladder", "fit_lines", "ladder_lines", "run_ladder"]


def run_ladder(study: Trainer, spec: LadderSpec) -> None:
    """The ladder of ``study`` (module docstring); a :class:`~normlab.study.errors.StudyError`
    when it cannot run or complete."""
    out, sweep = study.spec.out, study.spec.sweep
    try:
        plan = plan_ladder(spec)
    except ValueError as err:
        raise Invalid(err) from None
    record = None
    if sweep is not None:
        record = ladder_sweep_record(spec.config, plan, sweep, study.spec.rounds)
    try:
        check_ladder_out(out)
        if not study.spec.plan:
            make_executor(spec.config)
    except ValueError as err:
        raise Refused(err) from None
    prepare_ladder(plan, out, record)
    configs = list(plan.configs) if record is None else sweep_ladder(study, plan, record)
    if study.spec.plan:
        _plan_rungs(plan, configs, out)
        return
    summaries: dict[str, dict[str, Any]] = {}
    for setting, rung_cfg, n in zip(plan.settings, configs, plan.n_params, strict=True):
        study.console.print(f"rung {setting}: {n:,} parameters")
        rung_out = run_folder.rung_path(out, setting)
        try:
            done = study.train(
                rung_cfg, rung_out, report=study.spec.report, rounds=study.spec.rounds
            )
        finally:  # planned (or refused) by now: its budget, where it has one, is known
            record_rung_budget(out, setting)
        summaries.update({run_folder.ladder_run_id(setting, k): v for k, v in done.items()})
    study.check_results(summaries, out)
    _answer(study.console, out, report=study.spec.report)


def _plan_rungs(plan: LadderPlan, configs: list[Any], out: Path) -> None:
    """``--plan``: prepare every rung's compare folder and list its runs as
    ``<setting>/<run_id>``."""
    console = Console(stderr=True)
    ids: list[str] = []
    for setting, rung_cfg, n in zip(plan.settings, configs, plan.n_params, strict=True):
        console.print(f"rung {setting}: {n:,} parameters")
        todo = plan_grid(rung_cfg, run_folder.rung_path(out, setting), console)
        record_rung_budget(out, setting)
        ids += [run_folder.ladder_run_id(setting, r) for r in todo]
    emit_plan(out, ids, console, f" of {len(plan.settings)} rungs")


def analyse_ladder(out: Path, n_boot: int | None = None) -> dict[str, Any]:
    """Analyse the ladder folder ``out`` (:func:`normlab.analysis.ladder_folder.analyze_ladder`:
    per arm the fit and the prediction at the target) and write it, with ``ladder.json``, to
    the folder's summary.json (:func:`normlab.run_format.folder.write_ladder_analysis`);
    returns the ``ladder`` value. ``ValueError`` when a rung cannot be read or has fewer than
    two paired seeds."""
    plan = run_folder.read_ladder_plan(out)
    ladder = analyze_ladder(out, n_boot)
    run_folder.write_ladder_analysis(out, ladder, plan)
    return ladder


def fit_lines(ladder: dict[str, Any]) -> list[str]:
    """One line per arm: its fitted trend d = a + b·log₁₀ N against the baseline, and b with
    its standard error (the change per tenfold N), from the ``ladder`` value."""
    lines = []
    for arm, rec in ladder["arms"].items():
        a, b, se, unit = rec["fit"]["a"], rec["fit"]["b"], rec["fit"]["b_se"], rec["unit"]
        lines.append(
            f"fit: {arm} − {rec['baseline']} = {a:+.4g} {'−' if b < 0 else '+'} "
            f"{abs(b):.4g}·log10(N) {unit}; per tenfold N {b:+.4g} ± {se:.2g} {unit}"
        )
    return lines


def ladder_lines(ladder: dict[str, Any]) -> list[str]:
    """The terminal's closing lines of a ladder: the :func:`fit_lines`, then one prediction
    sentence per arm at the target
    (:func:`normlab.report.ladder_report.prediction_lines`), the last lines."""
    from normlab.report.ladder_report import prediction_lines  # its figures: when needed

    return [*fit_lines(ladder), *prediction_lines(ladder)]


def _answer(console: Console, out: Path, *, report: bool) -> None:
    """The ladder's analysis written on its locked folder, then its report when asked for;
    the fit and prediction lines last (unwrapped, one a line)."""
    from normlab.report.ladder_report import build_ladder_report

    try:
        with OutputLock(out):
            ladder = analyse_ladder(out)
    except (FolderLockedError, ValueError, OSError) as err:
        raise Stopped(f"ladder analysis: not written ({err})") from None
    if report:
        try:
            with OutputLock(out):
                written = build_ladder_report(out)
        except (FolderLockedError, ValueError, OSError) as err:
            raise Stopped(f"ladder report: not built ({err})") from None
        md, html = written[REPORT_MD_FILE], written[REPORT_HTML_FILE]
        console.print(f"ladder report: {md} and {html}")
    for line in ladder_lines(ladder):
        console.print(escape(line), soft_wrap=True, highlight=False)
