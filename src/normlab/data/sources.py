"""Where the bytes come from: the interpreter's own standard library, or the user's text files.

The default corpus is the running Python's standard-library source: every ``*.py`` file under
``sysconfig.get_paths()["stdlib"]``, except those inside test folders, ``site-packages`` and
``pydoc_data`` (one generated 0.7 MB string of English help text, not source code), in sorted
order of relative path. Nothing is downloaded.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}
)
BINARY_PROBE_BYTES = 8192


@dataclass(frozen=True)
class SourceFile:
    """One file of the corpus: its path relative to the corpus root, and its bytes."""

    rel_path: str
    data: bytes


def stdlib_root() -> Path:
    """The standard-library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_stdlib_files(root: Path | None = None) -> list[Path]:
    """The stdlib's ``*.py`` files outside the :data:`EXCLUDED_DIRS`, sorted by relative POSIX
    path."""
    root = stdlib_root() if root is None else Path(root)
    found = []
    for path in root.rglob("*.py"):
        folders = path.relative_to(root).parts[:-1]
        if any(f in EXCLUDED_DIRS for f in folders):
            continue
        if path.is_file():
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def looks_binary(path: Path) -> bool:
    """Whether the file's first bytes contain a NUL byte (text files never do)."""
    with open(path, "rb") as f:
        return b"\0" in f.read(BINARY_PROBE_BYTES)


def list_text_files(folder: Path) -> list[Path]:
    """Regular, non-hidden, non-binary files under ``folder`` (recursively), sorted by relative
    path."""
    folder = Path(folder)
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        if not looks_binary(path):
            found.append(path)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def read_head(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of the file at ``path`` (all of it if it is shorter); never
    reads more than ``limit`` bytes into memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size  # read(n) allocates n bytes up front
        return f.read(min(limit, size + 1) if size else limit)


def read_files(root: Path, paths: list[Path], max_bytes: int) -> tuple[list[SourceFile], bool]:
    """Read files in the given order, at most ``max_bytes`` bytes in all.

    Later files are read whole until the next one would pass ``max_bytes``; the first file is
    truncated to ``max_bytes`` if it is longer (as a single-file corpus is), so a corpus is never
    empty and never over the cap. Returns the files read and whether the cap left something out
    (a file, or the end of the first one). Never holds more than ``max_bytes + 1`` bytes of
    file data.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes: expected an int >= 1, got {max_bytes!r}")
    files: list[SourceFile] = []
    total = 0
    for path in paths:
        room = max_bytes - total
        data = read_head(path, room + 1)  # one byte past the room tells whether the file fits
        if len(data) > room:
            if not files:
                files.append(SourceFile(Path(path).relative_to(root).as_posix(), data[:room]))
            return files, True
        files.append(SourceFile(Path(path).relative_to(root).as_posix(), data))
        total += len(data)
    return files, False
