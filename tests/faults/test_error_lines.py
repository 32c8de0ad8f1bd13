"""Every command's error is one line on standard error, whatever the terminal's width, and
standard output keeps only results: ``normlab <command>: error: <message>``, typer's own usage
errors included, so that a script can tell errors from results and read each error whole."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from faultlib import cli_env, normlab_args
from typer.testing import CliRunner

from normlab.cli import app

NARROW = {"COLUMNS": "40", "NO_COLOR": "1"}
"""A terminal narrower than every message below: nothing may wrap at its width."""


def _cases(tmp: Path) -> list[tuple[list[str], int, str]]:
    """(arguments, exit status, start of the error line) of an error of every command."""
    a_file = tmp / "a_file"
    a_file.write_text("keep me")
    return [
        (["compare", "--seeds", "x"], 2, "normlab compare: error: Invalid value for --seeds:"),
        (
            ["compare", "--lr", "-1", "--out", str(tmp / "o1")],
            2,
            "normlab compare: error: invalid experiment config: train.lr: Input should be",
        ),
        (["compare", "--out", str(a_file)], 1, f"normlab compare: error: out: '{a_file}' exists"),
        (
            ["compare", "--run", "r0", "--seeds", "2", "--out", str(tmp / "o2")],
            2,
            "normlab compare: error: --run: trains a planned run",
        ),
        (["report", str(tmp / "missing")], 1, "normlab report: error: "),
        (["bench", "--dims", "0"], 2, "normlab bench: error: Invalid value for --dims:"),
        (["audit", "norm", "nope"], 2, "normlab audit norm: error: Invalid value for TARGET:"),
        (
            ["audit", "model", "hf:llama", "--model-set", "hidden_size=abc"],
            2,
            "normlab audit model: error: Invalid value for --model-set: hidden_size='abc': "
            "expected an integer",
        ),
        (
            ["audit", "model", "nope"],
            2,
            "normlab audit model: error: Invalid value for TARGET: 'nope' is neither a testbed",
        ),
        (
            ["coord-check", "--ladder", "d_model=32", "--out", str(tmp / "o3")],
            2,
            "normlab coord-check: error: ",
        ),
        (["explain", "1", "2", "--eps", "-1"], 2, "normlab explain: error: Invalid value: eps:"),
        (["--no-such-option"], 2, "normlab: error: No such option: --no-such-option"),
    ]


def test_every_command_prints_its_error_as_one_line_on_stderr(tmp_path: Path) -> None:
    for args, code, start in _cases(tmp_path):
        result = CliRunner().invoke(app, args, env=NARROW)
        assert not isinstance(result.exception, (AssertionError, TypeError)), result.exception
        assert result.exit_code == code, (args, result.output)
        assert "error" not in result.stdout.lower(), (args, result.stdout)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), (args, result.stderr)
        assert "Traceback" not in result.output and "╭" not in result.output, result.output


@pytest.mark.parametrize(
    ("args", "code", "start"),
    [
        (
            ["compare", "--lr", "-1", "--norms", "rmsnorm,x"],
            2,
            "normlab compare: error: invalid experiment config: norms: unknown norm 'x'; ",
        ),
        (["audit", "norm", "nope"], 2, "normlab audit norm: error: Invalid value for TARGET:"),
    ],
)
def test_a_piped_error_is_one_line_at_40_columns(
    tmp_path: Path, args: list[str], code: int, start: str
) -> None:
    """A real process with its output piped and ``COLUMNS=40``: stderr holds exactly the one
    error line (however long), stdout nothing."""
    done = subprocess.run(
        normlab_args(*args, *(["--out", str(tmp_path / "o")] if args[0] == "compare" else [])),
        env={**cli_env(), **NARROW},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert done.stdout == "", done.stdout
    lines = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith(start), done.stderr
    assert len(lines[0]) > 40 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "o").exists()
