"""A grid of normlab's own runs: a registered testbed's model, trained by normlab's loop.

The kind of grid of an :class:`normlab.experiment.config.ExperimentConfig`
(:mod:`normlab.experiment.execution.kinds`). Before anything is written it checks the testbed's
inputs (:meth:`Testbed.check_inputs`), the device and the memory and disk the runs will need;
under the folder's lock it prepares the data (:meth:`Testbed.prepare_data`) and plans every run
(:func:`normlab.experiment.execution.grid.plan_runs`: each arm built for every seed, the
parameters they share checked equal, the configs checked to differ only in the factors), so the
pairing is checked before training and there is nothing to check after it. Each run's worker
trains it with :func:`normlab.experiment.training.train.train_run` (one process, or torchrun
when ``scale`` asks for several).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from normlab._plural import counted
from normlab.distributed.wrap import DEFAULT_PRECISION
from normlab.experiment.config import ExperimentConfig
from normlab.experiment.execution.environment import default_threads, environment, resolve_device
from normlab.experiment.execution.grid import flatten, plan_runs
from normlab.experiment.execution.sizes import check_experiment_sizes, check_records_disk
from normlab.experiment.testbeds import TESTBEDS
from normlab.run_format import DATA_DIR, FACTORS
from normlab.run_format.budget import (
    ALL_PARAMS,
    BUDGET_KEY,
    BUDGET_PARAMS,
    budget_record,
    budget_words,
)
from normlab.run_format.experiment_record import experiment_record
from normlab.run_format.testbeds import NORM_SWAP_FIELD

__all__ = [
    "RUN_KEYS",
    "OwnGrid",
    "budget_line",
    "fixed_keys",
    "grid_budget",
    "grid_record",
    "norm_swaps",
    "paired_description",
    "prepare_data",
]

RUN_KEYS = ("train", "anomaly", "device", "threads", "data")
"""The keys of a run config that every testbed's runs hold besides ``testbed`` and the
testbed's own config sections (``data``: the record of the data, :meth:`Testbed.run_settings`)."""


def fixed_keys(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The keys of a run config whose settings ``experiment.json``'s ``fixed`` lists (as dotted
    keys, from the first run): ``testbed``, the sections the testbed declares
    (:attr:`TestbedConfig.sections`; no testbed is named here), then :data:`RUN_KEYS`."""
    sections = TESTBEDS[cfg.testbed].config.sections
    return ("testbed", *(k for k in sections if k not in RUN_KEYS), *RUN_KEYS)


class OwnGrid:
    """How a grid of normlab's own runs is checked, planned and recorded (the interface of
    :class:`normlab.experiment.execution.kinds.GridKind`)."""

    exports_each_run = True
    """Each run is exported as it ends: its pairing was checked before it trained."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.device = ""
        self.threads = 0
        self.data_info: dict[str, Any] = {}

    def check(self, out: Path) -> None:
        """The testbed's inputs (the ``--data`` path, an lm's tokenizer and model source), the
        device, and the memory and disk the runs need; writes nothing."""
        TESTBEDS[self.cfg.testbed].check_inputs(self.cfg)
        self.device = resolve_device(self.cfg.device)
        check_experiment_sizes(self.cfg, out)  # memory and disk, before anything is allocated
        self.threads = self.cfg.threads or default_threads()

    def plan(self, out: Path, console: Console) -> list[dict[str, Any]]:
        """Prepare the data in ``out/data`` and plan every run (its config, parameter counts
        and initial digest; refuses unpaired arms), with how each is launched (``scale``) when
        it runs on several processes."""
        self.data_info = prepare_data(self.cfg, out / DATA_DIR, console)
        runs = plan_runs(self.cfg, self.device, self.threads, self.data_info)
        if self.cfg.fixed_steps() is None:  # a budget's steps: known now
            check_records_disk(self.cfg, out, runs[0]["train"]["steps"])
        if self.cfg.scale.world_size > 1:
            for r in runs:  # how each run is started (torchrun); not part of what it computes
                r["scale"] = self.cfg.scale.launch_spec()
        return runs

    def describe(self, runs: list[dict[str, Any]], console: Console) -> None:
        """Print each arm's parameter counts, then what the grid pairs
        (:func:`paired_description`)."""
        seen = set()
        for r in runs:
            if r["arm"] not in seen:
                seen.add(r["arm"])
                console.print(
                    f"arm {r['arm']}: {r['n_params']:,} parameters "
                    f"({r['n_norm_params']:,} in norms)"
                )
        console.print(paired_description(self.cfg, runs, self.device, self.threads))

    def record(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """``experiment.json`` (:func:`grid_record`)."""
        env = environment(self.device, self.threads)
        return grid_record(self.cfg, runs, self.data_info, env)

    def after_training(
        self, runs: list[dict[str, Any]], out: Path, console: Console
    ) -> dict[str, dict[str, Any]]:
        """Nothing to check: the pairing was checked before training. Returns {}."""
        return {}

    def settled(self, summaries: dict[str, dict[str, Any]]) -> list[str]:
        """Every run of ``summaries``: none can be refused after it trained."""
        return list(summaries)

    def paths(self) -> dict[str, Any]:
        """The ``--data`` path (the text testbeds' corpus; None where there is none)."""
        return {"data": self.cfg.data.path}

    @staticmethod
    def after_planned_run(out: Path, run_id: str, console: Console) -> list[str]:
        """Nothing to check: the run ``run_id`` is final as it ends. Returns [run_id]."""
        return [run_id]


def grid_record(
    cfg: ExperimentConfig,
    runs: list[dict[str, Any]],
    data_info: dict[str, Any],
    env: dict[str, Any],
) -> dict[str, Any]:
    """The content of ``experiment.json`` (docs/run-format.md;
    :func:`normlab.run_format.experiment_record.experiment_record`): the settings every run
    shares as dotted keys (those of :func:`fixed_keys` in the first run, but an arm's own
    learning rate), each arm's parameter counts and, when present, its norm swap record and
    learning rate, and the budget of tokens per parameter when one was given
    (:func:`grid_budget`)."""
    settings = flatten({k: runs[0][k] for k in fixed_keys(cfg) if k in runs[0]})
    extra: dict[str, Any] = {
        "parameter_counts": {
            r["arm"]: {"n_params": r["n_params"], "n_norm_params": r["n_norm_params"]} for r in runs
        },
        **norm_swaps(runs),
        **grid_budget(cfg, runs),
    }
    if cfg.train.arm_lr:  # each arm at its own rate: not a fixed setting
        settings.pop("train.lr", None)
        extra["learning_rates"] = {a: cfg.arm_lr(a) for a in cfg.arm_names()}
    return experiment_record(
        **cfg.grid_fields(),
        settings=settings,
        environment=env,
        runs=[r["run_id"] for r in runs],
        target_val_loss=cfg.train.target_val_loss,
        data=data_info,
        extra=extra,
    )


def grid_budget(cfg: ExperimentConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"budget": record}`` (:func:`normlab.run_format.budget.budget_record`: X, how N was
    counted, N, tokens per step, steps, tokens) when the grid trains to a budget of tokens
    per parameter, read from its runs (every run holds the same), else {}."""
    train = runs[0]["train"]
    if train.get("tokens_per_param") is None:
        return {}
    record = budget_record(
        train["tokens_per_param"], train["param_count"], train[BUDGET_PARAMS], cfg.tokens_per_step()
    )
    return {BUDGET_KEY: record}


def norm_swaps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"norm_swaps": {arm: record}}`` when the runs carry a per-arm ``norm_swap`` record
    (the lm testbed: which of the model's norm modules hold the arm's norm, which were held),
    else {}."""
    records = {r["arm"]: r[NORM_SWAP_FIELD] for r in runs if NORM_SWAP_FIELD in r}
    return {"norm_swaps": records} if records else {}


def paired_description(
    cfg: ExperimentConfig, runs: list[dict[str, Any]], device: str, threads: int
) -> str:
    """The line that says what the grid varies and what it costs: only the factors with more
    than one value differ (the norm, the placement, or both), and each arm's own learning rate
    when the config gives per-arm rates, each count with its plural; last the tokens per
    parameter (:func:`budget_line`)."""
    values = {
        "norm": list(cfg.norms),
        "placement": list(cfg.placements),
        "precision": list(cfg.precisions),
    }
    factors = FACTORS
    varied = [f for f in factors if len(values.get(f, [])) > 1] or ["norm"]
    fixed = [
        f"{f} {values[f][0]}"
        for f in factors
        if f not in varied
        and values.get(f)
        and (f, values[f]) != ("precision", [DEFAULT_PRECISION])
    ]  # float32, the default precision, goes without saying
    fixed_text = f" ({', '.join(fixed)} for all)" if fixed else ""
    if cfg.train.arm_lr:
        shown = ", ".join(f"{a} {cfg.arm_lr(a):g}" for a in cfg.arm_names())
        fixed_text += f", each arm at its own peak learning rate ({shown})"
    steps = runs[0]["train"]["steps"]
    seeds = len({r["seed"] for r in runs})
    return (
        f"paired: shared parameters equal across arms for every seed; only the "
        f"{' and '.join(varied)} differ{'s' if len(varied) == 1 else ''}{fixed_text}. "
        f"{counted(len(runs), 'run')} ({counted(seeds, 'seed')}) × {counted(steps, 'step')} "
        f"on {device} with {counted(threads, 'thread')}{budget_line(cfg, runs)}"
    )


def budget_line(cfg: ExperimentConfig, runs: list[dict[str, Any]]) -> str:
    """`` (X tokens per parameter of the baseline arm's N parameters, all)``: how many tokens
    each run trains per parameter of the baseline arm
    (:func:`normlab.run_format.budget.budget_words`), the budget's X and N when one was given,
    else the runs' tokens over the baseline arm's parameter count (all); "" when the runs do
    not say."""
    train = runs[0]["train"]
    if train.get("tokens_per_param") is not None:
        x, n, how = train["tokens_per_param"], train[BUDGET_PARAMS], train["param_count"]
    else:
        base = next((r for r in runs if r.get("arm") == cfg.baseline_arm()), {})
        n, tokens, how = base.get("n_params"), train.get("tokens"), ALL_PARAMS
        if not n or tokens is None:
            return ""
        x = tokens / n
    return f" ({budget_words(x, n, how)})"


def prepare_data(cfg: ExperimentConfig, data_dir: Path, console: Console) -> dict[str, Any]:
    """Prepare the testbed's data in ``data_dir`` (:meth:`Testbed.prepare_data`: the GPT's token
    cache, the description of the DiT's shapes, the lm's tokenizer and token cache), say what it
    is, and check that it fits; returns ``data.json``'s content."""
    return TESTBEDS[cfg.testbed].prepare_data(cfg, data_dir, console)
