"""The ``lm`` testbed: a user's causal LM (``lm.model``: ``hf:<folder or model_type>`` or
``package.module:factory``, see :mod:`normlab.models.external`) on a token cache of any
source and tokenizer (:mod:`normlab.data`).

For each arm the source builds the model afresh for the seed with every norm module replaced by
the arm's norm (those it cannot replace are held, the same in every arm); the arm's record of
swapped and held modules goes into ``run.json`` and the summary as ``norm_swap``. Training is
next-token cross-entropy on random windows of ``lm.context + 1`` tokens; validation on fixed
windows gives ``val_loss`` (nats per token) and ``val_bpb`` = Σ nats / ln 2 / UTF-8 bytes
covered (:class:`normlab.data.BpbTally`), comparable across tokenizers.

``data.tokenizer`` names a tokenizer (bytes by default); ``data.bpe_merges`` trains a byte-level
BPE on the corpus's training side at run time instead (:func:`normlab.data.corpus_bpe`), cached
as ``data/bpe-<fingerprint>/tokenizer.json`` in the output folder.

``lm.parametrization: mup`` trains a transformers model in μP, width-wise, against the base
width ``lm.base_hidden_size`` (:mod:`normlab.models.external.mup`). A size ladder
(:data:`LM_LADDER`) sets any integer key of a transformers config by the size rule of
:mod:`normlab.models.external.scaling`.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, Field, field_validator
from rich.console import Console
from torch import nn

from normlab.data import BpbTally, corpus_bpe, load_tokenizer, window_bytes
from normlab.data.batches import OffsetWindows, TrainBatches, split_offsets, validation_windows
from normlab.data.cache import check_source, load_tokens, prepare_tokens
from normlab.data.pretokenized import is_pretokenized, open_token_source
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
from normlab.experiment.testbeds.gpt import DataSettings, bpb_quality
from normlab.models.config import ConfigModel
from normlab.models.external import ModelSource, SourceLM, load_model_source
from normlab.models.external.arm import check_slot_norm
from normlab.models.external.footprint import check_source_fits
from normlab.models.external.mup import PARAMETRIZATION_OPTION
from normlab.models.external.scaling import (
    WIDTH_KEY,
    ScalingError,
    current_size,
    is_width,
    scaled_keys,
    with_changes,
)
from normlab.models.external.spec import SETTINGS_OPTION, parse_settings
from normlab.run_format import testbed_format
from normlab.run_format.testbeds import NORM_SWAP_FIELD

__all__ = [
    "LM_LADDER",
    "LM_TRAIN_DEFAULTS",
    "LMSettings",
    "LMTestbed",
    "lm_source",
    "resolve_tokenizer",
]

BYTE_VOCAB = 256
LM_TRAIN_DEFAULTS: dict[str, Any] = {"target_val_loss": None}
"""The lm testbed's defaults for the ``train`` keys a config leaves out, where they differ from
the GPT's: no target (its validation loss is in nats per token, whose scale depends on the
tokenizer)."""


class LMSettings(ConfigModel):
    """The lm testbed's model, the ``lm`` section: ``model`` is a source,
    ``hf:<folder or model_type>`` (a transformers causal LM built from its config, randomly
    initialised) or ``package.module:factory`` (called as ``factory(make_norm, **model_set)``),
    required; ``model_set`` are the config overrides or factory arguments (``key=value,…`` or a
    mapping; the vocabulary size is always the tokenizer's); ``context`` the tokens per training
    window; ``attn_implementation`` the transformers attention (``eager``: deterministic on the
    CPU). Each arm's model has every norm module of the source replaced by the arm's norm.
    ``parametrization``: ``sp`` or ``mup`` (width-wise μP of an ``hf:`` model,
    :mod:`normlab.models.external.mup`) against the base width ``base_hidden_size`` (None: the
    model's own ``hidden_size``, where ``mup`` is ``sp``); ``sp`` ignores it."""

    model: str | None = Field(
        None,
        min_length=1,
        description="Model source: hf:<folder or model_type> or package.module:factory "
        "(selects the lm testbed).",
    )
    model_set: dict[str, Any] = Field(
        default_factory=dict,
        description="Comma list of key=value: the model config's overrides or the factory's "
        "arguments.",
    )
    context: int = Field(128, ge=2, description="Tokens per training window (lm).")
    attn_implementation: Literal["eager", "sdpa"] = "eager"
    parametrization: Literal["sp", "mup"] = Field(
        "sp", description="lm: sp (standard) or mup (width-wise muP of an hf: model)."
    )
    base_hidden_size: int | None = Field(
        None, ge=1, description="lm mup: the hidden_size at which mup equals sp (default: own)."
    )

    @field_validator("model_set", mode="before")
    @classmethod
    def _parse_settings(cls, v: Any) -> Any:
        return parse_settings(v)


def check_lm_config(cfg: Experiment) -> None:
    """The lm testbed keeps the model's own norm placement and needs a model source."""
    if cfg.placements != ["pre"]:
        others = ", ".join(p for p in cfg.placements if p != "pre") or "pre twice"
        raise ValueError(
            f"placements: the lm testbed keeps the model's own norm placement (each norm "
            f"module is swapped where it sits); got {others}. Expected: pre (the default)"
        )
    if cfg.lm.model is None:
        raise ValueError(
            "lm.model: the lm testbed trains your model; expected a source, --model "
            "hf:<folder or model_type> (with --model-set overrides) or "
            "package.module:factory"
        )


def _json_ready(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists), so a planned run config compares
    equal to the ``run.json`` written from it."""
    return json.loads(json.dumps(value))


@lru_cache(maxsize=8)
def _source(
    model: str, settings_json: str, vocab_size: int, attn: str, mup: str, base: int | None
) -> ModelSource:
    return load_model_source(
        model,
        json.loads(settings_json),
        vocab_size=vocab_size,
        attn_implementation=attn,
        parametrization=mup,
        base_hidden_size=base,
    )


def lm_source(lm: dict[str, Any], vocab_size: int) -> ModelSource:
    """The checked model source of a run config's ``lm`` section for the vocabulary size
    ``vocab_size`` (loaded once per process; ``parametrization`` ``sp`` where the section has
    none)."""
    settings = json.dumps(lm.get("model_set") or {}, sort_keys=True)
    return _source(
        lm["model"],
        settings,
        vocab_size,
        lm.get("attn_implementation", "eager"),
        lm.get("parametrization", "sp"),
        lm.get("base_hidden_size"),
    )


MUP_KEYS = ("parametrization", "base_hidden_size")
"""The ``lm`` keys of μP, recorded in a run config only under ``mup`` (so that an ``sp`` run's
``run.json`` is what it was before μP existed)."""


def lm_record(cfg: Experiment) -> dict[str, Any]:
    """The ``lm`` section as a run config records it (:data:`MUP_KEYS` left out under sp)."""
    lm = cfg.lm.model_dump(mode="json")
    if lm["parametrization"] == "sp":
        for key in MUP_KEYS:
            lm.pop(key)
    return lm


def resolve_tokenizer(cfg: Experiment, data_dir: Path) -> str | None:
    """The tokenizer the token cache is built with: ``data.tokenizer``, or with
    ``data.bpe_merges`` the path of a BPE trained on the training side of ``data.path`` and
    cached under ``data_dir`` (:func:`normlab.data.corpus_bpe`); None for bytes."""
    d = cfg.data
    if d.bpe_merges is None:
        return d.tokenizer
    path = corpus_bpe(
        d.path,
        d.bpe_merges,
        data_dir,
        text_field=d.text_field,
        max_bytes=d.max_bytes,
        val_fraction=d.val_fraction,
    )
    return str(path)


def vocab_hint(cfg: Experiment) -> int:
    """The vocabulary size known before the data is prepared: the tokenizer's, 256 + the BPE's
    merges (an upper bound), or 256 for bytes."""
    if cfg.data.tokenizer is not None:
        try:
            return load_tokenizer(cfg.data.tokenizer).vocab_size
        except FileNotFoundError as err:
            raise ValueError(str(err)) from None
    return BYTE_VOCAB + (cfg.data.bpe_merges or 0)


def check_context(cfg: Experiment, source: ModelSource) -> None:
    """``lm.context`` fits the source's longest sequence, if it has one; ValueError naming
    ``lm.context`` otherwise."""
    if source.max_length is not None and cfg.lm.context > source.max_length:
        raise ValueError(
            f"lm.context: {cfg.lm.context} tokens per window, but {cfg.lm.model} takes at "
            f"most {source.max_length} (max_position_embeddings); lower lm.context or set "
            "--model-set max_position_embeddings=…"
        )


def _ladder_source(cfg: Experiment) -> ModelSource:
    """The experiment's transformers source (the vocabulary: :func:`vocab_hint`); ValueError
    naming ``--ladder`` for a factory."""
    source = lm_source(lm_record(cfg), vocab_hint(cfg))
    if source.config is None:
        raise ValueError(
            f"--ladder: the lm testbed's ladder sets a key of a transformers config; "
            f"{cfg.lm.model} is a factory (its arguments are its own). Expected --model hf:…"
        )
    return source


def check_lm_ladder_key(cfg: Experiment, key: str) -> None:
    """``key`` is an integer size of the model's transformers config (not ``vocab_size``);
    ValueError naming ``--ladder`` otherwise."""
    try:
        current_size(_ladder_source(cfg).config, key)
    except ScalingError as err:
        raise ValueError(f"--ladder: {err}") from None


def lm_rung(
    cfg: Experiment, key: str, value: int, smallest: int
) -> tuple[dict[str, BaseModel], dict[str, Any]]:
    """The ``lm`` section whose ``model_set`` puts the model at ``key`` = ``value`` by the size
    rule (:func:`~normlab.models.external.scaling.scaled_keys`) and, under ``mup`` with a
    width ladder, ``base_hidden_size`` = ``smallest``; its source loaded and checked (config,
    μP plan, context). ValueError naming ``--ladder`` for a rung that cannot be made."""
    source = _ladder_source(cfg)
    try:
        changes: dict[str, Any] = scaled_keys(source.config, key, value)
    except ScalingError as err:
        raise ValueError(f"--ladder: the rung {key}={value} cannot be made: {err}") from None
    update: dict[str, Any] = {"model_set": with_changes(source.config, cfg.lm.model_set, changes)}
    if cfg.lm.parametrization == "mup" and is_width(source.config, key):
        update["base_hidden_size"] = changes["base_hidden_size"] = smallest
    lm = cfg.lm.model_copy(update=update)
    rung = cfg.model_copy(update={"lm": lm})
    try:
        check_context(rung, lm_source(lm_record(rung), vocab_hint(rung)))
    except ValueError as err:
        why = str(err)
        for option in (SETTINGS_OPTION, PARAMETRIZATION_OPTION):
            why = why.removeprefix(f"{option}: ")
        raise ValueError(f"--ladder: the rung {key}={value} is not a valid model: {why}") from None
    return {"lm": lm}, changes


def lm_n_params(rung: Experiment) -> int:
    """The parameter count of the rung's baseline arm, its model built on the meta device
    (:meth:`~normlab.models.external.ModelSource.count_parameters`)."""
    norm, _ = baseline_factors(rung)
    return lm_source(lm_record(rung), vocab_hint(rung)).count_parameters(norm)


def check_lm_sizes(cfg: Experiment, memory: int, disk: int, on_disk: str) -> None:
    """The user's model's size estimate (:data:`~normlab.experiment.testbeds.base.SizeCheck`),
    from the ``--model`` source's config (parameters, Adam's state, activations;
    :func:`normlab.models.external.footprint.check_source_fits`), ``parallel + 1`` at once."""
    source = lm_source(cfg.lm.model_dump(mode="json"), vocab_hint(cfg))
    b, t, norm = cfg.train.batch_size, cfg.lm.context, cfg.norms[0]
    check_source_fits(
        source, batch_size=b, context=t, norm=norm, available=memory, copies=cfg.parallel + 1
    )


LM_LADDER = LadderRule(
    keys=f"an integer key of the model's transformers config ({WIDTH_KEY}, num_hidden_layers, …)",
    rule="the size rule of normlab.models.external.scaling: hidden_size brings "
    "num_attention_heads and num_key_value_heads along in proportion (head size fixed) and "
    "each MLP width (intermediate_size, …) keeps its ratio to the width, rounded to the nearest "
    "integer; any other key changes alone; under mup a hidden_size ladder's base_hidden_size "
    "is its smallest rung",
    check_key=check_lm_ladder_key,
    rung=lm_rung,
    n_params=lm_n_params,
    parametrization=lambda cfg: str(cfg.lm.parametrization),
    base_width_key="base_hidden_size",
)
"""How a size ladder varies an ``hf:`` model (:class:`LadderRule`)."""


class LMTestbed:
    """The lm testbed: the user's causal LM on the token cache in ``run_dir/../../data``."""

    name: ClassVar[str] = "lm"
    config: ClassVar[TestbedConfig] = TestbedConfig(
        summary="lm (your causal LM: --model)",
        sections={"lm": LMSettings, "data": DataSettings},
        sample_length=("lm", "context"),
        options=(
            "data.tokenizer",
            "data.text_field",
            "data.bpe_merges",
            "margin_bpb",
            "train.eval_windows",
            "train.full_val",
        ),
        train_defaults=LM_TRAIN_DEFAULTS,
        check_norm=check_slot_norm,
        check=check_lm_config,
        selected_by="lm",
        ladder=LM_LADDER,
        parametrization=ParametrizationKey("lm.parametrization", "a --model source"),
        check_sizes=check_lm_sizes,
    )
    quality_fields: ClassVar[tuple[str, ...]] = testbed_format("lm").validation_fields

    @staticmethod
    def check_inputs(cfg: Experiment) -> None:
        """``--data`` exists and can be read, ``--tokenizer`` loads, and ``--model`` /
        ``--model-set`` make a model source (config built or factory signature checked) whose
        longest sequence, if it has one, takes ``lm.context``; a ``.bin`` / ``.npy`` source
        opens (its sidecar read)."""
        path = check_source(cfg.data.path)
        if path is not None and is_pretokenized(path):
            try:
                open_token_source(path)
            except FileNotFoundError as err:
                raise ValueError(str(err)) from None
        check_context(cfg, lm_source(lm_record(cfg), vocab_hint(cfg)))

    @staticmethod
    def prepare_data(cfg: Experiment, data_dir: Path, console: Console) -> dict[str, Any]:
        """The tokenizer (trained first with ``data.bpe_merges``), then the token cache
        (:func:`normlab.data.cache.prepare_tokens`), checked to hold one ``lm.context`` window
        per side."""
        started = time.perf_counter()
        d = cfg.data
        tokenizer = resolve_tokenizer(cfg, data_dir)
        if d.bpe_merges is not None:
            console.print(
                f"tokenizer: byte-level BPE with {d.bpe_merges} merges on the training side, "
                f"{tokenizer} ({time.perf_counter() - started:.1f} s)"
            )
        try:
            info = prepare_tokens(
                data_dir,
                d.path,
                d.max_bytes,
                d.val_fraction,
                tokenizer=tokenizer,
                text_field=d.text_field,
            )
        except FileNotFoundError as err:  # a file the source names is missing
            raise ValueError(str(err)) from None
        vocab = info.get("vocab_size", BYTE_VOCAB)
        console.print(
            f"data: {info['source']} ({info['fingerprint']}), {info['n_train_tokens']:,} train / "
            f"{info['n_val_tokens']:,} val tokens, vocabulary {vocab:,} "
            f"({time.perf_counter() - started:.1f} s)"
        )
        check_data_fits(info, cfg.lm.context, d.val_fraction, "lm.context")
        return info

    @staticmethod
    def run_settings(cfg: Experiment, data_info: dict[str, Any]) -> dict[str, Any]:
        """``testbed``, ``lm`` (the config's section: source, parsed overrides, context,
        attention) and ``data``: the cache's fingerprint, source, format, tokenizer (path and
        content hash; ``bytes`` and None for bytes), vocabulary size and Python version."""
        return {
            "testbed": "lm",
            "lm": lm_record(cfg),
            "data": {
                "fingerprint": data_info["fingerprint"],
                "source": data_info["source"],
                "source_format": data_info.get("source_format", data_info.get("source_kind")),
                "tokenizer": data_info.get("tokenizer", "bytes"),
                "tokenizer_hash": data_info.get("tokenizer_hash"),
                "vocab_size": int(data_info.get("vocab_size", BYTE_VOCAB)),
                "python_version": data_info["python_version"],
            },
        }

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        source = lm_source(spec["lm"], spec["data"]["vocab_size"])
        model, _ = source.build(spec["norm"], seed)
        return model

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        """``norm_swap``: the arm's :class:`~normlab.models.external.NormSwapRecord`."""
        assert isinstance(model, SourceLM)
        return {NORM_SWAP_FIELD: _json_ready(model.record.to_dict())}

    def __init__(self, spec: dict[str, Any], run_dir: Path) -> None:
        t = spec["train"]
        data = load_tokens(Path(run_dir).parent.parent / "data")
        check_fingerprint(data.info["fingerprint"], spec, "cache")
        if data.vocab_size != spec["data"]["vocab_size"]:
            raise RuntimeError(
                f"data: the cache's vocabulary is {data.vocab_size}, run.json expects "
                f"{spec['data']['vocab_size']}"
            )
        self.model: SourceLM = self.build_model(spec, init_seed(spec))  # type: ignore[assignment]
        context = spec["lm"]["context"]
        self.context = context
        self.batch_size = t["batch_size"]
        self.batches = TrainBatches(data.train, t["batch_size"], context, data_seed(spec))
        self.windows = validation_windows(data.val, context, t["eval_windows"])
        self.window_bytes = window_bytes(
            data.val_bytes, data.val.shape[0], context, t["eval_windows"]
        )
        self.val, self.val_bytes = data.val, data.val_bytes
        self.tokens_per_step = t["batch_size"] * context
        self.data_fingerprint = data.info["fingerprint"]

    def _loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1)
        )

    def warm_up(self, device: torch.device) -> None:
        """On zeros of the training shape [batch_size, context]."""
        model = self.model
        was_training = model.training
        model.eval()
        idx = torch.zeros(self.batch_size, self.context, dtype=torch.long, device=device)
        self._loss(model, idx, idx).backward()
        model.zero_grad(set_to_none=True)
        model.train(was_training)

    def train_loss(self, device: torch.device) -> torch.Tensor:
        x, y = self.batches.next()
        return self._loss(self.model, x.to(device), y.to(device))

    def stream_state(self) -> object:
        return self.batches.get_state()

    def restore_stream(self, state: object) -> None:
        self.batches.set_state(state)  # type: ignore[arg-type]

    @torch.no_grad()
    def _tally(
        self,
        model: nn.Module,
        device: torch.device,
        windows: torch.Tensor | OffsetWindows | None = None,
        covered_bytes: torch.Tensor | OffsetWindows | None = None,
    ) -> BpbTally:
        """Σ nats, tokens and bytes over ``windows`` (default: the validation windows) whose
        predicted tokens cover ``covered_bytes``, in eval mode (restored)."""
        if windows is None or covered_bytes is None:
            windows, covered_bytes = self.windows, self.window_bytes
        was_training = model.training
        model.eval()
        tally = BpbTally()
        try:
            for start in range(0, windows.shape[0], self.batch_size):
                chunk = windows[start : start + self.batch_size].to(device)
                covered = covered_bytes[start : start + self.batch_size]
                tally.add(model(chunk[:, :-1]), chunk[:, 1:], covered.to(device))
        finally:
            model.train(was_training)
        return tally

    def evaluate(self, device: torch.device) -> dict[str, float]:
        """``val_loss`` = Σ nats / tokens (nats per token), ``val_bpb`` = Σ nats / ln 2 / bytes."""
        tally = self._tally(self.model, device)
        return {"val_loss": tally.loss, "val_bpb": tally.bpb}

    def full_evaluate(self, device: torch.device) -> dict[str, float]:
        """:meth:`evaluate` over every non-overlapping window of ``lm.context + 1`` tokens of
        the validation split (:func:`normlab.data.batches.split_offsets`), in batches of
        ``batch_size``, drawing no random numbers."""
        offsets = split_offsets(self.val.shape[0], self.context)
        counts = self.val_bytes
        if counts is None:  # bytes: every token covers one
            counts = np.broadcast_to(np.int64(1), self.val.shape)
        windows = OffsetWindows(self.val, offsets, self.context + 1)
        tally = self._tally(
            self.model, device, windows, OffsetWindows(counts, offsets, self.context, 1)
        )
        return {"val_loss": tally.loss, "val_bpb": tally.bpb}

    def parameter_groups(self) -> dict[str, list[str]]:
        return self.model.parameter_groups()

    def quality_summary(
        self, final: dict[str, Any] | None, finite_evals: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return {
            **bpb_quality(final, finite_evals),
            NORM_SWAP_FIELD: _json_ready(self.model.record.to_dict()),
        }

    def finish(self, device: torch.device) -> dict[str, Any]:
        return {}

    def posttrain(self, device: torch.device, final: dict[str, Any]) -> dict[str, Any]:
        """Deltas in validation bpb (the bf16 copy's logits go to the cross-entropy in
        float32); activations on the first ``batch_size`` validation windows."""

        def metric(model: nn.Module) -> float:
            return self._tally(model, device).bpb

        def run_batch(model: nn.Module) -> object:
            return model(self.windows[: self.batch_size, :-1].to(device))

        return posttrain_summary(self.model, final["val_bpb"], metric, metric, run_batch)
