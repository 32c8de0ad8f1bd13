"""The smallest difference that matters, per metric: δ, as the run format declares it.

Each compared field declares its δ in :mod:`normlab.run_format` (``Comparison.smallest``) and
whether it describes what a trained model learned (``Comparison.trained_model``). This module
reads those declarations; :mod:`normlab.analysis.wording` holds the words δ leads to, and
:func:`normlab.analysis.sequential.plan_for` the margin of a sequential plan.
"""

from __future__ import annotations

from dataclasses import replace

from normlab.run_format import TESTBED_FORMATS, Smallest, testbed_format
from normlab.run_format.fields import DEFAULT_SMALLEST

__all__ = ["LEARNED_MODEL_METRICS", "SMALLEST", "Smallest", "smallest_for"]


def _declared() -> tuple[dict[str, Smallest], tuple[str, ...]]:
    """δ and the trained-model flag of every compared field, as the run format declares them
    (each testbed's fields; a field both testbeds share is declared once, in
    :mod:`normlab.run_format.fields`)."""
    smallest: dict[str, Smallest] = {}
    learned: list[str] = []
    for fmt in TESTBED_FORMATS.values():
        for f in fmt.fields:
            if f.compare is None:
                continue
            if f.compare.smallest is not None:
                smallest.setdefault(f.name, f.compare.smallest)
            if f.compare.trained_model and f.name not in learned:
                learned.append(f.name)
    return smallest, tuple(learned)


SMALLEST, LEARNED_MODEL_METRICS = _declared()
"""δ per metric, and the metrics that describe what a trained model learned (quantization and
bf16 degradation, activation outliers: not comparable when either arm failed to learn), read
from the field declarations (:class:`normlab.run_format.Comparison`'s ``smallest`` and
``trained_model``): 2 % of throughput, 1 % of memory or bytes, 5 % of time and sample distance,
10 % of the activation-shape statistics, one outlier channel, half a spike per run, and the
experiment's margin for the quality metrics and quantization deltas (converted to nats, × ln 2,
for the GPT's training loss). Losses, speed, memory, spikes and time to target stay comparable
when an arm fails to learn: a failed arm's loss is worse, its speed is still its speed."""


def smallest_for(metric: str, testbed: str = "gpt") -> Smallest:
    """δ of ``metric`` as ``testbed`` declares it (a relative 5 % for a metric that declares
    none), with a training-loss margin converted by the testbed's ``train_per_quality`` (a
    relative 5 % where the testbed has no fixed conversion: the lm testbed's nats per token)."""
    fmt = testbed_format(testbed)
    spec = next(
        (f.compare.smallest for f in fmt.fields if f.name == metric and f.compare is not None),
        None,
    )
    spec = spec or SMALLEST.get(metric) or DEFAULT_SMALLEST
    if spec.in_train_unit:
        if fmt.train_per_quality is None:
            return Smallest("relative", 0.05)
        return replace(spec, margin_factor=fmt.train_per_quality)
    return spec
