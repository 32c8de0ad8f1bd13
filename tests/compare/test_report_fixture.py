"""The stored compare-folder fixture is exactly what its generator script writes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_compare_fixture", FIXTURES / "make_compare_fixture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_fixture_is_reproducible_and_small(tmp_path):
    _generator().main(tmp_path / "compare_run")
    stored = _files(FIXTURES / "compare_run")
    fresh = _files(tmp_path / "compare_run")
    assert sorted(fresh) == sorted(stored)
    changed = [name for name in stored if stored[name] != fresh[name]]
    assert not changed, (
        f"{changed} differ from tests/compare/fixtures/make_compare_fixture.py's output; "
        "regenerate with 'python tests/compare/fixtures/make_compare_fixture.py' if the change "
        "is intended"
    )
    assert sum(len(b) for b in stored.values()) < 300_000
    anomalies = sum(
        data.count(b'"type": "anomaly"') for name, data in stored.items() if "metrics" in name
    )
    assert anomalies == 1
