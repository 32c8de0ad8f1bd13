"""Atomic file writing: write to a temporary name in the same folder, fsync, rename into place.

A reader never sees a half-written file, and a crash leaves the previous version intact.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _atomic(path: str | os.PathLike[str], mode: str, write: Callable[[IO[Any]], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return _atomic(path, "wb", lambda f: f.write(data))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def json_text(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as JSON text ending in a newline; non-finite floats become null."""
    return json.dumps(_finite(obj), indent=indent, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (non-finite floats as null) to ``path`` atomically."""
    return write_text_atomic(path, json_text(obj, indent))


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one JSON line and flush it; non-finite floats are written as null.

    A line is written with a single ``write`` call so a crash can at worst leave one partial last
    line, which :func:`read_jsonl` skips.
    """
    line = json.dumps(_finite(record), allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON value in the file ``path``. Raises ``ValueError`` naming the file when it is
    not UTF-8 or not valid JSON (``json``'s own message names only a line and column);
    ``OSError`` as ``open`` does."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{str(path)!r} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
            f"{err.start}); expected a JSON file"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{str(path)!r} is not valid JSON ({err.msg} at line {err.lineno}, column "
            f"{err.colno}); it may be truncated or damaged"
        ) from None


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`read_json`, and a ``ValueError`` naming the file unless it holds an object."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(
            f"{str(path)!r} holds a JSON {type(value).__name__}; expected an object ({{...}})"
        )
    return value


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSON-lines file of objects, skipping an unterminated final line (what a crash
    while appending leaves, see :func:`append_jsonl`). Any other line that is not a JSON object
    (garbage, a non-UTF-8 byte, a complete but invalid line) raises ``ValueError`` naming the
    file and line, instead of being dropped silently."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    records = []
    last = len(lines) - 1  # the text after the last newline: empty, or an unfinished line
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if number - 1 == last:
                continue
            reason = "not UTF-8" if isinstance(err, UnicodeDecodeError) else "not valid JSON"
            raise ValueError(
                f"{str(path)!r}, line {number}: {reason}; the file is damaged"
            ) from None
        if not isinstance(record, dict):
            if number - 1 == last:
                continue
            raise ValueError(
                f"{str(path)!r}, line {number}: a JSON {type(record).__name__}, expected an "
                "object; the file is damaged"
            )
        records.append(record)
    return records


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
