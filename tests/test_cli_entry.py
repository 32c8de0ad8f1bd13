"""The command line is reachable as ``python -m normlab``, and the GPU check script parses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
