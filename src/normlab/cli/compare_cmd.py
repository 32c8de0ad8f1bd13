"""``normlab compare``: the controlled experiment — only the norm (or placement) differs.

The command parses its options into a :class:`normlab.study.spec.StudySpec` (the grid config,
normlab's own or a ``--script``'s, and the transforms asked for), runs the
:class:`normlab.study.Study`, and turns how it ended into the exit status of
:data:`COMPARE_HELP`. Which config key each flag sets, and their help, is
:mod:`normlab.cli.compare_options`'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from normlab.analysis.sequential import DEFAULT_MAX_SEEDS
from normlab.cli.answer import compare_args, print_answer
from normlab.cli.app import app
from normlab.cli.compare_options import (
    FLAG_KEYS,
    LADDER_HELP,
    LR_SWEEP_HELP,
    MAX_SEEDS_HELP,
    MAX_TIME_HELP,
    PARAMETRIZATION_HELP,
    RECORDED_AS_GIVEN,
    SCRIPT_HELP,
    SCRIPT_KEYS,
    UNTIL_DECIDED_HELP,
    config_field,
    flag_help,
    parse_flags,
)
from normlab.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_STOPPED,
    EXIT_USAGE,
    check_utf8_path,
    describe_error,
    exit_status_help,
    fail,
    interrupt_exit_code,
    print_error,
    signals_as_interrupt,
)
from normlab.experiment.config import (
    ScaleSettings,
    ScriptConfig,
    describe_errors,
)
from normlab.study import Invalid, NoResult, Refused, Stopped, Study, StudyError
from normlab.study.grid import grid_of
from normlab.study.loader import load_study
from normlab.study.plan import train_planned
from normlab.study.spec import (
    DEFAULT_MAX_TIME_S,
    GridConfig,
    RoundsSpec,
    StudySpec,
)

T = TypeVar("T")
DEFAULT_OUT = Path("normlab-out/compare")
EXIT_STATUS = {
    Refused: EXIT_REFUSED,
    Invalid: EXIT_USAGE,
    NoResult: EXIT_FAILED,
    Stopped: EXIT_STOPPED,
}
"""The exit status of each way a study stops short (:mod:`normlab.study.errors`)."""

COMPARE_HELP = (
    "Train the same small GPT (or, with --testbed dit, the same flow-matching DiT) with each norm "
    "on the same data, seeds and batches; report which norm to use."
    "\n\n"
    "With no arguments: LayerNorm vs RMSNorm, pre-norm, 3 paired seeds, on this Python's own "
    "standard-library source. With --testbed dit: adaLN-Zero vs AdaRMS in a small DiT trained by "
    "flow matching on embedded 16×16 images of shapes, judged on the validation flow-matching "
    "loss. With --model (hf:<folder or model_type> and --model-set overrides, or "
    "package.module:factory): your own causal LM with each of its norm modules swapped for the "
    "arm's, on --data with --tokenizer or --bpe-merges, judged on validation bits per byte. "
    "A comparison needs at least two arms (norm × placement). --out must be a new or empty "
    "folder, or the folder of an earlier compare: re-running with the same --out skips finished "
    "runs; it refuses, leaving the folder unchanged, if a finished run was trained with other "
    "settings. Runs in the folder that the new command does not plan (e.g. seeds beyond a lower "
    "--seeds) are kept on disk but left out of the analysis and report."
    "\n\n"
    + exit_status_help(
        ok="when at least one run finished or diverged (crashed runs are recorded as results)",
        refused="when the command refused before training (bad --out, --device or --data, a "
        "folder locked or damaged, unpaired arms, settings that differ from finished runs, a "
        "model the machine cannot hold)",
        usage="for an invalid config (an option or key, a --model type transformers lacks, a "
        "--model-set value or a --parametrization the model does not take)",
        failed="when every run crashed",
        stopped="when training began but the command could not complete (a full disk or "
        "another system error while training, or the report could not be written): finished "
        "runs are kept, run the same command again to resume, or `normlab report` to build the "
        "report",
        interrupted="when interrupted (Ctrl-C)",
        terminated="when terminated (SIGTERM)",
    )
)
"""The help of ``normlab compare``: one line per paragraph, so that Typer's rich help rewraps
each paragraph to the terminal instead of keeping the source's line breaks."""


@app.command(help=COMPARE_HELP)
def compare(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML experiment file (flags override it).")
    ] = None,
    testbed: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["testbed"]))] = None,
    norms: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["norms"]))] = None,
    placements: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["placements"]))] = None,
    precision: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["precision"]))] = None,
    seeds: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["seeds"]))] = None,
    steps: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["steps"]))] = None,
    tokens: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["tokens"]))] = None,
    tokens_per_param: Annotated[
        float | None, typer.Option(help=flag_help(FLAG_KEYS["tokens_per_param"]))
    ] = None,
    param_count: Annotated[
        str | None, typer.Option(help=flag_help(FLAG_KEYS["param_count"]))
    ] = None,
    lr: Annotated[float | None, typer.Option(help=flag_help(FLAG_KEYS["lr"]))] = None,
    schedule: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["schedule"]))] = None,
    warmup: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["warmup"]))] = None,
    batch_size: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["batch_size"]))] = None,
    device: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["device"]))] = None,
    threads: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["threads"]))] = None,
    parallel: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["parallel"]))] = None,
    log_to: Annotated[
        str | None, typer.Option(help=config_field(FLAG_KEYS["log_to"]).description)
    ] = None,
    data: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["data"]))] = None,
    model: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["model"]))] = None,
    model_set: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["model_set"]))] = None,
    parametrization: Annotated[str | None, typer.Option(help=PARAMETRIZATION_HELP)] = None,
    ladder: Annotated[str | None, typer.Option(help=LADDER_HELP)] = None,
    target_params: Annotated[
        float | None, typer.Option(help=flag_help(FLAG_KEYS["target_params"]))
    ] = None,
    lr_sweep: Annotated[str | None, typer.Option(help=LR_SWEEP_HELP)] = None,
    tuning_seeds: Annotated[
        int | None, typer.Option(help=flag_help(FLAG_KEYS["tuning_seeds"]))
    ] = None,
    tokenizer: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["tokenizer"]))] = None,
    text_field: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["text_field"]))] = None,
    bpe_merges: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["bpe_merges"]))] = None,
    nproc_per_node: Annotated[
        int | None, typer.Option(help=flag_help(FLAG_KEYS["nproc_per_node"]))
    ] = None,
    nnodes: Annotated[int | None, typer.Option(help=flag_help(FLAG_KEYS["nnodes"]))] = None,
    rdzv_endpoint: Annotated[
        str | None, typer.Option(help=flag_help(FLAG_KEYS["rdzv_endpoint"]))
    ] = None,
    fsdp: Annotated[
        bool | None, typer.Option("--fsdp/--no-fsdp", help=flag_help(FLAG_KEYS["fsdp"]))
    ] = None,
    executor: Annotated[str | None, typer.Option(help=flag_help(FLAG_KEYS["executor"]))] = None,
    ray_address: Annotated[
        str | None, typer.Option(help=flag_help(FLAG_KEYS["ray_address"]))
    ] = None,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Prepare --out (data, experiment.json, each run's run.json) and print one "
            "command per run to train (normlab compare --out OUT --run RUN_ID), for any "
            "scheduler; then `normlab report OUT`.",
        ),
    ] = False,
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Train one run that --plan prepared in --out (by its id), and nothing else.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Output folder; re-use it to resume.")] = DEFAULT_OUT,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Build the report after training.")
    ] = True,
    until_decided: Annotated[bool, typer.Option(help=UNTIL_DECIDED_HELP)] = False,
    max_seeds: Annotated[int, typer.Option(help=MAX_SEEDS_HELP)] = DEFAULT_MAX_SEEDS,
    max_time: Annotated[float, typer.Option(help=MAX_TIME_HELP)] = DEFAULT_MAX_TIME_S,
    script: Annotated[str | None, typer.Option(help=SCRIPT_HELP)] = None,
    metric: Annotated[
        str | None, typer.Option(help="With --script: the log_eval metric that decides quality.")
    ] = None,
    lower_is_better: Annotated[
        bool,
        typer.Option(
            "--lower-is-better/--higher-is-better",
            help="With --script: the metric's direction.",
        ),
    ] = True,
    margin: Annotated[
        float | None,
        typer.Option(
            help="With --script: the difference in the metric that does not matter (the "
            "equivalence margin, in the metric's unit). Without it no arm can be called "
            "equivalent: a quality verdict is better, worse or not determined."
        ),
    ] = None,
    run_timeout: Annotated[
        float | None,
        typer.Option(
            help="With --script: seconds after which a run is killed and recorded as timed out."
        ),
    ] = None,
) -> None:
    """Run the controlled experiment; what it does is :data:`COMPARE_HELP` (its ``--help``)."""
    flags = {flag: value for flag, value in locals().items() if flag in FLAG_KEYS}
    started, console = time.perf_counter(), Console()
    script_flags = {"script": script, "metric": metric, "margin": margin,
                    "run_timeout": run_timeout, "lower_is_better": lower_is_better}  # fmt: skip
    with _exit_statuses():
        given = _invalid(parse_flags, flags)
        if run is not None:
            others = {"plan": plan, "config": config, **given, "parametrization": parametrization}
            _refuse_beside_run({**others, **script_flags, "lower_is_better": None})
            train_planned(out, run, console)
            return
        if script is not None:
            _refuse_own_options(
                ctx, {"config": config, **given, "parametrization": parametrization}
            )
            cfg: GridConfig = _script_config(given, script_flags)
            ladder, sweep, args = None, None, _script_args(given, flags, script_flags)
        else:
            _refuse_script_options(script_flags)
            overrides = {FLAG_KEYS[flag]: value for flag, value in given.items()}
            cfg, ladder, sweep = _invalid(load_study, config, overrides, parametrization)
            args = compare_args(
                {"config": config, **given, "parametrization": parametrization, **_as_given(flags)}
            )
        rounds = RoundsSpec(max_seeds, max_time) if until_decided else None
        if rounds is not None:
            args += compare_args({"until_decided": True, "max_seeds": max_seeds,
                                  "max_time": max_time})  # fmt: skip
        spec = _invalid(StudySpec, cfg, out, ladder, sweep, rounds, plan, report, tuple(args))
        with _training(spec):
            folder = Study(spec, console, started).run()
    if folder is not None and report:
        print_answer(console, folder, list(spec.args))


@contextmanager
def _exit_statuses() -> Iterator[None]:
    """A study that stops short (:class:`~normlab.study.errors.StudyError`) ends the command
    with one error line and its exit status (:data:`EXIT_STATUS`; no line when it has nothing
    to say)."""
    try:
        yield
    except StudyError as err:
        code = EXIT_STATUS[type(err)]
        if err.cause is None:
            raise typer.Exit(code) from None
        if err.wrap == "{}":
            raise fail("compare", err.cause, code) from None
        cause = err.cause
        text = describe_error(cause) or str(cause) if isinstance(cause, BaseException) else cause
        raise fail("compare", err.wrap.format(text), code) from None


@contextmanager
def _training(spec: StudySpec) -> Iterator[None]:
    """Around a study that trains (not ``--plan``): refuse an output folder or data path that
    is not UTF-8 (:class:`Refused`), and end on ``Ctrl-C`` or ``SIGTERM`` with one line and
    exit status 130 or 143, the finished runs kept."""
    if spec.plan:
        yield
        return
    paths = {"out": spec.out, **grid_of(spec.grid).paths}
    try:
        for option, path in paths.items():
            check_utf8_path(path, option)
    except ValueError as err:
        raise Refused(err) from None
    try:
        with signals_as_interrupt():
            yield
    except KeyboardInterrupt as err:
        how = "terminated" if interrupt_exit_code(err) != EXIT_INTERRUPTED else "interrupted"
        kept = f"finished runs are kept in {spec.out}; run the same command to continue"
        print_error("compare", f"{how}: {kept}")
        raise typer.Exit(interrupt_exit_code(err)) from None


def _invalid(make: Callable[..., T], *args: Any) -> T:
    """``make(*args)``: the options parsed, the config loaded (:mod:`normlab.study.loader`) or
    the study's spec; a ``ValueError`` (one line naming the option) is :class:`Invalid`."""
    try:
        return make(*args)
    except ValueError as err:
        raise Invalid(err) from None


def _as_given(flags: dict[str, Any]) -> dict[str, Any]:
    return {k: flags[k] for k in RECORDED_AS_GIVEN}


def _named(options: dict[str, Any]) -> list[str]:
    """``--flag`` of each option given (not None, not False), in order."""
    return [
        f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None and v is not False
    ]


def _refuse_beside_run(others: dict[str, Any]) -> None:
    """``--run`` trains a planned run as its run.json says: :class:`Invalid` when any other
    option than ``--out`` is given with it."""
    named = _named(others)
    if named:
        raise Invalid(
            "--run: trains a planned run as its run.json says; expected only --out with it, "
            f"got {', '.join(named)}"
        )


def _refuse_own_options(ctx: typer.Context, own: dict[str, Any]) -> None:
    """:class:`Invalid` naming the first option of normlab's own training given with
    ``--script`` (``own``: those options, by parameter name), listing the options that work
    with it: every option of the command that is a :data:`SCRIPT_KEYS` flag or none of
    normlab's own training (``--run`` aside, a command of its own)."""
    refused = [k for k, v in own.items() if v is not None and k not in SCRIPT_KEYS]
    if not refused:
        return
    allowed = [
        "/".join([*p.opts, *p.secondary_opts])
        for p in ctx.command.params
        if p.name != "run" and (p.name in SCRIPT_KEYS or p.name not in own)
    ]
    raise Invalid(
        f"--{refused[0].replace('_', '-')}: sets normlab's own training, which --script "
        f"replaces; expected only {', '.join(allowed)} with --script (the script sets the rest "
        "itself)"
    )


def _refuse_script_options(script_flags: dict[str, Any]) -> None:
    """:class:`Invalid` naming the first option of ``--script`` given without it."""
    named = _named({**script_flags, "lower_is_better": None})
    if not script_flags["lower_is_better"]:
        named.append("--higher-is-better")
    if named:
        raise Invalid(
            f"{named[0]}: an option of --script; expected it with --script "
            '"CMD {norm} {seed} {run_dir}"'
        )


def _script_config(given: dict[str, Any], script_flags: dict[str, Any]) -> ScriptConfig:
    """The :class:`ScriptConfig` of ``--script`` and the flags that apply to it
    (:data:`SCRIPT_KEYS`), started in this folder; :class:`Invalid` naming what does not fit."""
    if not script_flags["metric"]:
        raise Invalid(
            "--metric: expected the name of the metric your script logs with "
            "run.log_eval(step, NAME=value), e.g. --metric val_loss"
        )
    values = {**given, **script_flags}
    keys = {SCRIPT_KEYS[f]: values[f] for f in SCRIPT_KEYS if values[f] is not None}
    scale = {k.removeprefix("scale."): v for k, v in keys.items() if k.startswith("scale.")}
    plain = {k: v for k, v in keys.items() if not k.startswith("scale.")}
    try:
        return ScriptConfig(**plain, cwd=os.getcwd(), scale=ScaleSettings(**scale))
    except ValidationError as err:
        raise Invalid(describe_errors(err, ScriptConfig)) from None
    except ValueError as err:
        raise Invalid(err) from None


def _script_args(
    given: dict[str, Any], flags: dict[str, Any], script_flags: dict[str, Any]
) -> list[str]:
    """The flags of a ``--script`` compare as the settling command records them."""
    own = [k for k in SCRIPT_KEYS if k in FLAG_KEYS and k not in RECORDED_AS_GIVEN]
    only = [k for k in SCRIPT_KEYS if k not in FLAG_KEYS and k != "lower_is_better"]
    return compare_args(
        {
            **{k: script_flags[k] for k in only},
            "higher_is_better": not script_flags["lower_is_better"],
            **_as_given(flags),
            **{k: given[k] for k in own},
        }
    )
