"""The grid: one resolved config per (arm, seed), checked to differ only in the factors studied.

Before anything trains, :func:`plan_runs` (1) resolves every run's config, (2) builds each arm's
model for every seed and checks that the parameters they share start from equal values, and
(3) compares the resolved configs of the arms and refuses, naming the field, if anything other
than the norm, the placement and the training precision differs. Precision is not part of
initialisation: arms that differ only in precision must start from equal parameters.

With per-arm learning rates (``train.arm_lr``, set by ``compare --lr-sweep``) each run's
``train.lr`` is its arm's rate, and ``train.lr`` is the one more field the arms may differ in;
initialisation, data order and seeds stay shared.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from normlab.experiment.config import ExperimentConfig
from normlab.experiment.testbeds import TESTBEDS, build_model, init_seed
from normlab.models import check_paired
from normlab.models.counts import budget_count
from normlab.run_format import FACTORS, run_id
from normlab.run_format.budget import BUDGET_PARAMS, budget_record, budget_words

IDENTITY_FIELDS = ("run_id", "arm", *FACTORS)
PER_ARM_FIELDS = ("n_params", "n_norm_params")
PER_SEED_FIELDS = ("seed", "init_digest")
PER_ARM_LR = "train.lr"
"""The field arms may differ in when the config gives per-arm rates (``train.arm_lr``)."""
_MISSING = object()


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def first_difference(
    a: dict[str, Any], b: dict[str, Any], allowed: Iterable[str] = ()
) -> tuple[str, str, str] | None:
    """The first dotted field (in sorted order), outside ``allowed``, whose value differs between
    the run configs ``a`` and ``b``, as (field, repr in ``a``, repr in ``b``); a field missing
    from one side shows as ``(absent)``. ``None`` when they agree. An allowed field allows its
    sub-fields too (``norm_swap`` allows ``norm_swap.kind``)."""
    allowed = set(allowed)
    flat_a, flat_b = flatten(a), flatten(b)
    for key in sorted(set(flat_a) | set(flat_b)):
        parts = key.split(".")
        if any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1)):
            continue
        va, vb = flat_a.get(key, _MISSING), flat_b.get(key, _MISSING)
        if va != vb:
            shown_a, shown_b = ("(absent)" if v is _MISSING else repr(v) for v in (va, vb))
            return key, shown_a, shown_b
    return None


def check_only_factors_differ(runs: list[dict[str, Any]], allowed: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first field, outside ``allowed``, whose value is not the
    same in every run (fields are dotted paths, e.g. ``train.lr``)."""
    allowed = sorted(set(allowed))
    if len(runs) < 2:
        return
    for other in runs[1:]:
        diff = first_difference(runs[0], other, allowed)
        if diff is None:
            continue
        key, shown_a, shown_b = diff
        may_differ = f"only {', '.join(allowed)} may differ" if allowed else "nothing may differ"
        raise ValueError(
            f"runs {runs[0]['run_id']!r} and {other['run_id']!r} differ in {key!r} "
            f"({shown_a} vs {shown_b}); {may_differ}. "
            "Refusing to train an unpaired comparison."
        )


def shared_settings(
    cfg: ExperimentConfig,
    device: str,
    threads: int,
    data_info: dict[str, Any],
    budget: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a run needs that is the same for every arm and seed, under the experiment
    config's own section and key names: the testbed's sections and data record
    (:meth:`normlab.experiment.testbeds.Testbed.run_settings`), ``train`` (as the config gives
    it for this testbed, with the resolved ``steps`` and the ``tokens`` they make; under a
    budget of tokens per parameter those of ``budget``, :func:`resolve_budget`, and its N as
    ``train.budget_params``: None until the grid has counted it), ``anomaly``, ``device``,
    ``threads`` and ``imports``."""
    testbed = TESTBEDS[cfg.testbed].run_settings(cfg, data_info)
    steps = cfg.fixed_steps() if budget is None else int(budget["steps"])
    train = cfg.dump()["train"]
    train.pop("arm_lr", None)  # per arm: each run's own train.lr (plan_runs)
    train.update(steps=steps, tokens=None if steps is None else steps * cfg.tokens_per_step())
    if budget is not None:
        train = _with_budget_params(train, int(budget["n_params"]))
    data = testbed.pop("data")
    return {
        **testbed,
        "train": train,
        "anomaly": cfg.anomaly.model_dump(),
        "device": device,
        "threads": threads,
        "imports": list(cfg.imports),
        "data": data,
        **precision_settings(cfg),
    }


def _with_budget_params(train: dict[str, Any], n_params: int) -> dict[str, Any]:
    """``train`` with :data:`~normlab.run_format.budget.BUDGET_PARAMS` = ``n_params`` right
    after ``param_count`` (the budget's keys together)."""
    out: dict[str, Any] = {}
    for key, value in train.items():
        out[key] = value
        if key == "param_count":
            out[BUDGET_PARAMS] = n_params
    out.setdefault(BUDGET_PARAMS, n_params)
    return out


def resolve_budget(cfg: ExperimentConfig, baseline: nn.Module) -> dict[str, Any]:
    """The grid's budget of ``train.tokens_per_param`` X
    (:func:`normlab.run_format.budget.budget_record`): N = the ``baseline`` arm's model
    counted as ``train.param_count`` says
    (:func:`normlab.models.counts.budget_count`), steps = ⌈X · N / tokens per step⌉, checked
    against the warm-up and the options that depend on the steps
    (:meth:`ExperimentConfig.check_steps`); a budget too small for them is one ``ValueError``
    line naming ``--tokens-per-param``."""
    x, how = cfg.train.tokens_per_param, cfg.train.param_count
    assert x is not None  # only under a budget
    n = budget_count(baseline, how)
    record = budget_record(x, how, n, cfg.tokens_per_step())
    try:
        cfg.check_steps(record["steps"])
    except ValueError as err:
        raise ValueError(
            f"--tokens-per-param: {budget_words(x, n, how)}, make {record['steps']:,} steps "
            f"of {cfg.tokens_per_step():,} tokens, too few: {err}"
        ) from None
    return record


def precision_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The precision settings every run shares: ``fp16_init_scale`` when fp16 is among the
    precisions, nothing otherwise (so that fp32 and bf16 runs record no scaler)."""
    return {"fp16_init_scale": cfg.fp16_init_scale} if "fp16" in cfg.precisions else {}


def plan_runs(
    cfg: ExperimentConfig, device: str, threads: int, data_info: dict[str, Any]
) -> list[dict[str, Any]]:
    """The resolved config of every run, seed-major (all arms of seed 0, then seed 1, …), with
    ``init_digest`` (digest of the shared initial parameters) and parameter counts filled in.

    Each run trains at its arm's peak rate (:meth:`ExperimentConfig.arm_lr`: ``train.arm_lr``,
    else ``train.lr``), recorded as its ``train.lr``. Under a budget of tokens per parameter
    (``train.tokens_per_param``) the steps are resolved once, from the baseline arm's model of
    the first seed (:func:`resolve_budget`; the model already built to check the pairing), and
    every run of the grid trains them.

    Raises ``ValueError`` if the arms do not share their non-norm parameters with equal initial
    values, if their configs differ in anything but the factors under study (and, with
    per-arm rates, ``train.lr``), or if a budget is too small for the warm-up or the cooldown.
    """
    settings = shared_settings(cfg, device, threads, data_info)
    arm_keys: set[str] = {PER_ARM_LR} if cfg.train.arm_lr else set()
    runs: list[dict[str, Any]] = []
    for seed in cfg.seed_list():
        models = _arm_models(cfg, settings, seed)
        if cfg.train.tokens_per_param is not None and not runs:
            budget = resolve_budget(cfg, models[cfg.baseline_arm()][1])
            settings = shared_settings(cfg, device, threads, data_info, budget)
        seed_runs = [
            _run_config(cfg, settings, seed, arm, factors, model, arm_keys)
            for arm, (factors, model) in models.items()
        ]
        digest = check_paired({arm: model for arm, (_, model) in models.items()})
        for run in seed_runs:
            run["init_digest"] = digest
        per_arm = (*PER_ARM_FIELDS, *sorted(arm_keys))
        check_only_factors_differ(seed_runs, IDENTITY_FIELDS + per_arm)
        runs.extend(seed_runs)
    per_arm = (*PER_ARM_FIELDS, *sorted(arm_keys))
    check_only_factors_differ(runs, IDENTITY_FIELDS + per_arm + PER_SEED_FIELDS)
    return runs


def _arm_models(
    cfg: ExperimentConfig, settings: dict[str, Any], seed: int
) -> dict[str, tuple[dict[str, str], nn.Module]]:
    """{arm: (its factors, its model for ``seed``)} in grid order."""
    models = {}
    for arm, norm, placement, precision in cfg.arm_factors():
        factors = dict(zip(FACTORS, (norm, placement, precision), strict=True))
        model = build_model({**settings, **factors}, init_seed({**settings, "seed": seed}))
        models[arm] = (factors, model)
    return models


def _run_config(
    cfg: ExperimentConfig,
    settings: dict[str, Any],
    seed: int,
    arm: str,
    factors: dict[str, str],
    model: nn.Module,
    arm_keys: set[str],
) -> dict[str, Any]:
    """The run config of ``arm`` at ``seed`` (its ``model`` built), its testbed's per-arm
    fields added to ``arm_keys``."""
    n_params, n_norm_params = model.count_parameters()  # type: ignore[operator]
    extra = TESTBEDS[cfg.testbed].arm_fields(model)
    arm_keys.update(extra)
    run = {
        "run_id": run_id(arm, seed),
        "arm": arm,
        "seed": seed,
        **factors,
        **copy.deepcopy(settings),
        "n_params": n_params,
        "n_norm_params": n_norm_params,
        **extra,
    }
    run["train"]["lr"] = cfg.arm_lr(arm)
    return run


def parameter_counts(runs: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """{arm: (parameters, parameters inside norms)}."""
    return {r["arm"]: (r["n_params"], r["n_norm_params"]) for r in runs}
