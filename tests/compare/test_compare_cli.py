"""``normlab compare`` through the command line: config validation, flags, a tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.compare_options import parse_seeds
from normlab.cli.errors import EXIT_REFUSED, EXIT_USAGE
from normlab.experiment.config import ConfigError, load_config_file, validate_config
from normlab.experiment.execution.lock import OutputLock
from normlab.experiment.execution.runner import check_out_contents, foreign_entries
from normlab.experiment.training.schedule import lr_at
from normlab.study.loader import build_config_dict, study_configs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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


def test_the_ladder_example_keeps_its_study_keys_at_the_top_level() -> None:
    """examples/ladder.yaml holds ``ladder:`` beside the experiment's keys: the study's loader
    splits it off, and one compare's config refuses it as none of its keys."""
    data = load_config_file(EXAMPLES / "ladder.yaml")
    loaded = study_configs(data)
    assert loaded.ladder is not None and loaded.ladder.config is loaded.config
    assert (loaded.ladder.key, list(loaded.ladder.values)) == next(iter(data["ladder"].items()))
    with pytest.raises(ConfigError, match=r"unknown key 'ladder'"):
        validate_config(data)


def test_default_example_is_the_default() -> None:
    assert validate_config(load_config_file(EXAMPLES / "default.yaml")) == validate_config({})


def test_dit_example_is_the_dit_default() -> None:
    dit = validate_config(load_config_file(EXAMPLES / "dit.yaml"))
    assert dit == validate_config({"testbed": "dit"})


# ----------------------------------------------------------------------------------------------
# Found in review: two arms at least, a warm-up shorter than the run, a new or compare --out
# ----------------------------------------------------------------------------------------------
def invoke_cli(*args: str, columns: int | None = None) -> tuple[int, str]:
    """Exit code and output (line breaks folded to spaces unless ``columns`` is given)."""
    env = {"COLUMNS": str(columns)} if columns else None
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    output = result.output if columns else " ".join(result.output.split())
    return result.exit_code, output


# --- 1 arm: refused up front ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "hint"),
    [
        ({"norms": ["layernorm"]}, "--placements"),
        ({"norms": ["rmsnorm"], "placements": ["post"]}, "--norms"),
        ({"testbed": "dit", "norms": ["adarms"]}, "the dit testbed is pre-norm only"),
    ],
)
def test_a_single_arm_is_an_invalid_config(data: dict, hint: str) -> None:
    with pytest.raises(ConfigError, match="norms, placements") as info:
        validate_config(data)
    message = str(info.value)
    assert "at least two arms" in message and hint in message
    # two arms from either factor are fine
    assert len(validate_config({"norms": ["layernorm"], "placements": ["pre", "post"]}).arms()) == 2
    assert len(validate_config({"norms": ["layernorm", "rmsnorm"]}).arms()) == 2


def test_compare_with_one_norm_exits_2_before_any_work(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = invoke_cli(
        "compare", "--config", str(config), "--norms", "layernorm", "--out", str(out)
    )
    assert code == EXIT_USAGE == 2, output
    assert "norms, placements" in output and "at least two arms" in output
    assert "Keep" not in output and not out.exists()


# --- warm-up against steps -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("train", "shown"),
    [
        ({"steps": 10, "warmup": 30}, "train.steps = 10"),
        ({"steps": 10, "warmup": 10}, "train.steps = 10"),
        ({"tokens": 1024, "warmup": 5}, "train.steps = 1 (from train.tokens = 1024)"),
    ],
)
def test_warmup_not_shorter_than_the_run_is_refused(train: dict, shown: str) -> None:
    with pytest.raises(ConfigError, match=r"train\.warmup") as info:
        validate_config({"train": train})
    assert shown in str(info.value) and "expected train.warmup < train.steps" in str(info.value)


def test_a_valid_warmup_reaches_the_peak_then_decays() -> None:
    """What the check guarantees, by :func:`lr_at`: a warm-up ends on the peak, and the cosine
    decay still ends on min_lr_ratio · peak at the last step."""
    for steps, warmup in ((10, 9), (10, 0), (1, 0), (31, 30), (600, 30)):
        t = validate_config({"train": {"steps": steps, "warmup": warmup}}).train
        if warmup:
            assert lr_at(warmup, t.lr, steps, warmup, t.min_lr_ratio) == pytest.approx(t.lr)
        last = lr_at(steps, t.lr, steps, warmup, t.min_lr_ratio)
        assert last == pytest.approx(t.lr * t.min_lr_ratio)


def test_compare_warmup_flag_is_checked(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = invoke_cli(
        "compare", "--config", str(config), "--warmup", "2", "--out", str(out)
    )
    assert code == EXIT_USAGE, output
    assert "train.warmup: 2 warm-up steps with train.steps = 2" in output
    assert not out.exists()


# --- --out: new, empty, or a compare folder ------------------------------------------------------
def test_out_with_foreign_files_is_refused_untouched(
    config: Path, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    out.mkdir()
    (out / "report.html").write_text("<p>mine</p>")
    (out / "notes.txt").write_text("mine")
    code, output = invoke_cli(
        "compare", "--config", str(config), "--data", str(corpus), "--out", str(out), columns=1000
    )
    output = " ".join(output.split())
    assert code == EXIT_REFUSED, output
    assert f"out: '{out}' is not empty and is not the folder of a normlab compare" in output
    assert "'notes.txt', 'report.html'" in output and "Nothing was written" in output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.html"]  # no .lock
    assert (out / "report.html").read_text() == "<p>mine</p>"


def test_what_a_compare_leaves_before_experiment_json_is_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    check_out_contents(out)  # missing: fine
    out.mkdir()
    check_out_contents(out)  # empty: fine
    (out / ".lock").touch()
    (out / "data").mkdir()
    for name in ("data.json", "tokens.u8", ".tokens.u8.abc123.tmp"):
        (out / "data" / name).touch()
    assert foreign_entries(out) == []
    (out / "data" / "my_corpus.txt").touch()
    assert foreign_entries(out) == ["data/my_corpus.txt"]
    with pytest.raises(ValueError, match=r"out: .* it holds .data/my_corpus\.txt."):
        check_out_contents(out)
    # a compare folder: not foreign (its shape is checked by check_experiment_file, later)
    (out / "experiment.json").write_text("{}")
    check_out_contents(out)
