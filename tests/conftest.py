"""Shared fixtures, and the markers of the test folders.

Each test gets the marker of its folder (``kernels``, ``layers``, ``compare``, ``audit``,
``patching``, ``bench``, ``faults``); ``core`` marks kernels, layers and the top-level tests.

``backend`` runs a test once per backend that runs on the CPU here
(:func:`normlab.kernels.backends_for`), so a backend registered later joins every
backend-parametrised test without editing any test.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import pytest
import torch
import yaml

import normlab  # noqa: F401  (imports the kernels package, which registers the backends)
from normlab.kernels import backend_unavailable_reason, backends_for

# Two CPU cores are shared by the pytest-xdist workers: one intra-op thread each.
torch.set_num_threads(1)

CPU_BACKENDS: list[str] = backends_for("cpu")

TESTS = Path(__file__).resolve().parent
FOLDER_MARKERS = ("kernels", "layers", "compare", "audit", "patching", "bench", "faults")
"""Test folders under tests/, each its own marker (registered in pyproject.toml)."""
CORE_FOLDERS = ("kernels", "layers")
"""Folders that, with the top-level tests, make the ``core`` marker."""


def folder_markers(path: Path) -> list[str]:
    """The markers of a test file at ``path``: its folder's under tests/, plus ``core`` for
    kernels, layers and the files directly in tests/; none outside tests/."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return []
    if len(parts) == 1:
        return ["core"]
    folder = parts[0]
    markers = [folder] if folder in FOLDER_MARKERS else []
    return [*markers, "core"] if folder in CORE_FOLDERS else markers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its folder (see :func:`folder_markers`)."""
    for item in items:
        for name in folder_markers(item.path):
            item.add_marker(name)


def pytest_configure(config: pytest.Config) -> None:
    # torch.compile's cache in a folder of this session's own (the workers and the runs they
    # start inherit it): a file that an earlier, killed process left half-written in the
    # machine's shared cache must not fail a test ("file too short").
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="normlab-tests-inductor-")
    # torch.compile's own internals call a deprecated torch.jit helper; not ours to fix.
    config.addinivalue_line(
        "filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
    )
    # torch.nn.RMSNorm says so when the tests feed it 16-bit input with a float32 weight on
    # purpose (to compare against it); it warns once per process, so no single test owns it.
    config.addinivalue_line(
        "filterwarnings", "ignore:Mismatch dtype between input and weight:UserWarning"
    )


@pytest.fixture(params=CPU_BACKENDS, scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The name of a backend that runs on the CPU (session-scoped, so hypothesis can use it).

    A registered backend that cannot run in this process (the C++ kernels with no compiler) is
    skipped with its reason, found when its first test runs rather than at collection."""
    reason = backend_unavailable_reason(request.param)
    if reason is not None:
        pytest.skip(f"backend {request.param!r} unavailable: {reason}")
    return request.param


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A CPU generator seeded from the test's id: the same inputs on every run and worker."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


TINY_COMPARE = {
    "threads": 1,
    "seeds": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"steps": 2, "batch_size": 2, "eval_interval": 2, "eval_windows": 4, "warmup": 1},
}
"""A GPT compare config that trains in a second (one seed, two steps)."""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """:data:`TINY_COMPARE` as a YAML file (a test module may define its own ``config``)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY_COMPARE))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small text corpus for ``--data`` (a test module may define its own ``corpus``)."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(300)))
    return path
