"""The ``train`` options of budget and noise studies as a run config (``run.json``) records them:
only when set, so that a run without them is recorded, and computes, as it was before they
existed.

A key of :data:`OPTIONS_OFF` is absent from a run config whose option is off; reading it
(:func:`train_option`) then gives the value that turns it off. Under ``schedule: wsd`` the run
config always holds :data:`WSD_SETTINGS` too (``cooldown``, ``decay``); under ``cosine`` never.
With a budget of tokens per parameter (``tokens_per_param``) it holds :data:`BUDGET_SETTINGS`
too (``param_count``), and the grid adds the budget's N (:mod:`normlab.run_format.budget`);
without one, neither.
The experiment config (:class:`normlab.experiment.config.TrainSettings`) takes these values
as its defaults; the training loop reads a run config through :func:`train_option`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUDGET_SETTINGS",
    "COSINE",
    "OPTIONS_OFF",
    "RECORDED_WHEN_SET",
    "WSD",
    "WSD_SETTINGS",
    "fraction_steps",
    "train_option",
]

COSINE = "cosine"
"""The schedule of a run config that names none: linear warm-up, then cosine decay."""
WSD = "wsd"
"""The warm-up–stable–decay schedule (``train.schedule``)."""
OPTIONS_OFF: dict[str, Any] = {
    "schedule": COSINE,
    "branches": None,
    "init_seed": None,
    "data_seed": None,
    "full_val": False,
    "average_last": None,
    "tokens_per_param": None,
}
"""Each option recorded only when set, with the value that turns it off (a run config without
the key has that value): the cosine schedule, no branches, the run's seed for the initial
weights and for the data, no whole-split validation, no weight average, no budget of tokens per
parameter."""
WSD_SETTINGS: tuple[str, ...] = ("cooldown", "decay")
"""The settings of the ``wsd`` schedule, recorded with it and only with it."""
BUDGET_SETTINGS: tuple[str, ...] = ("param_count",)
"""The settings of a budget of tokens per parameter, recorded with it and only with it."""
RECORDED_WHEN_SET: tuple[str, ...] = (*OPTIONS_OFF, *WSD_SETTINGS, *BUDGET_SETTINGS)
"""Every ``train`` key a run config holds only when its option is set."""


def train_option(train: Mapping[str, Any], key: str) -> Any:
    """The option ``key`` of a run config's ``train`` section: the recorded value, or
    :data:`OPTIONS_OFF`'s where the record leaves it out. ValueError naming ``key`` for a key
    that is not such an option (a wsd setting is read from the section itself)."""
    if key not in OPTIONS_OFF:
        raise ValueError(f"key: expected one of {', '.join(OPTIONS_OFF)}, got {key!r}")
    return train.get(key, OPTIONS_OFF[key])


def fraction_steps(total_steps: int, fraction: float) -> int:
    """The steps a fraction f of a budget of n steps takes: ⌊f·n + ½⌋ (rounded half up).
    A wsd cooldown is the last ``fraction_steps(n, cooldown)`` steps of a budget of n;
    ``average_last`` averages the weights after each of the last
    ``fraction_steps(n, average_last)`` steps."""
    return math.floor(fraction * total_steps + 0.5)
