"""Fixtures of the fault-injection suite; the helpers are in :mod:`faultlib`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faultlib import STARTED, make_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small text corpus for ``--data``."""
    return make_corpus(tmp_path)


@pytest.fixture(autouse=True)
def _kill_leftovers() -> Iterator[None]:
    """A test that fails half-way leaves no ``normlab`` process running."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
