"""The size rule of a transformers config: which keys change, and to what, when one integer key
of the config is set to a new size (a rung of ``compare --ladder KEY=…`` on an ``hf:`` source,
and the base model of μP, :mod:`normlab.models.external.mup`).

Let d be the config's width (``hidden_size``, under whatever name the config's
``attribute_map`` gives it: ``n_embd`` for GPT-2) and d′ the new one. Setting the **width**
holds the head size fixed and keeps the MLP's ratio to the width:

- ``num_attention_heads`` → h · d′ / d and ``num_key_value_heads`` → k · d′ / d (the same
  ratio, so each key/value head still serves h / k query heads); both must come out whole, so
  d′ must be a multiple of d / gcd(d, h) and of d / gcd(d, k) (:func:`width_multiple`);
- each MLP width of :data:`MLP_WIDTH_KEYS` the config holds as an integer (``intermediate_size``;
  GPT-2's ``n_inner`` when set, None follows the width by itself) → I · d′ / d rounded to the
  nearest integer, at least 1 (a transformers MLP is made of ``nn.Linear`` layers, which take
  any width);
- ``head_dim`` is not touched: it is either derived from d / h, which the rule keeps, or
  written out, and then it is what stays fixed.

Setting **any other** integer key (``num_hidden_layers``, ``intermediate_size``,
``num_attention_heads``, …) changes that key alone. Keys that are not integers (a float, a
bool, None, a string), keys the config lacks and ``vocab_size`` (the tokenizer's) cannot be
set. The result is the changed keys under the config's own attribute names
(:func:`scaled_keys`); :func:`with_changes` lays them over ``--model-set`` settings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "HEAD_KEYS",
    "MLP_WIDTH_KEYS",
    "WIDTH_KEY",
    "ScalingError",
    "attribute_name",
    "config_int",
    "current_size",
    "is_width",
    "scaled_keys",
    "width_multiple",
    "with_changes",
]

WIDTH_KEY = "hidden_size"
"""The width of a transformers config (the name every config answers to, through its
``attribute_map`` where it stores it under another)."""
HEAD_KEYS = ("num_attention_heads", "num_key_value_heads")
"""Head counts that follow the width (head size fixed)."""
MLP_WIDTH_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
"""MLP widths that keep their ratio to the width (those the config holds as integers)."""
NOT_SCALABLE = ("vocab_size",)
"""Keys a size rule never sets: the vocabulary is the tokenizer's."""


class ScalingError(ValueError):
    """A size the rule cannot make: a key the config lacks or that is no integer size, or a
    width the heads do not divide. The message is one line without the option's name (the
    caller names ``--ladder`` or ``--parametrization``)."""


def attribute_name(config: Any, key: str) -> str:
    """The config's own attribute for ``key`` (its ``attribute_map`` alias: ``hidden_size`` →
    ``n_embd`` for GPT-2), or ``key`` itself."""
    aliases = getattr(config, "attribute_map", {}) or {}
    return aliases.get(key, key)


def config_int(config: Any, key: str) -> int | None:
    """The config's value for ``key`` when it is an integer (not a bool), else None."""
    value = getattr(config, attribute_name(config, key), None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_width(config: Any, key: str) -> bool:
    """Whether ``key`` names the config's width (``hidden_size`` or its alias)."""
    return attribute_name(config, key) == attribute_name(config, WIDTH_KEY)


def width_multiple(config: Any) -> int:
    """The step m of the widths the rule can make: d′ must be a multiple of m so that every
    head count of :data:`HEAD_KEYS` the config holds, h · d′ / d, is whole;
    m = lcm over those h of d / gcd(d, h)."""
    d = config_int(config, WIDTH_KEY)
    if d is None:
        raise ScalingError(f"the {_type(config)} config has no integer {WIDTH_KEY}")
    m = 1
    for key in HEAD_KEYS:
        h = config_int(config, key)
        if h is not None:
            m = math.lcm(m, d // math.gcd(d, h))
    return m


def current_size(config: Any, key: str) -> int:
    """The config's integer value for ``key``; :class:`ScalingError` for ``vocab_size``, a key
    the config lacks or one that is not an integer size."""
    name = attribute_name(config, key)
    if key in NOT_SCALABLE or name in NOT_SCALABLE:
        raise ScalingError(
            f"{key} is the tokenizer's vocabulary size, not a model size; expected a key such "
            f"as {WIDTH_KEY} or num_hidden_layers"
        )
    if not hasattr(config, name):
        raise ScalingError(
            f"the {_type(config)} config has no {key!r}; expected an integer key of "
            f"{type(config).__name__}, e.g. {WIDTH_KEY} or num_hidden_layers"
        )
    current = config_int(config, key)
    if current is None:
        raise ScalingError(
            f"the {_type(config)} config's {key} is {getattr(config, name)!r}, not an integer "
            f"size; expected an integer key such as {WIDTH_KEY} or num_hidden_layers"
        )
    return current


def scaled_keys(config: Any, key: str, value: int) -> dict[str, int]:
    """{attribute: new value} of every key the rule (module docstring) changes when ``config``
    is set to ``key`` = ``value``; :class:`ScalingError` when it cannot."""
    current = current_size(config, key)
    name = attribute_name(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScalingError(f"{key}={value!r}: expected an integer size >= 1")
    if not is_width(config, key):
        return {name: value}
    changes = {name: value}
    m = width_multiple(config)
    if value % m:
        heads = ", ".join(
            f"{k}={config_int(config, k)}" for k in HEAD_KEYS if config_int(config, k) is not None
        )
        raise ScalingError(
            f"{key}={value} cannot keep the head size: the heads ({heads} at {key}={current}) "
            f"scale with the width, so {key} must be a multiple of {m}"
        )
    for k in HEAD_KEYS:
        h = config_int(config, k)
        if h is not None:
            changes[attribute_name(config, k)] = h * value // current
    for k in MLP_WIDTH_KEYS:
        inner = config_int(config, k)
        if inner is not None:
            changes[attribute_name(config, k)] = max(1, round(inner * value / current))
    return changes


def with_changes(
    config: Any, settings: Mapping[str, Any], changes: Mapping[str, Any]
) -> dict[str, Any]:
    """``settings`` (``--model-set``) with ``changes`` laid over them: a setting that names a
    changed attribute under another name (``hidden_size`` for GPT-2's ``n_embd``) is dropped,
    so the config's constructor sees each size once."""
    kept = {k: v for k, v in settings.items() if attribute_name(config, k) not in changes}
    return {**kept, **changes}


def _type(config: Any) -> str:
    return str(getattr(config, "model_type", type(config).__name__))
