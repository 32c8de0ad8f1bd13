"""What a run's files hold for each testbed: its validation fields and their units, its quality
metric, its equivalence margin, and the words the report uses for them.

The GPT testbed is judged on validation bits per byte, the DiT testbed on the validation
flow-matching loss (mean squared error of the predicted velocity). A folder or run config that
names no testbed is a GPT one (written before the DiT testbed existed).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from normlab.run_format.fields import (
    AVERAGED_PREFIX,
    BRANCHES,
    FULL_VAL_PREFIX,
    GROUPS,
    HEAD_FIELDS,
    MARGIN,
    QUALITY_UNIT,
    TAIL_FIELDS,
    Display,
    MetricSpec,
    Smallest,
    SummaryField,
    compared_field,
)

__all__ = [
    "DEFAULT_TESTBED",
    "DIT",
    "FLOW_UNIT",
    "GPT",
    "LM",
    "SCRIPT_TESTBED",
    "SW2_UNIT",
    "TESTBED_FORMATS",
    "TestbedFormat",
    "parse_script_testbed",
    "script_format",
    "script_testbed",
    "testbed_format",
]

DEFAULT_TESTBED = "gpt"
"""The testbed of a folder or run config that names none."""

FLOW_UNIT = "MSE"
"""The unit of the DiT's losses: the mean squared error of the predicted velocity v̂ against
x1 − x0, per element, on images scaled to [−1, 1]."""

SW2_UNIT = "pixel units"
"""The unit of ``final_sample_sw2``: a distance between images whose pixels lie in [−1, 1]."""

_LOSS = Display(digits=4)


@dataclass(frozen=True)
class TestbedFormat:
    """What the files of one testbed's runs hold, and how the analysis and report name it.

    ``validation`` are the validation fields of its run summaries, in order (between
    :data:`~normlab.run_format.fields.HEAD_FIELDS` and
    :data:`~normlab.run_format.fields.TAIL_FIELDS`). ``quality`` names the metric that decides
    quality (``best`` its best-seen variant); ``curve`` the field of the ``eval`` records in
    ``metrics.jsonl`` that the validation plot draws (also that plot's name). The equivalence
    margin, in the quality metric's unit, is ``experiment.json``'s ``margin_key``
    (``margin_default`` when absent). ``settings`` is the section of ``run.json`` that holds
    the testbed's own settings (None: none). Units: ``unit`` is the quality metric's unit
    spelled out ("bits per byte"), ``short_unit`` suffixes its numbers ("bpb"), ``train_unit``
    is the training loss's unit and ``train_per_quality`` converts the margin into it (ln 2:
    bits to nats; None: no fixed factor, the training loss is then compared without a margin).
    Words: ``quality_name`` names the quality metric in sentences ("validation bpb"),
    ``short_label`` in table headers ("final val bpb"), ``curve_word`` in plot titles
    ("bpb"), ``curve_title`` titles the validation plot; ``run_columns`` are the validation
    fields the report's run table shows after the quality metric, with their headers;
    ``method_note`` is a paragraph for the report's method section ("" for none).
    ``optional``: fields a run's summary holds only when the run sets the option that makes
    them (``train.full_val``, ``train.average_last``, ``train.branches``), after every field of
    :attr:`fields`, in this order; declared with their label and unit
    (:attr:`optional_metrics`) but never part of :attr:`fields`, so a run without them, its
    crashed summary and the analysis are what they were before they existed.
    ``run_line`` names the quality metric in the line the grid prints as each run ends, with
    the decimals of its value there (("val bpb", 3): "finished val bpb 2.549").
    """

    name: str
    validation: tuple[SummaryField, ...]
    quality: str
    best: str
    curve: str
    margin_key: str
    margin_default: float
    unit: str
    short_unit: str
    train_unit: str
    train_per_quality: float | None
    quality_name: str
    short_label: str
    curve_word: str
    curve_title: str
    settings: str | None = None
    run_columns: tuple[tuple[str, str], ...] = ()
    method_note: str = ""
    optional: tuple[SummaryField, ...] = ()
    run_line: tuple[str, int] = ("val loss", 4)

    @cached_property
    def fields(self) -> tuple[SummaryField, ...]:
        """Every field of a run summary of this testbed, in summary.json's order."""
        return (*HEAD_FIELDS, *self.validation, *TAIL_FIELDS)

    @cached_property
    def validation_fields(self) -> tuple[str, ...]:
        """The names of :attr:`validation`: the testbed's own fields of a run summary."""
        return tuple(f.name for f in self.validation)

    @cached_property
    def summary_fields(self) -> tuple[str, ...]:
        """The names of :attr:`fields`: a summary.json of this testbed, in order."""
        return tuple(f.name for f in self.fields)

    @cached_property
    def optional_fields(self) -> tuple[str, ...]:
        """The names of :attr:`optional`, in summary.json's order."""
        return tuple(f.name for f in self.optional)

    @cached_property
    def metrics(self) -> tuple[MetricSpec, ...]:
        """The compared fields, grouped in the order of
        :data:`~normlab.run_format.fields.GROUPS` (summary order within a group), with the
        testbed's units and margin factors filled in."""
        return self._metric_specs(self.fields)

    @cached_property
    def optional_metrics(self) -> tuple[MetricSpec, ...]:
        """:attr:`metrics` of the :attr:`optional` fields that have a comparison."""
        return self._metric_specs(self.optional)

    def _metric_specs(self, fields: tuple[SummaryField, ...]) -> tuple[MetricSpec, ...]:
        compared = [f for f in fields if f.compare is not None]
        compared.sort(key=lambda f: GROUPS.index(f.compare.group))  # type: ignore[union-attr]
        units = {"quality": self.unit, "train": self.train_unit}
        factors = {None: None, "quality": 1.0, "train": self.train_per_quality}
        return tuple(
            MetricSpec(
                name=f.name,
                label=c.label,
                unit=c.unit.format_map(units),
                lower_is_better=c.lower_is_better,
                scale=c.scale,
                margin_factor=factors[c.margin],
                statuses=c.statuses,
                discrete=c.discrete,
                censored=c.censored,
            )
            for f in compared
            for c in (f.compare,)
            if c is not None
        )

    @property
    def quality_label(self) -> str:
        """The quality metric's label ("final validation bpb")."""
        return self.metric(self.quality).label

    def metric(self, name: str) -> MetricSpec:
        """The :class:`~normlab.run_format.fields.MetricSpec` called ``name`` among this
        testbed's metrics."""
        for m in self.metrics:
            if m.name == name:
                return m
        names = sorted(m.name for m in self.metrics)
        raise ValueError(f"metric must be one of {names}, got {name!r}")

    def field(self, name: str) -> SummaryField:
        """The summary field called ``name``."""
        for f in self.fields:
            if f.name == name:
                return f
        raise ValueError(f"field must be one of {list(self.summary_fields)}, got {name!r}")

    def display(self, name: str) -> Display:
        """How the report prints the field ``name``."""
        display = self.field(name).display
        if display is None:
            raise ValueError(f"field {name!r} has no display format")
        return display


def _bpb_options() -> tuple[SummaryField, ...]:
    """The optional fields of a testbed judged on validation bpb: per evaluation variant, its
    ``val_loss`` (shown, not compared, like ``final_val_loss``) and its ``val_bpb`` (compared
    like ``final_val_bpb``), then :data:`~normlab.run_format.fields.BRANCHES`."""
    found: list[SummaryField] = []
    for prefix, what in (
        (FULL_VAL_PREFIX, "on the whole split"),
        (AVERAGED_PREFIX, "of the averaged weights"),
        (AVERAGED_PREFIX + FULL_VAL_PREFIX, "of the averaged weights on the whole split"),
    ):
        found.append(SummaryField(f"{prefix}val_loss", _LOSS))
        found.append(
            compared_field(
                f"{prefix}val_bpb",
                _LOSS,
                label=f"validation bpb {what}",
                unit=QUALITY_UNIT,
                group="quality",
                margin="quality",
                smallest=MARGIN,
            )
        )
    return (*found, BRANCHES)


GPT = TestbedFormat(
    name="gpt",
    validation=(
        SummaryField("final_val_loss", _LOSS),
        compared_field(
            "final_val_bpb",
            _LOSS,
            label="final validation bpb",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
        ),
        compared_field(
            "best_val_bpb",
            _LOSS,
            label="best validation bpb",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
        ),
    ),
    quality="final_val_bpb",
    best="best_val_bpb",
    curve="val_bpb",
    margin_key="margin_bpb",
    margin_default=0.02,
    unit="bits per byte",
    short_unit="bpb",
    train_unit="nats per byte",
    train_per_quality=math.log(2.0),
    quality_name="validation bpb",
    short_label="final val bpb",
    curve_word="bpb",
    curve_title="Validation bits per byte",
    optional=_bpb_options(),
    run_line=("val bpb", 3),
)
"""The byte-level GPT: validation loss in nats per byte (``final_val_loss``, shown, not
compared), bits per byte at the end and at best (compared; the end decides quality)."""

_DIT_SETTINGS = "dit"
"""The section of a DiT ``run.json`` holding ``label_dropout`` and ``cfg_scale``."""

DIT = TestbedFormat(
    name="dit",
    validation=(
        compared_field(
            "final_val_loss",
            _LOSS,
            label="final validation loss",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
        ),
        compared_field(
            "best_val_loss",
            _LOSS,
            label="best validation loss",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
        ),
        compared_field(
            "final_sample_sw2",
            _LOSS,
            label="sample SW2 to validation images",
            unit=SW2_UNIT,
            group="quality",
            smallest=Smallest("relative", 0.05),
            trained_model=True,
        ),
        compared_field(
            "final_sample_class_acc",
            Display(digits=3),
            label="sample class accuracy",
            unit="fraction of samples",
            group="quality",
            lower_is_better=False,
            smallest=Smallest("absolute", 0.02),
            trained_model=True,
        ),
        compared_field(
            "final_sample_fd",
            Display(digits=2),
            label="sample Fréchet distance (classifier features)",
            unit="squared feature units",
            group="quality",
            smallest=Smallest("absolute", 1.0),
            trained_model=True,
        ),
        SummaryField("sample_cfg_scale"),
    ),
    quality="final_val_loss",
    best="best_val_loss",
    curve="val_loss",
    margin_key="margin_val_loss",
    margin_default=0.002,
    unit=FLOW_UNIT,
    short_unit=FLOW_UNIT,
    train_unit=FLOW_UNIT,
    train_per_quality=1.0,
    quality_name="validation loss",
    short_label="final val loss",
    curve_word="loss",
    curve_title="Validation flow-matching loss",
    settings=_DIT_SETTINGS,
    optional=(
        compared_field(
            f"{AVERAGED_PREFIX}val_loss",
            _LOSS,
            label="validation loss of the averaged weights",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
        ),
        BRANCHES,
    ),
    run_line=("val loss", 4),
    run_columns=(
        ("final_sample_sw2", "sample SW2"),
        ("final_sample_class_acc", "sample class acc"),
        ("final_sample_fd", "sample FD"),
    ),
    method_note=(
        "Quality is the flow-matching loss, the mean squared error of the predicted velocity "
        "against x1 − x0 at x_t = (1 − t)·x0 + t·x1, on a fixed set of validation (image, "
        "noise, time) triples that is the same for every arm and seed, so its differences "
        "are paired like the training batches; lower is better. The training loss is the "
        "same quantity on the training batches, where a class-conditional model sees each "
        "label replaced by the null class with probability "
        f"{_DIT_SETTINGS}.label_dropout (label "
        "dropout for classifier-free guidance, the same draws for every arm of a seed); the "
        "validation triples always carry their true labels. Sample quality, shown but not "
        "deciding: at the end of each finished run the model generates one image per "
        "validation image with 32 Euler steps from noises and balanced labels drawn from the "
        "data seed (the same for every arm and seed), following the guided velocity "
        f"v = v_∅ + w·(v_c − v_∅) at w = {_DIT_SETTINGS}.cfg_scale (recorded as "
        "sample_cfg_scale; w = 1 is unguided), and final_sample_sw2 is the sliced "
        "Wasserstein-2 "
        "distance between the generated and the validation images, √(mean over 256 random "
        "unit projections of the mean squared difference of the sorted projected pixel "
        "vectors), in pixel units (pixels in [−1, 1]); lower is better. A small classifier "
        "of the four shapes, trained once and cached (its held-out accuracy is recorded with "
        "it), reads the same images: final_sample_class_acc is the share it assigns to the "
        "label they were generated with (chance 0.25; higher is better) and final_sample_fd "
        "the Fréchet distance between the Gaussian fits of the samples' and the validation "
        "images' classifier features, ‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2(Σ₁Σ₂)^½) (an FID for this "
        "data; lower is better)."
    ),
)
"""The flow-matching DiT: validation flow-matching MSE at the end and at best (the end decides
quality), the sliced Wasserstein-2 distance of its samples (compared paired by seed, without an
equivalence margin: shown, not deciding), and the guidance scale its samples used."""

NORM_SWAP_FIELD = "norm_swap"
"""The summary field of an ``lm`` run holding its arm's record of the model's norm modules
(``run.json``'s field of the same name: source, kind, swapped and held modules)."""

LM = TestbedFormat(
    name="lm",
    validation=(
        SummaryField("final_val_loss", _LOSS),
        *GPT.validation[1:],
        SummaryField(NORM_SWAP_FIELD),
    ),
    quality="final_val_bpb",
    best="best_val_bpb",
    curve="val_bpb",
    margin_key="margin_bpb",
    margin_default=0.02,
    unit="bits per byte",
    short_unit="bpb",
    train_unit="nats per token",
    train_per_quality=None,
    quality_name="validation bpb",
    short_label="final val bpb",
    curve_word="bpb",
    curve_title="Validation bits per byte",
    settings="lm",
    optional=_bpb_options(),
    run_line=("val bpb", 3),
    method_note=(
        "The model is the user's own causal LM (lm.model), built afresh for every arm and seed "
        "with each of its norm modules replaced by the arm's norm; norm modules the arm cannot "
        "replace are held the same in every arm (listed per arm below). Quality is validation "
        "bits per byte for any tokenizer: the cross-entropy summed over the predicted tokens of "
        "fixed validation windows, divided by ln 2 and by the UTF-8 bytes those tokens cover. "
        "final_val_loss is the same cross-entropy per token (nats per token); the training "
        "loss is per token too, so it has no fixed conversion from the bpb margin and is "
        "compared without one."
    ),
)
"""A user's causal LM (``--model``) on tokens of any tokenizer: validation loss in nats per
token (shown, not compared), bits per byte at the end and at best (compared; the end decides
quality), and the arm's record of swapped and held norm modules."""

TESTBED_FORMATS: dict[str, TestbedFormat] = {t.name: t for t in (GPT, DIT, LM)}
"""Every testbed's format, by name."""


def testbed_format(name: object) -> TestbedFormat:
    """The :class:`TestbedFormat` called ``name`` (None: :data:`DEFAULT_TESTBED`, for folders
    and run configs written before the DiT testbed existed); a :func:`script_testbed` name gives
    its :func:`script_format`. Raises ``ValueError`` naming the testbeds for any other name."""
    if name is None:
        return TESTBED_FORMATS[DEFAULT_TESTBED]
    script = parse_script_testbed(name)
    if script is not None:
        return script_format(*script)
    try:
        return TESTBED_FORMATS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(
            f"testbed must be one of {sorted(TESTBED_FORMATS)}, got {name!r}"
        ) from None


SCRIPT_TESTBED = "script"
"""The testbed of runs trained by the user's own script (``compare --script``). Its full name
carries the quality metric and its direction: ``script:<metric>:min`` (lower is better) or
``script:<metric>:max`` (:func:`script_testbed`)."""

_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def script_testbed(metric: str, lower_is_better: bool = True) -> str:
    """The testbed name of script runs judged on the ``eval`` metric ``metric``:
    ``script:<metric>:min`` or ``script:<metric>:max``. ``ValueError`` naming ``metric`` unless
    it is a name (letters, digits, ``_`` and ``.``, not starting with a digit)."""
    if not isinstance(metric, str) or not _METRIC_NAME.match(metric):
        raise ValueError(
            f"metric: expected the name of a metric the script logs with log_eval (letters, "
            f"digits, '_' and '.'), got {metric!r}"
        )
    return f"{SCRIPT_TESTBED}:{metric}:{'min' if lower_is_better else 'max'}"


def parse_script_testbed(name: object) -> tuple[str, bool] | None:
    """(metric, lower_is_better) of a :func:`script_testbed` name, None for any other name."""
    if not isinstance(name, str):
        return None
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != SCRIPT_TESTBED or parts[2] not in ("min", "max"):
        return None
    if not _METRIC_NAME.match(parts[1]):
        return None
    return parts[1], parts[2] == "min"


def script_format(metric: str, lower_is_better: bool = True) -> TestbedFormat:
    """The format of script runs judged on ``metric``: summary fields ``final_<metric>`` (the
    last ``eval`` value; decides quality) and ``best_<metric>`` (the minimum over the ``eval``
    records when lower is better, else the maximum), both compared with the experiment's
    ``margin`` in the metric's own unit."""
    name = script_testbed(metric, lower_is_better)
    return _script_format(name, metric, lower_is_better)


@lru_cache(maxsize=64)
def _script_format(name: str, metric: str, lower_is_better: bool) -> TestbedFormat:
    direction = "lower" if lower_is_better else "higher"
    fields = tuple(
        compared_field(
            f"{which}_{metric}",
            _LOSS,
            label=f"{which} {metric}",
            unit=QUALITY_UNIT,
            group="quality",
            margin="quality",
            smallest=MARGIN,
            lower_is_better=lower_is_better,
        )
        for which in ("final", "best")
    )
    return TestbedFormat(
        name=name,
        validation=fields,
        quality=f"final_{metric}",
        best=f"best_{metric}",
        curve=metric,
        margin_key="margin",
        margin_default=0.0,
        unit=f"{metric} units",
        short_unit=metric,
        train_unit="training-loss units",
        train_per_quality=None,
        quality_name=metric,
        short_label=f"final {metric}",
        curve_word=metric,
        curve_title=f"Validation {metric} (as the script logged it)",
        run_line=(metric, 4),
        method_note=(
            "Every run was trained by the user's own script (compare --script), once per arm and "
            f"seed; quality is the last value of {metric} it logged with log_eval ({direction} "
            "is better). Pairing was checked from each run's fingerprint (digests of the initial "
            "parameters outside the norm modules and of the first batch): a seed whose arms "
            "disagree is refused, not judged. The training loss is the script's own and is "
            "compared without a margin."
        ),
    )
