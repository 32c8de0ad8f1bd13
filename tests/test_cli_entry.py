"""The command line is reachable as ``python -m normlab``, and the GPU check script parses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import typer.main
from rich.cells import cell_len
from typer.testing import CliRunner

import normlab
from normlab._version import _read_version, source_commit
from normlab.cli import app

ROOT = Path(__file__).resolve().parents[1]


def test_python_dash_m_normlab_lists_the_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "normlab", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("compare", "report", "bench", "audit", "explain"):
        assert command in done.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_script_is_valid_bash() -> None:
    script = ROOT / "benchmarks" / "gpu-check.sh"
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_version_is_the_package_metadata() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "normlab", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"normlab {metadata.version('normlab')}"
    assert normlab.__version__ == metadata.version("normlab")


@pytest.mark.skipif(
    Path(normlab.__file__).resolve().parents[2] != ROOT, reason="normlab is not this source tree"
)
def test_version_without_metadata_is_the_source_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert _read_version() == pyproject["project"]["version"]


@pytest.mark.skipif(
    Path(normlab.__file__).resolve().parents[2] != ROOT or shutil.which("git") is None,
    reason="normlab is not this source tree, or no git",
)
def test_source_commit_is_the_checkouts_head(monkeypatch: pytest.MonkeyPatch) -> None:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD")
    if not head:
        pytest.skip("this source tree is not a git checkout")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    assert source_commit() == (f"{head}-dirty" if dirty else head)

    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert source_commit() == "unknown"


# ----------------------------------------------------------------------------------------------
# Found in review: help text that rewraps at any width; normlab --version
# ----------------------------------------------------------------------------------------------
def invoke(*args: str, columns: int | None = None) -> tuple[int, str]:
    """Exit code and output (line breaks folded to spaces unless ``columns`` is given)."""
    env = {"COLUMNS": str(columns)} if columns else None
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    output = result.output if columns else " ".join(result.output.split())
    return result.exit_code, output


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
