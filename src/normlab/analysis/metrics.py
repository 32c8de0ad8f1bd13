"""The per-run metrics the analysis compares, per testbed, under the analysis's names.

The metrics, their units, direction and scale are declared once with the summary fields in
:mod:`normlab.run_format` (:mod:`~normlab.run_format.fields` for the shared fields,
:mod:`~normlab.run_format.testbeds` for each testbed's validation fields); this module gives
the analysis and the report their views of them: a testbed's :class:`Profile` (its metrics, its
quality metric and the key, unit and default of its equivalence margin in ``experiment.json``).
"""

from __future__ import annotations

from normlab.run_format import (
    FLOW_UNIT,
    SW2_UNIT,
    TESTBED_FORMATS,
    MetricSpec,
    TestbedFormat,
    testbed_format,
)

__all__ = [
    "DIT_METRICS",
    "FLOW_UNIT",
    "METRICS",
    "PROFILES",
    "SW2_UNIT",
    "MetricSpec",
    "Profile",
    "metric_spec",
    "profile_of",
]

Profile = TestbedFormat
"""What the analysis and the report need to know of a testbed (see
:class:`normlab.run_format.TestbedFormat`)."""

PROFILES: dict[str, Profile] = TESTBED_FORMATS
"""Every testbed's :class:`Profile`, by name."""

profile_of = testbed_format
"""The :class:`Profile` called ``name`` (``None``: ``gpt``, for folders written before the DiT
testbed existed); see :func:`normlab.run_format.testbed_format`."""

METRICS: tuple[MetricSpec, ...] = PROFILES["gpt"].metrics
"""The GPT testbed's metrics: validation bits per byte (final and best) and the training loss,
then throughput, peak memory and saved activations, spike counts, time to target, and the
post-training metrics (quantization and bf16 degradation in bits per byte, activation
outliers). Quality metrics count finished runs only; spike counts also count diverged runs;
summaries written before the post-training fields hold none and are left out of those."""

DIT_METRICS: tuple[MetricSpec, ...] = PROFILES["dit"].metrics
"""The DiT testbed's metrics: its flow-matching losses and the sliced Wasserstein-2 distance of
its samples (compared paired by seed, without an equivalence margin: it is shown, the validation
loss decides), then the GPT's speed, memory, spike and time-to-target metrics, then the
post-training metrics with their deltas in the flow-matching MSE."""


def metric_spec(name: str) -> MetricSpec:
    """The GPT testbed's :class:`MetricSpec` called ``name``."""
    return PROFILES["gpt"].metric(name)
