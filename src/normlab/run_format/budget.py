"""A training budget of tokens per parameter, as a run records it: defined once.

``train.tokens_per_param`` X (``compare --tokens-per-param``) is the third way to give a run's
length, beside ``train.steps`` and ``train.tokens``: every run of a grid trains

    steps = ⌈X · N / tokens per step⌉,   tokens = steps · tokens per step,

where N (:data:`BUDGET_PARAMS`) is counted once per grid from its baseline arm's model, as
``train.param_count`` says (:data:`PARAM_COUNTS`: every parameter, or all but the
embeddings), so every arm of a grid trains exactly the same tokens (the controlled experiment
fixes them: an arm with more parameters, LayerNorm's bias, buys no more data). X is read as the
decimal it is written as (0.1 is one tenth), so the steps are exact integers
(:func:`budget_steps`).

A run config (``run.json``) holds ``tokens_per_param``, ``param_count`` and
:data:`BUDGET_PARAMS` in its ``train`` section only when a budget was given (so a run without
one is recorded as it always was), and the resolved ``steps`` and ``tokens`` always;
``experiment.json`` holds the grid's :func:`budget_record` under :data:`BUDGET_KEY`. Every
run's summary holds :data:`TOKENS_PER_PARAM_FIELD` (:func:`tokens_per_param`): the tokens it trained
per parameter of the budget's N, or of its own count without a budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from normlab.run_format.fields import TOKENS_PER_PARAM

__all__ = [
    "ALL_PARAMS",
    "BUDGET_KEY",
    "BUDGET_PARAMS",
    "NON_EMBEDDING",
    "PARAM_COUNTS",
    "PARAM_COUNT_WORDS",
    "TOKENS_PER_PARAM_FIELD",
    "budget_record",
    "budget_steps",
    "budget_words",
    "fmt_tokens_per_param",
    "tokens_per_param",
]

ALL_PARAMS = "all"
"""``train.param_count``: every parameter of the model counts (tied weights once)."""
NON_EMBEDDING = "non_embedding"
"""``train.param_count``: every parameter but the embeddings the testbed's model declares
(the token embedding, an untied output embedding, learned positions; the DiT's patch, label
and position embeddings and its output projection)."""
PARAM_COUNTS: tuple[str, ...] = (ALL_PARAMS, NON_EMBEDDING)
"""The values of ``train.param_count``."""
PARAM_COUNT_WORDS: dict[str, str] = {ALL_PARAMS: "all", NON_EMBEDDING: "non-embedding"}
"""How the terminal and the report say which parameters count."""

BUDGET_PARAMS = "budget_params"
"""The ``train`` key of a run config with a budget: N, the baseline arm's parameter count
(as ``param_count`` counts) that the budget's tokens are counted against."""
BUDGET_KEY = "budget"
"""The key of ``experiment.json`` that holds the grid's budget (absent without one)."""

TOKENS_PER_PARAM_FIELD = TOKENS_PER_PARAM.name
"""The summary field of the tokens a run trained per parameter (declared as
:data:`normlab.run_format.fields.TOKENS_PER_PARAM`, a head field after the parameter
counts)."""


def budget_steps(tokens_per_param: float, n_params: int, tokens_per_step: int) -> int:
    """⌈X · N / tokens per step⌉ in exact arithmetic, X = ``tokens_per_param`` read as the
    decimal it is written as (its shortest repr), N = ``n_params``. ValueError naming the
    argument when X or N is not positive, or the tokens per step is not a positive integer."""
    if not (isinstance(tokens_per_param, (int, float)) and math.isfinite(tokens_per_param)):
        raise ValueError(f"tokens_per_param: expected a finite number, got {tokens_per_param!r}")
    if tokens_per_param <= 0:
        raise ValueError(f"tokens_per_param: expected a number > 0, got {tokens_per_param!r}")
    if isinstance(n_params, bool) or not isinstance(n_params, int) or n_params < 1:
        raise ValueError(f"n_params: expected a positive integer, got {n_params!r}")
    if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, int):
        raise ValueError(f"tokens_per_step: expected a positive integer, got {tokens_per_step!r}")
    if tokens_per_step < 1:
        raise ValueError(f"tokens_per_step: expected a positive integer, got {tokens_per_step!r}")
    x = Fraction(repr(float(tokens_per_param)))
    return math.ceil(x * n_params / tokens_per_step)


def budget_record(
    tokens_per_param: float, param_count: str, n_params: int, tokens_per_step: int
) -> dict[str, Any]:
    """``experiment.json``'s :data:`BUDGET_KEY`: ``tokens_per_param`` (X as given),
    ``param_count`` (which parameters count), ``n_params`` (N), ``tokens_per_step``, ``steps``
    (:func:`budget_steps`) and ``tokens`` (steps · tokens per step: X · N rounded up to whole
    steps)."""
    if param_count not in PARAM_COUNTS:
        raise ValueError(
            f"param_count: expected one of {', '.join(PARAM_COUNTS)}, got {param_count!r}"
        )
    steps = budget_steps(tokens_per_param, n_params, tokens_per_step)
    return {
        "tokens_per_param": float(tokens_per_param),
        "param_count": param_count,
        "n_params": int(n_params),
        "tokens_per_step": int(tokens_per_step),
        "steps": steps,
        "tokens": steps * tokens_per_step,
    }


def tokens_per_param(
    tokens: float | None, train: Mapping[str, Any] | None, n_params: float | None
) -> float | None:
    """The summary's :data:`TOKENS_PER_PARAM_FIELD` of a run that trained ``tokens``: tokens / N,
    N = its run config's ``train`` :data:`BUDGET_PARAMS` when a budget was given, else the
    run's own parameter count ``n_params``; None without tokens or a positive N."""
    basis = (train or {}).get(BUDGET_PARAMS) or n_params
    if tokens is None or not basis or basis <= 0:
        return None
    return float(tokens) / float(basis)


def fmt_tokens_per_param(x: float) -> str:
    """Tokens per parameter as the terminal and the report show them: three significant
    digits (``2.87``, ``20``, ``0.6``), whole numbers from 100 on (``1,250``)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def budget_words(x: float, n_params: int, param_count: str) -> str:
    """``2.87 tokens per parameter of the baseline arm's 214,144 parameters, all``: X
    (:func:`fmt_tokens_per_param`) against N counted as ``param_count`` says
    (:data:`PARAM_COUNT_WORDS`)."""
    words = PARAM_COUNT_WORDS.get(param_count, param_count)
    return (
        f"{fmt_tokens_per_param(x)} tokens per parameter of the baseline arm's "
        f"{int(n_params):,} parameters, {words}"
    )
