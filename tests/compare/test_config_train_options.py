"""The ``train`` options of budget and noise studies in the config: recorded only when set (a
run without them is the run it was), and refused in one line naming the key where they do not
fit the run."""

from __future__ import annotations

from typing import Any

import pytest

from normlab.experiment.config import ConfigError, TrainSettings, validate_config
from normlab.experiment.execution.grid import shared_settings
from normlab.run_format.train_options import OPTIONS_OFF, RECORDED_WHEN_SET, train_option

BEFORE = [
    "steps", "tokens", "batch_size", "lr", "arm_lr", "min_lr_ratio", "warmup", "weight_decay",
    "beta1", "beta2", "grad_clip", "eval_interval", "eval_windows", "layer_grad_interval",
    "throughput_warmup", "target_val_loss",
]  # fmt: skip
"""The ``train`` keys of experiment.json before these options existed, in order."""
DATA_INFO = {"fingerprint": "f", "python_version": "3", "source": "s", "classes": ["a", "b"]}


def test_a_config_without_the_options_records_what_it_recorded_before() -> None:
    for testbed in ("gpt", "dit"):
        cfg = validate_config({"testbed": testbed})
        assert list(cfg.dump()["train"]) == [
            k for k in BEFORE if testbed == "gpt" or k != ("eval_windows")
        ]
        run_train = shared_settings(cfg, "cpu", 1, DATA_INFO)["train"]
        assert not set(run_train) & set(RECORDED_WHEN_SET)
    # a default given explicitly is not recorded either: the run is the same
    given = {"schedule": "cosine", "init_seed": None, "full_val": False, "average_last": None}
    assert list(validate_config({"train": given}).dump()["train"]) == BEFORE


def test_set_options_are_recorded_and_read_back() -> None:
    train: dict[str, Any] = {"schedule": "wsd", "branches": [300], "init_seed": 0}
    train |= {"data_seed": 5, "full_val": True, "average_last": 0.1}
    recorded = validate_config({"train": train}).dump()["train"]
    assert recorded["cooldown"] == 0.2 and recorded["decay"] == "linear"  # kept under wsd
    assert {k: recorded[k] for k in train} == train
    assert train_option(recorded, "average_last") == 0.1
    assert train_option({}, "schedule") == "cosine" and train_option({}, "branches") is None
    assert train_option({}, "full_val") is False
    with pytest.raises(ValueError, match="key: expected one of schedule, branches"):
        train_option(recorded, "cooldown")
    for key in RECORDED_WHEN_SET:
        assert TrainSettings.model_fields[key].description, key  # the later flags' help
    for key, off in OPTIONS_OFF.items():  # the values that turn them off are the defaults
        assert TrainSettings.model_fields[key].default == off, key


@pytest.mark.parametrize(
    ("config", "line"),
    [
        ({"train": {"cooldown": 0.3}}, "train.cooldown: only with train.schedule: wsd"),
        ({"train": {"decay": "sqrt"}}, "train.decay: only with train.schedule: wsd"),
        ({"train": {"branches": [100]}}, "train.branches: only with train.schedule: wsd"),
        (
            {"train": {"schedule": "wsd", "cooldown": 0.96}},
            "train.cooldown: 0.96 of train.steps = 600 makes a cooldown of 576 step(s); "
            "expected at least 1 step, starting after the 30 warm-up steps (at most "
            "600 − 30 = 570)",
        ),
        (
            {"train": {"schedule": "wsd", "cooldown": 0.0001}},
            "train.cooldown: 0.0001 of train.steps = 600 makes a cooldown of 0 step(s)",
        ),
        (
            {"train": {"schedule": "wsd", "branches": [35]}},
            "train.cooldown: 0.2 of the branch of 35 steps makes a cooldown of 7 step(s); "
            "expected at least 1 step, starting after the 30 warm-up steps (at most "
            "35 − 30 = 5)",
        ),
        (
            {"train": {"schedule": "wsd", "branches": [600]}},
            "train.branches: the branch of 600 steps is not shorter than the run "
            "(train.steps = 600)",
        ),
        (
            {"train": {"schedule": "wsd", "branches": [300, 300]}},
            "train.branches: a budget is listed twice in [300, 300]",
        ),
        ({"train": {"schedule": "wsd", "branches": [0]}}, "train.branches.0: Input should be"),
        (
            {"train": {"average_last": 0.0001}},
            "train.average_last: 0.0001 of 600 steps averages no step",
        ),
        ({"train": {"average_last": 1.5}}, "train.average_last: Input should be less than"),
        ({"train": {"init_seed": -1}}, "train.init_seed: Input should be greater than"),
        (
            {"train": {"average_last": 0.5}, "scale": {"nproc_per_node": 2}},
            "train.average_last: only for runs on one process, got 2 processes per run",
        ),
        (
            {"train": {"schedule": "wsd", "branches": [300]}, "scale": {"nproc_per_node": 2}},
            "train.branches: only for runs on one process",
        ),
        (
            {"testbed": "dit", "train": {"full_val": True}},
            "train.full_val: an option of the gpt or lm testbed, but this experiment's testbed "
            "is dit; the dit testbed already validates on every image of shapes.n_val",
        ),
    ],
)
def test_options_that_do_not_fit_are_refused_in_one_line(config: dict, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(config)
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and lines[1].strip().startswith(line), lines


def test_the_cooldown_is_checked_on_the_steps_a_token_budget_gives() -> None:
    """steps = ⌈tokens / (batch_size · context)⌉ = 10 here: a cooldown of 0.2 is 2 steps,
    after a warm-up of 8 at most."""
    base = {"tokens": 10 * 16 * 64, "schedule": "wsd", "cooldown": 0.2}
    assert validate_config({"train": {**base, "warmup": 8}}).resolved_steps() == 10
    with pytest.raises(ConfigError, match=r"train.steps = 10 makes a cooldown of 2 step"):
        validate_config({"train": {**base, "warmup": 9}})


def test_the_dit_and_lm_testbeds_take_what_applies_to_them() -> None:
    dit = validate_config({"testbed": "dit", "train": {"average_last": 0.25, "data_seed": 0}})
    assert dit.dump()["train"]["average_last"] == 0.25
    lm = validate_config({"lm": {"model": "hf:llama"}, "train": {"full_val": True}})
    assert lm.dump()["train"]["full_val"] is True
