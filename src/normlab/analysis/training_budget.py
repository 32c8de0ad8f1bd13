"""How long the runs of a compare folder trained, in tokens per parameter, and whether that is
early training: the ``budget`` record of the analysis (the top-level summary.json).

Compute-optimal training (Hoffmann et al. 2022, "Training Compute-Optimal Large Language
Models") gives a model about :data:`COMPUTE_OPTIMAL_TOKENS_PER_PARAM` tokens per parameter.
A comparison whose runs saw far fewer, below :data:`EARLY_TRAINING_TOKENS_PER_PARAM`, compares
how fast the models start, not where they end: its verdict is flagged as early training.

The tokens per parameter are the grid's plan (``experiment.json``): a budget of tokens per
parameter's X with its N (``budget``), else the runs' tokens over the baseline arm's parameter
count (``fixed``'s ``train.tokens``, ``parameter_counts``); a folder without them (a script's,
an import) takes the median ``tokens_per_param`` of the baseline arm's finished runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from normlab.analysis.runs import CompareFolder
from normlab.run_format import FINISHED
from normlab.run_format.budget import (
    ALL_PARAMS,
    BUDGET_KEY,
    TOKENS_PER_PARAM_FIELD,
    fmt_tokens_per_param,
)

__all__ = [
    "COMPUTE_OPTIMAL_TOKENS_PER_PARAM",
    "EARLY_TRAINING_TOKENS_PER_PARAM",
    "budget_lines",
    "budget_record",
    "early_note",
    "experiment_budget",
    "planned_budget",
]

COMPUTE_OPTIMAL_TOKENS_PER_PARAM = 20.0
"""About the tokens per parameter of compute-optimal training (Hoffmann et al. 2022: for a
given compute, model size and tokens grow together at about 20 tokens per parameter)."""
EARLY_TRAINING_TOKENS_PER_PARAM = 5.0
"""Below this many tokens per parameter a comparison is early training: a quarter of the
compute-optimal budget, where the loss still falls fast (the default GPT at 2.9 still loses
about 0.1 bpb per 100 steps when it stops), so the verdict says which model starts faster, not
which ends better."""


def experiment_budget(experiment: Mapping[str, Any]) -> dict[str, Any] | None:
    """The planned budget of a compare folder's ``experiment`` (its experiment.json): its
    ``budget`` (given), else its fixed ``train.tokens`` over the baseline arm's parameter
    count; None without them."""
    given = experiment.get(BUDGET_KEY)
    if isinstance(given, Mapping) and given.get("n_params"):
        keys = ("tokens_per_param", "n_params", "param_count", "tokens", "steps")
        return {"given": True, **{k: given.get(k) for k in keys}}
    fixed = experiment.get("fixed") or {}
    counts = experiment.get("parameter_counts") or {}
    baseline = experiment.get("baseline_arm") or next(iter(experiment.get("arms") or []), None)
    base = counts.get(baseline) if isinstance(counts, Mapping) else None
    tokens = fixed.get("train.tokens") if isinstance(fixed, Mapping) else None
    n = base.get("n_params") if isinstance(base, Mapping) else None
    if not tokens or not n:
        return None
    return {
        "given": False,
        "tokens_per_param": float(tokens) / float(n),
        "n_params": int(n),
        "param_count": ALL_PARAMS,
        "tokens": int(tokens),
        "steps": fixed.get("train.steps"),
    }


def _from_runs(folder: CompareFolder) -> dict[str, Any] | None:
    """The median ``tokens_per_param`` of the baseline arm's finished runs, None without."""
    values = [
        float(v)
        for r in folder.runs_of(folder.baseline_arm)
        if r.status == FINISHED and (v := r.summary.get(TOKENS_PER_PARAM_FIELD)) is not None
    ]
    if not values:
        return None
    return {
        "given": False,
        "tokens_per_param": statistics.median(values),
        "n_params": None,
        "param_count": ALL_PARAMS,
        "tokens": None,
        "steps": None,
    }


def planned_budget(folder: CompareFolder) -> dict[str, Any] | None:
    """How long ``folder``'s runs trained (module docstring): {``given``, ``tokens_per_param``,
    ``n_params``, ``param_count``, ``tokens``, ``steps``}, None where nothing says."""
    return experiment_budget(folder.experiment) or _from_runs(folder)


def budget_record(folder: CompareFolder) -> dict[str, Any]:
    """The analysis's ``budget``: ``given`` (a budget of tokens per parameter was given),
    ``tokens_per_param``, ``n_params`` (N), ``param_count``, ``tokens`` and ``steps`` per run
    (null where unknown), ``compute_optimal`` and ``early_below`` (the two thresholds),
    ``early_training`` (tokens per parameter below ``early_below``) and ``note``
    (:func:`early_note`, null unless early)."""
    record: dict[str, Any] = planned_budget(folder) or {
        "given": False,
        "tokens_per_param": None,
        "n_params": None,
        "param_count": None,
        "tokens": None,
        "steps": None,
    }
    x = record["tokens_per_param"]
    early = x is not None and x < EARLY_TRAINING_TOKENS_PER_PARAM
    return {
        **record,
        "compute_optimal": COMPUTE_OPTIMAL_TOKENS_PER_PARAM,
        "early_below": EARLY_TRAINING_TOKENS_PER_PARAM,
        "early_training": early,
        "note": early_note(x) if early else None,
    }


def early_note(tokens_per_param: float) -> str:
    """The sentence of an early-training verdict: ``early training: 2.9 tokens per parameter,
    far below the ~20 of compute-optimal training; this verdict is about how fast the models
    start``."""
    return (
        f"early training: {fmt_tokens_per_param(tokens_per_param)} tokens per parameter, far "
        f"below the ~{COMPUTE_OPTIMAL_TOKENS_PER_PARAM:g} of compute-optimal training; this "
        "verdict is about how fast the models start"
    )


def budget_lines(a: Mapping[str, Any]) -> list[str]:
    """The terminal's line of the analysis ``a``'s ``budget``: its note when the runs are early
    training, else nothing (an analysis written without the record says nothing)."""
    note = (a.get(BUDGET_KEY) or {}).get("note")
    return [f"Note: {note}."] if note else []
