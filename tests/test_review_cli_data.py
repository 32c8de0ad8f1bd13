"""Review fixes of the command line and the experiment config: at least two arms, a warm-up
shorter than the run, a --out that is new, empty or a compare folder, --data checked before the
folder's cache, help text that rewraps at any width, and ``normlab --version``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.main
from rich.cells import cell_len
from typer.testing import CliRunner

import normlab
from normlab.cli import app
from normlab.cli.compare_cmd import EXIT_BAD_CONFIG, EXIT_REFUSED
from normlab.data import prepare_tokens
from normlab.experiment import ConfigError, validate_config
from normlab.experiment.runner import check_out_contents, foreign_entries
from normlab.experiment.schedule import lr_at


def invoke(*args: str, columns: int | None = None) -> tuple[int, str]:
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
    code, output = invoke(
        "compare", "--config", str(config), "--norms", "layernorm", "--out", str(out)
    )
    assert code == EXIT_BAD_CONFIG == 2, output
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
    code, output = invoke("compare", "--config", str(config), "--warmup", "2", "--out", str(out))
    assert code == EXIT_BAD_CONFIG, output
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
    code, output = invoke(
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
    (out / "experiment.json").write_text("{}")  # a compare folder: resumable, whatever it holds
    check_out_contents(out)


# --- --data is checked before the folder's cache -------------------------------------------------


def test_missing_data_is_named_even_with_an_old_cache(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_tokens(out / "data", None, max_bytes=200_000)  # a stdlib cache, as a compare leaves
    (out / "experiment.json").write_text("{}")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    missing = tmp_path / "nonexistent"
    code, output = invoke(
        "compare", "--config", str(config), "--data", str(missing), "--out", str(out), columns=1000
    )
    assert code == EXIT_REFUSED, output
    assert f"data: no such file or folder '{missing}'" in " ".join(output.split())
    assert "was built with" not in output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"} == {
        p: t for p, t in before.items() if p.name != ".lock"
    }


# --- help text rewraps; --version ----------------------------------------------------------------


def _commands() -> list[tuple[str, str]]:
    """(command path, help text) of every command and group of the CLI."""
    found = []

    def walk(cmd: object, path: str) -> None:
        found.append((path, getattr(cmd, "help", None) or ""))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "normlab")
    return found


def test_help_paragraphs_have_no_hard_line_breaks() -> None:
    """Typer's rich help keeps single line breaks inside a paragraph, which splits sentences
    mid-line at any terminal width; every paragraph must be one line."""
    for path, text in _commands():
        for paragraph in text.strip().split("\n\n"):
            assert "\n" not in paragraph.strip(), f"{path}: {paragraph!r}"


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (("--help",), "flow-matching DiT) with each norm on the same data"),
        (("audit", "--help"), "where each sits (pre/post/sandwich, final) and its conditioning"),
        (("compare", "--help"), "on this Python's own standard-library source."),
    ],
)
def test_help_sentences_flow_at_a_wide_terminal(args: tuple[str, ...], sentence: str) -> None:
    code, output = invoke(*args, columns=200)
    assert code == 0 and sentence in output, output


def test_every_help_renders_at_80_columns() -> None:
    for path, _ in _commands():
        code, output = invoke(*path.split()[1:], "--help", columns=80)
        assert code == 0, (path, output)
        assert max(cell_len(line) for line in output.splitlines()) <= 80, path


def test_version() -> None:
    code, output = invoke("--version")
    assert code == 0 and output == f"normlab {normlab.__version__}"
    assert json.dumps(normlab.__version__)  # a plain string
