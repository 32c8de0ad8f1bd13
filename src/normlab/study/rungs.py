"""The rungs of a size ladder (``compare --ladder KEY=v1,v2,…``): one full paired comparison per
model size.

Each rung is the experiment's config with its model set to ``KEY`` = the rung's value by the
testbed's size rule (its :class:`~normlab.experiment.testbeds.base.LadderRule`: the gpt testbed
changes ``d_model`` or ``n_layers`` alone; the lm testbed sets any integer key of a transformers
config, a width bringing its heads and MLP widths along,
:mod:`normlab.models.external.scaling`): the same arms, seeds and data in every rung, and the
same fixed number of steps, or, with ``--tokens-per-param`` X, the steps each rung's own grid
resolves from X and its baseline arm's parameters (:mod:`normlab.run_format.budget`), so each
rung trains in proportion to its size (recorded per rung in ``ladder.json``'s ``budgets``,
:func:`record_rung_budget`). Under ``mup`` a width ladder's base width (``base_d_model``,
``lm.base_hidden_size``) is the smallest rung, so the smallest model is the standard one and
the rates tuned there carry up. This module names no testbed: what a ladder may vary, how a
rung is made and how its parameters are counted are the testbed's hooks.

The ladder folder ``OUT`` holds ``ladder.json`` (the plan: key, values, rung folders, the size
rule and per rung the settings it changed with their values, target, how long the rungs train
and, once each rung is planned, its budget)
and one compare folder per rung, ``OUT/<KEY>=<value>/``
(:func:`normlab.run_format.folder.rung_path`), trained one rung after another by the same
executor (each rung's runs as a compare trains them: ``--parallel``, ``--executor``,
``--nproc-per-node``); with ``--plan`` every rung's runs are
prepared and listed as ``<KEY>=<value>/<run_id>``.

Everything :func:`plan_ladder` checks — the key, the values, each rung's config, the target
against the largest rung's parameter count — is checked before anything is written, and each
refusal is one ``ValueError`` line that names the option. :mod:`normlab.study.ladder` trains
(or plans) the rungs this module makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from normlab.analysis.training_budget import experiment_budget
from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.runner import check_out_path, foreign_entries
from normlab.experiment.testbeds.base import LadderRule
from normlab.run_format import folder as run_folder
from normlab.run_format.budget import PARAM_COUNT_WORDS, fmt_tokens_per_param
from normlab.study.spec import LadderSpec

__all__ = [
    "DEFAULT_TARGET_FACTOR",
    "LadderPlan",
    "check_ladder_out",
    "length_words",
    "parse_ladder",
    "plan_ladder",
    "prepare_ladder",
    "record_rung_budget",
]

DEFAULT_TARGET_FACTOR = 100.0
"""Without ``--target-params``: the prediction is made at this many times the largest rung's
parameter count (the baseline arm's)."""


@dataclass(frozen=True)
class LadderPlan:
    """A checked ladder: ``key``, ``values`` (ascending), per rung its ``setting``
    (``d_model=64``), config, the model settings it changed with their values (``changes``)
    and the baseline arm's parameter count, ``target_params``, and the testbed's size ``rule``
    and ``parametrization``."""

    key: str
    values: tuple[int, ...]
    settings: tuple[str, ...]
    configs: tuple[ExperimentConfig, ...]
    n_params: tuple[int, ...]
    target_params: float
    changes: tuple[dict[str, Any], ...] = ()
    rule: str = ""
    parametrization: str = "sp"
    carries_rates: bool = False
    """Under μP, a width ladder (its rungs set the testbed's base width to the smallest
    rung): one learning rate holds across its rungs."""

    def record(self) -> dict[str, Any]:
        """The content of ``ladder.json``."""
        return {
            "key": self.key,
            "values": list(self.values),
            "rungs": list(self.settings),
            "n_params": list(self.n_params),
            "target_params": self.target_params,
            "parametrization": self.parametrization,
            "steps": length_words(self.configs[0]),
            "rule": self.rule,
            "changes": dict(zip(self.settings, self.changes, strict=True)),
        }


def length_words(cfg: ExperimentConfig) -> str:
    """How long a ladder's rungs train, as ``ladder.json``'s ``steps`` says it: the same fixed
    steps in every rung, or a budget of tokens per parameter that gives each rung its own."""
    x = cfg.train.tokens_per_param
    if x is None:
        return "fixed: the same number of steps in every rung"
    counted = PARAM_COUNT_WORDS[cfg.train.param_count]
    return (
        f"{fmt_tokens_per_param(x)} tokens per parameter of each rung's baseline arm, "
        f"{counted} parameters counted: each rung trains its own tokens and steps, every arm "
        "of a rung the same"
    )


def record_rung_budget(out: Path, setting: str) -> None:
    """Put how long the rung ``setting`` of the ladder folder ``out`` trains into
    ``ladder.json``'s ``budgets`` ({setting: {``given``, ``tokens_per_param``, ``n_params``,
    ``param_count``, ``tokens``, ``steps``}}), from the rung's experiment.json as its grid
    planned it (:func:`normlab.analysis.training_budget.experiment_budget`); nothing while the
    rung has none (a damaged one raises the reader's ``ValueError`` naming it)."""
    try:
        experiment = run_folder.read_experiment(run_folder.rung_path(out, setting))
    except FileNotFoundError:
        return
    budget = experiment_budget(experiment)
    if budget is None:
        return
    plan = run_folder.read_ladder_plan(out)
    budgets = plan.get("budgets") if isinstance(plan.get("budgets"), dict) else {}
    plan["budgets"] = {**budgets, setting: budget}
    run_folder.write_ladder_plan(out, plan)


def parse_ladder(text: str) -> dict[str, list[int]]:
    """``"d_model=32,64,128"`` → ``{"d_model": [32, 64, 128]}``; ``ValueError`` naming
    ``--ladder`` when it is not KEY=integer,integer,…"""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--ladder: expected KEY=v1,v2,… (e.g. d_model=32,64,128), got {text!r}")
    items = [v.strip() for v in values.split(",") if v.strip()]
    out = []
    for item in items:
        try:
            out.append(int(item))
        except ValueError:
            raise ValueError(
                f"--ladder: expected integer sizes for {key}, got {item!r} in {text!r}"
            ) from None
    return {key: out}


def _testbed_rule(cfg: ExperimentConfig) -> LadderRule:
    rule = cfg.testbeds[cfg.testbed].config.ladder
    if rule is None:
        with_ladder = [n for n, t in cfg.testbeds.items() if t.config.ladder is not None]
        raise ValueError(
            f"--ladder: not available for the {cfg.testbed} testbed here; expected the "
            f"{' or '.join(with_ladder)} testbed"
        )
    return rule


def _key_and_values(spec: LadderSpec, rule: LadderRule) -> tuple[str, list[int]]:
    key, values = spec.key, list(spec.values)
    rule.check_key(spec.config, key)
    if len(values) < 2:
        raise ValueError(
            f"--ladder: expected at least two sizes to fit a trend, got {len(values)} "
            f"({key}={','.join(map(str, values))})"
        )
    if len(set(values)) != len(values):
        raise ValueError(f"--ladder: expected distinct sizes, got {key}={values}")
    return key, sorted(values)


def _rung_config(
    cfg: ExperimentConfig, rule: LadderRule, key: str, value: int, smallest: int
) -> tuple[ExperimentConfig, dict[str, Any]]:
    """``cfg`` with its model at ``key`` = ``value`` by the testbed's rule, and the settings
    the rung changed."""
    sections, changes = rule.rung(cfg, key, value, smallest)
    return cfg.model_copy(update=dict(sections)), changes


def plan_ladder(spec: LadderSpec) -> LadderPlan:
    """Check the ladder ``spec`` (its key, sizes and target) and make each rung's config;
    writes nothing. ``ValueError`` naming ``--ladder`` or ``--target-params`` for: a testbed
    without a ladder, a key the testbed's model lacks, fewer than two distinct sizes, a rung
    that is not a valid model, or a target below the largest rung's parameter count."""
    cfg = spec.config
    rule = _testbed_rule(cfg)
    key, values = _key_and_values(spec, rule)
    rungs = [_rung_config(cfg, rule, key, v, values[0]) for v in values]
    configs = tuple(c for c, _ in rungs)
    counts = tuple(rule.n_params(c) for c in configs)
    largest = max(counts)
    target = spec.target_params
    if target is None:
        target = DEFAULT_TARGET_FACTOR * largest
    elif target < largest:
        raise ValueError(
            f"--target-params: {target:.6g} is below the largest rung's {largest:,} parameters "
            f"({key}={values[-1]}); expected a size at or beyond the ladder"
        )
    return LadderPlan(
        key,
        tuple(values),
        tuple(f"{key}={v}" for v in values),
        configs,
        counts,
        float(target),
        changes=tuple(c for _, c in rungs),
        rule=rule.rule,
        parametrization=rule.parametrization(cfg),
        carries_rates=rule.parametrization(cfg) == "mup"
        and all(rule.base_width_key in c for _, c in rungs),
    )


def check_ladder_out(out: Path) -> None:
    """``ValueError`` naming ``--out`` unless ``out`` is missing, empty, or a ladder folder
    (it holds ``ladder.json``; resuming it re-uses each rung's finished runs). Writes nothing."""
    check_out_path(out)
    if not out.is_dir() or run_folder.has_ladder_plan(out):
        return
    entries = sorted(p.name for p in out.iterdir())
    if entries and not foreign_entries(out) and run_folder.has_experiment(out):
        raise ValueError(
            f"out: {str(out)!r} is the folder of a compare without --ladder; expected a new "
            "or empty folder, or the folder of an earlier compare --ladder"
        )
    if entries:
        raise ValueError(
            f"out: {str(out)!r} is not empty and is not a ladder folder (no "
            f"{'ladder.json'}); expected a new or empty folder, or the folder of an earlier "
            "compare --ladder. Nothing was written."
        )


def prepare_ladder(plan: LadderPlan, out: Path, sweep: dict[str, Any] | None = None) -> None:
    """Create ``out`` and write ``ladder.json`` (after :func:`check_ladder_out`), with the
    learning-rate sweep's plan under ``lr_sweep`` when there is one (``rates``,
    ``tuning_seeds``, ``swept``: the rungs swept, ``chosen_at``: {rung: the swept rung whose
    best rates it runs}; :mod:`normlab.study.sweep`)."""
    out.mkdir(parents=True, exist_ok=True)
    record = plan.record()
    if sweep is not None:
        record["lr_sweep"] = sweep
    run_folder.write_ladder_plan(out, record)
