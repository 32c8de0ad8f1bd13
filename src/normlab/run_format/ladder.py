"""The ``ladder`` key of the top-level ``summary.json``: a size ladder's trend and prediction.

A ladder compares the arms at several model sizes (rungs) and extrapolates each arm's paired
difference to a target size (:mod:`normlab.analysis.ladder`); its learning-rate sweep, when one
was run, chooses each arm's rate (:mod:`normlab.analysis.lr_sweep`). The shape is declared once
here as nested :class:`Key` s; :func:`check_ladder` validates a value against it, naming the
path of the first mismatch. The sweep's record (:data:`LR_SWEEP_SHAPE`) is also the top-level
``learning_rates`` of a plain compare's summary.json when it was swept
(:func:`check_lr_sweep_record`). docs/run-format.md describes the same keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LADDER_KEY",
    "LADDER_SHAPE",
    "LR_SWEEP_KEY",
    "LR_SWEEP_SHAPE",
    "Key",
    "check_key",
    "check_ladder",
    "check_lr_sweep_record",
]

LADDER_KEY = "ladder"
"""The key of the top-level summary.json that holds the ladder (absent without one)."""

LR_SWEEP_KEY = "learning_rates"
"""The key of a learning-rate sweep's record: in the ladder's value, and at the top level of a
compare folder's summary.json whose tuning folders lie beside it (absent without them)."""

KINDS = ("number", "integer", "string", "boolean", "object", "map", "list")


@dataclass(frozen=True)
class Key:
    """One key of a JSON object: its ``name``, ``kind`` (one of :data:`KINDS`), whether it may
    be null (``nullable``), what it means (``doc``) and, for an ``object``, the keys it holds;
    for a ``map`` ({any name: value}) and a ``list``, ``keys`` describe each value (an object)
    and ``item`` a scalar value's kind instead."""

    name: str
    kind: str
    doc: str
    keys: tuple[Key, ...] = ()
    item: str | None = None
    nullable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {self.kind!r}")


def _n(name: str, doc: str, nullable: bool = False) -> Key:
    return Key(name, "number", doc, nullable=nullable)


_INTERVAL = (
    Key("seeds", "integer", "k: 1 training, the mean of k, null: the trend", nullable=True),
    _n("estimate", "the fitted difference a + b·log10(N_t)"),
    _n("low", "the interval's lower end"),
    _n("high", "the interval's upper end"),
    _n("p_above", "fraction of bootstrap draws above zero"),
    _n("p_below", "fraction of bootstrap draws below zero"),
)

_RUNG = (
    Key("setting", "string", "the rung's model setting, e.g. d_model=64"),
    _n("n_params", "its parameter count N"),
    _n("tokens_per_param", "training tokens per parameter of its runs (null: unknown)", True),
    Key("tokens", "integer", "training tokens per run (null: unknown)", nullable=True),
    Key("steps", "integer", "training steps per run (null: unknown)", nullable=True),
    Key("n", "integer", "paired seeds"),
    _n("mean", "mean paired difference d̄ (arm − baseline)"),
    _n("sd", "sd of the paired differences (n − 1)"),
    _n("low", "t-interval of d̄, lower end"),
    _n("high", "t-interval of d̄, upper end"),
    _n("weight_sd", "max(sd, sd_floor·pooled_sd): the sd the fit weight uses"),
    Key("seeds", "list", "the seeds, in the order of diffs", item="integer"),
    Key("diffs", "list", "the per-seed differences", item="number"),
)

_FIT = (
    Key("model", "string", "the fitted model, d = a + b·log10(N)"),
    Key("weights", "string", "the weights, n_j / max(s_j, sd_floor·pooled_sd)²"),
    _n("a", "intercept"),
    _n("b", "change of the difference per tenfold N"),
    _n("a_se", "standard error of a"),
    _n("b_se", "standard error of b"),
    _n("pooled_sd", "pooled paired sd over the rungs"),
    Key("df", "integer", "its degrees of freedom Σ(n_j − 1)"),
    _n("sd_floor", "f of the weight floor"),
    _n("lack_of_fit_p", "F-test of the rung means about the line (three rungs or more)", True),
)

_TARGET = (
    _n("n_params", "the target parameter count N_t"),
    _n("largest_rung", "the largest rung's N"),
    _n("extrapolation", "N_t / largest rung"),
    Key("words", "string", "how far beyond the largest rung, in words"),
)

_PREDICTION = (
    Key("method", "string", "how the interval is computed"),
    Key("n_boot", "integer", "bootstrap replicates"),
    Key("seed", "integer", "the bootstrap's random seed"),
    _n("confidence", "the intervals' level"),
    Key("single", "object", "one training at the target", _INTERVAL),
    Key("mean_of_seeds", "object", "the mean over k paired trainings", _INTERVAL),
    Key("trend", "object", "the expected difference (infinitely many seeds)", _INTERVAL),
    Key("word", "string", "better / worse / equivalent / not determined"),
    Key("reason", "string", "why, with the probability of the likelier sign"),
    Key("sentence", "string", "the answer in one sentence"),
)

_ARM = (
    Key("arm", "string", "the arm"),
    Key("baseline", "string", "the baseline arm"),
    Key("metric", "string", "the quality metric"),
    Key("unit", "string", "its unit"),
    Key("lower_is_better", "boolean", "direction of the metric"),
    Key("rungs", "list", "per rung, smallest first", _RUNG),
    Key("fit", "object", "the weighted line", _FIT),
    Key("target", "object", "the target size", _TARGET),
    Key("prediction", "object", "the prediction at the target", _PREDICTION),
)

_LR_POINT = (
    _n("rate", "the learning rate"),
    Key("n", "integer", "tuning seeds that finished"),
    Key("n_diverged", "integer", "tuning seeds that diverged"),
    _n("mean", "mean loss", True),
    _n("sd", "sd of the loss (n − 1)", True),
    _n("low", "t-interval of the mean, lower end", True),
    _n("high", "t-interval of the mean, upper end", True),
)

_LR_CURVE = (
    _n("best", "the best rate (lowest mean, no seed diverged)"),
    _n("best_mean", "its mean loss"),
    Key("edge", "string", "lowest / highest when the best is at the sweep's end", nullable=True),
    Key("points", "list", "per rate, increasing", _LR_POINT),
)

LR_SWEEP_SHAPE = (
    Key("tuning_seeds", "list", "seeds of the sweep (not evaluation seeds)", item="integer"),
    Key(
        "chosen_at",
        "map",
        "{rung: the swept setting whose best rates it runs (itself under sp; the smallest "
        "width under mup)}",
        item="string",
    ),
    Key(
        "chosen",
        "map",
        "{rung: {arm: the rate its comparison runs the arm at}}",
        (Key("*", "map", "{arm: rate}", item="number"),),
    ),
    Key("settings", "map", "{setting: {arm: curve}}", (Key("*", "map", "{arm}", _LR_CURVE),)),
    Key(
        "alignment",
        "list",
        "per arm its best rate per setting and their spread in sweep steps",
        (
            Key("arm", "string", "the arm"),
            Key("best", "map", "{setting: best rate}", item="number"),
            Key("steps", "integer", "largest distance between the best rates, in sweep steps"),
            Key(
                "aligned",
                "boolean",
                "some rate is within the tuning seeds' spread of the best at every setting "
                "(with one tuning seed: steps ≤ 1)",
            ),
            Key(
                "tied",
                "map",
                "{setting: the rates within the seeds' spread of its best}",
                (Key("*", "list", "rates", item="number"),),
            ),
            Key("common", "list", "the rates tied with the best at every setting", item="number"),
        ),
    ),
)
"""The keys of a learning-rate sweep's record
(:func:`normlab.analysis.lr_sweep.lr_sweep_record`)."""

LADDER_SHAPE: tuple[Key, ...] = (
    Key("arms", "map", "{arm: its ladder against the baseline}", _ARM),
    Key(
        LR_SWEEP_KEY,
        "object",
        "the learning-rate sweep, null without one",
        LR_SWEEP_SHAPE,
        None,
        True,
    ),
)
"""The keys of summary.json's ``ladder`` object."""


def _check(value: Any, key: Key, path: str) -> None:
    if value is None:
        if key.nullable:
            return
        raise ValueError(f"{path}: expected a {key.kind}, got null")
    kind = key.kind
    if kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(float(value)):
            raise ValueError(f"{path}: expected a finite number, got {value!r}")
    elif kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "string":
        ok = isinstance(value, str)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    elif kind == "list":
        ok = isinstance(value, list)
    else:
        ok = isinstance(value, Mapping)
    if not ok:
        raise ValueError(f"{path}: expected a {kind}, got {value!r}")
    if kind == "object":
        _check_object(value, key.keys, path)
    elif kind in ("map", "list"):
        items = value.items() if kind == "map" else enumerate(value)
        for k, v in items:
            sub = f"{path}[{k!r}]" if kind == "map" else f"{path}[{k}]"
            if key.item is not None:
                _check(v, Key(key.name, key.item, key.doc), sub)
            elif len(key.keys) == 1 and key.keys[0].name == "*":
                _check(v, key.keys[0], sub)
            else:
                _check(v, Key(key.name, "object", key.doc, key.keys), sub)


def _check_object(value: Mapping[str, Any], keys: tuple[Key, ...], path: str) -> None:
    names = [k.name for k in keys]
    missing = [n for n in names if n not in value]
    extra = [n for n in value if n not in names]
    if missing or extra:
        raise ValueError(f"{path}: expected the keys {names}, missing {missing}, unknown {extra}")
    for k in keys:
        _check(value[k.name], k, f"{path}.{k.name}")


def check_ladder(value: Any) -> None:
    """Raise ValueError, naming the path (e.g. ``ladder.arms['rms'].fit.b``), unless ``value``
    has the shape :data:`LADDER_SHAPE` declares."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{LADDER_KEY}: expected an object, got {value!r}")
    _check_object(value, LADDER_SHAPE, LADDER_KEY)


def check_lr_sweep_record(value: Any) -> None:
    """Raise ValueError, naming the path (e.g. ``learning_rates.chosen['this size']``), unless
    ``value`` has the shape :data:`LR_SWEEP_SHAPE` declares."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{LR_SWEEP_KEY}: expected an object, got {value!r}")
    _check_object(value, LR_SWEEP_SHAPE, LR_SWEEP_KEY)


def check_key(value: Any, key: Key) -> None:
    """Raise ValueError, naming the path from ``key.name``, unless ``value`` has the shape
    ``key`` declares (the check of every record declared with :class:`Key`)."""
    _check(value, key, key.name)
