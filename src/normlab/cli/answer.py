"""The exact command that would settle an open comparison, and the closing terminal lines.

``normlab compare`` records the flags it was given in ``OUT/command.json``; the settling
command is that same command with the same ``--out`` (so every finished run is reused):

- after a fixed number of seeds: ``--seeds`` removed and ``--until-decided`` added (its look
  schedule starts at the seeds already run, 3 by default), with ``--max-seeds`` set to the
  upper end of the seeds-needed forecast (:func:`normlab.analysis.power.forecast_seeds`: the
  seeds needed if the spread of the few seeds so far understates the noise as much as its
  confidence interval allows) where that differs from the default, and ``--max-time`` to the
  time those runs would take at the speed of the runs so far where that exceeds the default;
- after ``--until-decided`` stopped on its time budget: the same command again (the rounds
  already trained are reused, so it continues where it stopped), with ``--max-time`` set to
  the time the remaining planned runs would take at the speed of the runs so far (else a
  budget too small for one round would stop it again before it trains anything);
- after ``--until-decided`` reached its last planned look undecided: ``--max-seeds`` doubled.
  That is a new plan; its error rates assume it is fixed before any look, so the line says so;
- whichever of these, when the analysis prices a decision (``decision_cost``) and another
  training budget is cheaper than what the current one still costs with its seeds reused
  (:func:`normlab.analysis.cost_folder.settle_budget`): a new experiment at that budget,
  ``--tokens-per-param`` in place of ``--steps`` / ``--tokens``, ``--until-decided`` with
  ``--max-seeds`` at the upper end of the seeds it needs there and ``--max-time`` at their
  time here, into a new folder beside ``--out`` (``OUT-tpp<budget>``: the runs of the current
  budget are of another experiment).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from normlab.analysis.answer import answer_lines
from normlab.analysis.cost_folder import settle_budget
from normlab.analysis.rounds import read_state
from normlab.analysis.sequential import DEFAULT_MAX_SEEDS
from normlab.run_format import DECISION_COST_KEY
from normlab.run_format import folder as run_folder
from normlab.study.rounds import DEFAULT_MAX_TIME_S, round_seconds

__all__ = [
    "budget_out",
    "budget_settle_command",
    "compare_args",
    "plan_size",
    "print_answer",
    "read_command",
    "remaining_seconds",
    "settle_command",
    "write_command",
]

VALUE_FLAGS = ("--seeds", "--max-seeds", "--max-time", "--out")
BUDGET_FLAGS = ("--steps", "--tokens", "--tokens-per-param")
"""The flags that set a run's training budget (each takes a value)."""


def compare_args(given: Mapping[str, Any]) -> list[str]:
    """The command-line arguments of ``normlab compare`` that set ``given`` ({parameter:
    value}; None and False are left out, True is a bare switch), in the order given."""
    args: list[str] = []
    for name, value in given.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, float):
            args += [flag, f"{value:g}"]
        elif isinstance(value, list):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


def _without(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` without ``flags`` and their values (``--flag v`` or ``--flag=v``)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg and name in (*VALUE_FLAGS, *BUDGET_FLAGS)
            continue
        kept.append(arg)
    return kept


def _value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def settle_command(
    args: Sequence[str],
    out: Path | str,
    state: Mapping[str, Any] | None = None,
    max_seeds: int | None = None,
    max_time_s: float | None = None,
) -> str:
    """The command that would settle the question left open by ``normlab compare args``
    (module docstring), with ``--out out``, shell-quoted. After fixed seeds, ``max_seeds`` and
    ``max_time_s`` (when given, and other than or above the defaults) size the sequential
    plan."""
    base = _without(args, ("--out",))
    if state is None:
        new = [*_without(base, ("--seeds", "--until-decided", "--max-seeds", "--max-time"))]
        new.append("--until-decided")
        if max_seeds is not None and max_seeds != DEFAULT_MAX_SEEDS:
            new += ["--max-seeds", str(max_seeds)]
        if max_time_s is not None and max_time_s > DEFAULT_MAX_TIME_S:
            new += ["--max-time", f"{max_time_s:g}"]
    elif (state.get("stopped") or {}).get("reason") == "max-seeds":
        most = int(state["plan"]["max_seeds"])
        new = [*_without(base, ("--max-seeds", "--max-time")), "--max-seeds", str(2 * most)]
        if max_time_s is not None:
            new += ["--max-time", f"{max_time_s:g}"]
    elif max_time_s is not None:
        new = [*_without(base, ("--max-time",)), "--max-time", f"{max_time_s:g}"]
    else:
        new = list(base)
    return shlex.join(["normlab", "compare", *new, "--out", str(out)])


def budget_out(out: Path | str, budget: float) -> Path:
    """The folder of a new experiment at ``budget`` tokens per parameter, beside ``out``:
    ``OUT-tpp<budget>``."""
    path = Path(out)
    return path.with_name(f"{path.name}-tpp{budget:g}")


def budget_settle_command(a: Mapping[str, Any], args: Sequence[str], out: Path | str) -> str | None:
    """The command that would settle the open arms at a cheaper training budget (module
    docstring), or None when the current budget is the one to settle at (or nothing is
    priced)."""
    plan = settle_budget(a.get(DECISION_COST_KEY) or {})
    if plan is None:
        return None
    budget, most, seconds = plan
    info = (a.get("arm_info") or {}).get(a.get("baseline_arm"), {})
    first = len(info.get("seeds_done", [])) + len(info.get("seeds_missing", []))
    new = [*_without(args, BUDGET_FLAGS), "--tokens-per-param", f"{budget:g}"]
    return settle_command(new, budget_out(out, budget), None, max(most, first), _minutes(seconds))


def plan_size(a: Mapping[str, Any], out: Path | str) -> tuple[int | None, float | None]:
    """(most seeds, seconds) for the sequential plan that would settle the open arms of the
    analysis ``a``: the largest upper end of an undecided arm's seeds-needed forecast
    (``seeds_needed_high``; its plug-in ``seeds_needed`` where the upper end lies beyond what a
    forecast looks at, or in an analysis written without it), and the time its new runs would
    take (:func:`normlab.study.rounds.round_seconds` from the folder's runs,
    rounded up to a minute), or (None, None) without an estimate."""
    needs = [
        v.get("seeds_needed_high") or v["seeds_needed"]
        for v in a.get("verdicts", {}).values()
        if v.get("decision") == "undecided" and v.get("seeds_needed")
    ]
    if not needs:
        return None, None
    most = max(int(n) for n in needs)
    summaries = _summaries(out)
    done = len({s.get("seed") for s in summaries.values()})
    new_runs = max(0, most - done) * len(a.get("arm_order", []))
    return most, _minutes(round_seconds(summaries, new_runs))


def remaining_seconds(state: Mapping[str, Any], out: Path | str) -> float | None:
    """After ``--until-decided`` stopped on its time budget: the time the runs up to the last
    planned look would take; after it reached its last look: the time of the runs up to twice
    as many seeds (:func:`settle_command`'s new plan); rounded up to a minute, else None."""
    stopped = state.get("stopped") or {}
    most = int(state["plan"]["max_seeds"])
    if stopped.get("reason") == "max-seeds":
        most *= 2
    elif stopped.get("reason") != "max-time":
        return None
    runs = most - int(stopped.get("n_seeds", 0))
    new_runs = max(0, runs) * (len(state.get("arms", [])) + 1)
    return _minutes(round_seconds(_summaries(out), new_runs))


def _minutes(seconds: float) -> float | None:
    return math.ceil(seconds / 60) * 60 if seconds > 0 else None


def _summaries(out: Path | str) -> dict[str, dict[str, Any]]:
    summaries = {}
    for run in run_folder.run_folders(out):
        try:
            summary = run_folder.read_summary(run)
        except ValueError:  # a damaged one: the report names it; here only its seconds count
            continue
        if summary is not None:
            summaries[run.name] = summary
    return summaries


def write_command(out: Path, args: Sequence[str]) -> None:
    """Record the flags of this compare in ``out/command.json``."""
    run_folder.write_command(out, args)


def read_command(out: Path) -> list[str] | None:
    """The flags recorded by :func:`write_command`, or None."""
    try:
        data = run_folder.read_command(out)
    except (OSError, ValueError):
        return None
    args = data.get("args")
    return [str(a) for a in args] if isinstance(args, list) else None


def print_answer(console: Console, out: Path, args: Sequence[str] | None = None) -> bool:
    """Print the closing lines for the folder ``out`` from its analysis (``summary.json``) and
    sequential state; ``args`` are the compare's flags (default: those recorded in the folder).
    Returns False, printing nothing, when the folder has no analysis."""
    try:
        a = run_folder.read_analysis(out)
    except (OSError, ValueError):
        return False
    state = read_state(out)
    if args is None:
        args = read_command(out)
    if state is not None and "verdicts" not in state:
        state = None
    settle = None
    if args is not None:
        if state is None:
            seeds, seconds = plan_size(a, out)
        else:
            seeds, seconds = None, remaining_seconds(state, out)
        settle = settle_command(args, out, state, seeds, seconds)
        settle = budget_settle_command(a, args, out) or settle
    lines = answer_lines(a, state, settle)
    ended = state is not None and (state.get("stopped") or {}).get("reason") == "max-seeds"
    if settle and ended and lines[-1].startswith("To settle"):
        lines.insert(
            len(lines) - 1,
            "More seeds after the last planned look make a new plan, chosen after this one "
            "ended undecided: its error rates then hold only approximately.",
        )
    console.print(f"[bold]{escape(lines[0])}[/bold]", highlight=False, soft_wrap=True)
    for line in lines[1:]:
        console.print(escape(line), highlight=False, soft_wrap=True)
    return True
