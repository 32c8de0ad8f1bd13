"""A run's ``summary.json``: built by one function, written by this module alone.

:func:`build_summary` makes every run's summary, whoever trained it (normlab's own loop, a
user's script through :mod:`normlab.track`, a tracker's run being imported) and however it
ended: the fields of its testbed's format in summary.json's order
(:attr:`~normlab.run_format.testbeds.TestbedFormat.summary_fields`, null until given), then

1. the identity (:data:`IDENTITY`) from the run's config,
2. the status,
3. what the caller measured,
4. the quality fields from the ``eval`` values the run logged, by the one rule of
   :func:`logged_quality` (``final_<m>`` the last value, ``best_<m>`` the best finite one),
5. any field the caller adds last.

A field the format does not declare follows the declared ones, in the order given.
:func:`crashed_summary` is the summary of a run that left none of its own.

The writers are the only callers of :func:`normlab.run_format.folder.write_summary`:
:func:`finish_run` writes the summary a run built, :func:`record_crash` builds a crashed one and
writes it. Every module that ends a run calls them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from normlab.run_format.budget import TOKENS_PER_PARAM_FIELD, tokens_per_param
from normlab.run_format.fields import CRASHED, FACTORS
from normlab.run_format.folder import write_summary
from normlab.run_format.testbeds import DEFAULT_TESTBED, TestbedFormat, testbed_format

__all__ = [
    "IDENTITY",
    "best_value",
    "build_summary",
    "crashed_summary",
    "finish_run",
    "logged_quality",
    "record_crash",
]

IDENTITY: tuple[str, ...] = ("run_id", "arm", "seed", *FACTORS)
"""The fields a summary takes from the run's config (``run.json``): ``run_id``, ``arm``,
``seed`` and the arm's factors."""


def best_value(values: Sequence[float], lower_is_better: bool = True) -> float | None:
    """The best of the finite ``values``: their minimum, or their maximum when higher is
    better; None when none is finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return min(finite) if lower_is_better else max(finite)


def logged_quality(
    evals: Mapping[str, Sequence[float]], fmt: TestbedFormat | None
) -> dict[str, Any]:
    """The summary fields of the ``eval`` values a run logged, ``evals`` ({metric: values in
    the order logged}): ``final_<m>`` = the last value of every metric ``m`` (a non-finite one
    kept: summary.json writes it as null), and, for the metric ``m`` that ``fmt`` judges (its
    ``curve``), ``best_<m>`` (``fmt.best``) = :func:`best_value` in the direction of ``fmt``'s
    metric. A metric logged with no value gives nothing; without ``fmt`` none is judged."""
    fields: dict[str, Any] = {}
    for metric, values in evals.items():
        if values:
            fields[f"final_{metric}"] = values[-1]
    if fmt is not None and evals.get(fmt.curve):
        fields[fmt.best] = best_value(evals[fmt.curve], fmt.metric(fmt.best).lower_is_better)
    return fields


def build_summary(
    fmt: TestbedFormat | None,
    spec: Mapping[str, Any],
    status: str,
    measured: Mapping[str, Any] | None = None,
    *,
    logged: Mapping[str, Sequence[float]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of the run ``spec`` (its ``run.json``, or what stands for it) that ended
    with ``status``: every field of ``fmt`` in order, null until set (no field is declared
    without ``fmt``: a standalone script's run names no testbed), then :data:`IDENTITY` from
    ``spec`` (null where absent), ``status``, the ``measured`` fields, the fields of the
    ``eval`` values ``logged`` (:func:`logged_quality`) and the ``extra`` fields, each step
    overriding the ones before; last, unless given, ``tokens_per_param`` from the summary's
    ``tokens`` and ``n_params`` and the run config's budget
    (:func:`normlab.run_format.budget.tokens_per_param`). Fields outside ``fmt`` keep the
    order in which they are set."""
    summary: dict[str, Any] = dict.fromkeys(fmt.summary_fields) if fmt is not None else {}
    for key in IDENTITY:
        summary[key] = spec.get(key)
    summary["status"] = status
    summary.update(measured or {})
    if logged is not None:
        summary.update(logged_quality(logged, fmt))
    summary.update(extra or {})
    if summary.get(TOKENS_PER_PARAM_FIELD) is None:
        tokens, n_params = summary.get("tokens"), summary.get("n_params")
        per_param = tokens_per_param(tokens, spec.get("train"), n_params)
        if per_param is not None or TOKENS_PER_PARAM_FIELD in summary:
            summary[TOKENS_PER_PARAM_FIELD] = per_param
    return summary


def crashed_summary(spec: Mapping[str, Any], error: str, trace: str) -> dict[str, Any]:
    """The summary of a run that left none of its own (status ``crashed``): identity, the
    parameter counts, device, threads, data fingerprint and target from ``spec``, metrics
    null, then ``error`` and ``traceback``. A ``spec`` naming an unknown testbed gets the
    default testbed's fields."""
    try:
        fmt = testbed_format(spec.get("testbed"))
    except ValueError:  # a run.json naming an unknown testbed still gets a crashed summary
        fmt = testbed_format(DEFAULT_TESTBED)
    measured = {
        "n_params": spec.get("n_params"),
        "n_norm_params": spec.get("n_norm_params"),
        "device": spec.get("device"),
        "threads": spec.get("threads"),
        "data_fingerprint": spec.get("data", {}).get("fingerprint"),
        "target_val_loss": spec.get("train", {}).get("target_val_loss"),
        "error": error,
        "traceback": trace,
    }
    return build_summary(fmt, spec, CRASHED, measured)


def finish_run(run: Path | str, summary: dict[str, Any]) -> dict[str, Any]:
    """Write ``summary`` (built by :func:`build_summary`) as the run folder's ``summary.json``,
    atomically, and return it: the run is done, whatever its status."""
    write_summary(run, summary)
    return summary


def record_crash(
    run: Path | str, spec: Mapping[str, Any], error: str, trace: str
) -> dict[str, Any]:
    """Write the :func:`crashed_summary` of ``spec`` (``error``, ``trace``) as the run folder's
    ``summary.json`` and return it."""
    return finish_run(run, crashed_summary(spec, error, trace))
