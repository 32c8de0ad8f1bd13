"""The token cache of an output folder: ``data/tokens.u8`` (train bytes, then validation bytes)
and ``data/data.json``, built once and memory-mapped by every run.

With the default byte tokenizer on the standard library, a text file or a folder, tokens are
bytes (vocabulary 256), so the cache is the corpus itself, split by file. Any other source
format or tokenizer goes through :func:`normlab.data.token_cache.prepare_token_cache`, whose
cache also holds each token's UTF-8 byte count; :func:`load_tokens` maps either kind.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from normlab._io import read_json_object, write_bytes_atomic, write_json_atomic
from normlab.data.documents import FOLDER, TEXT
from normlab.data.sources import (
    BINARY_PROBE_BYTES,
    SourceFile,
    list_stdlib_files,
    list_text_files,
    looks_binary,
    read_files,
    read_head,
    stdlib_root,
)
from normlab.data.split import check_val_fraction, split_by_file, split_single
from normlab.data.token_cache import BYTES_DTYPE, prepare_token_cache, source_format
from normlab.data.tokenizer import BYTES
from normlab.data.verify import HASHES_KEY, cache_problem, content_hash
from normlab.run_format import DATA_INFO_FILE as INFO_FILE
from normlab.run_format import TOKENS_FILE

STDLIB = "stdlib"
DEFAULT_MAX_BYTES = 16 * 2**20
DEFAULT_VAL_FRACTION = 0.05
VOCAB_SIZE = 256


@dataclass(frozen=True)
class TokenData:
    """Memory-mapped train and validation tokens, and the cache's ``data.json``.

    ``train_bytes``/``val_bytes``: the UTF-8 bytes each token covers (memory-mapped uint16), or
    ``None`` for the byte tokenizer (every token is one byte). ``vocab_size``: 256 for bytes.
    """

    train: np.ndarray
    val: np.ndarray
    info: dict[str, Any]
    train_bytes: np.ndarray | None = None
    val_bytes: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size (``data.json``'s ``vocab_size``; 256 for bytes)."""
        return int(self.info.get("vocab_size", VOCAB_SIZE))


def fingerprint(train: bytes, val: bytes) -> str:
    """``sha256:`` + first 16 hex digits of sha256(len(train) ‖ train ‖ val)."""
    h = hashlib.sha256(len(train).to_bytes(8, "little"))
    h.update(train)
    h.update(val)
    return "sha256:" + h.hexdigest()[:16]


def resolve_source(source: str | Path) -> Path:
    """The absolute path of a user source: ``~`` expanded, then symlinks and ``..`` resolved.

    :func:`read_corpus` reads this path and :func:`request_key` records it, so both must agree.
    """
    return Path(source).expanduser().resolve()


def check_source(source: str | Path | None) -> Path | None:
    """Check that a user source exists and can be read; returns its :func:`resolve_source` path,
    or ``None`` for the standard library (``None`` or ``"stdlib"``).

    Raises ``ValueError`` naming ``data`` if the path does not exist, is neither a regular file
    nor a folder, or cannot be read (a folder must also be listable). Reads no file content.
    """
    if source is None or str(source) == STDLIB:
        return None
    expected = "expected a text file or a folder of text files"
    try:
        path = resolve_source(source)
    except (OSError, RuntimeError) as err:  # e.g. a symbolic link loop
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ValueError(f"data: cannot resolve {str(source)!r} ({reason}); {expected}") from None
    if not path.exists():
        raise ValueError(f"data: no such file or folder {str(source)!r}; {expected}")
    if not path.is_file() and not path.is_dir():
        raise ValueError(f"data: {str(source)!r} is neither a file nor a folder; {expected}")
    needed = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, needed):
        kind = "folder" if path.is_dir() else "file"
        raise ValueError(
            f"data: cannot read the {kind} {str(source)!r} (permission denied); {expected} "
            "that this user can read"
        )
    return path


def read_corpus(
    source: str | Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    val_fraction: float = DEFAULT_VAL_FRACTION,
) -> tuple[bytes, bytes, dict[str, Any]]:
    """Read and split a corpus; returns (train bytes, validation bytes, description).

    ``source``: ``None`` or ``"stdlib"`` for the interpreter's standard library; a text file (split
    into a leading train and trailing validation part); or a folder of text files (split by file).
    At most ``max_bytes`` are read: whole files in sorted order until the next would pass the
    cap, except that the first (or only) file is cut at ``max_bytes`` if it is longer.
    ``truncated`` says whether the cap left something out. Raises ``ValueError`` naming ``data``
    for a missing, unreadable or empty source.
    """
    val_fraction = check_val_fraction(val_fraction)
    desc: dict[str, Any] = {"max_bytes": max_bytes, "val_fraction": val_fraction}
    if source is None or str(source) == STDLIB:
        root = stdlib_root()
        paths = list_stdlib_files(root)
        desc.update(source=STDLIB, source_kind=STDLIB, source_root=str(root))
    else:
        path = check_source(source)
        assert path is not None  # only the standard library has no path
        if path.is_file():
            if looks_binary(path):  # a folder skips such files; a lone one is refused
                raise ValueError(
                    f"data: {str(path)!r} looks binary (a NUL byte in its first "
                    f"{BINARY_PROBE_BYTES:,} bytes); expected a text file (a folder skips "
                    "binary files)"
                )
            data = read_head(path, max_bytes)
            if len(data) < 2:
                raise ValueError(f"data: {str(path)!r} has fewer than 2 bytes; expected text")
            train, val = split_single(data, val_fraction)
            desc.update(
                source=str(path),
                source_kind="file",
                split="single_file_tail",
                truncated=path.stat().st_size > max_bytes,
                n_files_available=1,
                n_train_files=1,
                n_val_files=1,
            )
            return train, val, desc
        root = path
        paths = list_text_files(root)
        desc.update(source=str(path), source_kind="folder", source_root=str(root))
    if not paths:
        raise ValueError(f"data: no text files found under {str(root)!r}")
    files, truncated = read_files(root, paths, max_bytes)
    if len(files) == 1:
        train, val = split_single(files[0].data, val_fraction)
        n_train_files = n_val_files = 1
        split = "single_file_tail"
    else:
        train_files, val_files = split_by_file(files, val_fraction)
        train, val = _join(train_files), _join(val_files)
        n_train_files, n_val_files = len(train_files), len(val_files)
        split = "by_file"
    desc.update(
        split=split,
        truncated=truncated,
        n_files_available=len(paths),
        n_train_files=n_train_files,
        n_val_files=n_val_files,
    )
    return train, val, desc


def _join(files: list[SourceFile]) -> bytes:
    return b"".join(f.data for f in files)


def request_key(source: str | Path | None, max_bytes: int, val_fraction: float) -> dict[str, Any]:
    """What identifies a cache: the source, the cap, the split fraction (and, for the stdlib,
    the Python version whose library it is)."""
    src = STDLIB if source is None or str(source) == STDLIB else str(resolve_source(source))
    key: dict[str, Any] = {"source": src, "max_bytes": max_bytes, "val_fraction": val_fraction}
    if src == STDLIB:
        key["python_version"] = platform.python_version()
    return key


def uses_byte_corpus(
    source: str | Path | None, tokenizer: str | Path | None, data_format: str | None
) -> bool:
    """Whether a request is the original byte corpus (stdlib, a text file or a folder of text
    files, with the byte tokenizer), whose cache and fingerprint stay as they always were."""
    if tokenizer is not None and str(tokenizer) != BYTES:
        return False
    if source is None or str(source) == STDLIB:
        return data_format in (None, STDLIB)
    path = resolve_source(source)
    fmt = source_format(path, data_format) if path.exists() else data_format
    return fmt in (None, TEXT, FOLDER)


def prepare_tokens(
    data_dir: Path,
    source: str | Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    *,
    tokenizer: str | Path | None = None,
    text_field: str = "text",
    data_format: str | None = None,
) -> dict[str, Any]:
    """Build ``data_dir/tokens.u8`` and ``data.json`` once; later calls reuse them.

    Returns the content of ``data.json``. ``tokenizer`` (``None``/``"bytes"``, a tokenizer.json
    or a local tokenizer folder), ``text_field`` (JSON Lines, Parquet, ``save_to_disk``) and
    ``data_format`` (default: from the path) reach the general cache of
    :func:`normlab.data.token_cache.prepare_token_cache`, used for every request but the byte
    corpus (:func:`uses_byte_corpus`), which is built below exactly as before.

    Raises ``ValueError`` naming ``data`` if a user source does not exist or cannot be read
    (checked first, whatever the folder holds), and naming the field when the folder already
    holds a cache made from a different request (source, cap, fraction, Python version or
    tokenizer), since finished runs in the folder were trained on it.
    """
    check_source(source)
    if not uses_byte_corpus(source, tokenizer, data_format):
        return prepare_token_cache(
            data_dir,
            source,
            tokenizer=tokenizer,
            text_field=text_field,
            data_format=data_format,
            max_bytes=max_bytes,
            val_fraction=val_fraction,
        )
    data_dir = Path(data_dir)
    key = request_key(source, max_bytes, val_fraction)
    info_path, tokens_path = data_dir / INFO_FILE, data_dir / TOKENS_FILE
    old: dict[str, Any] | None = None
    if info_path.exists():
        old = read_cache_info(info_path)
        if old.get("tokenizer", BYTES) != BYTES or "source_format" in old:
            raise ValueError(
                f"data: the cache in {str(data_dir)!r} was built with tokenizer="
                f"{old.get('tokenizer')!r} from a {old.get('source_format')!r} source, this run "
                "asks for the byte corpus; use another --out"
            )
        for field, value in key.items():
            if old.get(field) != value:
                raise ValueError(
                    f"data: the cache in {str(data_dir)!r} was built with {field}="
                    f"{old.get(field)!r}, this run asks for {field}={value!r}; use another --out"
                )
        expected_size = old["n_train_tokens"] + old["n_val_tokens"]
        if (
            tokens_path.exists()
            and tokens_path.stat().st_size == expected_size
            and cache_problem(data_dir, old, TOKENS_FILE) is None
        ):
            return old
        # missing, resized or damaged (its content hash differs): rebuilt from the source below,
        # which must read as the same fingerprint
    train, val, desc = read_corpus(source, max_bytes, val_fraction)
    fp = fingerprint(train, val)
    if old is not None and old.get("fingerprint") != fp:
        raise ValueError(
            f"data: {str(tokens_path)!r} is missing or damaged and the source now reads as "
            f"{fp}, not {old.get('fingerprint')}; use another --out"
        )
    info = {
        **desc,
        "fingerprint": fp,
        "python_version": platform.python_version(),
        "n_train_tokens": len(train),
        "n_val_tokens": len(val),
    }
    write_bytes_atomic(tokens_path, train + val)
    info[HASHES_KEY] = {TOKENS_FILE: content_hash(tokens_path)}
    write_json_atomic(info_path, info)
    return info


def read_cache_info(info_path: Path) -> dict[str, Any]:
    """A cache's ``data.json``; ``ValueError`` naming the file (and how to start over) if it is
    not a JSON object."""
    try:
        return read_json_object(info_path)
    except ValueError as err:
        raise ValueError(
            f"data: {err}. Delete the folder {str(Path(info_path).parent)!r} to rebuild the "
            "cache (finished runs are checked against its fingerprint)"
        ) from None


def load_tokens(data_dir: Path) -> TokenData:
    """Memory-map a cache made by :func:`prepare_tokens` (tokens, and byte counts if any)."""
    data_dir = Path(data_dir)
    info_path = data_dir / INFO_FILE
    if not info_path.exists():
        raise FileNotFoundError(f"data_dir: no {INFO_FILE} in {str(data_dir)!r}")
    info = read_cache_info(info_path)
    if HASHES_KEY in info:  # caches made before hashes were recorded are mapped unchecked
        problem = cache_problem(data_dir, info, TOKENS_FILE)
        if problem is not None:
            raise ValueError(
                f"data: the token cache in {str(data_dir)!r} is damaged ({problem}); run the "
                "same command again to rebuild it"
            )
    name = info.get("tokens_file", TOKENS_FILE)
    tokens = np.memmap(data_dir / name, dtype=np.dtype(info.get("token_dtype", "uint8")), mode="r")
    n_train, n_val = info["n_train_tokens"], info["n_val_tokens"]
    if tokens.shape[0] != n_train + n_val:
        raise ValueError(
            f"data_dir: {name} holds {tokens.shape[0]} tokens; data.json says {n_train} + {n_val}"
        )
    train_bytes = val_bytes = None
    if info.get("token_bytes_file"):
        counts = np.memmap(data_dir / info["token_bytes_file"], dtype=BYTES_DTYPE, mode="r")
        if counts.shape[0] != n_train + n_val:
            raise ValueError(
                f"data_dir: {info['token_bytes_file']} holds {counts.shape[0]} counts; "
                f"data.json says {n_train} + {n_val} tokens"
            )
        train_bytes, val_bytes = counts[:n_train], counts[n_train:]
    return TokenData(
        train=tokens[:n_train],
        val=tokens[n_train:],
        info=info,
        train_bytes=train_bytes,
        val_bytes=val_bytes,
    )
