"""What a ``--model`` source would hold in memory, estimated before any model is built.

Training keeps, per parameter, the float32 weight, its float32 gradient and Adam's two float32
moments: :data:`TRAIN_BYTES_PER_PARAMETER` = 16 bytes. The activations kept for the backward
pass of one step of ``B`` windows of ``T`` tokens are, in float32 (4 bytes a value), for a
transformers config with width ``d``, ``L`` layers, ``h`` query heads and ``k`` key/value heads
of size ``e``, an MLP of width ``I`` (GPT-2: ``4·d``) of which ``a`` experts run per token
(1 without experts) and a vocabulary of ``V``::

    4·B·T·( L·(6·d + 3·h·e + 4·k·e + 2·h·T + 4·a·I) + 3·V + 3·d )

(per layer: the two norms' inputs and outputs, the query, key and value projections with their
rotated copies, the attention scores and probabilities, the gated MLP's four tensors; then the
logits, their log-softmax and gradient). The parameters are counted from the config::

    V·d·(1 or 2, tied or not) + L·(d·h·e + 2·d·k·e + h·e·d + n·3·d·I + n·d + 2·d) + d

with ``n`` experts per layer (1 without). Both are rough (within a small factor) and only refuse
sizes far beyond the machine: :func:`check_source_fits` refuses from the config's estimate
alone, so an absurd size is refused at once, then builds the model on the ``meta`` device
(shapes only, no memory; seconds for the largest model that fits) to count its parameters
exactly and to see that the settings build a model at all.

A ``package.module:factory`` source has no config to read: its parameters are counted by calling
the factory with torch's default device set to ``meta`` (which allocates nothing for modules
built the usual way: ``nn.Linear``, ``nn.Embedding``, ``torch.empty`` without a device), and of
its activations only the logits' (``3·4·B·T·V`` bytes) are known, a lower bound; a factory
that cannot run on the meta device is left unchecked here (its first real build says what it
needs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from normlab._resources import DoesNotFitError, format_bytes
from normlab.models.external.spec import MODEL_OPTION, SETTINGS_OPTION, SettingsError


class ModelSource(Protocol):
    """What sizing reads of a :class:`normlab.models.external.source.ModelSource` (declared
    here so that this module, which the source module calls, does not import it)."""

    spec: Any
    settings: dict[str, Any]
    vocab_size: int
    attn_implementation: str
    config: Any
    factory: Any

    @property
    def factory_kwargs(self) -> dict[str, Any]: ...


TRAIN_BYTES_PER_PARAMETER = 16
"""float32 weight, float32 gradient, and Adam's two float32 moments."""
INFER_BYTES_PER_PARAMETER = 4
"""A float32 weight (an audit builds the model and runs it without training)."""
FLOAT_BYTES = 4
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
ACTIVE_EXPERT_KEYS = ("num_experts_per_tok", "moe_topk")


@dataclass(frozen=True)
class Footprint:
    """Parameters (None: not known) and the bytes of one step's activations, and how they were
    found (``"from the config"``, ``"counted on the meta device"``)."""

    parameters: int | None
    activation_bytes: int
    how: str

    def total(self, bytes_per_parameter: int) -> int:
        """Parameters × ``bytes_per_parameter`` + activations, in bytes."""
        return (self.parameters or 0) * bytes_per_parameter + self.activation_bytes

    def describe(self, bytes_per_parameter: int) -> str:
        """``"6.6e+12 parameters (96 TiB ...) and 3 GiB of activations, from the config"``."""
        held = (
            "float32 weights, gradients and Adam's two moments"
            if bytes_per_parameter == TRAIN_BYTES_PER_PARAMETER
            else "float32 weights"
        )
        if self.parameters is None:
            params = "parameters unknown"
        else:
            weights = format_bytes(self.parameters * bytes_per_parameter)
            params = f"{self.parameters:.3g} parameters ({weights} of {held})"
        return f"{params} and {format_bytes(self.activation_bytes)} of activations, {self.how}"


def _int(config: Any, *keys: str, default: int | None = None) -> int | None:
    """The first of ``keys`` the config holds as an int (not a bool), else ``default``."""
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def config_footprint(config: Any, batch_size: int, context: int) -> Footprint:
    """The module docstring's estimate for a transformers ``config`` trained on ``batch_size``
    windows of ``context`` tokens."""
    d = _int(config, "hidden_size", default=1) or 1
    layers = _int(config, "num_hidden_layers", default=1) or 1
    heads = _int(config, "num_attention_heads", default=1) or 1
    kv = _int(config, "num_key_value_heads", default=heads) or heads
    head = _int(config, "head_dim", default=max(d // heads, 1)) or 1
    inner = _int(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * d) or 4 * d
    vocab = _int(config, "vocab_size", default=1) or 1
    experts = _int(config, *EXPERT_KEYS, default=1) or 1
    active = min(_int(config, *ACTIVE_EXPERT_KEYS, default=1) or 1, experts)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    per_layer = (
        d * heads * head + 2 * d * kv * head + heads * head * d
        + experts * 3 * d * inner + (d * experts if experts > 1 else 0) + 2 * d
    )  # fmt: skip
    params = vocab * d * (1 if tied else 2) + layers * per_layer + d
    per_token = (
        layers
        * (6 * d + 3 * heads * head + 4 * kv * head + 2 * heads * context + 4 * active * inner)
        + 3 * vocab
        + 3 * d
    )
    return Footprint(params, FLOAT_BYTES * batch_size * context * per_token, "from the config")


def _refuse(
    source: ModelSource, need: Footprint, per_parameter: int, copies: int, available: int, what: str
) -> None:
    total = copies * need.total(per_parameter)
    if total <= available:
        return
    settings = ",".join(f"{k}={v}" for k, v in source.settings.items())
    shown = f"{MODEL_OPTION} {source.spec}" + (f" {SETTINGS_OPTION} {settings}" if settings else "")
    times = f" × {copies} at once" if copies > 1 else ""
    raise DoesNotFitError(
        f"{shown} needs about {format_bytes(total)} to {what} ({need.describe(per_parameter)}"
        f"{times}), but only {format_bytes(available)} is available in memory; use a smaller "
        f"model ({SETTINGS_OPTION}), batch or context"
        + (", or fewer runs in parallel" if copies > 1 else "")
    )


def check_source_fits(
    source: ModelSource,
    *,
    batch_size: int,
    context: int,
    norm: str,
    available: int,
    copies: int = 1,
    training: bool = True,
) -> Footprint:
    """Refuse (``ValueError`` naming ``--model`` and ``--model-set``, with both sizes) a source
    whose model, trained (``training``; else only built and run) on ``batch_size`` windows of
    ``context`` tokens in ``copies`` processes at once, would need more than ``available``
    bytes; see the module docstring for the estimate. The model is built on the meta device
    (with the arm ``norm``) only once the config's estimate fits; a transformers model that
    cannot be built from the settings raises :class:`SettingsError`. Returns the footprint
    used for the last check."""
    per_parameter = TRAIN_BYTES_PER_PARAMETER if training else INFER_BYTES_PER_PARAMETER
    what = "train" if training else "build and run"
    logits = 3 * FLOAT_BYTES * batch_size * context * source.vocab_size
    if source.config is not None:
        need = config_footprint(source.config, batch_size, context)
        _refuse(source, need, per_parameter, copies, available, what)
        activations = need.activation_bytes
    else:
        activations = logits
    counted = meta_parameter_count(source, norm)
    if counted is None:
        return Footprint(None, activations, "activations of the logits only")
    need = Footprint(counted, activations, "counted on the meta device")
    _refuse(source, need, per_parameter, copies, available, what)
    return need


def meta_parameter_count(source: ModelSource, norm: str) -> int | None:
    """The parameters of ``source``'s model with the arm ``norm``, built on the meta device
    (tied weights counted once). A transformers model that cannot be built from its settings
    raises :class:`SettingsError`; a factory that fails on the meta device gives None."""
    from normlab.models.external.arm import ArmNorm
    from normlab.models.external.hf import build_hf_model

    try:
        with torch.device("meta"):
            if source.config is not None:
                model = build_hf_model(source.config, 0, source.attn_implementation)
            else:
                model = source.factory(make_norm=ArmNorm(norm), **source.factory_kwargs)
    except Exception as err:  # whatever the model's constructor raises
        if source.config is None:
            return None
        message = " ".join(str(err).split()) or type(err).__name__
        raise SettingsError(
            f"{SETTINGS_OPTION}: the {source.spec} model cannot be built from them: "
            f"{type(err).__name__}: {message}"
        ) from None
    if not isinstance(model, torch.nn.Module):
        return None
    return sum(p.numel() for p in model.parameters())
