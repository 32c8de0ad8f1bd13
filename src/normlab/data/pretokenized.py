"""Pre-tokenized sources: a flat ``.bin`` of uint16/uint32 token ids (as nanoGPT's prepare
scripts write them) with a JSON sidecar, or a ``.npy`` of integers (sidecar optional).

The sidecar is ``<file>.json`` (``train.bin.json``) or the file's name with ``.json`` in place of
its suffix (``train.json``)::

    {"dtype": "uint16", "tokenizer": "tokenizer.json", "doc_starts": "docs.npy"}

``dtype`` (``.bin`` only, required): ``uint16`` or ``uint32``, little-endian. ``tokenizer``
(optional): ``"bytes"`` or a path, relative to the sidecar's folder, of a ``tokenizer.json`` or a
tokenizer folder. ``doc_starts`` (optional): the index of each document's first token, a list
or the name of a ``.npy`` next to the sidecar; without it the tokens are one stream, split
into a leading train and trailing validation part. The ids are memory-mapped, never loaded
whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BIN_SUFFIXES = (".bin",)
NPY_SUFFIXES = (".npy",)
BIN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
TOKENS = "tokens"


@dataclass(frozen=True)
class TokenSource:
    """A pre-tokenized file: its path, its ids (memory-mapped), the tokenizer its sidecar names
    (a path resolved against the sidecar's folder, ``"bytes"``, or ``None``), document starts
    or ``None``, and the sidecar's path (``None`` if it has none)."""

    path: Path
    ids: np.ndarray
    tokenizer: str | None
    doc_starts: np.ndarray | None
    sidecar: Path | None


def is_pretokenized(path: Path) -> bool:
    """Whether ``path`` is a ``.bin`` or ``.npy`` file."""
    return path.is_file() and path.suffix.lower() in BIN_SUFFIXES + NPY_SUFFIXES


def find_sidecar(path: Path) -> Path | None:
    """``<file>.json`` if it exists, else ``<stem>.json``, else ``None``."""
    for candidate in (path.with_name(path.name + ".json"), path.with_suffix(".json")):
        if candidate.is_file():
            return candidate
    return None


def read_sidecar(sidecar: Path) -> dict[str, Any]:
    """The sidecar's JSON object; ``ValueError`` naming ``data`` and the file otherwise."""
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"data: the sidecar {str(sidecar)!r} is not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"data: the sidecar {str(sidecar)!r} must hold a JSON object")
    return meta


def open_token_source(path: Path) -> TokenSource:
    """Memory-map a ``.bin`` (its sidecar required) or ``.npy`` (sidecar optional) file.

    Raises ``FileNotFoundError`` naming ``data`` for a ``.bin`` without a sidecar and
    ``ValueError`` naming ``data`` for an unknown dtype, a length that is not a whole number of
    ids, a ``.npy`` that is not a 1-D integer array, or bad ``doc_starts``.
    """
    sidecar = find_sidecar(path)
    meta = read_sidecar(sidecar) if sidecar is not None else {}
    if path.suffix.lower() in BIN_SUFFIXES:
        if sidecar is None:
            raise FileNotFoundError(
                f"data: the token file {str(path)!r} has no sidecar; expected "
                f"{str(path.with_name(path.name + '.json'))!r} with "
                '{"dtype": "uint16" or "uint32", "tokenizer": ...}'
            )
        name = meta.get("dtype")
        if name not in BIN_DTYPES:
            raise ValueError(
                f"data: the sidecar {str(sidecar)!r} names dtype {name!r}; expected "
                f"{' or '.join(BIN_DTYPES)}"
            )
        dtype = BIN_DTYPES[name]
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ValueError(
                f"data: {str(path)!r} holds {size} bytes, not a whole number of {name} ids"
            )
        ids = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)
    else:
        try:
            ids = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ValueError(f"data: {str(path)!r} is not a readable .npy file ({err})") from None
        if ids.ndim != 1 or ids.dtype.kind not in "ui":
            raise ValueError(
                f"data: {str(path)!r} holds a {ids.ndim}-D {ids.dtype} array; expected a 1-D "
                "array of integer token ids"
            )
    tokenizer = meta.get("tokenizer")
    if tokenizer is not None and str(tokenizer) != "bytes" and sidecar is not None:
        tokenizer = str((sidecar.parent / str(tokenizer)).resolve())
    starts = _doc_starts(meta.get("doc_starts"), sidecar, ids.shape[0])
    return TokenSource(path=path, ids=ids, tokenizer=tokenizer, doc_starts=starts, sidecar=sidecar)


def _doc_starts(value: object, sidecar: Path | None, n: int) -> np.ndarray | None:
    if value is None:
        return None
    assert sidecar is not None  # only a sidecar can name document starts
    if isinstance(value, str):
        try:
            starts = np.load(sidecar.parent / value, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ValueError(
                f"data: doc_starts {value!r} of the sidecar {str(sidecar)!r} is not a readable "
                f".npy file ({err})"
            ) from None
    else:
        starts = np.asarray(value)
    if starts.ndim != 1 or starts.dtype.kind not in "ui" or starts.shape[0] == 0:
        raise ValueError(
            f"data: doc_starts of the sidecar {str(sidecar)!r} must be a non-empty list of "
            "integer token indices"
        )
    starts = starts.astype(np.int64)
    if starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= max(n, 1):
        raise ValueError(
            f"data: doc_starts of the sidecar {str(sidecar)!r} must start at 0 and increase "
            f"strictly below the number of tokens ({n})"
        )
    return starts
