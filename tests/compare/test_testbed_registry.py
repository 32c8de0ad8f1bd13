"""A testbed is one module plus one registration: registering a new testbed (its config section,
defaults and rules declared by the testbed itself) is enough for the experiment config to
accept its section, apply its defaults, reject its options in other testbeds' configs, and for
the grid to plan its runs."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import pytest
from pydantic import Field
from torch import nn

from normlab.experiment import config as experiment_config
from normlab.experiment import testbeds
from normlab.experiment.config import ConfigError, ExperimentConfig, config_class, validate_config
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.execution.own_grid import fixed_keys, grid_record
from normlab.experiment.testbeds import TESTBEDS
from normlab.models import GPTConfig, build_gpt
from normlab.models.config import ConfigModel
from normlab.run_format import TESTBED_FORMATS


class ToySettings(ConfigModel):
    """The toy testbed's one section: a one-block GPT of ``width`` channels on windows of
    ``context`` bytes."""

    width: int = Field(16, ge=8)
    context: int = Field(8, ge=2)


class ToyTestbed:
    """A testbed declared as a new one would be: its config, and what the grid calls to plan."""

    name: ClassVar[str] = "toy"
    config: ClassVar[testbeds.TestbedConfig] = testbeds.TestbedConfig(
        summary="toy (a one-block GPT)",
        sections={"toy": ToySettings},
        sample_length=("toy", "context"),
        options=("margin_bpb",),
        train_defaults={"batch_size": 4, "steps": 50},
    )
    quality_fields: ClassVar[tuple[str, ...]] = TESTBED_FORMATS["gpt"].validation_fields

    @staticmethod
    def run_settings(cfg: Any, data_info: dict[str, Any]) -> dict[str, Any]:
        return {"testbed": "toy", "toy": cfg.toy.model_dump(), "data": dict(data_info)}

    @staticmethod
    def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
        toy = spec["toy"]
        config = GPTConfig(
            d_model=toy["width"],
            n_layers=1,
            n_heads=2,
            context=toy["context"],
            norm=spec["norm"],
            placement=spec["placement"],
        )
        return build_gpt(config, seed)

    @staticmethod
    def arm_fields(model: nn.Module) -> dict[str, Any]:
        return {}


@pytest.fixture
def toy_config(monkeypatch: pytest.MonkeyPatch) -> type:
    """The experiment config with the toy testbed registered: its run format declared (as
    ``run_format/testbeds.py`` would), then the one registration line."""
    monkeypatch.setitem(TESTBED_FORMATS, "toy", dataclasses.replace(TESTBED_FORMATS["gpt"]))
    monkeypatch.setitem(TESTBEDS, "toy", ToyTestbed)
    return config_class(TESTBEDS)


def test_a_registered_testbed_gets_its_section_and_defaults(toy_config: type) -> None:
    cfg = validate_config({"testbed": "toy", "toy": {"width": 32}}, toy_config)
    assert cfg.toy == ToySettings(width=32)
    assert (cfg.train.batch_size, cfg.train.steps) == (4, 50)  # the toy's train defaults
    tokens = validate_config({"testbed": "toy", "train": {"tokens": 1000, "warmup": 0}}, toy_config)
    assert tokens.train.steps is None  # a token budget replaces the default steps
    assert tokens.resolved_steps() == math.ceil(1000 / (4 * 8))  # its sample length: toy.context
    dumped = cfg.dump()
    assert dumped["toy"] == {"width": 32, "context": 8}
    assert not {"model", "data", "dit", "shapes", "lm"} & set(dumped)
    assert "toy (a one-block GPT)" in toy_config.model_fields["testbed"].description


def test_a_registered_testbeds_options_are_errors_elsewhere(toy_config: type) -> None:
    assert experiment_config.testbed_options(TESTBEDS)["toy"] == ("toy",)
    with pytest.raises(ConfigError, match=r"toy\.width: an option of the toy testbed"):
        validate_config({"toy": {"width": 32}}, toy_config)
    with pytest.raises(ConfigError, match=r"shapes: an option of the dit testbed"):
        validate_config({"testbed": "toy", "shapes": {}}, toy_config)
    # the config built at import knows only the testbeds registered then
    with pytest.raises(ConfigError, match="testbed: expected one of gpt, dit, lm"):
        validate_config({"testbed": "toy"})


def test_the_grid_plans_a_registered_testbeds_runs(toy_config: type) -> None:
    cfg = validate_config({"testbed": "toy", "seeds": 2}, toy_config)
    runs = plan_runs(cfg, "cpu", 1, {"fingerprint": "none"})
    assert [r["run_id"] for r in runs] == [
        "layernorm-pre__s0",
        "rmsnorm-pre__s0",
        "layernorm-pre__s1",
        "rmsnorm-pre__s1",
    ]
    assert all(r["toy"] == {"width": 16, "context": 8} and r["testbed"] == "toy" for r in runs)
    assert runs[0]["train"]["tokens"] == 50 * 4 * 8
    assert runs[0]["init_digest"] == runs[1]["init_digest"] != runs[2]["init_digest"]
    fixed = grid_record(cfg, runs, {"fingerprint": "none"}, {})["fixed"]
    assert fixed["toy.width"] == 16 and fixed["testbed"] == "toy"  # its section: held fixed


def test_the_fixed_settings_are_the_testbeds_sections() -> None:
    keys = {name: fixed_keys(validate_config({"testbed": name})) for name in ("gpt", "dit")}
    tail = ("train", "anomaly", "device", "threads", "data")
    assert keys == {"gpt": ("testbed", "model", *tail), "dit": ("testbed", "dit", "shapes", *tail)}


def test_a_section_two_testbeds_share_must_be_one_class(monkeypatch: pytest.MonkeyPatch) -> None:
    class Clash(ToyTestbed):
        config: ClassVar[testbeds.TestbedConfig] = dataclasses.replace(
            ToyTestbed.config, sections={"data": ToySettings}
        )

    monkeypatch.setitem(TESTBED_FORMATS, "toy", dataclasses.replace(TESTBED_FORMATS["gpt"]))
    with pytest.raises(TypeError, match="section 'data' is ToySettings, another testbed's is"):
        config_class({**TESTBEDS, "toy": Clash})
    with pytest.raises(TypeError, match="run format"):
        config_class({**TESTBEDS, "vit": ToyTestbed})


def test_the_registered_testbeds_make_the_config() -> None:
    assert set(ExperimentConfig.testbeds) == set(TESTBED_FORMATS) == {"gpt", "dit", "lm"}
    for name, testbed in TESTBEDS.items():
        for section, cls in testbed.config.sections.items():
            assert ExperimentConfig.model_fields[section].annotation is cls, (name, section)
