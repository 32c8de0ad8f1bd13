"""The command line is reachable as ``python -m normlab``, and the GPU check script parses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import normlab

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
    assert normlab._read_version() == pyproject["project"]["version"]
