"""Config values: non-finite floats are config errors; YAML scientific notation is a float."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from normlab.cli import app
from normlab.experiment import ConfigError, load_config_file, validate_config
from normlab.experiment.config import load_yaml


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"train": {"lr": math.inf}}, "train.lr"),
        ({"train": {"lr": -math.inf}}, "train.lr"),
        ({"train": {"weight_decay": math.nan}}, "train.weight_decay"),
        ({"train": {"target_val_loss": math.nan}}, "train.target_val_loss"),
        ({"model": {"mlp_ratio": math.inf}}, "model.mlp_ratio"),
        ({"model": {"dyt_alpha_init": math.nan}}, "model.dyt_alpha_init"),
        ({"anomaly": {"loss_z": math.inf}}, "anomaly.loss_z"),
        ({"margin_bpb": math.inf}, "margin_bpb"),
    ],
)
def test_non_finite_floats_are_config_errors(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        validate_config(data)


def test_lr_inf_on_the_command_line_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", "--lr", "inf", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "train.lr: Input should be a finite number (got inf)" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-3", 1e-3), ("1E5", 1e5), ("-2.5e+4", -2.5e4), (".5e-3", 0.5e-3), ("+3e2", 300.0)],
)
def test_scientific_notation_loads_as_a_float(tmp_path: Path, text: str, value: float) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"model:\n  dyt_alpha_init: {text}\n")  # a float field with no bounds
    data = load_config_file(path)
    assert isinstance(data["model"]["dyt_alpha_init"], float)
    assert validate_config(data).model.dyt_alpha_init == value


def test_lr_1e_minus_3_in_a_yaml_file_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n")
    assert validate_config(load_config_file(path)).train.lr == 1e-3


@pytest.mark.parametrize(
    "text",
    ["1e", "e5", "1e-3x", "'1e-3'", "1.5", "10", "0x1F", "yes", "~", ".inf", "2001-12-14", "1:30"],
)
def test_other_yaml_scalars_load_as_before(text: str) -> None:
    assert load_yaml(f"v: {text}") == yaml.safe_load(f"v: {text}")


def test_the_global_safe_loader_is_unchanged() -> None:
    load_yaml("v: 1e-3")
    assert yaml.safe_load("v: 1e-3") == {"v": "1e-3"}
