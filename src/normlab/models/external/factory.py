"""Factory source: ``package.module:factory`` where ``factory(make_norm, **settings)`` builds a
causal LM that maps token ids [B, T] to logits [B, T, V] (or an object with ``.logits``).

``make_norm(dim, eps=None)`` is the arm's norm (:class:`~normlab.models.external.arm.ArmNorm`):
the factory calls it wherever its model has a norm. A factory with a ``vocab_size`` parameter
gets the tokenizer's; any other factory must build V = the tokenizer's vocabulary itself (the
output check says so when it does not).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from normlab.models.external.spec import (
    MODEL_OPTION,
    SETTINGS_OPTION,
    SettingsError,
    UnknownModelError,
)

MAKE_NORM = "make_norm"
VOCAB_SIZE = "vocab_size"


def load_factory(target: str) -> Callable[..., Any]:
    """The callable ``package.module:attribute`` names, checked to take ``make_norm``.

    :class:`UnknownModelError` (``target`` names no model factory there is) naming
    :data:`MODEL_OPTION`: the module cannot be imported, has no such attribute, the attribute is
    not callable, or it takes no ``make_norm`` parameter.
    """
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise UnknownModelError(
            f"{MODEL_OPTION}: cannot import module {module_name!r} ({err})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UnknownModelError(
                f"{MODEL_OPTION}: module {module_name!r} has no attribute {attr!r}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise UnknownModelError(
            f"{MODEL_OPTION}: {target} is a {type(obj).__name__}, not callable; expected a "
            f"factory {attr}({MAKE_NORM}, **settings) returning a causal LM"
        )
    params = _parameters(obj, target)
    if MAKE_NORM not in params:
        taken = ", ".join(params) or "nothing"
        raise UnknownModelError(
            f"{MODEL_OPTION}: {target} takes {taken} but no {MAKE_NORM} parameter; expected "
            f"{attr}({MAKE_NORM}, **settings), where {MAKE_NORM}(dim) builds the arm's norm"
        )
    return obj


def _parameters(fn: Callable[..., Any], target: str) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{MODEL_OPTION}: cannot read the signature of {target} ({err})") from None


def factory_kwargs(
    fn: Callable[..., Any], target: str, settings: dict[str, Any], vocab_size: int
) -> dict[str, Any]:
    """The keyword arguments besides ``make_norm``: ``settings`` (each checked to be a
    parameter of ``fn``, unless it takes ``**kwargs``) and ``vocab_size`` when ``fn`` has that
    parameter. :class:`SettingsError` naming :data:`SETTINGS_OPTION` for a setting it does not
    take."""
    params = _parameters(fn, target)
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in settings:
        if key in (MAKE_NORM, VOCAB_SIZE):
            what = "the arm's norm" if key == MAKE_NORM else "the tokenizer's vocabulary size"
            raise SettingsError(f"{SETTINGS_OPTION}: {key} is not a setting; normlab passes {what}")
        if key not in named and not open_kwargs:
            others = ", ".join(n for n in named if n not in (MAKE_NORM, VOCAB_SIZE)) or "none"
            raise SettingsError(
                f"{SETTINGS_OPTION}: {target} takes no {key!r}; its settings are: {others}"
            )
    kwargs = dict(settings)
    if VOCAB_SIZE in named:
        kwargs[VOCAB_SIZE] = vocab_size
    return kwargs
