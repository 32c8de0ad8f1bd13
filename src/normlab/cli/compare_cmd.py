"""``normlab compare``: the controlled experiment — only the norm (or placement) differs.

Each flag sets one key of the experiment config
(:class:`normlab.experiment.config.ExperimentConfig`, the dotted key in :data:`FLAG_KEYS`); its
help text and the default it shows come from that key's field, so the config is the only place a
default lives. A flag left out is ``None``: the key keeps the YAML file's value, or the config's
default.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape

from normlab.analysis.sequential import DEFAULT_MAX_SEEDS
from normlab.cli.answer import compare_args, print_answer, write_command
from normlab.cli.app import app
from normlab.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_STOPPED,
    EXIT_USAGE,
    exit_status_help,
    fail,
)
from normlab.experiment.config import ExperimentConfig, ScriptConfig, testbed_defaults
from normlab.experiment.execution.rounds import DEFAULT_MAX_TIME_S
from normlab.run_format import (
    DONE_STATUSES,
    LADDER_KEY,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
)
from normlab.run_format import folder as run_folder
from normlab.trackers.exporting import Exporter, check_installed, parse_kinds

DEFAULT_OUT = Path("normlab-out/compare")

UNTIL_DECIDED_HELP = (
    "Train paired seeds in rounds until the quality verdict of every arm is decided, by a "
    "group-sequential paired t-test with O'Brien–Fleming alpha-spending (Lan & DeMets 1983): "
    "looks after the --seeds given (3), then every 2 more, and at --max-seeds, fixed before the "
    "first look. Finished runs in --out are reused."
)
PARAMETRIZATION_HELP = (
    "sp (standard) or mup (width-wise muP): the gpt testbed's model.parametrization (base width "
    "model.base_d_model) or, with --model, lm.parametrization (base width lm.base_hidden_size); "
    "in a width ladder the smallest rung is the base width (default: sp). Not for the dit testbed."
)
LADDER_HELP = (
    "A size ladder KEY=v1,v2,… (gpt testbed: d_model or n_layers; --model hf:…: any integer "
    "key of its config, where hidden_size brings the heads along at a fixed head size and the "
    "MLP width at its ratio, and any other key changes alone): one full paired comparison per "
    "size, each in OUT/KEY=v/, with the same arms, seeds, data and fixed --steps in every rung "
    "(the steps do not follow the size); then the difference against the parameter count, a "
    "line in log N and its prediction interval at --target-params. Under --parametrization mup "
    "the base width is the smallest rung. With --until-decided each rung adds seeds in rounds "
    "until decided (--max-time per rung), and the fit uses the seeds each rung has."
)
LR_SWEEP_HELP = (
    "Learning rates to try, e.g. 1e-3,3e-3,1e-2: each arm is trained at each rate on "
    "--tuning-seeds seeds after the evaluation seeds (in OUT/lr-sweep/), its best rate (lowest "
    "mean quality metric, no tuning seed diverged) is chosen, and the comparison runs each arm "
    "at its own best rate; a best rate at the sweep's edge is flagged. With --ladder: per rung "
    "under sp; under --parametrization mup at the smallest rung (the choice) and the largest "
    "(the check that the optimum lines up). Not with --lr or --plan."
)
MAX_SEEDS_HELP = "With --until-decided: the most seeds per arm (the last planned look)."
MAX_TIME_HELP = (
    "With --until-decided: seconds after which no new round starts (a round is skipped when "
    "its estimated time would overrun); run the same command again to continue."
)


def _split(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise typer.BadParameter(f"expected a comma-separated list, got {text!r}")
    return items


def parse_seeds(text: str | None) -> int | list[int] | None:
    """``"3"`` → 3 seeds (0, 1, 2); ``"0,4,7"`` → those seeds."""
    if text is None:
        return None
    try:
        if "," in text:
            return [int(t) for t in _split(text) or []]
        return int(text)
    except ValueError:
        raise typer.BadParameter(
            f"expected a count (e.g. 3) or a comma-separated list of seeds (e.g. 0,1,2), "
            f"got {text!r}",
            param_hint="--seeds",
        ) from None


FLAG_KEYS = {
    "testbed": "testbed",
    "norms": "norms",
    "placements": "placements",
    "precision": "precisions",
    "seeds": "seeds",
    "steps": "train.steps",
    "tokens": "train.tokens",
    "lr": "train.lr",
    "warmup": "train.warmup",
    "batch_size": "train.batch_size",
    "device": "device",
    "threads": "threads",
    "parallel": "parallel",
    "log_to": "log_to",
    "data": "data.path",
    "model": "lm.model",
    "model_set": "lm.model_set",
    "parametrization": "model.parametrization",
    "ladder": "ladder",
    "target_params": "target_params",
    "lr_sweep": "lr_sweep",
    "tuning_seeds": "tuning_seeds",
    "tokenizer": "data.tokenizer",
    "text_field": "data.text_field",
    "bpe_merges": "data.bpe_merges",
    **{
        flag: f"scale.{flag}"
        for flag in ("nproc_per_node", "nnodes", "rdzv_endpoint", "fsdp", "executor", "ray_address")
    },
}
"""The config key each flag sets (flag parameter name → dotted key)."""


def config_field(dotted: str) -> FieldInfo:
    """The field of :class:`ExperimentConfig` at the dotted key ``dotted`` (``"train.lr"``)."""
    cls: type[BaseModel] = ExperimentConfig
    *sections, key = dotted.split(".")
    for section in sections:
        sub = cls.model_fields[section].annotation
        assert isinstance(sub, type) and issubclass(sub, BaseModel), dotted
        cls = sub
    return cls.model_fields[key]


def _shown(value: Any) -> str:
    """A default as a flag takes it: lists comma-separated, floats short (``0.005``)."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_help(dotted: str) -> str:
    """The help of the flag that sets ``dotted``: the field's description, then its default
    (and each testbed's own, where it has one) unless the default is None."""
    field = config_field(dotted)
    text = field.description or ""
    default = field.get_default(call_default_factory=True)
    if default is None or default == {}:
        return text
    shown = f"default: {_shown(default)}"
    for testbed, value in testbed_defaults(dotted).items():
        shown += f"; {testbed}: {_shown(value)}"
    return f"{text.removesuffix('.')} ({shown})."


def build_config_dict(config: Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The YAML file's content (or {}) with the flags' values laid over it."""
    from normlab.experiment.config import load_config_file, merge_overrides

    base = load_config_file(config) if config is not None else {}
    train = base.get("train")
    if isinstance(train, dict):
        # --steps and --tokens replace each other, whichever the file gave
        if overrides.get("train.steps") is not None:
            base["train"] = {k: v for k, v in train.items() if k != "tokens"}
        if overrides.get("train.tokens") is not None:
            base["train"] = {k: v for k, v in train.items() if k != "steps"}
    return merge_overrides(base, overrides)


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
    lr: Annotated[float | None, typer.Option(help=flag_help(FLAG_KEYS["lr"]))] = None,
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
    _compare(dict(locals()))  # the parameters as given, before any other name is bound


def _compare(flags: dict[str, Any]) -> None:
    """The body of :func:`compare`, given its parameters ``flags``: one planned run (``--run``),
    or the config (own testbeds or ``--script``) → a ladder, a plan, or training, the results'
    check and the answer."""
    run, out, config, plan, script = (flags[k] for k in ("run", "out", "config", "plan", "script"))
    until_decided, max_seeds = flags["until_decided"], flags["max_seeds"]
    max_time = flags["max_time"]
    report, lower_is_better = flags["report"], flags["lower_is_better"]
    console = Console()
    started = time.perf_counter()
    given = _config_flags(flags)
    if run is not None:
        _run_one(run, out, config, given, plan)
        return
    cfg: ExperimentConfig | ScriptConfig
    if script is not None:
        cfg = _script_config(flags, given, config)
        args = compare_args(
            {
                **{k: flags[k] for k in _SCRIPT_FLAGS},
                "higher_is_better": not lower_is_better,
                **{k: flags[k] for k in _RECORDED_AS_GIVEN},
                **{k: given[k] for k in _SCRIPT_CONFIG_FLAGS if k not in _RECORDED_AS_GIVEN},
            }
        )
    else:
        script_only = [f for f in _SCRIPT_FLAGS if flags[f] is not None]
        if not lower_is_better:
            script_only.append("higher_is_better")
        if script_only:
            raise fail(
                "compare",
                f"--{script_only[0].replace('_', '-')}: an option of --script; expected it "
                'with --script "CMD {norm} {seed} {run_dir}"',
                EXIT_USAGE,
            )
        cfg = _validated_config(config, given, console)
        args = compare_args(
            {"config": config, **given, **{k: flags[k] for k in _RECORDED_AS_GIVEN}}
        )
    try:
        check_installed(cfg.log_to)
    except ValueError as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    if isinstance(cfg, ExperimentConfig) and cfg.lr_sweep is not None and plan:
        raise fail(
            "compare",
            "--plan: not available with --lr-sweep (the comparison's rates come from the tuning "
            "runs' results); run without --plan",
            EXIT_USAGE,
        )
    if until_decided:
        args += compare_args({"until_decided": True, "max_seeds": max_seeds, "max_time": max_time})
    rounds = (max_seeds, max_time) if until_decided else None
    if isinstance(cfg, ExperimentConfig) and cfg.ladder is not None:
        _ladder(cfg, out, console, args, plan=plan, report=report, started=started, rounds=rounds)
        return
    if isinstance(cfg, ExperimentConfig) and cfg.target_params is not None:
        raise fail("compare", "--target-params: only with --ladder", EXIT_USAGE)
    if plan:
        _plan(cfg, out)
        return
    if isinstance(cfg, ExperimentConfig) and cfg.lr_sweep is not None:
        cfg = _plain_sweep(cfg, out, console, args, rounds)
    summaries = _train(cfg, out, console, args, report=report, rounds=rounds)
    _check_results(console, summaries, out, started)
    if report:
        print_answer(console, out, args)


SCRIPT_HELP = (
    'Your own training command as the trainer, one run per arm and seed, e.g. "python train.py '
    '--norm {norm} --seed {seed} --out {run_dir}" (placeholders {norm}, {placement}, '
    "{precision}, {seed}, {run_dir}; split into arguments first, then filled in, never run by a "
    "shell). The script logs with normlab.track; needs --metric. See docs/own-loop.md."
)
_SCRIPT_FLAGS = ("script", "metric", "margin", "run_timeout")
"""The options of ``--script`` only (with ``--lower-is-better/--higher-is-better``)."""
_SCRIPT_CONFIG_FLAGS = (
    "norms", "placements", "precision", "seeds", "steps", "threads", "parallel", "executor",
    "ray_address", "log_to",
)  # fmt: skip
"""The compare options that also apply with ``--script``; the others set normlab's own training
and are refused with it."""


def _script_config(
    flags: dict[str, Any], given: dict[str, Any], config: Path | None
) -> ScriptConfig:
    """The :class:`ScriptConfig` of ``--script`` and the flags that apply to it; exits with
    :data:`EXIT_USAGE` and one line naming the flag when one does not fit."""
    import os

    from normlab.experiment.config import ScaleSettings

    others = [k for k, v in given.items() if v is not None and k not in _SCRIPT_CONFIG_FLAGS]
    allowed = ", ".join("--" + f.replace("_", "-") for f in _SCRIPT_CONFIG_FLAGS)
    if config is not None:
        others.insert(0, "config")
    if others:
        raise fail(
            "compare",
            f"--{others[0].replace('_', '-')}: sets normlab's own training, which --script "
            f"replaces; expected only {allowed} "
            "with --script (the script sets the rest itself)",
            EXIT_USAGE,
        )
    if not flags["metric"]:
        raise fail(
            "compare",
            "--metric: expected the name of the metric your script logs with "
            "run.log_eval(step, NAME=value), e.g. --metric val_loss",
            EXIT_USAGE,
        )
    values = {
        "command": flags["script"],
        "metric": flags["metric"],
        "lower_is_better": flags["lower_is_better"],
        "equivalence_margin": flags["margin"],
        "norms": given["norms"],
        "placements": given["placements"],
        "precisions": given["precision"],
        "seeds": given["seeds"],
        "parallel": given["parallel"],
        "threads": given["threads"],
        "log_to": given["log_to"],
        "run_timeout": flags["run_timeout"],
        "steps": given["steps"],
        "cwd": os.getcwd(),
    }
    scale = {k: given[k] for k in ("executor", "ray_address") if given[k] is not None}
    try:
        return ScriptConfig(
            **{k: v for k, v in values.items() if v is not None}, scale=ScaleSettings(**scale)
        )
    except ValueError as err:
        raise fail("compare", err, EXIT_USAGE) from None


_LIST_FLAGS = ("norms", "placements", "precision", "log_to")
"""Flags given as comma-separated lists."""
_RECORDED_AS_GIVEN = ("seeds", "norms", "placements", "ladder", "lr_sweep")
"""Flags whose text, not its parsed value, is recorded for the settling command."""


def _config_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """{flag: parsed value} of every flag that sets a config key (:data:`FLAG_KEYS`), in that
    order; None where the flag was left out."""
    given = {flag: flags[flag] for flag in FLAG_KEYS}
    for flag in _LIST_FLAGS:
        given[flag] = _split(given[flag])
    given["seeds"] = parse_seeds(given["seeds"])
    if given["log_to"] is not None:
        try:
            given["log_to"] = list(parse_kinds(given["log_to"]))
        except ValueError as err:
            raise fail("compare", err, EXIT_USAGE) from None
    if given["ladder"] is not None:
        from normlab.experiment.execution.ladder import parse_ladder

        try:
            given["ladder"] = parse_ladder(given["ladder"])
        except ValueError as err:
            raise fail("compare", err, EXIT_USAGE) from None
    if given["lr_sweep"] is not None:
        given["lr_sweep"] = parse_rates(given["lr_sweep"])
    return given


def parse_rates(text: str) -> list[float]:
    """``"1e-3,3e-3,1e-2"`` → [0.001, 0.003, 0.01]; exits with :data:`EXIT_USAGE` and one
    line naming ``--lr-sweep`` when an item is not a number (the rates' own rules are
    :func:`normlab.experiment.config.check_lr_sweep`'s)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return [float(t) for t in items]
    except ValueError:
        raise fail(
            "compare",
            f"--lr-sweep: expected comma-separated learning rates (e.g. 1e-3,3e-3,1e-2), got "
            f"{text!r}",
            EXIT_USAGE,
        ) from None


def _validated_config(
    config: Path | None, given: dict[str, Any], console: Console
) -> ExperimentConfig:
    """The experiment config of the YAML file with the flags laid over it, validated; exits
    with :data:`EXIT_USAGE` and one line naming the problem when it is invalid."""
    from normlab.experiment.config import ConfigError, validate_config

    overrides = {FLAG_KEYS[flag]: value for flag, value in given.items()}
    try:
        merged = build_config_dict(config, overrides)
        check_scale_options(merged)
        route_parametrization(merged, given)
        check_lr_sweep_options(merged)
        return validate_config(merged)
    except (ConfigError, ValueError) as err:
        raise fail("compare", err, EXIT_USAGE) from None


def _train(
    cfg: ExperimentConfig | ScriptConfig,
    out: Path,
    console: Console,
    args: list[str],
    *,
    report: bool,
    rounds: tuple[int, float] | None,
) -> dict[str, dict[str, Any]]:
    """Train the grid into ``out`` (in ``--until-decided`` rounds when ``rounds`` holds
    (max seeds, max time)), record the command and build the report on the locked folder;
    returns {run_id: summary}. Every way it can stop early becomes its exit status."""
    from normlab.cli.errors import (
        check_utf8_path,
        interrupt_exit_code,
        print_error,
        signals_as_interrupt,
    )
    from normlab.experiment.execution.executors import GridStopped, make_executor
    from normlab.experiment.execution.lock import FolderLockedError
    from normlab.experiment.execution.runner import run_experiment
    from normlab.experiment.execution.script_grid import run_script_experiment

    grid = run_script_experiment if isinstance(cfg, ScriptConfig) else run_experiment
    script = isinstance(cfg, ScriptConfig)
    exporter = Exporter(out, tuple(cfg.log_to), console.print) if cfg.log_to else None
    # normlab's own runs are exported as each ends; a script's once its seed's pairing is checked
    on_result = exporter.export_one if exporter is not None and not script else None
    try:
        grid_executor = make_executor(cfg.scale, on_result=on_result)
    except ValueError as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    try:
        with signals_as_interrupt():
            check_utf8_path(out, "out")
            if isinstance(cfg, ExperimentConfig):
                check_utf8_path(cfg.data.path, "data")
            after = _build_report_step(console) if report else None
            after = _export_step(exporter, after, script=script)
            after = _record_command_step(args, after, sequential=rounds is not None)
            if rounds is not None:
                return _run_rounds(cfg, out, console, after, *rounds, grid_executor)
            return grid(cfg, out, console=console, after_training=after, executor=grid_executor)
    except (GridStopped, ReportNotBuilt) as err:
        raise fail("compare", str(err), EXIT_STOPPED) from None
    except (FolderLockedError, ValueError, OSError, MemoryError, RecursionError) as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    except KeyboardInterrupt as err:
        how = "terminated" if interrupt_exit_code(err) != EXIT_INTERRUPTED else "interrupted"
        kept = f"finished runs are kept in {out}; run the same command to continue"
        print_error("compare", f"{how}: {kept}")
        raise typer.Exit(interrupt_exit_code(err)) from None
    finally:
        if exporter is not None:
            exporter.close()


def _export_step(
    exporter: Exporter | None,
    after: Callable[[Path, dict[str, dict[str, Any]]], None] | None,
    *,
    script: bool,
) -> Callable[[Path, dict[str, dict[str, Any]]], None] | None:
    """``after`` preceded by exporting the grid's runs to the trackers of ``--log-to`` (those
    not yet exported: runs of an earlier command, or a script's runs, whose seed's pairing is
    only checked once every arm has trained; :func:`settled_runs`); ``after`` as it is
    without ``--log-to``."""
    if exporter is None:
        return after

    def step(out: Path, summaries: dict[str, dict[str, Any]]) -> None:
        from normlab.experiment.execution.script_grid import settled_runs

        exporter.export(settled_runs(summaries) if script else list(summaries))
        if after is not None:
            after(out, summaries)

    return step


def _check_results(
    console: Console, summaries: dict[str, dict[str, Any]], out: Path, started: float
) -> None:
    """Print how the runs ended; exit with :data:`EXIT_FAILED` when none finished or
    diverged."""
    counts = status_counts(summaries)
    shown = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    console.print(f"done in {time.perf_counter() - started:.0f} s: {shown}; results in {out}")
    if not counts.get("finished") and not counts.get("diverged"):
        raise fail(
            "compare",
            f"no run finished or diverged; each run's error is in "
            f"{run_folder.summary_path(run_folder.runs_path(out) / '<run>')}",
            EXIT_FAILED,
        )


def status_counts(summaries: dict[str, dict[str, Any]]) -> dict[str, int]:
    """{status: number of runs} over the runs' summaries."""
    counts: dict[str, int] = {}
    for summary in summaries.values():
        status = str(summary.get("status", "?"))
        counts[status] = counts.get(status, 0) + 1
    return counts


def _build_report_step(console: Console) -> Callable[[Path, dict[str, dict[str, Any]]], None]:
    """The step :func:`normlab.experiment.execution.runner.run_experiment` runs on the trained
    folder, still locked: build the report (:func:`build_report_if_available`) when at least one run
    finished or diverged, else say why there is none."""

    def build(out: Path, summaries: dict[str, dict[str, Any]]) -> None:
        if any(s.get("status") in DONE_STATUSES for s in summaries.values()):
            try:
                build_report_if_available(out, console)
            except (ValueError, OSError, MemoryError, UnicodeError) as err:
                raise ReportNotBuilt(out, err) from err
        else:
            console.print("report: not built, since no run finished or diverged")

    return build


class ReportNotBuilt(RuntimeError):
    """Training ended but the report could not be written (exit status 4)."""

    def __init__(self, out: Path, cause: BaseException) -> None:
        from normlab.cli.errors import describe_error

        super().__init__(
            f"report: not built ({describe_error(cause) or cause}); the runs are kept in "
            f"{str(out)!r}: fix the cause, then run `normlab report` on that folder"
        )


def build_report_if_available(out: Path, console: Console) -> bool:
    """Call ``normlab.report.build_report(out)`` if that module exists; returns whether it ran."""
    try:
        from normlab.report import build_report
    except ImportError as err:
        console.print(f"report: not built ({escape(str(err))}); the runs are in {out}")
        return False
    build_report(Path(out))
    console.print(f"report: {Path(out) / REPORT_MD_FILE} and {Path(out) / REPORT_HTML_FILE}")
    return True


def _record_command_step(
    args: list[str],
    after: Callable[[Path, dict[str, dict[str, Any]]], None] | None,
    *,
    sequential: bool,
) -> Callable[[Path, dict[str, dict[str, Any]]], None]:
    """``after`` preceded by recording the compare's flags in the folder (for the settling
    command of :mod:`normlab.cli.answer`); a compare with a fixed number of seeds also removes
    the sequential state an earlier ``--until-decided`` left, which no longer describes it."""

    def step(out: Path, summaries: dict[str, dict[str, Any]]) -> None:
        write_command(out, args)
        if not sequential:
            run_folder.clear_sequential(out)
        if after is not None:
            after(out, summaries)

    return step


def _run_rounds(
    cfg: Any,
    out: Path,
    console: Console,
    after: Callable[[Path, dict[str, dict[str, Any]]], None],
    max_seeds: int,
    max_time: float,
    executor: Any = None,
) -> dict[str, dict[str, Any]]:
    """``--until-decided``: the rounds of
    :func:`normlab.experiment.execution.rounds.run_until_decided`,
    looked at by :class:`normlab.analysis.rounds.SequentialTracker` on the quality metric, each
    round trained by ``executor`` (the local one by default, or ``--executor ray``)."""
    from functools import partial

    from normlab.analysis.rounds import SequentialTracker
    from normlab.analysis.sequential import look_schedule, plan_for
    from normlab.experiment.execution import runner
    from normlab.experiment.execution.rounds import run_until_decided
    from normlab.run_format import testbed_format

    try:  # the options' values, before anything is trained: a usage error
        if not max_time > 0:
            raise ValueError(f"max_time: expected --max-time in seconds > 0, got {max_time!r}")
        looks = look_schedule(len(cfg.seed_list()), max_seeds)
    except ValueError as err:
        raise fail("compare", err, EXIT_USAGE) from None
    fmt = testbed_format(cfg.testbed)
    plan = plan_for(
        fmt.quality,
        lower_is_better=fmt.metric(fmt.quality).lower_is_better,
        margin=cfg.margin(),
        looks=looks,
        testbed=cfg.testbed,
    )
    base = cfg.baseline_arm()
    tracker = SequentialTracker(
        plan,
        [a for a in cfg.arm_names() if a != base],
        base,
        fmt.quality,
        fmt.short_unit,
        max_time,
    )
    margin = f"margin ±{cfg.margin():g} {fmt.short_unit}" if cfg.margin() else "no margin"
    console.print(
        f"until decided: looks after {', '.join(map(str, looks))} seeds on {fmt.quality}, "
        f"{margin}, at most {max_time:g} s"
    )
    from normlab.experiment.execution.script_grid import run_script_experiment

    grid = run_script_experiment if isinstance(cfg, ScriptConfig) else runner.run_experiment
    train = partial(grid, executor=executor)
    summaries, _ = run_until_decided(
        cfg, out, tracker, looks, max_time_s=max_time, console=console, finish=after, train=train
    )
    return summaries


def route_parametrization(merged: dict[str, Any], given: dict[str, Any]) -> None:
    """Put ``--parametrization`` where the testbed's model keeps it: ``model.parametrization``
    for the gpt testbed (as laid over), ``lm.parametrization`` for a ``--model`` source; raise
    ``ValueError`` with one line naming the flag for the dit testbed, whose DiT has none."""
    value = given.get("parametrization")
    if value is None:
        return
    lm = merged.get("lm")
    testbed = "lm" if isinstance(lm, dict) and lm.get("model") else merged.get("testbed", "gpt")
    if testbed == "gpt":
        return
    if testbed != "lm":
        raise ValueError(
            f"--parametrization: a setting of the gpt testbed's model and of a --model source; "
            f"the {testbed} testbed has none (leave the flag out)"
        )
    model = merged.get("model")
    if isinstance(model, dict):
        model.pop("parametrization", None)
        if not model:
            del merged["model"]
    assert isinstance(lm, dict)
    lm["parametrization"] = value


def check_lr_sweep_options(merged: dict[str, Any]) -> None:
    """Raise ``ValueError`` with one line naming the option (``--lr-sweep``,
    ``--tuning-seeds``, ``--lr``) when the merged config (file and flags) asks for a sweep that
    :func:`normlab.experiment.config.check_lr_sweep` refuses; values of the wrong type are left
    to the config's validation."""
    from normlab.experiment.config import check_lr_sweep

    rates, seeds = merged.get("lr_sweep"), merged.get("tuning_seeds")
    if not (rates is None or isinstance(rates, list)):
        return
    train = merged.get("train")
    lr_given = isinstance(train, dict) and train.get("lr") is not None
    check_lr_sweep(rates, seeds, lr_given)


def check_scale_options(merged: dict[str, Any]) -> None:
    """Raise ``ValueError`` with one line naming the option (``--nproc-per-node``, ``--fsdp``,
    ``--executor``, …) when the ``scale`` section of the merged config (file and flags) does not
    describe a launch; its other errors are left to the config's validation."""
    from normlab.experiment.config import check_scale

    scale = merged.get("scale")
    if not isinstance(scale, dict):
        return
    values = (
        scale.get("nproc_per_node", 1),
        scale.get("nnodes", 1),
        scale.get("rdzv_endpoint"),
        scale.get("fsdp", False),
        scale.get("executor", "local"),
    )
    if not isinstance(values[3], bool) or not all(isinstance(v, int) for v in values[:2]):
        return
    check_scale(*values)  # type: ignore[arg-type]


def plan_commands(out: Path, run_ids: list[str]) -> list[str]:
    """One self-contained shell command per run: ``normlab compare --out OUT --run RUN_ID``
    (OUT absolute, so it runs from any folder)."""
    import shlex

    folder = shlex.quote(str(Path(out).absolute()))
    return [f"normlab compare --out {folder} --run {shlex.quote(r)}" for r in run_ids]


def _plan(cfg: Any, out: Path) -> None:
    """``--plan``: prepare ``out`` and print the runs' commands, one a line, on stdout (all
    else goes to stderr, so the output can be piped to a scheduler)."""
    from normlab.experiment.execution.lock import FolderLockedError
    from normlab.experiment.execution.runner import plan_experiment
    from normlab.experiment.execution.script_grid import plan_script_experiment

    console = Console(stderr=True)
    plan = plan_script_experiment if isinstance(cfg, ScriptConfig) else plan_experiment
    try:
        run_ids = plan(cfg, out, console=console)
    except (FolderLockedError, ValueError) as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    for command in plan_commands(out, run_ids):
        typer.echo(command)
    console.print(
        f"plan: {len(run_ids)} runs to train in {out}; run each command above (any order, any "
        f"number at once), then: normlab report {out}"
    )


def _run_one(
    run_id: str, out: Path, config: Path | None, given: dict[str, Any], plan: bool
) -> None:
    """``--run RUN_ID``: train that planned run of ``out`` (its run.json says how)."""
    from normlab.experiment.execution.lock import FolderLockedError
    from normlab.experiment.execution.runner import run_planned

    console = Console()
    rung = run_folder.split_ladder_run_id(run_id)
    if rung is not None:  # a ladder's run: <setting>/<run_id>, in the rung's compare folder
        out, run_id = run_folder.rung_path(out, rung[0]), rung[1]
    others = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    if config is not None:
        others.insert(0, "--config")
    if plan:
        others.insert(0, "--plan")
    if others:
        raise fail(
            "compare",
            f"--run: trains a planned run as its run.json says; expected only --out with it, "
            f"got {', '.join(others)}",
            EXIT_USAGE,
        )
    try:
        summary = run_planned(out, run_id, console=console)
    except (FolderLockedError, ValueError) as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    summary = _after_planned_run(out, run_id, summary, console)
    if summary.get("status") not in DONE_STATUSES:
        raise typer.Exit(EXIT_FAILED)


def _after_planned_run(
    out: Path, run_id: str, summary: dict[str, Any], console: Console
) -> dict[str, Any]:
    """What follows a planned run (``--run``) in the folder ``out``: for a script's run, the
    pairing guard of its seed once every arm of the seed has a result
    (:func:`normlab.experiment.execution.script_grid.check_planned_seed`); then the export of
    what is settled to the trackers that the planning command's ``--log-to`` recorded. Returns
    the run's summary as it now stands."""
    from normlab.experiment.execution.script_grid import check_planned_seed
    from normlab.run_format.testbeds import parse_script_testbed

    try:
        experiment = run_folder.read_experiment(out)
    except (OSError, ValueError):
        return summary
    settled = [run_id]
    if parse_script_testbed(experiment.get("testbed")) is not None:
        settled = check_planned_seed(out, run_id, console)
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


def _ladder(
    cfg: ExperimentConfig,
    out: Path,
    console: Console,
    args: list[str],
    *,
    plan: bool,
    report: bool,
    started: float,
    rounds: tuple[int, float] | None = None,
) -> None:
    """``--ladder``: check the ladder (:func:`normlab.experiment.execution.ladder.plan_ladder`)
    and ``--out`` before anything is written, write ``ladder.json``, then with ``--lr-sweep``
    the tuning runs of the swept rungs and each arm's choice
    (:mod:`normlab.experiment.execution.lr_sweep`), then per rung what a compare does
    (``--plan``: prepare and list its runs as ``<setting>/<run_id>``; else train it, in
    ``--until-decided`` rounds when ``rounds`` holds (max seeds, max time), and build its
    report), and last the ladder's report, whose prediction sentence is the terminal's last
    line."""
    from normlab.experiment.execution.ladder import check_ladder_out, plan_ladder, prepare_ladder
    from normlab.experiment.execution.lr_sweep import sweep_plan

    if len(cfg.seed_list()) < 2:
        raise fail(
            "compare",
            "--seeds: a ladder needs at least two paired seeds per rung (their spread weighs "
            f"each rung), got {len(cfg.seed_list())}",
            EXIT_USAGE,
        )
    try:
        ladder_plan = plan_ladder(cfg)
    except ValueError as err:
        raise fail("compare", err, EXIT_USAGE) from None
    sweep = sweep_plan(ladder_plan) if cfg.lr_sweep is not None else None
    sweep_record = None
    if sweep is not None:
        assert cfg.lr_sweep is not None
        seeds = _tuning_seeds(cfg, rounds)
        sweep_record = {
            "rates": sorted(cfg.lr_sweep),
            "tuning_seeds": seeds,
            "swept": list(sweep.swept),
            "chosen_at": sweep.chosen_at,
        }
    try:
        check_ladder_out(out)
        if not plan:
            from normlab.experiment.execution.executors import make_executor

            make_executor(cfg.scale)
    except ValueError as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    prepare_ladder(ladder_plan, out, sweep_record)
    configs = list(ladder_plan.configs)
    if sweep is not None and sweep_record is not None:
        configs = _ladder_sweep(ladder_plan, out, console, args, sweep_record)
    rungs = zip(ladder_plan.settings, configs, ladder_plan.n_params, strict=True)
    if plan:
        err_console = Console(stderr=True)
        ids: list[str] = []
        for setting, rung_cfg, n in rungs:
            err_console.print(f"rung {setting}: {n:,} parameters")
            try:
                from normlab.experiment.execution.runner import plan_experiment

                todo = plan_experiment(
                    rung_cfg, run_folder.rung_path(out, setting), console=err_console
                )
            except ValueError as err:
                raise fail("compare", err, EXIT_REFUSED) from None
            ids += [run_folder.ladder_run_id(setting, r) for r in todo]
        for command in plan_commands(out, ids):
            typer.echo(command)
        err_console.print(
            f"plan: {len(ids)} runs of {len(ladder_plan.settings)} rungs to train in {out}; run "
            f"each command above (any order, any number at once), then: normlab report {out}"
        )
        return
    summaries: dict[str, dict[str, Any]] = {}
    for setting, rung_cfg, n in rungs:
        console.print(f"rung {setting}: {n:,} parameters")
        rung_out = run_folder.rung_path(out, setting)
        done = _train(rung_cfg, rung_out, console, args, report=report, rounds=rounds)
        summaries.update({run_folder.ladder_run_id(setting, k): v for k, v in done.items()})
    _check_results(console, summaries, out, started)
    if report:
        _ladder_report(out, console)


def _tuning_seeds(cfg: ExperimentConfig, rounds: tuple[int, float] | None) -> list[int]:
    """The sweep's tuning seeds (:func:`normlab.analysis.lr_sweep.tuning_seeds`): after the
    evaluation seeds, which under ``--until-decided`` are every seed the rounds may add (up to
    ``--max-seeds``, :func:`normlab.experiment.execution.rounds.seed_sequence`)."""
    from normlab.analysis.lr_sweep import tuning_seeds
    from normlab.experiment.execution.rounds import seed_sequence

    evaluation = cfg.seed_list()
    if rounds is not None:
        evaluation = seed_sequence(cfg, max(rounds[0], len(evaluation)))
    return tuning_seeds(cfg.tuning_seed_count(), evaluation)


def _sweep(
    cfg: ExperimentConfig,
    folders: dict[float, Path],
    seeds: list[int],
    console: Console,
    args: list[str],
    where: str,
) -> tuple[str, dict[str, Any]]:
    """Train every rate's tuning runs of ``cfg`` (each arm at that rate, on ``seeds``) into
    ``folders`` ({rate: folder}; finished runs are kept) and read each arm's curve and best
    rate: (the quality metric, {arm: :class:`normlab.analysis.lr_sweep.LrCurve`})."""
    from normlab.analysis.lr_sweep_folder import read_sweep
    from normlab.experiment.execution.lr_sweep import tuning_config

    for rate, folder in folders.items():
        console.print(
            f"learning-rate sweep at {where}: every arm at {rate:g} on tuning seeds "
            f"{', '.join(map(str, seeds))}"
        )
        _train(tuning_config(cfg, rate, seeds), folder, console, args, report=False, rounds=None)
    try:
        return read_sweep(folders)
    except ValueError as err:
        raise fail("compare", err, EXIT_STOPPED) from None


def _print_sweep(console: Console, record: dict[str, Any], metric: str) -> None:
    from normlab.analysis.lr_sweep import sweep_lines

    for line in sweep_lines(record, metric):
        console.print(escape(line), soft_wrap=True, highlight=False)


def _ladder_sweep(
    ladder_plan: Any, out: Path, console: Console, args: list[str], record: dict[str, Any]
) -> list[ExperimentConfig]:
    """The tuning runs of every swept rung (``record``: ladder.json's ``lr_sweep``), the words
    of the choice, and each rung's config with its arms at their chosen rates."""
    from normlab.analysis.lr_sweep import lr_sweep_record
    from normlab.experiment.execution.lr_sweep import sweep_folders, with_arm_rates

    by_setting = dict(zip(ladder_plan.settings, ladder_plan.configs, strict=True))
    curves, metric = {}, ""
    for setting in record["swept"]:
        folders = sweep_folders(out, record["rates"], setting)
        metric, curves[setting] = _sweep(
            by_setting[setting], folders, record["tuning_seeds"], console, args, setting
        )
    choice = lr_sweep_record(curves, record["tuning_seeds"], record["chosen_at"])
    _print_sweep(console, choice, metric)
    return [with_arm_rates(by_setting[s], choice["chosen"][s]) for s in ladder_plan.settings]


def _plain_sweep(
    cfg: ExperimentConfig,
    out: Path,
    console: Console,
    args: list[str],
    rounds: tuple[int, float] | None,
) -> ExperimentConfig:
    """``--lr-sweep`` without ``--ladder``: check ``--out`` (before anything is written), train
    the tuning runs into ``OUT/lr-sweep/lr=<rate>/``, say the choice, and return ``cfg`` with
    each arm at its best rate."""
    from normlab.analysis.lr_sweep import PLAIN_SWEEP_SETTING, lr_sweep_record
    from normlab.experiment.execution.lr_sweep import sweep_folders, with_arm_rates
    from normlab.experiment.execution.runner import check_out_contents, check_out_path

    assert cfg.lr_sweep is not None
    try:
        check_out_path(out)
        check_out_contents(out)
    except ValueError as err:
        raise fail("compare", err, EXIT_REFUSED) from None
    seeds = _tuning_seeds(cfg, rounds)
    metric, curves = _sweep(
        cfg, sweep_folders(out, cfg.lr_sweep), seeds, console, args, PLAIN_SWEEP_SETTING
    )
    _print_sweep(console, lr_sweep_record({PLAIN_SWEEP_SETTING: curves}, seeds), metric)
    return with_arm_rates(cfg, {arm: c.best for arm, c in curves.items()})


def _ladder_report(out: Path, console: Console) -> None:
    """Build the ladder's report on its locked folder and print the prediction sentences last
    (unwrapped, one a line)."""
    from normlab.experiment.execution.lock import FolderLockedError, OutputLock
    from normlab.report.ladder_report import build_ladder_report, prediction_lines

    try:
        with OutputLock(out):
            written = build_ladder_report(out)
        ladder = run_folder.read_analysis(out)[LADDER_KEY]
    except (FolderLockedError, ValueError, OSError) as err:
        raise fail("compare", f"ladder report: not built ({err})", EXIT_STOPPED) from None
    console.print(f"ladder report: {written[REPORT_MD_FILE]} and {written[REPORT_HTML_FILE]}")
    for line in prediction_lines(ladder):
        console.print(escape(line), soft_wrap=True, highlight=False)
