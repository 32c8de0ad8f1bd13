"""Reading the user's model option: the source (``--model``) and its ``key=value`` settings
(``--model-set``).

A source is ``hf:<folder with config.json, or a transformers model_type>`` or
``package.module:factory``. Settings are ``key=value`` pairs separated by commas; a value reads
as an int, else a float, else a bool (``true`` / ``false``, any case), else None (``none`` /
``null``), else the string itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from normlab._checks import UsageValueError

MODEL_OPTION = "--model"
"""The option that names a model source, as errors name it."""
SETTINGS_OPTION = "--model-set"
"""The option that holds the source's ``key=value`` settings, as errors name it."""
HF_PREFIX = "hf:"

Scalar = int | float | bool | str | None


class UnknownModelError(UsageValueError):
    """A :data:`MODEL_OPTION` that names no model there is: a model_type transformers does not
    know or has no causal-LM class for, or a ``package.module:factory`` that cannot be imported
    or is no factory. One line naming the option (a usage error on the command line, exit status
    2, like :class:`SettingsError`); a folder that cannot be read is not one."""


class SettingsError(UsageValueError):
    """A :data:`SETTINGS_OPTION` value the source does not take: a malformed pair, a key it
    lacks, a value of the wrong type or out of range, sizes that do not fit together. The
    message is one line that names the key and what was expected (a usage error on the command
    line, exit status 2)."""


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source: ``kind`` is ``"hf"`` (``target``: a folder or a model_type) or
    ``"factory"`` (``target``: ``package.module:attribute``)."""

    kind: str
    target: str

    def __str__(self) -> str:
        return f"{HF_PREFIX}{self.target}" if self.kind == "hf" else self.target


def parse_source(text: object) -> SourceSpec:
    """``hf:<folder or model_type>`` or ``package.module:factory``; ValueError naming
    :data:`MODEL_OPTION` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"{MODEL_OPTION}: expected 'hf:<folder or model_type>' or 'package.module:factory', "
            f"got {text!r}"
        )
    text = text.strip()
    if text.startswith(HF_PREFIX):
        target = text[len(HF_PREFIX) :].strip()
        if not target:
            raise ValueError(
                f"{MODEL_OPTION}: {text!r} names nothing after 'hf:'; expected a folder holding "
                "config.json or a transformers model_type such as llama, qwen3 or gpt2"
            )
        return SourceSpec("hf", target)
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".")):
        raise ValueError(
            f"{MODEL_OPTION}: {text!r} is neither 'hf:<folder or model_type>' nor "
            "'package.module:factory'"
        )
    return SourceSpec("factory", text)


def parse_value(text: str) -> Scalar:
    """``"128"`` → 128, ``"1e-5"`` → 1e-05, ``"True"`` → True, ``"none"`` → None, else the
    string (stripped). A non-finite float (``nan``, ``inf``) stays a string."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    return text


def parse_settings(settings: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"hidden_size=128,num_hidden_layers=2"`` → ``{"hidden_size": 128, …}``; a mapping is
    taken as it is (its keys checked); None is no settings. :class:`SettingsError` naming
    :data:`SETTINGS_OPTION` for a pair without ``=``, an empty or repeated key."""
    if settings is None:
        return {}
    if isinstance(settings, Mapping):
        out = dict(settings)
        for key in out:
            if not isinstance(key, str) or not key.isidentifier():
                raise SettingsError(f"{SETTINGS_OPTION}: expected identifier keys, got {key!r}")
        return out
    if not isinstance(settings, str):
        raise SettingsError(
            f"{SETTINGS_OPTION}: expected 'key=value,key=value' or a mapping, got "
            f"{type(settings).__name__}"
        )
    out = {}
    for pair in (p.strip() for p in settings.split(",")):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise SettingsError(f"{SETTINGS_OPTION}: expected key=value pairs, got {pair!r}")
        if key in out:
            raise SettingsError(f"{SETTINGS_OPTION}: {key!r} is set twice")
        out[key] = parse_value(value)
    return out
