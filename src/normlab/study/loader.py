"""A compare's config (a YAML file with the flags laid over it) → the validated experiment config
and the specs of the study's transforms.

:func:`load_study` reads the file (or nothing), lays the flags' dotted keys over it,
checks the options that a plain validation would word less clearly (the launch of ``scale``,
the learning-rate sweep), puts ``--parametrization`` where the testbed's model keeps it (the
testbed's declaration, ``TestbedConfig.parametrization``), splits the study's keys
(:data:`normlab.study.spec.STUDY_KEYS`: a ladder, a sweep) from the experiment's, and
validates each (:func:`study_configs`, also for a config given as data); :func:`transforms`
turns the study's settings into the ladder's and the sweep's specs. A YAML file that holds
``ladder:`` or ``lr_sweep:`` at its top level keeps working: those keys never reach
:class:`ExperimentConfig`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError, create_model

from normlab.experiment.config import (
    LENGTH_KEYS,
    ConfigError,
    ExperimentConfig,
    check_scale,
    describe_errors,
    load_config_file,
    merge_overrides,
    selected_testbed,
)
from normlab.experiment.testbeds import TESTBEDS
from normlab.study.spec import (
    DEFAULT_TUNING_SEEDS,
    STUDY_KEYS,
    LadderSpec,
    StudySettings,
    SweepSpec,
    check_lr_sweep,
)

__all__ = [
    "Loaded",
    "build_config_dict",
    "check_lr_sweep_options",
    "check_scale_options",
    "load_study",
    "route_parametrization",
    "split_study_keys",
    "study_configs",
    "transforms",
]


def build_config_dict(config: Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The YAML file's content (or {}) with the flags' values laid over it. A run's length
    given by a flag (``--steps``, ``--tokens``, ``--tokens-per-param``:
    :data:`~normlab.experiment.config.LENGTH_KEYS`) replaces the file's, whichever the file
    gave (and the file's ``param_count`` with its budget of tokens per parameter)."""
    base = load_config_file(config) if config is not None else {}
    train = base.get("train")
    flagged = [k for k in LENGTH_KEYS if overrides.get(f"train.{k}") is not None]
    if isinstance(train, dict) and flagged:
        replaced = set(LENGTH_KEYS) - set(flagged)
        if "tokens_per_param" in replaced:
            replaced.add("param_count")
        base["train"] = {k: v for k, v in train.items() if k not in replaced}
    return merge_overrides(base, overrides)


def route_parametrization(merged: dict[str, Any], value: str | None) -> None:
    """Put ``--parametrization`` ``value`` at the key where the selected testbed's model keeps
    it (its ``TestbedConfig.parametrization``); raise ``ValueError`` with one line naming the
    flag for a testbed whose model has none. An unknown testbed is left to the validation."""
    if value is None:
        return
    name = selected_testbed(merged)
    testbed = TESTBEDS.get(name)
    if testbed is None:
        return
    where = testbed.config.parametrization
    if where is None:
        owners = [t.config.parametrization for t in TESTBEDS.values()]
        held = " and of ".join(o.owner for o in owners if o is not None)
        raise ValueError(
            f"--parametrization: a setting of {held}; the {name} testbed has none (leave the "
            "flag out)"
        )
    merged.update(merge_overrides(merged, {where.key: value}))


def check_lr_sweep_options(merged: dict[str, Any]) -> None:
    """Raise ``ValueError`` with one line naming the option (``--lr-sweep``,
    ``--tuning-seeds``, ``--lr``) when the merged config (file and flags) asks for a sweep that
    :func:`normlab.study.spec.check_lr_sweep` refuses; values of the wrong type are left to
    the validation of :class:`normlab.study.spec.StudySettings`."""
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


def split_study_keys(merged: dict[str, Any]) -> tuple[dict[str, Any], StudySettings]:
    """(the experiment's part of ``merged``, the study's keys validated); :class:`ConfigError`
    naming the key when a study key has the wrong type."""
    given = {k: merged[k] for k in STUDY_KEYS if k in merged}
    rest = {k: v for k, v in merged.items() if k not in STUDY_KEYS}
    try:
        return rest, StudySettings.model_validate(given)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, StudySettings)) from None


class Loaded(NamedTuple):
    """A compare's configs: the experiment ``config`` and the ladder's and the sweep's specs
    (None where not asked for)."""

    config: ExperimentConfig
    ladder: LadderSpec | None
    sweep: SweepSpec | None


CompareFile = create_model(
    "CompareFile",
    __base__=ExperimentConfig,
    **{k: (f.annotation, f) for k, f in StudySettings.model_fields.items()},  # type: ignore[call-overload]
)
"""A compare's config file as a whole (the experiment's keys and the study's): only to name
every valid key when a file holds an unknown one."""


def _validated(rest: dict[str, Any]) -> ExperimentConfig:
    """:func:`normlab.experiment.config.validate_config` of the experiment's part of a file,
    whose unknown keys are named against every key the file may hold (:data:`CompareFile`)."""
    try:
        return ExperimentConfig.model_validate(rest)
    except ValidationError as err:
        raise ConfigError(describe_errors(err, CompareFile)) from None


def study_configs(data: dict[str, Any]) -> Loaded:
    """The configs of ``data``, a config as a YAML file holds it (the study's keys at its top
    level): the learning-rate sweep checked (:func:`check_lr_sweep_options`), the study's
    keys split off and validated, the rest validated as the experiment config, then the
    ladder's and the sweep's specs (:func:`transforms`). ``ValueError``
    (:class:`ConfigError` among them) with one line naming the problem."""
    check_lr_sweep_options(data)
    rest, settings = split_study_keys(data)
    config = _validated(rest)
    return Loaded(config, *transforms(config, settings))


def load_study(
    config: Path | None, overrides: dict[str, Any], parametrization: str | None = None
) -> Loaded:
    """The configs of the YAML file ``config`` with the flags' dotted keys ``overrides`` laid
    over it (:func:`build_config_dict`), the launch checked (:func:`check_scale_options`) and
    ``--parametrization`` routed (:func:`route_parametrization`), then
    :func:`study_configs`."""
    merged = build_config_dict(config, overrides)
    check_scale_options(merged)
    route_parametrization(merged, parametrization)
    return study_configs(merged)


def transforms(
    cfg: ExperimentConfig, settings: StudySettings
) -> tuple[LadderSpec | None, SweepSpec | None]:
    """The ladder's and the sweep's specs of ``settings`` for the grid ``cfg`` (None where not
    asked for); ``ValueError`` naming the option for ``--target-params`` without a ladder and
    for a ladder or a sweep that cannot run."""
    ladder = None
    if settings.ladder is not None:
        ladder = LadderSpec.of(cfg, settings.ladder, settings.target_params)
    elif settings.target_params is not None:
        raise ValueError("--target-params: only with --ladder")
    sweep = None
    if settings.lr_sweep is not None:
        seeds = settings.tuning_seeds
        sweep = SweepSpec(
            tuple(settings.lr_sweep), DEFAULT_TUNING_SEEDS if seeds is None else seeds
        )
    return ladder, sweep
