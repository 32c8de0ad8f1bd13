"""What the Triton test files share: how they run here, and their child processes.

The kernels run in this process only on a GPU or under ``TRITON_INTERPRET=1`` set before triton
was imported (see tests/kernels/test_triton_kernels.py); otherwise each file re-runs its tests in a
fresh interpreter process, and compiles kernels for CUDA ahead of time in another.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
IN_PROCESS = INTERPRET or torch.cuda.is_available()
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
REPO_ROOT = Path(__file__).resolve().parents[2]
SKIPPED = 3
"""Exit status of a compile script that cannot compile for NVIDIA here."""


def run_python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def run_under_interpreter(test_file: str, select: str) -> None:
    """Run the tests of ``test_file`` that ``-k select`` picks in a fresh pytest process with
    ``TRITON_INTERPRET=1``; fail with its output unless they all pass."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTEST_ADDOPTS": ""}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = run_python(
        ["-m", "pytest", str(Path(test_file).resolve()), "-q", "-p", "no:cacheprovider",
         "-k", select],
        env,
    )  # fmt: skip
    assert proc.returncode == 0, f"inner run failed:\n{proc.stdout[-20000:]}\n{proc.stderr[-5000:]}"
    assert " passed" in proc.stdout, proc.stdout[-5000:]


def run_compile_script(test_file: str, flag: str) -> None:
    """Run ``python test_file flag`` without the interpreter (a compile for CUDA, no GPU
    needed): skip when it exits :data:`SKIPPED`, fail with its output on any other failure."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = run_python([str(Path(test_file).resolve()), flag], env)
    if proc.returncode == SKIPPED:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, f"{proc.stdout[-10000:]}\n{proc.stderr[-10000:]}"


def nvidia_compile_unavailable() -> str | None:
    """None when this Triton can compile for NVIDIA ahead of time, else why not."""
    try:
        from triton.backends import backends
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError as err:
        return f"this Triton cannot compile ahead of time: {err}"
    if "nvidia" not in backends:
        return "this Triton has no NVIDIA backend"
    return None
