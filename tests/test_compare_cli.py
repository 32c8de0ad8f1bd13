"""``normlab compare`` through the command line: config validation, flags, a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.compare_cmd import build_config_dict, parse_seeds
from normlab.experiment import ConfigError, OutputLock, load_config_file, validate_config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 4, "warmup": 1},
    "data": {"max_bytes": 300_000},
}


def write_yaml(path: Path, data: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.output


def test_tiny_compare_end_to_end(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    out = tmp_path / "out"
    code, output = invoke(
        "--config", str(config), "--seeds", "2", "--steps", "4", "--out", str(out)
    )
    assert code == 0, output
    assert "4 finished" in output
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["layernorm-pre__s0", "layernorm-pre__s1", "rmsnorm-pre__s0", "rmsnorm-pre__s1"]
    for run in runs:
        summary = json.loads((out / "runs" / run / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 4
    experiment = json.loads((out / "experiment.json").read_text())
    assert experiment["seeds"] == [0, 1] and experiment["config"]["train"]["steps"] == 4
    assert (out / "data" / "tokens.u8").stat().st_size == (
        experiment["data"]["n_train_tokens"] + experiment["data"]["n_val_tokens"]
    )
    try:
        import normlab.report  # noqa: F401
    except ImportError:
        return
    assert (out / "report.md").exists() and (out / "report.html").exists()
    assert (out / "summary.json").exists() and (out / "runs.csv").exists()


def test_unknown_key_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "bad.yaml", {"train": {"lrr": 0.1}})
    code, output = invoke("--config", str(config), "--out", str(tmp_path / "out"))
    assert code == 2
    assert "unknown key 'train.lrr'" in output
    assert "valid keys of train:" in output and "batch_size" in output and "lr," in output
    assert not (tmp_path / "out").exists()


def test_wrong_type_and_unknown_top_level_key(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "bad.yaml", {"train": {"lr": "fast"}, "nroms": ["x"]})
    code, output = invoke("--config", str(config), "--out", str(tmp_path / "out"))
    assert code == 2
    assert "train.lr" in output and "'fast'" in output
    assert "unknown key 'nroms'" in output and "norms" in output
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        validate_config({"model": {"d_model": "big"}})
    with pytest.raises(ConfigError, match="norms: unknown norm 'batchnorm'"):
        validate_config({"norms": ["batchnorm"]})


def test_flags_override_the_file(tmp_path: Path) -> None:
    config = write_yaml(
        tmp_path / "exp.yaml",
        {
            "norms": ["layernorm"],
            "placements": ["pre", "post"],
            "train": {"lr": 0.1, "steps": 50},
            "seeds": 5,
        },
    )
    cfg = validate_config(
        build_config_dict(config, {"train.lr": 0.01, "norms": ["rmsnorm", "dyt"], "seeds": None})
    )
    assert cfg.train.lr == 0.01 and cfg.norms == ["rmsnorm", "dyt"] and cfg.seeds == 5
    assert cfg.train.steps == 50
    by_tokens = validate_config(build_config_dict(config, {"train.tokens": 100_000}))
    assert by_tokens.train.steps is None
    per_step = by_tokens.train.batch_size * by_tokens.model.context
    assert by_tokens.resolved_steps() == -(-100_000 // per_step)


def test_seeds_flag() -> None:
    assert parse_seeds("3") == 3
    assert parse_seeds("0,4,7") == [0, 4, 7]
    assert parse_seeds(None) is None
    code, output = invoke("--seeds", "three")
    assert code == 2 and "--seeds" in output


def test_locked_folder_is_a_clear_error(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "tiny.yaml", TINY)
    out = tmp_path / "out"
    with OutputLock(out):
        code, output = invoke("--config", str(config), "--out", str(out))
    assert code == 1 and "another normlab command" in output


@pytest.mark.parametrize(
    "name", ["default.yaml", "postln_high_lr.yaml", "rmsnorm_gemma_dyt.yaml", "dit.yaml"]
)
def test_examples_are_valid(name: str) -> None:
    cfg = validate_config(load_config_file(EXAMPLES / name))
    assert cfg.arm_names()


def test_default_example_is_the_default() -> None:
    assert validate_config(load_config_file(EXAMPLES / "default.yaml")) == validate_config({})


def test_dit_example_is_the_dit_default() -> None:
    dit = validate_config(load_config_file(EXAMPLES / "dit.yaml"))
    assert dit == validate_config({"testbed": "dit"})
