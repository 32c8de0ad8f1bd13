"""Fixtures of the fault-injection suite; the helpers are in :mod:`faultlib`."""

from __future__ import annotations

from pathlib import Path

import pytest
from faultlib import make_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small text corpus for ``--data``."""
    return make_corpus(tmp_path)
