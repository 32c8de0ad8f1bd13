"""The per-run metrics the analysis compares, with their units, direction and scale, per testbed.

The GPT testbed is judged on validation bits per byte, the DiT testbed on the validation
flow-matching loss (mean squared error of the predicted velocity); :class:`Profile` holds what
the analysis and the report need to know of each: its metrics, its quality metric and the key,
unit and default of its equivalence margin in ``experiment.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from normlab.analysis.runs import DONE_STATUSES, MARGIN_KEYS

__all__ = [
    "DIT_METRICS",
    "METRICS",
    "PROFILES",
    "MetricSpec",
    "Profile",
    "metric_spec",
    "profile_of",
]


@dataclass(frozen=True)
class MetricSpec:
    """How one summary field is compared across arms.

    ``scale`` is ``"difference"`` (paired differences x − y) or ``"ratio"`` (paired log ratios
    ln(x / y), reported as a ratio). ``margin_factor`` converts the experiment's equivalence
    margin (GPT: bits per byte; DiT: validation MSE) into this metric's unit (1 for bpb, ln 2 for
    nats per byte, 1 for the DiT's losses), or is None when no equivalence margin applies.
    ``statuses`` are the run statuses whose value counts.
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


_SHARED_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("tokens_per_s", "throughput", "tokens/s", False, scale="ratio"),
    MetricSpec("peak_memory_bytes", "peak memory", "bytes", True, scale="ratio"),
    MetricSpec(
        "saved_activation_bytes", "activations saved for backward", "bytes", True, scale="ratio"
    ),
    MetricSpec(
        "n_loss_spikes", "loss spikes", "count", True, statuses=DONE_STATUSES, discrete=True
    ),
    MetricSpec(
        "n_grad_spikes", "gradient spikes", "count", True, statuses=DONE_STATUSES, discrete=True
    ),
    MetricSpec("time_to_target_s", "time to target loss", "s", True, scale="ratio", censored=True),
)
"""Speed, memory, spike and time-to-target metrics, the same for every testbed."""


def _posttrain_metrics(unit: str) -> tuple[MetricSpec, ...]:
    """The post-training metrics of :mod:`normlab.experiment.posttrain`, their quality deltas in
    the testbed's quality ``unit``: informative, compared paired like the others, never part of
    the verdict (which reads quality, throughput, memory and stability only)."""
    return (
        MetricSpec("ptq_int8wo_delta", "int8 weight-only PTQ degradation", unit, True),
        MetricSpec("ptq_w8a8_delta", "int8 W8A8 PTQ degradation", unit, True),
        MetricSpec("bf16_eval_delta", "bf16 evaluation degradation", unit, True),
        MetricSpec("act_kurtosis_max", "max Linear-input kurtosis", "Gaussian = 3", True),
        MetricSpec("act_max_over_rms", "max Linear-input max|x| / RMS", "ratio", True),
        MetricSpec(
            "channel_rms_kurtosis_max", "max kurtosis of Linear-input channel RMS", "no unit", True
        ),
        MetricSpec("outlier_channels", "outlier channels (max |x| ≥ 6)", "count", True),
    )


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
    *_SHARED_METRICS,
    *_posttrain_metrics("bits per byte"),
)
"""Quality metrics count finished runs only (a diverged run's last numbers describe a truncated
run; its divergence is judged under stability). Spike counts also count diverged runs. The
post-training metrics (quantization and bf16 degradation in bits per byte, activation outliers)
exist for finished runs only; summaries written before them hold none and are left out."""

FLOW_UNIT = "MSE"
"""The unit of the DiT's losses: the mean squared error of the predicted velocity v̂ against
x1 − x0, per element, on images scaled to [−1, 1]."""

SW2_UNIT = "pixel units"
"""The unit of ``final_sample_sw2``: a distance between images whose pixels lie in [−1, 1]."""

DIT_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("final_val_loss", "final validation loss", FLOW_UNIT, True, margin_factor=1.0),
    MetricSpec("best_val_loss", "best validation loss", FLOW_UNIT, True, margin_factor=1.0),
    MetricSpec("final_sample_sw2", "sample SW2 to validation images", SW2_UNIT, True),
    MetricSpec("final_train_loss", "final training loss", FLOW_UNIT, True, margin_factor=1.0),
    *_SHARED_METRICS,
    *_posttrain_metrics(FLOW_UNIT),
)
"""The DiT testbed's metrics: its flow-matching losses and the sliced Wasserstein-2 distance of
its samples (compared paired by seed, without an equivalence margin: it is shown, the validation
loss decides), then the GPT's speed, memory, spike and time-to-target metrics, then the
post-training metrics with their deltas in the flow-matching MSE."""


@dataclass(frozen=True)
class Profile:
    """What the analysis and the report need to know of a testbed.

    ``quality`` names the metric that decides quality (``best`` its best-seen variant);
    ``curve`` the field of the ``eval`` records in ``metrics.jsonl`` that the validation plot
    draws (also that plot's name). Words: ``quality_name`` names the metric in sentences
    ("validation bpb"), ``short_label`` in table headers ("final val bpb"), ``curve_word`` in
    plot titles ("bpb"), ``curve_title`` titles the validation plot; ``unit`` is the quality
    metric's unit spelled out ("bits per byte"), ``short_unit`` suffixes its numbers ("bpb"),
    ``train_unit`` is the training loss's unit. ``method_note`` is a sentence for the report's
    method section ("" for none). The equivalence margin, in the quality metric's unit, is
    ``experiment.json``'s :attr:`margin_key` (see :data:`normlab.analysis.runs.MARGIN_KEYS`).
    """

    name: str
    metrics: tuple[MetricSpec, ...]
    quality: str
    best: str
    curve: str
    quality_name: str
    short_label: str
    curve_word: str
    curve_title: str
    unit: str
    short_unit: str
    train_unit: str
    method_note: str = ""

    @property
    def margin_key(self) -> str:
        """The key of the equivalence margin in ``experiment.json`` and the analysis."""
        return MARGIN_KEYS[self.name][0]

    @property
    def quality_label(self) -> str:
        """The quality metric's label ("final validation bpb")."""
        return self.metric(self.quality).label

    def metric(self, name: str) -> MetricSpec:
        """The :class:`MetricSpec` called ``name`` among this testbed's metrics."""
        for m in self.metrics:
            if m.name == name:
                return m
        names = sorted(m.name for m in self.metrics)
        raise ValueError(f"metric must be one of {names}, got {name!r}")


PROFILES: dict[str, Profile] = {
    "gpt": Profile(
        name="gpt",
        metrics=METRICS,
        quality="final_val_bpb",
        best="best_val_bpb",
        curve="val_bpb",
        quality_name="validation bpb",
        short_label="final val bpb",
        curve_word="bpb",
        curve_title="Validation bits per byte",
        unit="bits per byte",
        short_unit="bpb",
        train_unit="nats per byte",
    ),
    "dit": Profile(
        name="dit",
        metrics=DIT_METRICS,
        quality="final_val_loss",
        best="best_val_loss",
        curve="val_loss",
        quality_name="validation loss",
        short_label="final val loss",
        curve_word="loss",
        curve_title="Validation flow-matching loss",
        unit=FLOW_UNIT,
        short_unit=FLOW_UNIT,
        train_unit=FLOW_UNIT,
        method_note=(
            "Quality is the flow-matching loss, the mean squared error of the predicted velocity "
            "against x1 − x0 at x_t = (1 − t)·x0 + t·x1, on a fixed set of validation (image, "
            "noise, time) triples that is the same for every arm and seed, so its differences "
            "are paired like the training batches; lower is better. The training loss is the "
            "same quantity on the training batches, where a class-conditional model sees each "
            "label replaced by the null class with probability dit.label_dropout (label "
            "dropout for classifier-free guidance, the same draws for every arm of a seed); the "
            "validation triples always carry their true labels. Sample quality, shown but not "
            "deciding: at the end of each finished run the model generates one image per "
            "validation image with 32 Euler steps from noises and balanced labels drawn from the "
            "data seed (the same for every arm and seed), following the guided velocity "
            "v = v_∅ + w·(v_c − v_∅) at w = dit.cfg_scale (recorded as sample_cfg_scale; "
            "w = 1 is unguided), and final_sample_sw2 is the sliced Wasserstein-2 "
            "distance between the generated and the validation images, √(mean over 256 random "
            "unit projections of the mean squared difference of the sorted projected pixel "
            "vectors), in pixel units (pixels in [−1, 1]); lower is better."
        ),
    ),
}


def profile_of(name: object) -> Profile:
    """The :class:`Profile` called ``name`` (``None``: ``gpt``, for folders written before the
    DiT testbed existed)."""
    if name is None:
        return PROFILES["gpt"]
    try:
        return PROFILES[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"testbed must be one of {sorted(PROFILES)}, got {name!r}") from None


def metric_spec(name: str) -> MetricSpec:
    """The GPT testbed's :class:`MetricSpec` called ``name``."""
    return PROFILES["gpt"].metric(name)
