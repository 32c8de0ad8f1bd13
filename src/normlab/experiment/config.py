"""The experiment's configuration: validated, with errors that name the key and list the valid
ones.

A YAML file has the shape of :class:`ExperimentConfig` (top-level factors and run settings, and
the sections ``model``, ``train``, ``anomaly``, ``data``); command-line flags override it.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from normlab.data.cache import DEFAULT_MAX_BYTES, DEFAULT_VAL_FRACTION
from normlab.experiment.anomaly import (
    DEFAULT_MIN_SCALE,
    DEFAULT_THRESHOLD,
    DEFAULT_WARMUP,
    DEFAULT_WINDOW,
    SpikeRule,
)
from normlab.models.config import GPTConfig
from normlab.models.norms import check_model_norm

DEFAULT_STEPS = 600


class Section(BaseModel):
    """A config section: unknown keys, wrong types and non-finite floats (inf, nan) are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelSettings(Section):
    """The GPT testbed, held equal across arms (see :class:`normlab.models.GPTConfig`)."""

    d_model: int = Field(64, ge=8)
    n_layers: int = Field(4, ge=1)
    n_heads: int = Field(4, ge=1)
    context: int = Field(64, ge=2)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = Field(4.0, gt=0)
    positions: Literal["learned", "rope"] = "rope"
    norm_eps: float | None = Field(1e-5, gt=0)
    dyt_alpha_init: float = 0.5
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSettings:
        GPTConfig(**self.model_dump())  # the testbed's own checks (heads divide d_model, …)
        return self


class TrainSettings(Section):
    """Optimisation and evaluation: AdamW, linear warm-up then cosine decay, gradient clipping.

    Give ``steps`` or ``tokens`` (converted to ⌈tokens / (batch_size · context)⌉ steps), not both;
    with neither, ``steps`` is 600.
    ``grad_clip`` 0 turns clipping off. ``target_val_loss`` (nats per byte) is the level for
    time- and tokens-to-target. ``throughput_warmup`` steps are left out of tokens/s.
    """

    steps: int | None = Field(None, ge=1)
    tokens: int | None = Field(None, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(5e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup: int = Field(30, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)
    eval_interval: int = Field(50, ge=1)
    eval_windows: int = Field(128, ge=1)
    layer_grad_interval: int = Field(10, ge=1)
    throughput_warmup: int = Field(5, ge=0)
    target_val_loss: float | None = Field(2.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _default_steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("steps") is None and data.get("tokens") is None:
            return {**data, "steps": DEFAULT_STEPS}
        return data

    @model_validator(mode="after")
    def _steps_or_tokens(self) -> TrainSettings:
        if self.steps is not None and self.tokens is not None:
            raise ValueError(
                f"give steps or tokens, not both (steps={self.steps}, tokens={self.tokens})"
            )
        return self


class AnomalySettings(Section):
    """Spike detection (see :mod:`normlab.experiment.anomaly`): robust z of the log value against
    the trailing ``window`` steps, judged after ``warmup`` steps."""

    window: int = Field(DEFAULT_WINDOW, ge=3)
    warmup: int = Field(DEFAULT_WARMUP, ge=0)
    loss_z: float = Field(DEFAULT_THRESHOLD, gt=0)
    grad_z: float = Field(DEFAULT_THRESHOLD, gt=0)
    min_scale: float = Field(DEFAULT_MIN_SCALE, gt=0)

    def loss_rule(self) -> SpikeRule:
        return SpikeRule(self.window, self.warmup, self.loss_z, self.min_scale)

    def grad_rule(self) -> SpikeRule:
        return SpikeRule(self.window, self.warmup, self.grad_z, self.min_scale)


class DataSettings(Section):
    """``path``: null for the standard library, or a text file or folder of text files.
    At most ``max_bytes`` are read (whole files in sorted order)."""

    path: str | None = None
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=1024)
    val_fraction: float = Field(DEFAULT_VAL_FRACTION, gt=0, le=0.5)


class ExperimentConfig(Section):
    """The whole experiment: the factors under study and everything held equal.

    Arms are every ``norm × placement`` (named ``<norm>-<placement>``); each arm runs once per
    seed. ``seeds`` is a count (0 … n−1) or a list. ``baseline`` names the arm the others are
    compared with (default: the first). ``margin_bpb`` is the equivalence margin in bits per byte.
    ``imports`` are modules imported before norms are resolved, in this process and in every
    worker (e.g. a module that calls ``normlab.register_norm``). ``threads``: torch threads per
    worker (default: half the CPUs this process may use, at least 1). ``parallel``: runs trained
    at once (1 keeps timings clean).
    """

    imports: list[str] = Field(default_factory=list)
    norms: list[str] = Field(default_factory=lambda: ["layernorm", "rmsnorm"], min_length=1)
    placements: list[Literal["pre", "post", "sandwich"]] = Field(
        default_factory=lambda: ["pre"], min_length=1
    )
    seeds: int | list[int] = 3
    baseline: str | None = None
    margin_bpb: float = Field(0.02, gt=0)
    device: str = "auto"
    threads: int | None = Field(None, ge=1)
    parallel: int = Field(1, ge=1)
    model: ModelSettings = Field(default_factory=ModelSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings)
    data: DataSettings = Field(default_factory=DataSettings)

    @field_validator("seeds")
    @classmethod
    def _check_seeds(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and v < 1:
            raise ValueError("a seed count must be >= 1")
        if isinstance(v, list) and (not v or len(set(v)) != len(v) or min(v) < 0):
            raise ValueError("a seed list must be non-empty, with distinct values >= 0")
        return v

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        if v != "auto" and v.split(":")[0] not in ("cpu", "cuda", "mps", "xpu"):
            raise ValueError("expected auto, cpu, cuda, cuda:N, mps or xpu")
        return v

    @field_validator("imports")
    @classmethod
    def _import_modules(cls, v: list[str]) -> list[str]:
        for module in v:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ValueError(f"cannot import {module!r}: {err}") from None
        return v

    @field_validator("norms")
    @classmethod
    def _check_norms(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a norm is listed twice")
        for norm in v:
            try:
                check_model_norm(norm)
            except (TypeError, ValueError) as err:
                raise ValueError(str(err).removeprefix("norm: ")) from None
        return v

    @field_validator("placements")
    @classmethod
    def _check_placements(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a placement is listed twice")
        return v

    @model_validator(mode="after")
    def _check_baseline(self) -> ExperimentConfig:
        if self.baseline is not None and self.baseline not in self.arm_names():
            raise ValueError(
                f"baseline: {self.baseline!r} is not an arm; expected one of "
                f"{', '.join(self.arm_names())}"
            )
        return self

    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)

    def arms(self) -> list[tuple[str, str, str]]:
        """(arm name, norm, placement) in grid order: placements outer, norms inner."""
        return [(arm_name(n, p), n, p) for p in self.placements for n in self.norms]

    def arm_names(self) -> list[str]:
        return [a for a, _, _ in self.arms()]

    def baseline_arm(self) -> str:
        return self.baseline or self.arm_names()[0]

    def resolved_steps(self) -> int:
        """Training steps: ``train.steps``, or ⌈``train.tokens`` / tokens per step⌉."""
        t = self.train
        if t.steps is not None:
            return t.steps
        assert t.tokens is not None  # TrainSettings guarantees one of the two
        return math.ceil(t.tokens / (t.batch_size * self.model.context))


def arm_name(norm: str, placement: str) -> str:
    """``<norm>-<placement>``, e.g. ``rmsnorm-pre``."""
    return f"{norm}-{placement}"


class ConfigError(ValueError):
    """An invalid experiment configuration; the message names each bad key."""


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The config class that owns the key at ``loc`` (the last element)."""
    cls: type[BaseModel] = ExperimentConfig
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        sub = getattr(field, "annotation", None) if field else None
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            cls = sub
        else:
            break
    return cls


def describe_errors(err: ValidationError) -> str:
    """One line per problem: the dotted key, what is wrong, and the valid keys for unknown ones."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "config"
        if e["type"] == "extra_forbidden":
            cls = _section_at(loc)
            section = ".".join(str(p) for p in loc[:-1]) or "the top level"
            valid = ", ".join(cls.model_fields)
            lines.append(f"unknown key {key!r}; valid keys of {section}: {valid}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            given = e.get("input")
            shown = "" if isinstance(given, dict) else f" (got {given!r})"
            lines.append(f"{key}: {msg}{shown}" if loc else msg)
    return "invalid experiment config:\n  " + "\n  ".join(lines)


def validate_config(data: dict[str, Any]) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from a plain dict, raising :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"config: expected a mapping of keys to values, got {type(data).__name__}"
        )
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_errors(err)) from None


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that scientific notation without a dot or without an
    exponent sign (``1e-3``, ``1E5``, ``2.5e4``, ``.5e-3``) is a float, as in YAML 1.2 and
    Python. PyYAML follows YAML 1.1 there and would read those as strings."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML with :class:`ConfigLoader` (safe: plain data only)."""
    return yaml.load(text, Loader=ConfigLoader)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML config into a dict (an empty file is an empty dict)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"config: {str(path)!r} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the dotted keys of ``overrides`` (``"train.lr"``) set; ``None`` is skipped."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for dotted, value in overrides.items():
        if value is None:
            continue
        *sections, key = dotted.split(".")
        node = merged
        for s in sections:
            child = node.get(s)
            if not isinstance(child, dict):
                child = {}
                node[s] = child
            node = child
        node[key] = value
    return merged
