"""Content hashes of a token cache's files, recorded in ``data.json`` and checked before use.

A cache's fingerprint names the corpus it was made from; it is a string in ``data.json`` and
proves nothing about the bytes now on disk. :func:`cache_hashes` hashes the files themselves
(sha256) when the cache is written; :func:`cache_problem` hashes them again
before the cache is reused (:func:`normlab.data.cache.prepare_tokens`, which then rebuilds it)
or mapped by a run (:func:`normlab.data.cache.load_tokens`, which refuses it). Hashing the
default 11 MB byte cache takes 16–22 ms on one core of the development machine, whose CPU has
SHA extensions (blake2b measured 25–50 ms there, xxhash is not a dependency), once per compare
and once per run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

HASHES_KEY = "content_hashes"
"""The key of ``data.json`` holding {file name: content hash} for the cache's files."""
_BLOCK = 1 << 22


def content_hash(path: Path) -> str:
    """``sha256:`` + the 64 hex digits of sha256(file content)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return "sha256:" + h.hexdigest()


def cache_files(info: dict[str, Any], default_tokens_file: str) -> list[str]:
    """The names of the cache files ``info`` (a ``data.json``) describes: the token file and,
    for a tokenizer other than bytes, the byte-count file."""
    names = [str(info.get("tokens_file") or default_tokens_file)]
    if info.get("token_bytes_file"):
        names.append(str(info["token_bytes_file"]))
    return names


def cache_hashes(data_dir: Path, names: list[str]) -> dict[str, str]:
    """{name: :func:`content_hash`} for the files ``names`` in ``data_dir``."""
    return {name: content_hash(Path(data_dir) / name) for name in names}


def cache_problem(data_dir: Path, info: dict[str, Any], default_tokens_file: str) -> str | None:
    """What is wrong with the cache files in ``data_dir`` against ``info``'s content hashes, or
    ``None`` if each file is there and hashes as recorded. A ``data.json`` without hashes (made
    before they were recorded) is a problem too: its files cannot be vouched for."""
    recorded = info.get(HASHES_KEY)
    if not isinstance(recorded, dict):
        return f"its {HASHES_KEY} are not recorded"
    for name in cache_files(info, default_tokens_file):
        path = Path(data_dir) / name
        if not path.is_file():
            return f"{name} is missing"
        found = content_hash(path)
        if recorded.get(name) != found:
            return f"{name} hashes as {found}, data.json records {recorded.get(name)}"
    return None
