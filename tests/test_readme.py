"""The README's Python usage runs as written, and its tolerance table is the one the tests use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_python_usage_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    assert "rmsnorm" in capsys.readouterr().out  # print(normlab.available_norms())


def test_readme_tolerance_table_matches_the_tests() -> None:
    from test_functional_matrix import TOL

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Testing") :]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and isinstance(getattr(torch, cells[0], None), torch.dtype):
            rows[getattr(torch, cells[0])] = (float(cells[1].split()[0]), float(cells[2]))
    assert rows == TOL
