"""Config values: non-finite floats are config errors; YAML scientific notation is a float."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from normlab.cli import app
from normlab.experiment.config import ConfigError, load_config_file, load_yaml, validate_config


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


# ----------------------------------------------------------------------------------------------
# one source: the testbeds' config classes, the experiment config and the flags agree
# ----------------------------------------------------------------------------------------------
def test_the_testbed_configs_defaults_are_compare_defaults() -> None:
    """The experiment's model and dit sections are the models' own config classes: building a
    testbed with no settings gives the model ``normlab compare`` trains by default."""
    from normlab.data.shapes import SHAPE_CLASSES
    from normlab.models import DiTConfig, DiTSettings, GPTConfig, GPTSettings

    gpt = validate_config({})
    assert type(gpt.model) is GPTSettings
    built = GPTConfig(**gpt.model.model_dump(), norm="layernorm", placement="pre")
    assert built == GPTConfig()
    assert (built.d_model, built.context, built.positions) == (64, 64, "rope")
    dit = validate_config({"testbed": "dit"})
    assert type(dit.dit) is DiTSettings
    s = dit.shapes
    arm = dit.dit.dit_config(s.in_channels, s.seq_len, len(SHAPE_CLASSES), "adaln_zero")
    defaults = DiTConfig(in_channels=s.in_channels, seq_len=s.seq_len, n_classes=4)
    assert arm == defaults and (arm.d_model, arm.time_freq_dim) == (64, 128)


@pytest.mark.parametrize(
    ("cls", "kw", "key"),
    [
        ("GPTConfig", {"n_layers": 0}, "n_layers"),
        ("GPTConfig", {"d_model": 15, "n_heads": 2}, "n_heads"),
        ("GPTConfig", {"d_model": 12, "n_heads": 4, "positions": "rope"}, "positions"),
        ("GPTConfig", {"context": True}, "context"),
        ("GPTConfig", {"mlp_ratio": math.inf}, "mlp_ratio"),
        ("GPTConfig", {"vocab": 256}, "vocab"),
        ("DiTConfig", {"time_freq_dim": 7}, "time_freq_dim"),
        ("DiTSettings", {"label_dropout": 1.0}, "label_dropout"),
    ],
)
def test_testbed_config_errors_start_with_the_key(cls: str, kw: dict, key: str) -> None:
    import normlab.models as models

    with pytest.raises(ValueError, match=rf"^{key}:"):
        getattr(models, cls)(**kw)


def test_a_section_error_keeps_its_dotted_key_in_the_experiment_config() -> None:
    with pytest.raises(ConfigError, match=r"model\.n_layers: Input should be greater"):
        validate_config({"model": {"n_layers": 0}})
    with pytest.raises(ConfigError, match=r"dit\.time_freq_dim: Input should be"):
        validate_config({"testbed": "dit", "dit": {"time_freq_dim": 1}})
    with pytest.raises(ConfigError, match=r"model: n_heads: d_model=60 is not divisible"):
        validate_config({"model": {"d_model": 60, "n_heads": 8}})


def test_compare_flags_take_default_and_help_from_the_config() -> None:
    """No flag keeps a default of its own: each is None (not given) and its help shows the
    config field's description and default."""
    import inspect

    from normlab.cli.compare_cmd import compare
    from normlab.cli.compare_options import FLAG_KEYS, config_field, flag_help

    params = inspect.signature(compare).parameters
    for flag, dotted in FLAG_KEYS.items():
        assert params[flag].default is None, flag
        field = config_field(dotted)
        assert field.description and flag_help(dotted).startswith(
            field.description.removesuffix(".")
        ), dotted
    assert "(default: 0.005; dit: 0.003)" in flag_help("train.lr")
    assert "(default: 16; dit: 32)" in flag_help("train.batch_size")
    assert "(default: layernorm,rmsnorm; dit: adaln_zero,adarms)" in flag_help("norms")
    assert "(default: 3)" in flag_help("seeds")
    result = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "Peak learning rate (default: 0.005; dit: 0.003)." in (
        result.output
    )


@pytest.mark.parametrize("testbed", ["gpt", "dit"])
def test_run_json_names_settings_as_the_yaml_config(testbed: str) -> None:
    """Every setting a run records (and the report shows) is a key a YAML config accepts,
    under the same section; only the run's identity, its counts and the data's record
    (source, fingerprint, …) are not settings."""
    from normlab.cli.compare_options import config_field
    from normlab.experiment.execution.grid import flatten, shared_settings

    cfg = validate_config({"testbed": testbed})
    data_info = {
        "fingerprint": "f",
        "python_version": "3",
        "source": "s",
        "classes": ["a", "b"],
    }
    spec = shared_settings(cfg, "cpu", 1, data_info)
    names = [k for k in flatten({k: v for k, v in spec.items() if k != "data"})]
    assert names and all(config_field(name) for name in names)
    dumped = flatten(cfg.dump())
    resolved = ("device", "threads", "train.steps", "train.tokens")  # and dit's guidance
    for name in names:
        if name not in (*resolved, "dit.label_dropout", "dit.cfg_scale"):
            assert spec_value(spec, name) == dumped[name], name


def spec_value(spec: dict, dotted: str) -> object:
    node: object = spec
    for part in dotted.split("."):
        assert isinstance(node, dict)
        node = node[part]
    return node


def test_yaml_dit_guidance_keys_are_the_ones_the_report_names(tmp_path: Path) -> None:
    """``dit.cfg_scale`` and ``dit.label_dropout`` (the names the report and its method notes
    use) are accepted in a YAML file; the old ``flow`` section is not a config section."""
    path = tmp_path / "c.yaml"
    path.write_text("testbed: dit\ndit:\n  cfg_scale: 2.0\n  label_dropout: 0.2\n")
    cfg = validate_config(load_config_file(path))
    assert (cfg.dit.cfg_scale, cfg.dit.label_dropout) == (2.0, 0.2)
    with pytest.raises(ConfigError, match=r"unknown key 'flow'"):
        validate_config({"testbed": "dit", "flow": {"cfg_scale": 2.0}})
