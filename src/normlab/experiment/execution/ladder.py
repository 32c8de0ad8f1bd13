"""A size ladder (``compare --ladder KEY=v1,v2,…``): one full paired comparison per model size.

Each rung is the experiment's config with one model setting changed (``KEY`` = the rung's
value): the same arms, seeds, data and *fixed number of steps* in every rung (the steps do not
follow the size; a budget of tokens per parameter is not implemented). Under
``parametrization: mup`` with a ``d_model`` ladder the base width ``base_d_model`` is the
smallest rung, so the smallest model is the standard one and the rates tuned there carry up.

The ladder folder ``OUT`` holds ``ladder.json`` (the plan: key, values, rung folders, target)
and one compare folder per rung, ``OUT/<KEY>=<value>/``
(:func:`normlab.run_format.folder.rung_path`), trained one rung after another by the same
executor (each rung's runs as a compare trains them: ``--parallel``, ``--executor``,
``--nproc-per-node``); with ``--plan`` every rung's runs are
prepared and listed as ``<KEY>=<value>/<run_id>``.

Everything :func:`plan_ladder` checks — the key, the values, each rung's config, the target
against the largest rung's parameter count — is checked before anything is written, and each
refusal is one ``ValueError`` line that names the option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.runner import check_out_path, foreign_entries
from normlab.models.config import GPTSettings
from normlab.run_format import folder as run_folder

__all__ = [
    "DEFAULT_TARGET_FACTOR",
    "LADDER_KEYS",
    "LadderPlan",
    "check_ladder_out",
    "parse_ladder",
    "plan_ladder",
    "prepare_ladder",
]

LADDER_KEYS: dict[str, tuple[str, ...]] = {"gpt": ("d_model", "n_layers")}
"""The model settings a ladder may vary, per testbed (the gpt testbed's ``model`` section)."""
DEFAULT_TARGET_FACTOR = 100.0
"""Without ``--target-params``: the prediction is made at this many times the largest rung's
parameter count (the baseline arm's)."""


@dataclass(frozen=True)
class LadderPlan:
    """A checked ladder: ``key``, ``values`` (ascending), per rung its ``setting``
    (``d_model=64``), config and the baseline arm's parameter count, and ``target_params``."""

    key: str
    values: tuple[int, ...]
    settings: tuple[str, ...]
    configs: tuple[ExperimentConfig, ...]
    n_params: tuple[int, ...]
    target_params: float

    def record(self) -> dict[str, Any]:
        """The content of ``ladder.json``."""
        return {
            "key": self.key,
            "values": list(self.values),
            "rungs": list(self.settings),
            "n_params": list(self.n_params),
            "target_params": self.target_params,
            "parametrization": self.configs[0].model.parametrization,
            "steps": "fixed: the same number of steps in every rung",
        }


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


def _key_and_values(cfg: ExperimentConfig) -> tuple[str, list[int]]:
    ladder = cfg.ladder or {}
    if len(ladder) != 1:
        raise ValueError(
            f"--ladder: expected one KEY=v1,v2,… (e.g. d_model=32,64,128), got {len(ladder)} keys"
        )
    ((key, values),) = ladder.items()
    keys = LADDER_KEYS.get(cfg.testbed)
    if keys is None:
        raise ValueError(
            f"--ladder: not available for the {cfg.testbed} testbed here; expected the gpt "
            f"testbed ({', '.join(LADDER_KEYS['gpt'])})"
        )
    if key not in keys:
        raise ValueError(
            f"--ladder: the {cfg.testbed} model has no setting {key!r} to ladder; expected "
            f"one of {', '.join(keys)}"
        )
    if len(values) < 2:
        raise ValueError(
            f"--ladder: expected at least two sizes to fit a trend, got {len(values)} "
            f"({key}={','.join(map(str, values))})"
        )
    if len(set(values)) != len(values):
        raise ValueError(f"--ladder: expected distinct sizes, got {key}={values}")
    return key, sorted(values)


def _rung_config(cfg: ExperimentConfig, key: str, value: int, base: int) -> ExperimentConfig:
    """``cfg`` at ``key`` = ``value`` (and, under mup with a width ladder, ``base_d_model`` =
    the smallest width), without the ladder's own fields, validated anew."""
    update: dict[str, Any] = {key: value}
    if key == "d_model" and cfg.model.parametrization == "mup":
        update["base_d_model"] = base
    try:
        model = GPTSettings(**{**cfg.model.model_dump(), **update})
    except ValueError as err:  # a pydantic ValidationError, or a validator's own ValueError
        if isinstance(err, ValidationError):
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        else:
            why = str(err)
        raise ValueError(f"--ladder: the rung {key}={value} is not a valid model: {why}") from None
    return cfg.model_copy(update={"model": model, "ladder": None, "target_params": None})


def _n_params(rung: ExperimentConfig) -> int:
    """The parameter count of the rung's baseline arm (built once, seed 0, nothing written)."""
    from normlab.models import GPTConfig, build_gpt

    base = rung.baseline_arm()
    for arm, norm, placement, _precision in rung.arm_factors():
        if arm == base:
            model = build_gpt(
                GPTConfig(**rung.model.model_dump(), norm=norm, placement=placement), 0
            )
            return int(model.count_parameters()[0])
    raise AssertionError(base)  # the baseline is one of the arms


def plan_ladder(cfg: ExperimentConfig) -> LadderPlan:
    """Check ``cfg.ladder`` and ``cfg.target_params`` and make each rung's config; writes
    nothing. ``ValueError`` naming ``--ladder`` or ``--target-params`` for: not one key, a key
    the testbed's model lacks, fewer than two distinct sizes, a rung that is not a valid model,
    or a target below the largest rung's parameter count."""
    key, values = _key_and_values(cfg)
    configs = tuple(_rung_config(cfg, key, v, values[0]) for v in values)
    counts = tuple(_n_params(c) for c in configs)
    largest = max(counts)
    target = cfg.target_params
    if target is None:
        target = DEFAULT_TARGET_FACTOR * largest
    elif target < largest:
        raise ValueError(
            f"--target-params: {target:.6g} is below the largest rung's {largest:,} parameters "
            f"({key}={values[-1]}); expected a size at or beyond the ladder"
        )
    return LadderPlan(
        key, tuple(values), tuple(f"{key}={v}" for v in values), configs, counts, float(target)
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
    best rates it runs}; :mod:`normlab.experiment.execution.lr_sweep`)."""
    out.mkdir(parents=True, exist_ok=True)
    record = plan.record()
    if sweep is not None:
        record["lr_sweep"] = sweep
    run_folder.write_ladder_plan(out, record)


def for_each_rung(
    plan: LadderPlan,
    out: Path,
    step: Callable[[str, ExperimentConfig, Path], Any],
    console: Console,
) -> dict[str, Any]:
    """``step(setting, config, folder)`` for every rung in ascending size; {setting: result}."""
    results = {}
    for setting, cfg, n in zip(plan.settings, plan.configs, plan.n_params, strict=True):
        console.print(f"rung {setting}: {n:,} parameters ({cfg.baseline_arm()})")
        results[setting] = step(setting, cfg, run_folder.rung_path(out, setting))
    return results
