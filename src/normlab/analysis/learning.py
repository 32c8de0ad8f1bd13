"""Did a run learn? Stalls and failures to learn, read from the training-loss curve.

A diverged run is marked by the trainer; a run that stays finite but never learns (DyT stuck
at the unigram level, Post-LN flat from step 50) is not, and its other numbers — outlier counts,
kurtosis, quantization deltas — then describe a model that does nothing and must not be read as
a property of the norm. With the training losses L_1 … L_T of a finished run (finite values, in
step order), L_0 the median of the first three, L_end the mean of the last 10 % and L_q the mean
of the 10 % window starting at a quarter of the steps:

- ``not learning``: L_end ≥ (1 − min_drop) · L_0 — the loss fell by less than ``min_drop``
  (10 %) of where it started;
- ``stalled``: L_q − L_end < stall_drop · L_q — after the first quarter the loss moved by less
  than ``stall_drop`` (2 %);
- ``reference``: when the loss of a trivial predictor is known (the unigram level, in the
  training loss's unit), L_end ≥ reference − min_drop · (L_0 − reference) also counts as
  ``not learning``: the run got no further than counting symbols;
- otherwise ``learned``; ``unknown`` when fewer than 8 finite losses were recorded.

A converged healthy run is also flat after its first quarter, so a stall alone says nothing:
:func:`arm_failed` calls an arm failed when most of its done runs diverged, did not learn or
stalled, and the baseline's runs did not (the same reading for both is "this task converges
early", not a failure). A run without a curve counts as not failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from normlab._io import read_jsonl
from normlab.analysis.runs import RunResult
from normlab.run_format import TRAIN_RECORD

__all__ = ["FAILED_OUTCOMES", "RunLearning", "arm_failed", "classify_losses", "run_learning"]

FAILED_OUTCOMES = ("diverged", "not learning", "stalled")
"""Run outcomes that count as a failure to learn."""


@dataclass(frozen=True)
class RunLearning:
    """The learning outcome of one run, with the losses it was judged on."""

    outcome: str
    initial: float | None
    quarter: float | None
    final: float | None

    @property
    def failed(self) -> bool:
        """Whether the outcome is one of :data:`FAILED_OUTCOMES`."""
        return self.outcome in FAILED_OUTCOMES


def classify_losses(
    losses: Sequence[float],
    reference: float | None = None,
    min_drop: float = 0.1,
    stall_drop: float = 0.02,
) -> RunLearning:
    """Classify a training-loss curve (rules in the module docstring)."""
    if not (0.0 < min_drop < 1.0 and 0.0 < stall_drop < 1.0):
        raise ValueError(
            f"min_drop and stall_drop must lie in (0, 1), got {min_drop!r}, {stall_drop!r}"
        )
    arr = np.asarray([v for v in losses if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size < 8:
        return RunLearning("unknown", None, None, None)
    w = max(1, arr.size // 10)
    initial = float(np.median(arr[:3]))
    q0 = arr.size // 4
    quarter = float(arr[q0 : q0 + w].mean())
    final = float(arr[-w:].mean())
    outcome = "learned"
    if final >= (1.0 - min_drop) * initial or (
        reference is not None
        and initial > reference
        and final >= reference - min_drop * (initial - reference)
    ):
        outcome = "not learning"
    elif quarter - final < stall_drop * abs(quarter):
        outcome = "stalled"
    return RunLearning(outcome, initial, quarter, final)


def run_learning(run: RunResult, reference: float | None = None) -> RunLearning:
    """The outcome of ``run``: ``diverged`` for a diverged run, else :func:`classify_losses` on
    the ``loss`` of its ``train`` records in ``metrics.jsonl`` (``unknown`` for other statuses
    or a missing file)."""
    if run.status == "diverged":
        return RunLearning("diverged", None, None, None)
    if run.status != "finished" or not run.metrics_path.is_file():
        return RunLearning("unknown", None, None, None)
    try:
        records = [r for r in read_jsonl(run.metrics_path) if r.get("type") == TRAIN_RECORD]
    except (OSError, ValueError):  # a damaged file: the report says so beside the curves
        return RunLearning("unknown", None, None, None)
    records.sort(key=lambda r: r.get("step") if isinstance(r.get("step"), int) else 0)
    losses = [
        float(r["loss"])
        for r in records
        if isinstance(r.get("loss"), (int, float)) and not isinstance(r.get("loss"), bool)
    ]
    return classify_losses(losses, reference)


def _mostly_failed(outcomes: Sequence[RunLearning]) -> bool:
    """More than half of the done runs failed (a run without a curve counts as not failed)."""
    return 2 * sum(o.failed for o in outcomes) > len(outcomes)


def arm_failed(arm: Sequence[RunLearning], baseline: Sequence[RunLearning]) -> bool:
    """Whether most of the arm's done runs failed to learn while the baseline's did not.

    A diverged-or-not-learning majority always fails the arm; a majority that merely
    ``stalled`` fails it only when the baseline's runs mostly did not stall (module docstring).
    """
    if not _mostly_failed(arm):
        return False
    hard = [o for o in arm if o.outcome in ("diverged", "not learning")]
    if 2 * len(hard) > len(arm):
        return True
    return not _mostly_failed(baseline)
