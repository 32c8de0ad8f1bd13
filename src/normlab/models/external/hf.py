"""Hugging Face source: a transformers causal LM from a config, randomly initialised.

``hf:<model_type>`` builds ``AutoConfig.for_model(model_type, **settings)``; ``hf:<folder>``
reads the folder's ``config.json`` (``AutoConfig.from_pretrained(folder,
local_files_only=True)``) and builds its model_type's config from the file's values with the
settings on top, through the config's constructor: a value the constructor derives (a head size
from the hidden size) follows the settings unless the file writes it out (``save_pretrained``
writes ``head_dim``), in which case the file's value stays unless it is set too. Weights are
never loaded or downloaded: ``AutoModelForCausalLM.from_config`` initialises every parameter
from torch's global generator, which :func:`build_hf_model` seeds with the run's seed inside a
forked random state.

The vocabulary size is the tokenizer's (a parameter, never a setting); token ids the config
names beyond it (``bos_token_id``, ``eos_token_id``, ``pad_token_id``) become None unless set.
The attention implementation is ``eager`` by default (deterministic on the CPU), the model is
float32 and ``use_cache`` is off.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from normlab._quiet import quiet_loggers
from normlab.models.external.arm import forked_rng
from normlab.models.external.spec import (
    MODEL_OPTION,
    SETTINGS_OPTION,
    SettingsError,
    UnknownModelError,
)

TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
CONFIG_FILE = "config.json"


def import_transformers() -> Any:
    """The transformers package, or a ValueError naming :data:`MODEL_OPTION` without it."""
    try:
        import transformers
    except ImportError as err:
        raise ValueError(
            f"{MODEL_OPTION}: an 'hf:' source needs the transformers package ({err}); "
            "pip install transformers"
        ) from None
    return transformers


def causal_lm_types() -> list[str]:
    """The model_types transformers has a causal-LM class for, sorted."""
    import_transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _looks_like_path(target: str) -> bool:
    return "/" in target or "\\" in target or target.startswith(".") or Path(target).exists()


def hf_config(target: str, settings: dict[str, Any], vocab_size: int) -> Any:
    """The transformers config of ``hf:<target>`` with ``settings`` applied and the
    vocabulary size ``vocab_size``. ``target`` is a folder when it holds a ``/`` or ``\\``,
    starts with ``.`` or exists here as a path; else a model_type.

    Errors (ValueError, one line): :class:`UnknownModelError` naming :data:`MODEL_OPTION` for an
    unknown model_type (with the closest known ones) or a model_type without a causal-LM class;
    ValueError naming it for a folder without config.json or
    a path that is no folder; :class:`SettingsError` naming :data:`SETTINGS_OPTION` and the key
    for a key the config does not have, ``vocab_size`` (the tokenizer's), a value of another type
    than the config's own (:func:`check_setting_types`), a value the config's constructor
    refuses, or sizes that cannot make a model (:func:`check_geometry`).
    """
    transformers = import_transformers()
    if _looks_like_path(target):
        model_type, base = _folder_config(transformers, target)
    else:
        model_type, base = target, {}
    _check_model_type(transformers, model_type)
    default = transformers.AutoConfig.for_model(model_type)
    if "vocab_size" in settings:
        raise SettingsError(
            f"{SETTINGS_OPTION}: vocab_size is the tokenizer's ({vocab_size}); leave it out"
        )
    unknown = sorted(k for k in settings if k not in base and not hasattr(default, k))
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(default.to_dict()), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise SettingsError(
            f"{SETTINGS_OPTION}: the {model_type} config has no {', '.join(map(repr, unknown))}"
            f"{hint}; expected keys of {type(default).__name__}"
        )
    check_setting_types(settings, default, model_type)
    check_sizes_given(settings, default, model_type)
    merged = {**base, **settings, "vocab_size": vocab_size}
    for name in TOKEN_ID_FIELDS:
        if name not in settings and _out_of_range(
            merged.get(name, getattr(default, name, None)), vocab_size
        ):
            merged[name] = None
    try:
        config = transformers.AutoConfig.for_model(model_type, **merged)
    except Exception as err:  # TypeError, ValueError, huggingface_hub's strict-dataclass errors
        message = " ".join(str(err).split()) or type(err).__name__
        raise SettingsError(
            f"{SETTINGS_OPTION}: the {model_type} config does not accept these settings: {message}"
        ) from None
    check_geometry(config, settings, model_type)
    config.use_cache = False
    return config


_KINDS = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"))
"""The value kinds a setting is checked against, by its default's type (bool before int)."""


def check_setting_types(settings: dict[str, Any], default: Any, model_type: str) -> None:
    """Each setting must be of the kind of the config's own value for its key: an integer where
    the config has an integer (not a float or a bool), a number where it has a float, true or
    false where it has a bool, a string where it has a string; a key whose value is None, a list
    or a mapping takes anything (the config's constructor checks it). :class:`SettingsError`
    naming the key, the expected kind and the value otherwise."""
    for key, value in settings.items():
        current = getattr(default, key, None)
        for kind, words in _KINDS:
            if isinstance(current, kind):
                fits = (
                    isinstance(value, (int, float)) and not isinstance(value, bool)
                    if kind is float
                    else isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
                )
                if value is not None and not fits:
                    raise SettingsError(
                        f"{SETTINGS_OPTION}: {key}={value!r}: expected {words} (the "
                        f"{model_type} config's {key} is {current!r})"
                    )
                break


_POSITIVE_SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "max_position_embeddings",
)
"""The sizes every transformers causal LM config names this way (directly or through its
``attribute_map``: ``n_embd`` is ``hidden_size`` for GPT-2): each must be an integer >= 1."""


def check_sizes_given(settings: dict[str, Any], default: Any, model_type: str) -> None:
    """Each size among ``settings`` (:data:`_POSITIVE_SIZES`, under its own name or an alias of
    the config's ``attribute_map``) must be an integer >= 1, checked before the config is built
    so that the error names the key as given (a config's own validation words it its way)."""
    aliases = getattr(default, "attribute_map", {}) or {}
    for key, value in settings.items():
        if aliases.get(key, key) not in _POSITIVE_SIZES or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(
                f"{SETTINGS_OPTION}: {key}={value!r}: expected an integer >= 1 (a size of the "
                f"{model_type} model)"
            )


def check_geometry(config: Any, settings: dict[str, Any], model_type: str) -> None:
    """The built config's sizes must make a model: :data:`_POSITIVE_SIZES` integers >= 1 where
    set, ``num_attention_heads`` a multiple of ``num_key_value_heads``, and ``hidden_size`` a
    multiple of ``num_attention_heads`` where the head size follows from them (a ``head_dim``
    of ``hidden_size // num_attention_heads``, or none). :class:`SettingsError` naming the keys
    as the settings spell them (``n_embd`` for GPT-2's ``hidden_size``)."""
    aliases = getattr(config, "attribute_map", {}) or {}

    def spelled(key: str) -> str:
        return aliases[key] if aliases.get(key) in settings else key

    sizes = {k: getattr(config, k, None) for k in _POSITIVE_SIZES}
    for key, value in sizes.items():
        if value is None or (key == "intermediate_size" and not isinstance(value, int)):
            continue  # GPT-2's n_inner: None means 4 × the width
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SettingsError(
                f"{SETTINGS_OPTION}: {spelled(key)}={value!r}: expected an integer >= 1 (a size "
                f"of the {model_type} model)"
            )
    width, heads, kv = (
        sizes[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    if heads is not None and kv is not None and heads % kv:
        raise SettingsError(
            f"{SETTINGS_OPTION}: {spelled('num_attention_heads')}={heads} is not a multiple of "
            f"{spelled('num_key_value_heads')}={kv}; expected each key/value head to serve the "
            "same number of query heads"
        )
    if width is None or heads is None or not width % heads:
        return
    if sizes["head_dim"] in (None, width // heads):
        raise SettingsError(
            f"{SETTINGS_OPTION}: {spelled('hidden_size')}={width} is not a multiple of "
            f"{spelled('num_attention_heads')}={heads}; expected the width to split evenly "
            "into the heads (or a head_dim of their own)"
        )


def _out_of_range(value: object, vocab_size: int) -> bool:
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, int) and not 0 <= v < vocab_size for v in values)


def _folder_config(transformers: Any, target: str) -> tuple[str, dict[str, Any]]:
    folder = Path(target).expanduser()
    if not folder.is_dir():
        raise ValueError(
            f"{MODEL_OPTION}: hf:{target} is no folder here; expected a local folder holding "
            f"{CONFIG_FILE} or a transformers model_type (hub names are never downloaded)"
        )
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ValueError(
            f"{MODEL_OPTION}: folder {target} has no {CONFIG_FILE}; expected a folder holding a "
            "transformers config.json"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError) as err:
        message = " ".join(str(err).split())
        raise ValueError(f"{MODEL_OPTION}: cannot read {path}: {message}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{MODEL_OPTION}: {path} holds no JSON object")
    base = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}
    return config.model_type, base


def _check_model_type(transformers: Any, model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    lm_types = causal_lm_types()
    if model_type in lm_types:
        return
    if model_type in CONFIG_MAPPING:
        raise UnknownModelError(
            f"{MODEL_OPTION}: transformers has no causal-LM class for model_type "
            f"{model_type!r}; expected one of the {len(lm_types)} causal-LM types, e.g. "
            f"{', '.join(_examples(lm_types))}"
        )
    close = difflib.get_close_matches(model_type, lm_types, n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(
        f"{MODEL_OPTION}: unknown model_type {model_type!r}; {hint}expected a transformers "
        f"causal-LM type, e.g. {', '.join(_examples(lm_types))} (all {len(lm_types)}: "
        "normlab.models.external.causal_lm_types()), or a folder holding config.json"
    )


def _examples(types: list[str]) -> list[str]:
    preferred = [t for t in ("llama", "qwen3", "gpt2", "mistral", "gemma") if t in types]
    return preferred or types[:5]


def build_hf_model(config: Any, seed: int, attn_implementation: str = "eager") -> nn.Module:
    """``AutoModelForCausalLM.from_config(config)`` in float32 on the CPU, every parameter
    drawn by transformers' own initialisation from torch's generator seeded with ``seed``, in a
    forked random state (the caller's stream is left as it was). The same config and seed give
    the same values, whichever arm the model is for. torchao's import-time warnings, when the
    model classes import it, are dropped (:mod:`normlab._quiet`)."""
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: expected one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, "
            f"got {attn_implementation!r}"
        )
    transformers = import_transformers()
    with forked_rng(), quiet_loggers():  # the model classes import torchao when installed
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=torch.float32
        )
    return model.train()
