"""The experiment's configuration: validated, with errors that name the key and list the valid
ones.

A YAML file has the shape of :class:`ExperimentConfig` (top-level factors and run settings, and
the sections ``model``, ``train``, ``anomaly``, ``data`` for the GPT testbed, ``dit`` and
``shapes`` instead of ``model`` and ``data`` for the DiT testbed); command-line flags override it.

Every setting is declared once, with its default, its bounds and (for those with a flag) its
help text: the testbeds' sections are the models' own config classes
(:class:`normlab.models.GPTSettings` for ``model``, :class:`normlab.models.DiTSettings` for
``dit``), the others are defined here, and ``normlab compare``'s flags read their defaults and
help from these fields. A run's ``run.json`` uses the same section and key names.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from normlab.data.cache import DEFAULT_MAX_BYTES, DEFAULT_VAL_FRACTION
from normlab.experiment.anomaly import (
    DEFAULT_MIN_SCALE,
    DEFAULT_THRESHOLD,
    DEFAULT_WARMUP,
    DEFAULT_WINDOW,
    SpikeRule,
)
from normlab.models.config import (
    DEFAULT_CFG_SCALE,
    DEFAULT_LABEL_DROPOUT,
    GUIDANCE_NEUTRAL,
    ConfigModel,
    DiTSettings,
    GPTSettings,
)
from normlab.models.norms import check_dit_norm, check_model_norm

__all__ = [
    "DEFAULT_CFG_SCALE",
    "DEFAULT_LABEL_DROPOUT",
    "DEFAULT_STEPS",
    "DIT_DEFAULT_NORMS",
    "DIT_TRAIN_DEFAULTS",
    "EXECUTORS",
    "GUIDANCE_NEUTRAL",
    "AnomalySettings",
    "ConfigError",
    "DataSettings",
    "DiTSettings",
    "ExperimentConfig",
    "GPTSettings",
    "ModelSettings",
    "ScaleSettings",
    "ShapesSettings",
    "TrainSettings",
    "arm_name",
    "check_scale",
    "describe_errors",
    "load_config_file",
    "load_yaml",
    "merge_overrides",
    "validate_config",
]

DEFAULT_STEPS = 600
DIT_DEFAULT_NORMS = ("adaln_zero", "adarms")
DIT_TRAIN_DEFAULTS: dict[str, Any] = {
    "batch_size": 32,
    "lr": 2e-3,
    "weight_decay": 0.0,
    "target_val_loss": 0.3,
}
"""The DiT testbed's defaults for the ``train`` keys a config leaves out, where they differ from
the GPT's: 32 images per step, a peak learning rate of 2e-3 (higher rates train further in 600
steps but spread the seeds' results several times wider), no weight decay (as DiT), and a
target in the unit of its validation loss (the flow-matching MSE, about 1.9 at
initialisation)."""
GPT_ONLY = ("model", "data", "margin_bpb", "train.eval_windows")
DIT_ONLY = ("dit", "shapes", "margin_val_loss")


class Section(ConfigModel):
    """A config section, with the rules of the testbeds' sections (:class:`ConfigModel`):
    unknown keys, wrong types and non-finite floats (inf, nan) are errors."""


EXECUTORS = ("local", "ray")
"""The executors that train a grid (``--executor``): ``local`` (worker processes on this
machine) and ``ray`` (one Ray task per run); :mod:`normlab.experiment.executors` implements
them."""


def check_scale(
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    fsdp: bool = False,
    executor: str = "local",
) -> None:
    """Raise ``ValueError`` naming the option (``--nproc-per-node``, ``--nnodes``,
    ``--rdzv-endpoint``, ``--fsdp``, ``--executor``) unless the values describe a launch:
    N = nproc_per_node · nnodes >= 1 processes per run, a rendezvous endpoint across hosts,
    FSDP only with N >= 2, a known executor."""
    from normlab.distributed.launcher import Layout

    Layout(nproc_per_node, nnodes, 0, rdzv_endpoint, fsdp)
    if executor not in EXECUTORS:
        raise ValueError(f"--executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")


class ScaleSettings(Section):
    """How runs are executed, never what they compute: ``nproc_per_node`` processes per run on
    each of ``nnodes`` hosts (torchrun; DDP, or FSDP2 with ``fsdp``), meeting at
    ``rdzv_endpoint`` across hosts; ``executor`` (``local`` or ``ray``) trains the grid,
    ``ray_address`` names the Ray cluster (none: a local Ray instance). The global batch, data
    order and paired start do not depend on any of them."""

    nproc_per_node: int = Field(
        1, description="Processes per run (torchrun; DDP, or FSDP2 with --fsdp)."
    )
    nnodes: int = Field(1, description="Hosts per run (each runs --nproc-per-node processes).")
    rdzv_endpoint: str | None = Field(
        None, description="host:port where a run's hosts meet (needed with --nnodes > 1)."
    )
    fsdp: bool = Field(False, description="Shard the model with FSDP2 instead of DDP.")
    executor: str = Field("local", description="Who trains the grid: local or ray.")
    ray_address: str | None = Field(
        None, description="Ray cluster address (default: start a local Ray instance)."
    )

    @model_validator(mode="after")
    def _check_launch(self) -> ScaleSettings:
        check_scale(self.nproc_per_node, self.nnodes, self.rdzv_endpoint, self.fsdp, self.executor)
        return self

    @property
    def world_size(self) -> int:
        """Processes per run: N = nproc_per_node · nnodes."""
        return self.nproc_per_node * self.nnodes

    def launch_spec(self) -> dict[str, Any]:
        """The ``scale`` record of a run.json on several processes: how the run is started
        (its torchrun layout), under this section's own key names."""
        return {
            "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes,
            "rdzv_endpoint": self.rdzv_endpoint,
            "fsdp": self.fsdp,
        }


ModelSettings = GPTSettings
"""The ``model`` section under its earlier name: :class:`normlab.models.GPTSettings`."""


class ShapesSettings(Section):
    """The DiT testbed's embedded data (:mod:`normlab.data.shapes`): ``n_train`` and ``n_val``
    disjoint grayscale images of ``image_size`` × ``image_size`` pixels, made from ``seed``, cut
    into ``patch_size`` × ``patch_size`` patches: T = (image_size / patch_size)² tokens of
    patch_size² channels each."""

    image_size: int = Field(16, ge=4, le=256)
    patch_size: int = Field(4, ge=1)
    n_train: int = Field(4096, ge=1)
    n_val: int = Field(512, ge=1)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _patch_divides(self) -> ShapesSettings:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size {self.patch_size} does not divide image_size {self.image_size}"
            )
        return self

    @property
    def seq_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def in_channels(self) -> int:
        return self.patch_size**2


class TrainSettings(Section):
    """Optimisation and evaluation: AdamW, linear warm-up then cosine decay, gradient clipping.

    Give ``steps`` or ``tokens`` (converted to ⌈tokens / (batch_size · tokens per sample)⌉ steps,
    tokens per sample being the GPT's context or the DiT's patches per image), not both; with
    neither, ``steps`` is 600. ``warmup`` (steps of linear warm-up to the peak ``lr``) is 0 or
    fewer than the steps, so that the cosine decay follows it (checked by
    :class:`ExperimentConfig`, which knows the steps ``tokens`` gives).
    ``grad_clip`` 0 turns clipping off. ``target_val_loss`` (GPT: nats per byte; DiT: the
    validation flow-matching MSE) is the level for time- and tokens-to-target.
    ``throughput_warmup`` steps are left out of tokens/s. ``eval_windows`` (GPT only): the
    validation windows; the DiT validates on every image of ``shapes.n_val``.
    The DiT testbed has its own defaults for some keys (:data:`DIT_TRAIN_DEFAULTS`).
    """

    steps: int | None = Field(
        None,
        ge=1,
        description=f"Training steps per run (default: {DEFAULT_STEPS}, unless tokens are given).",
    )
    tokens: int | None = Field(
        None, ge=1, description="Training tokens per run (instead of --steps)."
    )
    batch_size: int = Field(16, ge=1, description="Sequences (dit: images) per step.")
    lr: float = Field(5e-3, gt=0, description="Peak learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup: int = Field(30, ge=0, description="Linear warm-up steps: 0, or fewer than the steps.")
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

    path: str | None = Field(
        None,
        description="A text file or a folder of text files (default: Python's stdlib); gpt only.",
    )
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=1024)
    val_fraction: float = Field(DEFAULT_VAL_FRACTION, gt=0, le=0.5)


class ExperimentConfig(Section):
    """The whole experiment: the factors under study and everything held equal.

    ``testbed``: ``gpt`` (the byte-level GPT, sections ``model`` and ``data``) or ``dit`` (the
    flow-matching DiT on the embedded shapes, sections ``dit`` and ``shapes``; conditional norms,
    ``adaln_zero`` and ``adarms`` by default, pre-norm only). Options of the other testbed are
    errors, not silently ignored.
    Arms are every ``norm × placement`` (named ``<norm>-<placement>``), at least two of them;
    each arm runs once per seed. ``seeds`` is a count (0 … n−1) or a list. ``baseline`` names
    the arm the others are compared with (default: the first). ``margin_bpb`` (GPT) is the
    equivalence margin in bits per byte; ``margin_val_loss`` (DiT) the equivalence margin of the
    validation flow-matching loss, an absolute difference in its own unit (mean squared error of
    the velocity).
    ``imports`` are modules imported before norms are resolved, in this process and in every
    worker (e.g. a module that calls ``normlab.register_norm``). ``threads``: torch threads per
    worker (default: half the CPUs this process may use, at least 1). ``parallel``: runs trained
    at once (1 keeps timings clean).
    """

    testbed: Literal["gpt", "dit"] = Field(
        "gpt",
        description="gpt (byte-level GPT) or dit (flow-matching DiT on embedded shapes; norms "
        "default to " + ",".join(DIT_DEFAULT_NORMS) + ").",
    )
    imports: list[str] = Field(default_factory=list)
    norms: list[str] = Field(
        default_factory=lambda: ["layernorm", "rmsnorm"],
        min_length=1,
        description="Comma list of norms, e.g. layernorm,rmsnorm,dyt.",
    )
    placements: list[Literal["pre", "post", "sandwich"]] = Field(
        default_factory=lambda: ["pre"],
        min_length=1,
        description="Comma list of placements: pre, post, sandwich.",
    )
    seeds: int | list[int] = Field(
        3, description="Number of paired seeds (0 … n−1) or a list (e.g. 0,1,2)."
    )
    baseline: str | None = None
    margin_bpb: float = Field(0.02, gt=0)
    margin_val_loss: float = Field(0.002, gt=0)
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    threads: int | None = Field(
        None,
        ge=1,
        description="Torch threads per worker (default: half the CPUs, at least 1).",
    )
    parallel: int = Field(1, ge=1, description="Runs trained at once (1 keeps timings clean).")
    model: GPTSettings = Field(default_factory=GPTSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    anomaly: AnomalySettings = Field(default_factory=AnomalySettings)
    data: DataSettings = Field(default_factory=DataSettings)
    dit: DiTSettings = Field(default_factory=DiTSettings)
    shapes: ShapesSettings = Field(default_factory=ShapesSettings)
    scale: ScaleSettings = Field(default_factory=ScaleSettings)

    @model_validator(mode="before")
    @classmethod
    def _testbed_defaults(cls, data: Any) -> Any:
        """The DiT testbed's defaults for the norms and the ``train`` keys left out."""
        if not isinstance(data, dict) or data.get("testbed") != "dit":
            return data
        data = dict(data)
        data.setdefault("norms", list(DIT_DEFAULT_NORMS))
        train = data.get("train", {})
        if isinstance(train, dict):
            data["train"] = {**DIT_TRAIN_DEFAULTS, **train}
        return data

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
    def _check_norms(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a norm is listed twice")
        check = check_dit_norm if info.data.get("testbed") == "dit" else check_model_norm
        for norm in v:
            try:
                check(norm)
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
    def _check_testbed_options(self) -> ExperimentConfig:
        if self.testbed == "dit" and self.placements != ["pre"]:
            others = ", ".join(p for p in self.placements if p != "pre") or "pre twice"
            raise ValueError(
                f"placements: the dit testbed is pre-norm only (its conditional norms modulate "
                f"the input of each sublayer and gate its output); got {others}. Expected: pre"
            )
        other = "gpt" if self.testbed == "dit" else "dit"
        for option in GPT_ONLY if self.testbed == "dit" else DIT_ONLY:
            given = self._given(option)
            if given is not None:
                hint = _HINTS.get(option, "set testbed: dit (or --testbed dit) to use it")
                raise ValueError(
                    f"{given}: an option of the {other} testbed, but this experiment's testbed "
                    f"is {self.testbed}; {hint}"
                )
        return self

    def _given(self, option: str) -> str | None:
        """The dotted name of the key ``option`` (``"data"``, ``"train.eval_windows"``) if the
        config gave it (for a section: its first key given, or the section itself), else None."""
        section, _, key = option.partition(".")
        if section not in self.model_fields_set:
            return None
        value = getattr(self, section)
        if not isinstance(value, BaseModel):
            return section
        if key:
            return option if key in value.model_fields_set else None
        given = [k for k in type(value).model_fields if k in value.model_fields_set]
        return f"{section}.{given[0]}" if given else section

    @model_validator(mode="after")
    def _check_two_arms(self) -> ExperimentConfig:
        """A comparison needs something to compare: at least two arms (norm × placement)."""
        arms = self.arm_names()
        if len(arms) >= 2:
            return self
        if self.testbed == "dit":
            hint = (
                "two or more norms (--norms, e.g. adaln_zero,adarms; the dit testbed is "
                "pre-norm only)"
            )
        else:
            hint = (
                "two or more norms (--norms, e.g. layernorm,rmsnorm) or placements "
                "(--placements, e.g. pre,post)"
            )
        raise ValueError(
            f"norms, placements: {len(self.norms)} norm and {len(self.placements)} placement "
            f"make the single arm {arms[0]}; a comparison needs at least two arms. Expected {hint}"
        )

    @model_validator(mode="after")
    def _check_warmup(self) -> ExperimentConfig:
        """The schedule (:func:`normlab.experiment.schedule.lr_at`) reaches its peak at step
        ``warmup`` and decays until the last step, so a warm-up needs steps after it."""
        warmup, steps = self.train.warmup, self.resolved_steps()
        if warmup > 0 and warmup >= steps:
            given = (
                f"train.steps = {steps}"
                if self.train.steps is not None
                else f"train.steps = {steps} (from train.tokens = {self.train.tokens})"
            )
            raise ValueError(
                f"train.warmup: {warmup} warm-up steps with {given}; expected train.warmup < "
                "train.steps (the learning rate rises to its peak at step train.warmup, then "
                "decays to the last step), or 0 for no warm-up. Lower --warmup or raise --steps "
                "(or --tokens)"
            )
        return self

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

    def tokens_per_sample(self) -> int:
        """Tokens in one training sample: the GPT's context, or the DiT's patches per image."""
        return self.shapes.seq_len if self.testbed == "dit" else self.model.context

    def resolved_steps(self) -> int:
        """Training steps: ``train.steps``, or ⌈``train.tokens`` / tokens per step⌉."""
        t = self.train
        if t.steps is not None:
            return t.steps
        assert t.tokens is not None  # TrainSettings guarantees one of the two
        return math.ceil(t.tokens / (t.batch_size * self.tokens_per_sample()))

    def margin(self) -> float:
        """The equivalence margin of the testbed's quality metric (in that metric's unit)."""
        return self.margin_val_loss if self.testbed == "dit" else self.margin_bpb

    def dump(self) -> dict[str, Any]:
        """The validated config as JSON-ready data, without the other testbed's options."""
        other = GPT_ONLY if self.testbed == "dit" else DIT_ONLY
        data = self.model_dump(mode="json", exclude={o for o in other if "." not in o})
        for option in other:
            section, _, key = option.partition(".")
            if key:
                data[section].pop(key, None)
        return data


_HINTS = {
    "model": "the DiT's settings are under dit",
    "data": "the dit testbed trains on its embedded shapes (set under shapes); --data (text) "
    "is for the gpt testbed",
    "margin_bpb": "the dit testbed's equivalence margin is margin_val_loss",
    "train.eval_windows": "the dit testbed validates on every image of shapes.n_val",
}


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
