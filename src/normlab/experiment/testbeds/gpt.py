"""The ``gpt`` testbed: the byte-level GPT on the token cache; cross-entropy; validation in nats
and bits per byte on fixed windows; summary ``final_val_loss``, ``final_val_bpb``,
``best_val_bpb``. A run config without ``testbed`` is a GPT run (folders written before the DiT
testbed existed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, Field, ValidationError, model_validator
from rich.console import Console
from torch import nn

from normlab._resources import check_fits
from normlab.data.batches import OffsetWindows, TrainBatches, split_offsets, validation_windows
from normlab.data.cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VAL_FRACTION,
    check_source,
    load_tokens,
    prepare_tokens,
)
from normlab.experiment.measure.evaluate import bits_per_byte, validation_loss
from normlab.experiment.measure.posttrain import posttrain_summary
from normlab.experiment.testbeds.base import (
    Experiment,
    LadderRule,
    ParametrizationKey,
    TestbedConfig,
    baseline_factors,
    check_data_fits,
    check_fingerprint,
    data_seed,
    init_seed,
)
from normlab.models import GPT, GPTConfig, GPTSettings, build_gpt
from normlab.models.config import ConfigModel
from normlab.run_format import testbed_format

__all__ = ["GPT_LADDER", "DataSettings", "GPTTestbed", "gpt_config", "warm_up_gpt"]


class DataSettings(ConfigModel):
    """The ``data`` section of the text testbeds (gpt, lm). ``path``: null for the standard
    library, or a text file or folder of text files. At most ``max_bytes`` are read (whole files
    in sorted order). ``tokenizer``, ``text_field`` and ``bpe_merges`` are the lm testbed's."""

    path: str | None = Field(
        None,
        description="A text file or a folder of text files (default: Python's stdlib); gpt only.",
    )
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=1024)
    val_fraction: float = Field(DEFAULT_VAL_FRACTION, gt=0, le=0.5)
    tokenizer: str | None = Field(
        None,
        description="A local tokenizer folder or tokenizer.json (default: bytes); lm only.",
    )
    text_field: str = Field(
        "text", min_length=1, description="The text field of JSON Lines / Parquet records; lm only."
    )
    bpe_merges: int | None = Field(
        None,
        ge=1,
        description="Train a byte-level BPE with this many merges on the corpus's training side "
        "at run time (cached in the output folder's data/); lm only.",
    )

    @model_validator(mode="after")
    def _one_tokenizer(self) -> DataSettings:
        if self.tokenizer is not None and self.bpe_merges is not None:
            raise ValueError(
                f"give tokenizer or bpe_merges, not both (tokenizer={self.tokenizer!r}, "
                f"bpe_merges={self.bpe_merges})"
            )
        return self


def bpb_quality(final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The quality fields of a language model's run: the last evaluation's loss and bits per
    byte, and the lowest bits per byte of its finite evaluations (None where there is none)."""
    return {
        "final_val_loss": final["val_loss"] if final else None,
        "final_val_bpb": final["val_bpb"] if final else None,
        "best_val_bpb": min((e["val_bpb"] for e in finite_evals), default=None),
    }


def gpt_config(spec: dict[str, Any]) -> GPTConfig:
    """The GPT of a resolved GPT run config: its ``model`` section, ``norm`` and ``placement``."""
    return GPTConfig(**spec["model"], norm=spec["norm"], placement=spec["placement"])


def warm_up_gpt(model: GPT, device: torch.device, batch_size: int) -> None:
    """One forward and backward on a batch of the training shape [``batch_size``, context], in
    eval mode, before anything is timed, so that what the norms and torch set up on first use
    (kernels compiled and cached on disk, lazily initialised libraries) is not charged to the run.

    The shape matters: kernels specialise on it (the Triton norms pick their rows per program
    from the number of rows, N = batch_size · context), so a smaller warm-up batch would leave the
    training shape's compilation to step 1. Gradients are cleared afterwards."""
    was_training = model.training
    model.eval()
    idx = torch.zeros(batch_size, model.config.context, dtype=torch.long, device=device)
    _, loss = model(idx, idx)
    if loss is not None:
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)


GPT_LADDER_KEYS = ("d_model", "n_layers")
"""The GPT settings a size ladder may vary."""


def check_gpt_ladder_key(cfg: Experiment, key: str) -> None:
    """``key`` is one of :data:`GPT_LADDER_KEYS`; ValueError naming ``--ladder`` otherwise."""
    if key not in GPT_LADDER_KEYS:
        raise ValueError(
            f"--ladder: the gpt model has no setting {key!r} to ladder; expected one of "
            f"{', '.join(GPT_LADDER_KEYS)}"
        )


def gpt_rung(
    cfg: Experiment, key: str, value: int, smallest: int
) -> tuple[dict[str, BaseModel], dict[str, Any]]:
    """The ``model`` section at ``key`` = ``value`` and, under ``mup`` with a ``d_model``
    ladder, ``base_d_model`` = ``smallest``; validated anew (ValueError naming ``--ladder``)."""
    update: dict[str, Any] = {key: value}
    if key == "d_model" and cfg.model.parametrization == "mup":
        update["base_d_model"] = smallest
    try:
        model = GPTSettings(**{**cfg.model.model_dump(), **update})
    except ValueError as err:  # a pydantic ValidationError, or a validator's own ValueError
        if isinstance(err, ValidationError):
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        else:
            why = str(err)
        raise ValueError(f"--ladder: the rung {key}={value} is not a valid model: {why}") from None
    return {"model": model}, update


def gpt_n_params(rung: Experiment) -> int:
    """The parameter count of the rung's baseline arm (built once, seed 0, nothing written)."""
    norm, placement = baseline_factors(rung)
    model = build_gpt(GPTConfig(**rung.model.model_dump(), norm=norm, placement=placement), 0)
    return int(model.count_parameters()[0])


VOCAB_BYTES = 256
"""The byte-level GPT's vocabulary."""


def gpt_worker_bytes(cfg: Experiment) -> int:
    """Estimated memory of one GPT training worker: parameters
    P ≈ L·(12·d² + 13·d) + (V + T)·d in 4 copies (weights, gradients, two Adam moments) of 4
    bytes, and activations of about 4·B·T·(L·(16·d + 2·h·T) + 3·V) bytes."""
    m, b = cfg.model, cfg.train.batch_size
    d, n_layers, t, h, v = m.d_model, m.n_layers, m.context, m.n_heads, VOCAB_BYTES
    params = n_layers * (12 * d * d + 13 * d) + (v + t) * d
    activations = 4 * b * t * (n_layers * (16 * d + 2 * h * t) + 3 * v)
    return 16 * params + activations


def check_gpt_sizes(cfg: Experiment, memory: int, disk: int, on_disk: str) -> None:
    """The GPT's size estimate (:data:`~normlab.experiment.testbeds.base.SizeCheck`): the data
    cache may hold up to ``data.max_bytes`` on the output folder's disk and building it holds
    about three copies in memory (the cap is checked, not the source's size); ``parallel + 1``
    workers of :func:`gpt_worker_bytes` exist at once (one in standby)."""
    cap = cfg.data.max_bytes
    what = f"data.max_bytes = {cap:,} (the data cache, at its cap)"
    hint = "lower data.max_bytes"
    check_fits(3 * cap, memory, what, "in memory", hint)
    check_fits(cap, disk, what, on_disk, hint)
    m = cfg.model
    workers = cfg.parallel + 1
    check_fits(
        workers * gpt_worker_bytes(cfg),
        memory,
        f"the model (model.d_model = {m.d_model:,}, model.n_layers = {m.n_layers:,}, "
        f"model.context = {m.context:,}, train.batch_size = {cfg.train.batch_size:,}; "
        f"{workers} workers at once)",
        "in memory",
        "use a smaller model, batch or parallel",
    )


GPT_LADDER = LadderRule(
    keys=", ".join(GPT_LADDER_KEYS),
    rule="the key alone changes (n_heads, context and mlp_ratio as configured, so the head "
    "size follows d_model); under mup a d_model ladder's base_d_model is its smallest rung",
    check_key=check_gpt_ladder_key,
    rung=gpt_rung,
    n_params=gpt_n_params,
    parametrization=lambda cfg: str(cfg.model.parametrization),
    base_width_key="base_d_model",
)
"""How a size ladder varies the GPT (:class:`LadderRule`)."""


class GPTTestbed:
    """The GPT testbed: byte windows of the token cache in ``run_dir/../../data``."""

    name: ClassVar[str] = "gpt"
    config: ClassVar[TestbedConfig] = TestbedConfig(
        summary="gpt (byte-level GPT)",
        sections={"model": GPTSettings, "data": DataSettings},
        sample_length=("model", "context"),
        options=("margin_bpb", "train.eval_windows", "train.full_val"),
        ladder=GPT_LADDER,
        parametrization=ParametrizationKey("model.parametrization", "the gpt testbed's model"),
        check_sizes=check_gpt_sizes,
    )
    quality_fields: ClassVar[tuple[str, ...]] = testbed_format("gpt").validation_fields

    @staticmethod
    def run_settings(cfg: Experiment, data_info: dict[str, Any]) -> dict[str, Any]:
        """``model`` (the config's section) and ``data``: the cache's fingerprint, the Python
        version whose standard library it read (when that is the source) and its source. No
        ``testbed`` key: a run config without one is a GPT run."""
        return {
            "model": cfg.model.model_dump(),
            "data": {
                "fingerprint": data_info["fingerprint"],
                "python_version": data_info["python_version"],
                "source": data_info["source"],
            },
        }

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        return build_gpt(gpt_config(spec), seed)

    @staticmethod
    def check_inputs(cfg: Experiment) -> None:
        check_source(cfg.data.path)

    @staticmethod
    def prepare_data(cfg: Experiment, data_dir: Path, console: Console) -> dict[str, Any]:
        """The byte token cache (:func:`normlab.data.cache.prepare_tokens`), checked to hold one
        context window per side (:func:`check_data_fits`)."""
        started = time.perf_counter()
        d = cfg.data
        info = prepare_tokens(data_dir, d.path, d.max_bytes, d.val_fraction)
        console.print(
            f"data: {info['source']} ({info['fingerprint']}), "
            f"{info['n_train_tokens']:,} train / {info['n_val_tokens']:,} val bytes "
            f"from {info['n_train_files']} / {info['n_val_files']} files "
            f"({time.perf_counter() - started:.1f} s)"
        )
        check_data_fits(info, cfg.model.context, d.val_fraction, "model.context")
        return info

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        return {}

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t = spec["train"]
        data = load_tokens(Path(run_dir).parent.parent / "data")
        check_fingerprint(data.info["fingerprint"], spec, "cache")
        cfg = gpt_config(spec)
        self.model = build_gpt(cfg, init_seed(spec))
        self.batch_size = t["batch_size"]
        self.batches = TrainBatches(data.train, t["batch_size"], cfg.context, data_seed(spec))
        self.windows = validation_windows(data.val, cfg.context, t["eval_windows"])
        self.val, self.context = data.val, cfg.context
        self.tokens_per_step = t["batch_size"] * cfg.context
        self.data_fingerprint = data.info["fingerprint"]

    def warm_up(self, device: torch.device) -> None:
        warm_up_gpt(self.model, device, self.batch_size)

    def train_loss(self, device: torch.device) -> torch.Tensor:
        x, y = self.batches.next()
        _, loss = self.model(x.to(device), y.to(device))
        return loss

    def stream_state(self) -> object:
        return self.batches.get_state()

    def restore_stream(self, state: object) -> None:
        self.batches.set_state(state)  # type: ignore[arg-type]

    def evaluate(self, device: torch.device) -> dict[str, float]:
        val_loss = validation_loss(self.model, self.windows, self.batch_size, str(device))
        return {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss)}

    def full_evaluate(self, device: torch.device) -> dict[str, float]:
        """``val_loss`` and ``val_bpb`` over every non-overlapping window of ``context + 1``
        bytes of the validation split (:func:`normlab.data.batches.split_offsets`), in batches
        of ``batch_size``, drawing no random numbers."""
        split = OffsetWindows(
            self.val, split_offsets(self.val.shape[0], self.context), self.context + 1
        )
        val_loss = validation_loss(self.model, split, self.batch_size, str(device))
        return {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss)}

    def parameter_groups(self) -> dict[str, list[str]]:
        return self.model.parameter_groups()

    def quality_summary(
        self, final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return bpb_quality(final, finite_evals)

    def finish(self, device: torch.device) -> dict[str, Any]:
        return {}

    def _val_bpb(self, model: nn.Module, device: torch.device) -> float:
        loss = validation_loss(model, self.windows, self.batch_size, str(device))
        return bits_per_byte(loss)

    def health_batch(self, model: nn.Module, device: torch.device) -> object:
        """``model`` on the first ``batch_size`` validation windows (norm health's batch)."""
        return model(self.windows[: self.batch_size, :-1].to(device))

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Deltas in validation bpb (the bf16 copy's logits go to the cross-entropy in
        float32); activations on the first ``batch_size`` validation windows."""

        def metric(model: nn.Module) -> float:
            return self._val_bpb(model, device)

        def run_batch(model: nn.Module) -> object:
            return model(self.windows[: self.batch_size, :-1].to(device))

        return posttrain_summary(self.model, final["val_bpb"], metric, metric, run_batch)
