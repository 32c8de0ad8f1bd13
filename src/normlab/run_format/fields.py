"""The fields of a run's ``summary.json``: names, order, statuses, how each is shown and compared.

Every field is declared once, as a :class:`SummaryField`, in summary.json's order. A field the
analysis compares across arms carries a :class:`Comparison` (its label, unit, direction, scale,
which statuses count); a field the report prints carries a :class:`Display` (divisor, decimals,
unit suffix). The summary's field lists, the analysis's metric tables, the report's columns and
``runs.csv`` are all derived from these declarations (the per-testbed validation fields are in
:mod:`normlab.run_format.testbeds`).

Adding a metric: declare it here (or among a testbed's validation fields), and write it in the
training code that computes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "AVERAGED_PREFIX",
    "BRANCHES",
    "BRANCHES_FIELD",
    "CRASHED",
    "CRASH_FIELDS",
    "DIVERGED",
    "DONE_STATUSES",
    "FACTORS",
    "FINAL_PREFIX",
    "FINISHED",
    "FULL_VAL_PREFIX",
    "GROUPS",
    "HEAD_FIELDS",
    "MARGIN",
    "POSTTRAIN",
    "POSTTRAIN_FIELDS",
    "QUALITY_UNIT",
    "RUN_STATUSES",
    "TAIL_FIELDS",
    "TOKENS_PER_PARAM",
    "TRAIN_MARGIN",
    "TRAIN_UNIT",
    "UNFINISHED",
    "Comparison",
    "Display",
    "MetricSpec",
    "Smallest",
    "SummaryField",
    "compared_field",
    "prefixed",
]

FINISHED = "finished"
"""The run trained every step."""
DIVERGED = "diverged"
"""A result: training stopped on a non-finite loss or gradient."""
CRASHED = "crashed"
"""An error; the summary's :data:`CRASH_FIELDS` hold it."""
UNFINISHED = "unfinished"
"""Never written: what a reader calls a run folder without a summary (still training, or
killed)."""
DONE_STATUSES: tuple[str, ...] = (FINISHED, DIVERGED)
"""Statuses of runs that produced a result (a diverged run is a result: it was unstable); a
re-run skips them."""
RUN_STATUSES: tuple[str, ...] = (FINISHED, DIVERGED, CRASHED)
"""Every status a summary.json may hold."""

QUALITY_UNIT = "{quality}"
"""A :class:`Comparison` unit that stands for the testbed's quality unit (GPT: bits per byte,
DiT: the flow-matching MSE)."""
TRAIN_UNIT = "{train}"
"""A :class:`Comparison` unit that stands for the testbed's training-loss unit."""

GROUPS: tuple[str, ...] = ("quality", "cost", "stability", "convergence", "post-training")
"""What a compared field measures; the analysis lists the metrics group by group in this
order, in summary order within a group."""


@dataclass(frozen=True)
class Display:
    """How the report prints a number: ``value / divisor`` with ``digits`` decimals, then
    ``suffix`` (e.g. ``" MiB"``) where a unit is wanted."""

    divisor: float = 1.0
    digits: int = 4
    suffix: str = ""

    def format(self, value: float | None, unit: bool = True) -> str:
        """``value`` as text, ``suffix`` included when ``unit``; an em dash when missing (and
        in place of the number when it is not finite)."""
        if value is None:
            return "—"
        scaled = value / self.divisor
        number = f"{scaled:.{self.digits}f}" if math.isfinite(scaled) else "—"
        return f"{number}{self.suffix if unit else ''}"


@dataclass(frozen=True)
class Smallest:
    """The smallest difference of a compared field that matters, δ: ``relative`` (a fraction
    of the baseline's mean, or of 1 for a ratio) or ``absolute`` (in the field's unit). A
    ``value`` of None takes the experiment's equivalence margin times ``margin_factor``;
    ``in_train_unit`` marks a margin that is first converted to the testbed's training-loss
    unit (its ``train_per_quality``, ln 2 for the GPT's nats)."""

    kind: str
    value: float | None
    margin_factor: float = 1.0
    in_train_unit: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("relative", "absolute"):
            raise ValueError(f"kind: expected 'relative' or 'absolute', got {self.kind!r}")

    def resolve(self, margin: float | None) -> float:
        """δ as a number: ``value``, or ``margin · margin_factor`` when ``value`` is None
        (0 without a usable margin)."""
        if self.value is not None:
            return self.value
        if margin is None or not math.isfinite(margin) or margin <= 0:
            return 0.0
        return margin * self.margin_factor


MARGIN = Smallest("absolute", None)
"""δ = the experiment's equivalence margin, in the quality unit."""
TRAIN_MARGIN = Smallest("absolute", None, in_train_unit=True)
"""δ = the experiment's margin converted to the training-loss unit."""
DEFAULT_SMALLEST = Smallest("relative", 0.05)
"""δ of a compared field that declares none: 5 % of the baseline."""


@dataclass(frozen=True)
class Comparison:
    """How the analysis compares a field across arms, paired by seed.

    ``label`` names it in tables; ``unit`` is its unit (:data:`QUALITY_UNIT` or
    :data:`TRAIN_UNIT` for the testbed's own); ``group`` is one of :data:`GROUPS`.
    ``scale``: ``"difference"`` (paired x − y) or ``"ratio"`` (paired ln(x / y), reported as a
    ratio). ``margin``: None (no equivalence margin), ``"quality"`` (the experiment's margin as
    it is) or ``"train"`` (the margin converted to the training-loss unit). ``statuses``: the
    run statuses whose value counts. ``discrete``: small integer counts, decided by the exact
    sign test. ``censored``: a null in a finished run means "not reached" (a time to target).
    ``smallest``: the smallest difference that matters (:class:`Smallest`; None: 5 % of the
    baseline), the one number behind every better / worse / equivalent word.
    ``trained_model``: the field describes what a trained model learned (quantization
    degradation, activation outliers), so it is not comparable when an arm failed to learn.
    """

    label: str
    unit: str
    group: str
    lower_is_better: bool = True
    scale: str = "difference"
    margin: str | None = None
    statuses: tuple[str, ...] = (FINISHED,)
    discrete: bool = False
    censored: bool = False
    smallest: Smallest | None = None
    trained_model: bool = False

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"group: expected one of {GROUPS}, got {self.group!r}")
        if self.scale not in ("difference", "ratio"):
            raise ValueError(f"scale: expected 'difference' or 'ratio', got {self.scale!r}")
        if self.margin not in (None, "quality", "train"):
            raise ValueError(f"margin: expected None, 'quality' or 'train', got {self.margin!r}")


@dataclass(frozen=True)
class SummaryField:
    """One field of a run's summary.json: its ``name``, how the report prints it (``display``,
    None when it prints no number) and how the analysis compares it (``compare``, None when it
    is not compared). A field that is shown but not compared may name itself in words
    (``label``) and its ``unit``; a compared field's are its comparison's."""

    name: str
    display: Display | None = None
    compare: Comparison | None = None
    label: str = ""
    unit: str = ""


@dataclass(frozen=True)
class MetricSpec:
    """One compared field as the analysis of one testbed sees it (its units resolved).

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
    statuses: tuple[str, ...] = (FINISHED,)
    discrete: bool = False
    censored: bool = False


_LOSS = Display(digits=4)
_COUNT = Display(digits=2)
_SECONDS = Display(digits=2, suffix=" s")


def compared_field(name: str, display: Display | None, **compare: object) -> SummaryField:
    """A :class:`SummaryField` that the analysis compares: ``compare`` holds the arguments of
    its :class:`Comparison`."""
    return SummaryField(name, display, Comparison(**compare))  # type: ignore[arg-type]


FACTORS: tuple[str, ...] = ("norm", "placement", "precision")
"""The factors an arm is made of, in the order its name gives them
(``<norm>-<placement>[-<precision>]``); every run.json and summary records each."""

TOKENS_PER_PARAM = SummaryField(
    "tokens_per_param",
    Display(digits=2),
    label="tokens per parameter",
    unit="tokens per parameter",
)
"""The training tokens a run saw per parameter: ``tokens`` / N, N the budget's (the grid's
baseline arm, ``train.budget_params``) when the run trained to a budget of tokens per
parameter, else the run's own ``n_params`` (:func:`normlab.run_format.budget.tokens_per_param`,
which :func:`normlab.run_format.summary.build_summary` applies to every summary)."""

HEAD_FIELDS: tuple[SummaryField, ...] = (
    *(
        SummaryField(name)
        for name in (
            "run_id", "arm", "seed", *FACTORS, "status", "diverged_at",
            "steps", "tokens", "n_params", "n_norm_params",
        )
    ),
    TOKENS_PER_PARAM,
)  # fmt: skip
"""Identity, status, progress, parameter counts and the tokens per parameter: the summary's
first fields. The testbed's validation fields follow
(:attr:`normlab.run_format.testbeds.TestbedFormat.validation`)."""

POSTTRAIN: tuple[SummaryField, ...] = (
    compared_field(
        "ptq_int8wo_delta",
        Display(digits=5),
        label="int8 weight-only PTQ degradation",
        unit=QUALITY_UNIT,
        group="post-training",
        smallest=MARGIN,
        trained_model=True,
    ),
    compared_field(
        "ptq_w8a8_delta",
        Display(digits=5),
        label="int8 W8A8 PTQ degradation",
        unit=QUALITY_UNIT,
        group="post-training",
        smallest=MARGIN,
        trained_model=True,
    ),
    compared_field(
        "ptq_fp8_delta",
        Display(digits=5),
        label="fp8 E4M3 PTQ degradation",
        unit=QUALITY_UNIT,
        group="post-training",
        smallest=MARGIN,
        trained_model=True,
    ),
    compared_field(
        "bf16_eval_delta",
        Display(digits=5),
        label="bf16 evaluation degradation",
        unit=QUALITY_UNIT,
        group="post-training",
        smallest=MARGIN,
        trained_model=True,
    ),
    compared_field(
        "act_kurtosis_max",
        _COUNT,
        label="max Linear-input kurtosis",
        unit="Gaussian = 3",
        group="post-training",
        smallest=Smallest("relative", 0.10),
        trained_model=True,
    ),
    compared_field(
        "act_max_over_rms",
        _COUNT,
        label="max Linear-input max|x| / RMS",
        unit="ratio",
        group="post-training",
        smallest=Smallest("relative", 0.10),
        trained_model=True,
    ),
    compared_field(
        "channel_rms_kurtosis_max",
        _COUNT,
        label="max kurtosis of Linear-input channel RMS",
        unit="no unit",
        group="post-training",
        smallest=Smallest("relative", 0.10),
        trained_model=True,
    ),
    compared_field(
        "outlier_channels",
        Display(digits=1),
        label="outlier channels (max |x| ≥ 6)",
        unit="count",
        group="post-training",
        smallest=Smallest("absolute", 1.0),
        trained_model=True,
    ),
    SummaryField("ptq_fp8_method"),
    SummaryField("posttrain_errors"),
    SummaryField("posttrain_s"),
)
"""The post-training fields (:mod:`normlab.experiment.measure.posttrain` fills them; all null for a
run that did not finish): quality deltas in the testbed's quality unit and activation outliers,
compared paired like the other metrics but never part of the verdict."""

POSTTRAIN_FIELDS: tuple[str, ...] = tuple(f.name for f in POSTTRAIN)
"""The names of :data:`POSTTRAIN`, in summary.json's order."""

_SCALE_FIELDS = (
    "world_size",
    "parallel_mode",
    "rank_peak_memory_bytes",
    "rank_tokens_per_s",
    "total_peak_memory_bytes",
    "total_tokens_per_s",
)

_SCALE_FIELDS = (
    "world_size",
    "parallel_mode",
    "rank_peak_memory_bytes",
    "rank_tokens_per_s",
    "total_peak_memory_bytes",
    "total_tokens_per_s",
)

TAIL_FIELDS: tuple[SummaryField, ...] = (
    compared_field(
        "final_train_loss",
        _LOSS,
        label="final training loss",
        unit=TRAIN_UNIT,
        group="quality",
        margin="train",
        smallest=TRAIN_MARGIN,
    ),
    compared_field(
        "tokens_per_s",
        Display(digits=0),
        label="throughput",
        unit="tokens/s",
        group="cost",
        lower_is_better=False,
        scale="ratio",
        smallest=Smallest("relative", 0.02),
    ),
    compared_field(
        "peak_memory_bytes",
        Display(2.0**20, 1, " MiB"),
        label="peak memory",
        unit="bytes",
        group="cost",
        scale="ratio",
        smallest=Smallest("relative", 0.01),
    ),
    SummaryField("peak_memory_kind"),
    compared_field(
        "saved_activation_bytes",
        Display(2.0**20, 2, " MiB"),
        label="activations saved for backward",
        unit="bytes",
        group="cost",
        scale="ratio",
        smallest=Smallest("relative", 0.01),
    ),
    *POSTTRAIN,
    SummaryField("target_val_loss"),
    compared_field(
        "time_to_target_s",
        _SECONDS,
        label="time to target loss",
        unit="s",
        group="convergence",
        scale="ratio",
        censored=True,
        smallest=Smallest("relative", 0.05),
    ),
    SummaryField("tokens_to_target"),
    compared_field(
        "n_loss_spikes",
        _COUNT,
        label="loss spikes",
        unit="count",
        group="stability",
        statuses=DONE_STATUSES,
        discrete=True,
        smallest=Smallest("absolute", 0.5),
    ),
    compared_field(
        "n_grad_spikes",
        _COUNT,
        label="gradient spikes",
        unit="count",
        group="stability",
        statuses=DONE_STATUSES,
        discrete=True,
        smallest=Smallest("absolute", 0.5),
    ),
    compared_field(
        "n_skipped_steps",
        _COUNT,
        label="fp16 steps skipped by the gradient scaler",
        unit="count",
        group="stability",
        statuses=DONE_STATUSES,
        discrete=True,
        smallest=Smallest("absolute", 1.0),
    ),
    SummaryField("n_clipped"),
    SummaryField("wall_s", _SECONDS),
    *(SummaryField(name) for name in ("device", "torch_version", "threads", "data_fingerprint")),
    *(SummaryField(name) for name in _SCALE_FIELDS),
)
"""The fields after the testbed's validation fields: training loss, speed and memory,
post-training effects, target, spikes, environment, and how the run was spread over
processes: ``world_size`` N, ``parallel_mode`` (``single``, ``ddp``, ``fsdp``), each rank's
peak memory and throughput (lists by rank) and their totals Σ_r (``tokens_per_s`` is the run's
throughput, the total; ``peak_memory_bytes`` the largest rank's peak). Quality metrics count
finished runs only (a diverged run's last numbers describe a truncated run; its divergence is
judged under stability); spike counts also count diverged runs."""

FINAL_PREFIX = "final_"
"""A run's (or a branch's) last evaluation in its summary: ``final_`` + the ``eval`` record's
field (``final_val_loss``, ``final_val_bpb``)."""
FULL_VAL_PREFIX = "full_"
"""The final model evaluated on the whole validation split (``train.full_val``): ``full_`` + the
``eval`` record's field (``full_val_loss``, ``full_val_bpb``)."""
AVERAGED_PREFIX = "avg_"
"""The uniform average of the weights over the last steps (``train.average_last``), evaluated at
the end: ``avg_`` + the ``eval`` record's field, and ``avg_full_`` + it on the whole split."""


def prefixed(prefix: str, values: dict[str, object]) -> dict[str, object]:
    """``values`` with every key given ``prefix`` (an evaluation's values as summary fields)."""
    return {f"{prefix}{key}": value for key, value in values.items()}


BRANCHES_FIELD = "branches"
"""The summary field of a run with ``train.branches``: {budget B (a string): {``status``,
``diverged_at``, :data:`FINAL_PREFIX` + each ``eval`` field at step B (and
:data:`FULL_VAL_PREFIX` + each with ``train.full_val``), ``final_train_loss``, ``tokens``,
``train_s``}}, one entry per branch the run reached."""
BRANCHES = SummaryField(BRANCHES_FIELD)
"""The declaration of :data:`BRANCHES_FIELD`, among every testbed's optional fields
(:attr:`normlab.run_format.testbeds.TestbedFormat.optional`)."""

CRASH_FIELDS: tuple[str, ...] = ("error", "traceback")
"""Added to the summary of a ``crashed`` run: ``"ErrorType: message"`` and the traceback."""
