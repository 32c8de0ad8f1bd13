"""The per-run metrics the analysis compares, with their units, direction and scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

from normlab.analysis.runs import DONE_STATUSES

__all__ = ["METRICS", "MetricSpec", "metric_spec"]


@dataclass(frozen=True)
class MetricSpec:
    """How one summary field is compared across arms.

    ``scale`` is ``"difference"`` (paired differences x − y) or ``"ratio"`` (paired log ratios
    ln(x / y), reported as a ratio). ``margin_factor`` converts the experiment's equivalence
    margin in bits per byte into this metric's unit (1 for bpb, ln 2 for nats per byte), or is
    None when no equivalence margin applies. ``statuses`` are the run statuses whose value counts.
    ``discrete`` marks small integer counts, decided by the exact sign test rather than the
    t-test. ``censored`` marks a metric whose null in a finished run means "not reached within
    the run" (a time to target), not "missing": such a run was slower than one that reached it.
    """

    name: str
    label: str
    unit: str
    lower_is_better: bool
    scale: str = "difference"
    margin_factor: float | None = None
    statuses: tuple[str, ...] = ("finished",)
    discrete: bool = False
    censored: bool = False


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("final_val_bpb", "final validation bpb", "bits per byte", True, margin_factor=1.0),
    MetricSpec("best_val_bpb", "best validation bpb", "bits per byte", True, margin_factor=1.0),
    MetricSpec(
        "final_train_loss",
        "final training loss",
        "nats per byte",
        True,
        margin_factor=math.log(2.0),
    ),
    MetricSpec("tokens_per_s", "throughput", "tokens/s", False, scale="ratio"),
    MetricSpec("peak_memory_bytes", "peak memory", "bytes", True, scale="ratio"),
    MetricSpec(
        "n_loss_spikes", "loss spikes", "count", True, statuses=DONE_STATUSES, discrete=True
    ),
    MetricSpec(
        "n_grad_spikes", "gradient spikes", "count", True, statuses=DONE_STATUSES, discrete=True
    ),
    MetricSpec("time_to_target_s", "time to target loss", "s", True, scale="ratio", censored=True),
)
"""Quality metrics count finished runs only (a diverged run's last numbers describe a truncated
run; its divergence is judged under stability). Spike counts also count diverged runs."""

_BY_NAME = {m.name: m for m in METRICS}


def metric_spec(name: str) -> MetricSpec:
    """The :class:`MetricSpec` called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"metric must be one of {sorted(_BY_NAME)}, got {name!r}") from None
