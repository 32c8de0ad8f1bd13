"""Per-step curves from each run's ``metrics.jsonl``, and their bands over seeds."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._io import read_jsonl
from normlab.analysis.runs import RunResult
from normlab.run_format import ANOMALY_RECORD, EVAL_RECORD, TRAIN_RECORD

__all__ = ["Band", "RunCurves", "band_over_seeds", "load_run_curves", "moving_average"]


def _num(v: Any) -> float:
    """A JSON number as float; null, booleans, non-numbers and non-finite numbers (``Infinity``,
    which Python's JSON reader accepts) become NaN."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    v = float(v)
    return v if math.isfinite(v) else math.nan


@dataclass(frozen=True)
class RunCurves:
    """The per-step series of one run (NaN where a value was null or non-finite)."""

    run: RunResult
    train_steps: np.ndarray
    train_loss: np.ndarray
    grad_norm: np.ndarray
    eval_steps: np.ndarray
    val_bpb: np.ndarray
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    val_loss: np.ndarray = field(default_factory=lambda: np.array([]))
    """The ``val_loss`` of each eval record (GPT: nats per byte; DiT: the flow-matching MSE)."""
    problem: str | None = None
    """Why the run has no curves (no metrics.jsonl, a damaged one, no training records);
    None when it has them."""
    eval_series: dict[str, np.ndarray] = field(default_factory=dict)
    """Every field of the eval records but ``type`` and ``step``, by name, one value per eval
    step (NaN where a record lacks it or it is not a number): ``val_bpb``, ``val_loss``, and
    whatever a script or a tracker logged (``acc``, …)."""

    def eval_values(self, name: str) -> np.ndarray:
        """The eval records' ``name`` at each of :attr:`eval_steps` (all NaN when none has it)."""
        return self.eval_series.get(name, np.full(self.eval_steps.shape, math.nan))

    def value_at(self, step: int, series: str) -> float:
        """``series`` ("train_loss" or "grad_norm") at ``step``, or NaN."""
        idx = np.flatnonzero(self.train_steps == step)
        return float(getattr(self, series)[idx[0]]) if idx.size else math.nan

    def last_finite_step(self) -> tuple[int, float] | None:
        """The last step with a finite training loss and that loss (where a divergence shows)."""
        ok = np.flatnonzero(np.isfinite(self.train_loss))
        return (int(self.train_steps[ok[-1]]), float(self.train_loss[ok[-1]])) if ok.size else None


_EVAL_KEYS = ("type", "step")
"""Fields of an eval record that are not in :attr:`RunCurves.eval_series`."""


def load_run_curves(run: RunResult) -> RunCurves:
    """Read ``train``, ``eval`` and ``anomaly`` records of ``run``. A missing, unreadable or
    damaged metrics.jsonl gives empty curves whose :attr:`RunCurves.problem` says why (the
    report names the run and leaves its curves out, the rest of the report stands)."""
    problem = None
    try:
        records = read_jsonl(run.metrics_path)
    except FileNotFoundError:
        records, problem = [], f"it has no {run.metrics_path.name}"
    except (OSError, ValueError) as err:
        records, problem = [], f"its curves are left out: {err}"

    def of_type(kind: str) -> list[dict[str, Any]]:
        return [r for r in records if r.get("type") == kind and _num(r.get("step")) == r["step"]]

    train, evals = of_type(TRAIN_RECORD), of_type(EVAL_RECORD)
    if problem is None and not train:
        problem = f"its {run.metrics_path.name} holds no training records"
    train.sort(key=lambda r: r["step"])
    evals.sort(key=lambda r: r["step"])
    return RunCurves(
        run=run,
        train_steps=np.array([int(r["step"]) for r in train], dtype=np.int64),
        train_loss=np.array([_num(r.get("loss")) for r in train]),
        grad_norm=np.array([_num(r.get("grad_norm")) for r in train]),
        eval_steps=np.array([int(r["step"]) for r in evals], dtype=np.int64),
        val_bpb=np.array([_num(r.get("val_bpb")) for r in evals]),
        anomalies=[r for r in records if r.get("type") == ANOMALY_RECORD],
        val_loss=np.array([_num(r.get("val_loss")) for r in evals]),
        problem=problem,
        eval_series={
            name: np.array([_num(r.get(name)) for r in evals])
            for name in dict.fromkeys(k for r in evals for k in r)
            if name not in _EVAL_KEYS
        },
    )


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` points, ignoring NaN (window 1: unchanged).

    out_i = mean of the finite values among values[i − h .. i + h], h = window // 2 (clipped at
    the ends). The output has the length of ``values`` even when the series is shorter than the
    window (a run that diverged early).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if window == 1 or values.size == 0:
        return values.astype(np.float64, copy=True)
    finite = np.isfinite(values)
    filled = np.where(finite, values, 0.0)
    h = window // 2
    kernel = np.ones(2 * h + 1)
    # "full" then the centre slice: "same" would return max(len(values), len(kernel)) points
    sums = np.convolve(filled, kernel, mode="full")[h : h + values.size]
    counts = np.convolve(finite.astype(np.float64), kernel, mode="full")[h : h + values.size]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums / counts
    out[~finite] = np.nan  # a non-finite step stays visible as a gap
    return out


@dataclass(frozen=True)
class Band:
    """Mean, minimum and maximum over seeds at each step, and how many seeds had a value."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    count: np.ndarray


def band_over_seeds(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> Band:
    """Combine (steps, values) series of several seeds on the union of their steps.

    Steps where no seed has a finite value are dropped; a seed that stopped early (diverged)
    simply stops contributing, and ``count`` records how many seeds remain.
    """
    if not series:
        empty = np.array([])
        return Band(empty.astype(np.int64), empty, empty, empty, empty.astype(np.int64))
    steps = np.unique(np.concatenate([s for s, _ in series]))
    grid = np.full((len(series), steps.size), np.nan)
    for i, (s, v) in enumerate(series):
        grid[i, np.searchsorted(steps, s)] = v
    count = np.isfinite(grid).sum(axis=0)
    keep = count > 0
    grid = grid[:, keep]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Band(
            steps=steps[keep],
            mean=np.nanmean(grid, axis=0),
            low=np.nanmin(grid, axis=0),
            high=np.nanmax(grid, axis=0),
            count=count[keep],
        )
