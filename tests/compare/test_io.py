"""normlab._io: atomic writes never leave a half-written or missing file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from normlab._io import append_jsonl, read_jsonl, write_json_atomic, write_text_atomic


def test_write_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.json"
    write_json_atomic(target, {"v": 1})
    write_json_atomic(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def test_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    write_json_atomic(target, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"v": object()})  # not serialisable: fails mid-write
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_files_get_the_usual_mode(tmp_path: Path) -> None:
    target = write_text_atomic(tmp_path / "r.md", "x")
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_non_finite_floats_become_null(tmp_path: Path) -> None:
    target = write_json_atomic(tmp_path / "s.json", {"a": float("nan"), "b": [float("inf"), 1.5]})
    assert json.loads(target.read_text()) == {"a": None, "b": [None, 1.5]}


def test_jsonl_skips_a_truncated_last_line(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    append_jsonl(log, {"step": 1, "loss": 2.0})
    append_jsonl(log, {"step": 2, "loss": float("nan")})
    with open(log, "a") as f:
        f.write('{"step": 3, "lo')  # a crash mid-line
    assert read_jsonl(log) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": None}]
