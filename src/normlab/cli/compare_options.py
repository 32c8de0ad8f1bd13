"""The options of ``normlab compare``: which config key each sets, their help, and their parsing.

Each flag of :data:`FLAG_KEYS` sets one key of the experiment config
(:class:`normlab.experiment.config.ExperimentConfig`) or of the study's settings
(:class:`normlab.study.spec.StudySettings`: ``ladder``, ``target_params``, ``lr_sweep``,
``tuning_seeds``); its help text and the default it shows come from that key's field, so the
config is the only place a default lives. A flag left out is ``None``: the key keeps the YAML
file's value, or the config's default. :data:`SCRIPT_KEYS` says the same of the flags that set
a ``--script`` grid (:class:`normlab.experiment.config.ScriptConfig`); every other option of
normlab's own training is refused with ``--script``.
"""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from normlab.experiment.config import ExperimentConfig, testbed_defaults
from normlab.study.rungs import parse_ladder
from normlab.study.spec import StudySettings
from normlab.trackers.exporting import parse_kinds

__all__ = [
    "FLAG_KEYS",
    "LADDER_HELP",
    "LR_SWEEP_HELP",
    "MAX_SEEDS_HELP",
    "MAX_TIME_HELP",
    "PARAMETRIZATION_HELP",
    "RECORDED_AS_GIVEN",
    "SCRIPT_HELP",
    "SCRIPT_KEYS",
    "UNTIL_DECIDED_HELP",
    "config_field",
    "flag_help",
    "parse_flags",
    "parse_seeds",
]

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
    "size, each in OUT/KEY=v/, with the same arms, seeds and data in every rung, and the same "
    "--steps, or with --tokens-per-param each rung's own steps in proportion to its baseline "
    "arm's parameters; then the difference against the parameter count, a "
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
SCRIPT_HELP = (
    'Your own training command as the trainer, one run per arm and seed, e.g. "python train.py '
    '--norm {norm} --seed {seed} --out {run_dir}" (placeholders {norm}, {placement}, '
    "{precision}, {seed}, {run_dir}; split into arguments first, then filled in, never run by a "
    "shell). The script logs with normlab.track; needs --metric. See docs/own-loop.md."
)

FLAG_KEYS = {
    "testbed": "testbed",
    "norms": "norms",
    "placements": "placements",
    "precision": "precisions",
    "seeds": "seeds",
    "steps": "train.steps",
    "tokens": "train.tokens",
    "tokens_per_param": "train.tokens_per_param",
    "param_count": "train.param_count",
    "lr": "train.lr",
    "schedule": "train.schedule",
    "warmup": "train.warmup",
    "batch_size": "train.batch_size",
    "device": "device",
    "threads": "threads",
    "parallel": "parallel",
    "log_to": "log_to",
    "data": "data.path",
    "model": "lm.model",
    "model_set": "lm.model_set",
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
"""The config key each flag sets (flag parameter name → dotted key). ``--parametrization`` is
not among them: it goes where the testbed's model keeps it (its declaration,
:func:`normlab.study.loader.route_parametrization`)."""

SCRIPT_KEYS = {
    "script": "command",
    "metric": "metric",
    "margin": "equivalence_margin",
    "run_timeout": "run_timeout",
    "lower_is_better": "lower_is_better",
    "norms": "norms",
    "placements": "placements",
    "precision": "precisions",
    "seeds": "seeds",
    "steps": "steps",
    "threads": "threads",
    "parallel": "parallel",
    "executor": "scale.executor",
    "ray_address": "scale.ray_address",
    "log_to": "log_to",
}
"""The key of :class:`normlab.experiment.config.ScriptConfig` each flag of a ``--script`` grid
sets; an option of normlab's own training that is not here is refused with ``--script``."""

_LIST_FLAGS = ("norms", "placements", "precision", "log_to")
"""Flags given as comma-separated lists."""
RECORDED_AS_GIVEN = ("seeds", "norms", "placements", "ladder", "lr_sweep")
"""Flags whose text, not its parsed value, is recorded for the settling command."""


def config_field(dotted: str) -> FieldInfo:
    """The field at the dotted key ``dotted`` (``"train.lr"``) of :class:`ExperimentConfig`, or
    of :class:`normlab.study.spec.StudySettings` for the study's keys."""
    if dotted in StudySettings.model_fields:
        return StudySettings.model_fields[dotted]
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


def parse_rates(text: str) -> list[float]:
    """``"1e-3,3e-3,1e-2"`` → [0.001, 0.003, 0.01]; ``ValueError`` naming ``--lr-sweep`` when
    an item is not a number (the rates' own rules are
    :func:`normlab.study.spec.check_lr_sweep`'s)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return [float(t) for t in items]
    except ValueError:
        raise ValueError(
            f"--lr-sweep: expected comma-separated learning rates (e.g. 1e-3,3e-3,1e-2), got "
            f"{text!r}"
        ) from None


def parse_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """{flag: parsed value} of the flags of :data:`FLAG_KEYS` as given (text), in that order;
    None where the flag was left out. ``ValueError`` naming the flag for a value it does not
    take (``typer.BadParameter`` for a list or a seed count that is no such thing)."""
    given = {flag: flags[flag] for flag in FLAG_KEYS}
    for flag in _LIST_FLAGS:
        given[flag] = _split(given[flag])
    given["seeds"] = parse_seeds(given["seeds"])
    if given["log_to"] is not None:
        given["log_to"] = list(parse_kinds(given["log_to"]))
    if given["ladder"] is not None:
        given["ladder"] = parse_ladder(given["ladder"])
    if given["lr_sweep"] is not None:
        given["lr_sweep"] = parse_rates(given["lr_sweep"])
    return given
