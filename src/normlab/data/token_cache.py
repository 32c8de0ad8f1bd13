"""The token cache for any source and tokenizer (everything but the default byte corpus, which
:mod:`normlab.data.cache` keeps exactly as before).

Files in ``data_dir``: ``tokens.u8``/``tokens.u16``/``tokens.u32`` (train ids then validation ids,
the smallest dtype the vocabulary fits), ``token_bytes.u16`` (the UTF-8 bytes each token covers,
same order; absent for the byte tokenizer, where every token is one byte) and ``data.json``. The
corpus is read twice, one document at a time: the first pass decides the cap and the split, the
second tokenizes in batches and appends ids to temporary files, which are then joined into place
atomically. Nothing holds the corpus's tokens whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from normlab._io import _atomic, read_json_object, write_json_atomic
from normlab.data import documents as docs_mod
from normlab.data.pretokenized import is_pretokenized, open_token_source
from normlab.data.sources import stdlib_root
from normlab.data.split import (
    check_val_fraction,
    document_fraction,
    path_fraction,
    tail_cut,
    validation_mask,
)
from normlab.data.tokenizer import BYTES, Tokenizer, load_tokenizer, token_dtype
from normlab.data.verify import HASHES_KEY, cache_files, cache_hashes, cache_problem

INFO_FILE = "data.json"
BYTES_FILE = "token_bytes.u16"
BYTES_DTYPE = np.dtype("<u2")
CHUNK_TOKENS = 1 << 20
BATCH_BYTES = 1 << 22
PIECE_BYTES = 1 << 22
BIN = "bin"
NPY = "npy"
FORMATS = (*docs_mod.TEXT_FORMATS, BIN, NPY)
SUFFIX = {np.dtype(np.uint8): "u8", np.dtype(np.uint16): "u16", np.dtype(np.uint32): "u32"}


CACHE_ENTRY = re.compile(
    r"^(?:data\.json|tokens\.u(?:8|16|32)|token_bytes\.u16|bpe-[0-9a-f]{16})$"
    r"|^\.(?:data\.json|tokens\.u(?:8|16|32)|token_bytes\.u16)\..+\.tmp$"
)
"""Every name a token cache (of either kind) writes in its folder: ``data.json``, the token and
byte-count files, the temporary files they are written through (``.<name>.<anything>.tmp``),
and a :func:`normlab.data.bpe.corpus_bpe` cache folder ``bpe-<16 hex>`` when ``cache_dir`` is
the data folder."""


def is_cache_entry(name: str) -> bool:
    """Whether a file name in a data folder belongs to the token cache (:data:`CACHE_ENTRY`)."""
    return CACHE_ENTRY.match(name) is not None


def tokens_file(dtype: np.dtype) -> str:
    """``tokens.u8``, ``tokens.u16`` or ``tokens.u32``."""
    return f"tokens.{SUFFIX[np.dtype(dtype)]}"


def source_format(source: str | Path | None, data_format: str | None = None) -> str:
    """The format a source is read as: ``data_format`` if given (checked against
    :data:`FORMATS`), else ``stdlib`` for ``None``/``"stdlib"``, ``bin``/``npy`` by suffix, or
    :func:`normlab.data.documents.detect_format`. The path must exist."""
    if data_format is not None:
        if data_format not in FORMATS:
            raise ValueError(
                f"data_format: expected one of {', '.join(FORMATS)}, got {data_format!r}"
            )
        return data_format
    if source is None or str(source) == docs_mod.STDLIB:
        return docs_mod.STDLIB
    path = Path(source)
    if is_pretokenized(path):
        return path.suffix.lower().lstrip(".")
    return docs_mod.detect_format(path)


def cache_key(
    source: str | Path | None,
    fmt: str,
    tokenizer: Tokenizer,
    text_field: str,
    max_bytes: int,
    val_fraction: float,
) -> dict[str, Any]:
    """What identifies a cache of this module: the source (resolved path or ``stdlib``, with the
    Python version for the latter), its format, ``text_field`` (record formats only), the cap,
    the split fraction, the tokenizer's path and content hash."""
    stdlib = fmt == docs_mod.STDLIB
    key: dict[str, Any] = {
        "source": docs_mod.STDLIB if stdlib else str(Path(source).expanduser().resolve()),
        "max_bytes": max_bytes,
        "val_fraction": val_fraction,
        "source_format": fmt,
        "tokenizer": tokenizer.name,
        "tokenizer_hash": tokenizer.content_hash,
    }
    if fmt in (docs_mod.JSONL, docs_mod.PARQUET, docs_mod.HF_DISK):
        key["text_field"] = text_field
    if stdlib:
        key["python_version"] = platform.python_version()
    return key


class SplitWriter:
    """Appends each side's ids (and byte counts) to temporary files in ``data_dir``, then joins
    them into ``tokens.*`` and ``token_bytes.u16`` atomically and fingerprints them."""

    def __init__(self, data_dir: Path, dtype: np.dtype, with_bytes: bool) -> None:
        self.data_dir, self.dtype, self.with_bytes = data_dir, np.dtype(dtype), with_bytes
        data_dir.mkdir(parents=True, exist_ok=True)
        names = {"ids": tokens_file(self.dtype), "bytes": BYTES_FILE}
        self.paths = {
            (side, kind): data_dir / f".{names[kind]}.{side}-{os.getpid()}.tmp"
            for side in ("train", "val")
            for kind in (("ids", "bytes") if with_bytes else ("ids",))
        }
        self.files: dict[tuple[str, str], IO[bytes]] = {
            k: open(p, "wb")  # noqa: SIM115 (closed in close())
            for k, p in self.paths.items()
        }
        self.n_tokens = {"train": 0, "val": 0}
        self.n_bytes = {"train": 0, "val": 0}
        self.n_docs = {"train": 0, "val": 0}

    def add(self, side: str, ids: np.ndarray, lengths: np.ndarray | None) -> None:
        """Append ``ids`` (and their byte counts; ``None``: one byte each) to ``side``."""
        np.asarray(ids).astype(self.dtype, copy=False).tofile(self.files[(side, "ids")])
        self.n_tokens[side] += len(ids)
        if lengths is None:
            self.n_bytes[side] += len(ids)
        else:
            self.n_bytes[side] += int(np.asarray(lengths).sum(dtype=np.int64))
        if self.with_bytes:
            assert lengths is not None  # only the byte tokenizer has no counts
            np.asarray(lengths).astype(BYTES_DTYPE, copy=False).tofile(self.files[(side, "bytes")])

    def move_tail_to_val(self, n: int) -> None:
        """Make the last ``n`` train tokens the validation part (nothing has been written to
        validation yet): train ids then validation ids are one stream on disk, so only the
        counts move; the tail's byte counts are read back from the train part."""
        assert self.n_tokens["val"] == 0 and 0 <= n <= self.n_tokens["train"]
        moved = n
        if self.with_bytes:
            f = self.files[("train", "bytes")]
            f.flush()
            with open(self.paths[("train", "bytes")], "rb") as part:
                part.seek(-n * BYTES_DTYPE.itemsize, os.SEEK_END)
                moved = int(np.frombuffer(part.read(), dtype=BYTES_DTYPE).sum(dtype=np.int64))
        self.n_tokens["train"] -= n
        self.n_tokens["val"] += n
        self.n_bytes["train"] -= moved
        self.n_bytes["val"] += moved

    def fingerprint(self, header: dict[str, Any]) -> str:
        """``sha256:`` + 16 hex digits of sha256(header JSON ‖ train ids ‖ val ids ‖ train byte
        counts ‖ val byte counts), read back from the parts (call after the last :meth:`add`)."""
        for f in self.files.values():
            f.flush()
        h = hashlib.sha256(json.dumps(header, sort_keys=True).encode("utf-8"))
        for kind in self._kinds():
            for side in ("train", "val"):
                with open(self.paths[(side, kind)], "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
        return "sha256:" + h.hexdigest()[:16]

    def finish(self) -> None:
        """Join each kind's train and validation parts into its file, atomically."""
        for f in self.files.values():
            f.close()
        for kind in self._kinds():
            parts = [self.paths[("train", kind)], self.paths[("val", kind)]]
            name = tokens_file(self.dtype) if kind == "ids" else BYTES_FILE
            _atomic(self.data_dir / name, "wb", lambda out, parts=parts: _copy(parts, out))

    def _kinds(self) -> tuple[str, ...]:
        return ("ids", "bytes") if self.with_bytes else ("ids",)

    def close(self) -> None:
        """Close and remove the temporary parts (whether or not :meth:`finish` ran)."""
        for f in self.files.values():
            f.close()
        for p in self.paths.values():
            p.unlink(missing_ok=True)


def _copy(parts: list[Path], out: IO[Any]) -> None:
    for part in parts:
        with open(part, "rb") as f:
            while block := f.read(1 << 22):
                out.write(block)


def prepare_token_cache(
    data_dir: Path,
    source: str | Path | None = None,
    *,
    tokenizer: str | Path | None = None,
    text_field: str = "text",
    data_format: str | None = None,
    max_bytes: int,
    val_fraction: float,
) -> dict[str, Any]:
    """Build ``data_dir``'s token cache for any source and tokenizer once; returns ``data.json``.

    Text sources are read as documents (:func:`normlab.data.documents.iter_documents`): whole
    documents in order until the next would pass ``max_bytes`` (the first is cut at the last
    UTF-8 character boundary within ``max_bytes`` if it is longer). Two or more documents are
    split by document (:func:`normlab.data.split.validation_mask` of each document's fraction:
    ``path_fraction`` of a file's relative path, ``document_fraction`` of a record's content);
    a single one is split into leading train and trailing validation tokens. Pre-tokenized
    sources (:mod:`normlab.data.pretokenized`) follow the same rules in bytes covered, by the
    sidecar's documents if it names them, else as one stream. A later call with the same request
    reuses the cache; a different request is refused (``ValueError`` naming the field).
    """
    val_fraction = check_val_fraction(val_fraction)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes: expected an int >= 1, got {max_bytes!r}")
    if not isinstance(text_field, str) or not text_field:
        raise ValueError(f"text_field: expected a non-empty string, got {text_field!r}")
    fmt = source_format(source, data_format)
    path = stdlib_root() if fmt == docs_mod.STDLIB else Path(source).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"data: no such file or folder {str(source)!r}")
    pre = open_token_source(path) if fmt in (BIN, NPY) else None
    tok = _pick_tokenizer(tokenizer, pre.tokenizer if pre is not None else None)
    key = cache_key(source, fmt, tok, text_field, max_bytes, val_fraction)
    data_dir = Path(data_dir)
    old = _cached_info(data_dir, key)
    if old is not None and _intact(data_dir, old):
        return old  # else missing or damaged: rebuilt, and must read as the same fingerprint
    writer = SplitWriter(data_dir, token_dtype(tok.vocab_size), with_bytes=not tok.is_bytes)
    try:
        if pre is not None:
            desc = _write_pretokenized(writer, pre, tok, max_bytes, val_fraction)
        else:
            desc = _write_documents(writer, path, fmt, tok, text_field, max_bytes, val_fraction)
        fp = _checked_fingerprint(writer, tok, data_dir, old)
        writer.finish()
    finally:
        writer.close()
    info = {**key, **desc, **_written_fields(writer, tok, fp)}
    if fmt == docs_mod.STDLIB:
        info["source_root"] = str(path)
    info[HASHES_KEY] = cache_hashes(data_dir, cache_files(info, ""))
    write_json_atomic(data_dir / INFO_FILE, info)
    return info


def _cached_info(data_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """``data_dir``'s ``data.json``, or None without one; a cache built for another request
    (a field of :func:`cache_key` differs) is refused, naming the first such field."""
    info_path = data_dir / INFO_FILE
    if not info_path.exists():
        return None
    old = read_json_object(info_path)
    for field, value in key.items():
        if old.get(field) != value:
            raise ValueError(
                f"data: the cache in {str(data_dir)!r} was built with {field}="
                f"{old.get(field)!r}, this run asks for {field}={value!r}; use another --out"
            )
    return old


def _checked_fingerprint(
    writer: SplitWriter, tok: Tokenizer, data_dir: Path, old: dict[str, Any] | None
) -> str:
    """The written tokens' fingerprint (:meth:`SplitWriter.fingerprint` with the tokenizer's
    hash, the token dtype and the train size as header). A cache rebuilt because its files were
    missing or damaged (``old``: its ``data.json``) must read as the fingerprint it had."""
    header = {
        "tokenizer_hash": tok.content_hash,
        "token_dtype": writer.dtype.name,
        "n_train_tokens": writer.n_tokens["train"],
    }
    fp = writer.fingerprint(header)
    if old is not None and old.get("fingerprint") != fp:
        raise ValueError(
            f"data: the cache files in {str(data_dir)!r} are missing or damaged and the "
            f"source now reads as {fp}, not {old.get('fingerprint')}; use another --out"
        )
    return fp


def _written_fields(writer: SplitWriter, tok: Tokenizer, fp: str) -> dict[str, Any]:
    """What ``data.json`` records of the files ``writer`` wrote: the fingerprint, the Python
    version, the vocabulary, the token dtype and files, and each side's counts."""
    return {
        "fingerprint": fp,
        "python_version": platform.python_version(),
        "vocab_size": tok.vocab_size,
        "token_dtype": writer.dtype.name,
        "tokens_file": tokens_file(writer.dtype),
        "token_bytes_file": None if tok.is_bytes else BYTES_FILE,
        "n_train_tokens": writer.n_tokens["train"],
        "n_val_tokens": writer.n_tokens["val"],
        "n_train_bytes": writer.n_bytes["train"],
        "n_val_bytes": writer.n_bytes["val"],
        "n_train_docs": writer.n_docs["train"],
        "n_val_docs": writer.n_docs["val"],
        "n_train_files": writer.n_docs["train"],
        "n_val_files": writer.n_docs["val"],
    }


def _pick_tokenizer(option: str | Path | None, sidecar: str | None) -> Tokenizer:
    tok = load_tokenizer(option if option is not None else sidecar)
    if option is not None and sidecar is not None:
        named = load_tokenizer(sidecar)
        if named.content_hash != tok.content_hash:
            raise ValueError(
                f"tokenizer: {str(option)!r} differs from the tokenizer the sidecar names "
                f"({sidecar!r}); leave tokenizer unset to use the sidecar's"
            )
    return tok


def _intact(data_dir: Path, info: dict[str, Any]) -> bool:
    """Whether the cache ``info`` (its ``data.json``) describes is whole: every file there at
    the size it records (:func:`_files_complete`) and matching its content hashes."""
    return _files_complete(data_dir, info) and cache_problem(data_dir, info, "") is None


def _files_complete(data_dir: Path, info: dict[str, Any]) -> bool:
    n = info["n_train_tokens"] + info["n_val_tokens"]
    ids = data_dir / info["tokens_file"]
    if not ids.exists() or ids.stat().st_size != n * np.dtype(info["token_dtype"]).itemsize:
        return False
    if info.get("token_bytes_file") is None:
        return True
    counts = data_dir / info["token_bytes_file"]
    return counts.exists() and counts.stat().st_size == n * BYTES_DTYPE.itemsize


def plan_documents(
    path: Path, fmt: str, text_field: str, max_bytes: int
) -> tuple[list[float], int | None, bool]:
    """First pass: each taken document's split fraction, the cut of the first document (``None``
    if whole) and whether the cap left something out."""
    fractions: list[float] = []
    total, cut, truncated = 0, None, False
    for doc in docs_mod.iter_documents(path, fmt, text_field, limit=max_bytes + 1):
        room = max_bytes - total
        if len(doc.data) > room:
            truncated = True
            if not fractions:
                cut = room
                fractions.append(0.0)
            break
        key = path_fraction(doc.key) if doc.key is not None else document_fraction(doc.data)
        fractions.append(key)
        total += len(doc.data)
    return fractions, cut, truncated


def utf8_cut(data: bytes, cut: int) -> bytes:
    """``data[:cut]`` moved back to a character boundary (no partial UTF-8 sequence)."""
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut]


def text_pieces(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in consecutive pieces of about ``size`` bytes or more, each cut just after a
    newline that starts a non-blank line (where byte-level pre-tokenizers split anyway, and never
    inside a UTF-8 character); the whole of ``data`` if it has no such newline."""
    start = 0
    while len(data) - start > size:
        at = start + size
        while True:
            nl = data.find(b"\n", at)
            if nl < 0 or nl + 1 >= len(data):
                yield data[start:]
                return
            if data[nl + 1 : nl + 2] not in (b" ", b"\t", b"\r", b"\n", b"\x0b", b"\x0c"):
                break
            at = nl + 1
        yield data[start : nl + 1]
        start = nl + 1
    if start < len(data):
        yield data[start:]


def _encoded(
    docs: Iterator[bytes], tok: Tokenizer
) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
    """(document index, ids, byte counts) for each document, or for each piece of a document
    longer than ``PIECE_BYTES`` (:func:`text_pieces`), in order; tokenized in batches of about
    ``BATCH_BYTES``, so no more than a batch's ids are ever held as Python lists."""
    if tok.is_bytes:
        for i, data in enumerate(docs):
            yield (i, *tok.encode(data))
        return
    batch: list[bytes] = []
    owners: list[int] = []
    size = 0
    for i, data in enumerate(docs):
        pieces = text_pieces(data, PIECE_BYTES) if len(data) > PIECE_BYTES else [data]
        for piece in pieces:
            batch.append(piece)
            owners.append(i)
            size += len(piece)
            if size >= BATCH_BYTES:
                for owner, (ids, counts) in zip(owners, tok.encode_batch(batch), strict=True):
                    yield owner, ids, counts
                batch, owners, size = [], [], 0
    for owner, (ids, counts) in zip(owners, tok.encode_batch(batch), strict=True):
        yield owner, ids, counts


def _write_documents(
    writer: SplitWriter,
    path: Path,
    fmt: str,
    tok: Tokenizer,
    text_field: str,
    max_bytes: int,
    val_fraction: float,
) -> dict[str, Any]:
    fractions, cut, truncated = plan_documents(path, fmt, text_field, max_bytes)
    if not fractions:
        raise ValueError(f"data: no documents found in {str(path)!r}")
    n_docs = len(fractions)

    def taken() -> Iterator[bytes]:
        stream = docs_mod.iter_documents(path, fmt, text_field, limit=max_bytes + 1)
        for i, doc in zip(range(n_docs), stream, strict=False):
            if i == 0 and cut is not None:
                yield doc.data[:cut] if tok.is_bytes else utf8_cut(doc.data, cut)
            else:
                yield doc.data

    desc: dict[str, Any] = {"source_kind": fmt, "truncated": truncated}
    if n_docs == 1:
        for _, ids, lengths in _encoded(taken(), tok):
            writer.add("train", ids, lengths)
        n = writer.n_tokens["train"]
        if n < 2:
            raise ValueError(f"data: {str(path)!r} gives {n} token(s); expected at least 2")
        writer.move_tail_to_val(n - tail_cut(n, val_fraction))
        writer.n_docs.update(train=1, val=1)
        desc["split"] = "single_document_tail"
        return desc
    mask = validation_mask(np.asarray(fractions), val_fraction)
    last = -1
    for i, ids, lengths in _encoded(taken(), tok):
        side = "val" if mask[i] else "train"
        writer.add(side, ids, lengths)
        if i != last:
            writer.n_docs[side] += 1
            last = i
    desc["split"] = "by_document"
    return desc


def _bytes_before(ids: np.ndarray, table: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Σ table[ids[:p]] for each sorted position p, in chunks of ``CHUNK_TOKENS``."""
    out = np.zeros(len(positions), dtype=np.int64)
    running, j = 0, 0
    for start in range(0, len(ids) + 1, CHUNK_TOKENS):
        stop = min(start + CHUNK_TOKENS, len(ids))
        cum = running + np.cumsum(table[ids[start:stop]], dtype=np.int64)
        while j < len(positions) and positions[j] <= stop:
            p = positions[j]
            out[j] = running if p == start else cum[p - start - 1]
            j += 1
        running = int(cum[-1]) if len(cum) else running
    return out


def _tokens_within(ids: np.ndarray, table: np.ndarray, start: int, stop: int, room: int) -> int:
    """How many tokens from ``start`` (at most up to ``stop``) cover at most ``room`` bytes."""
    running = 0
    for a in range(start, stop, CHUNK_TOKENS):
        b = min(a + CHUNK_TOKENS, stop)
        cum = running + np.cumsum(table[ids[a:b]], dtype=np.int64)
        if cum[-1] > room:
            return a - start + int(np.searchsorted(cum, room, side="right"))
        running = int(cum[-1])
    return stop - start


def _write_range(
    writer: SplitWriter, side: str, ids: np.ndarray, table: np.ndarray | None, start: int, stop: int
) -> None:
    for a in range(start, stop, CHUNK_TOKENS):
        chunk = np.asarray(ids[a : min(a + CHUNK_TOKENS, stop)])
        writer.add(side, chunk, None if table is None else table[chunk])


def _write_pretokenized(
    writer: SplitWriter, pre: Any, tok: Tokenizer, max_bytes: int, val_fraction: float
) -> dict[str, Any]:
    ids = pre.ids
    table = tok.byte_table()
    if table is None:
        raise ValueError(
            f"tokenizer: {tok.name!r} is not byte-level, so the UTF-8 bytes of pre-tokenized "
            "ids cannot be counted for bits per byte; give the text instead"
        )
    n = ids.shape[0]
    for a in range(0, n, CHUNK_TOKENS):
        chunk = np.asarray(ids[a : a + CHUNK_TOKENS])
        if chunk.size and (chunk.min() < 0 or chunk.max() >= tok.vocab_size):
            raise ValueError(
                f"data: token ids of {str(pre.path)!r} fall outside the tokenizer "
                f"{tok.name!r}'s vocabulary of {tok.vocab_size} (ids {int(chunk.min())}.."
                f"{int(chunk.max())}); name the tokenizer they were made with (the tokenizer "
                'option or the sidecar\'s "tokenizer")'
            )
    counts = None if tok.is_bytes else table
    desc: dict[str, Any] = {"source_kind": "tokens"}
    if pre.doc_starts is None:
        take = _tokens_within(ids, table, 0, n, max_bytes)
        if take < 2:
            raise ValueError(f"data: the token source gives {take} token(s); expected at least 2")
        at = tail_cut(take, val_fraction)
        _write_range(writer, "train", ids, counts, 0, at)
        _write_range(writer, "val", ids, counts, at, take)
        writer.n_docs.update(train=1, val=1)
        desc.update(split="contiguous_tail", truncated=take < n)
        return desc
    bounds = np.append(pre.doc_starts, n)
    sizes = np.diff(_bytes_before(ids, table, bounds))
    fitting = np.cumsum(sizes) <= max_bytes
    n_docs = int(np.argmin(fitting)) if not fitting.all() else len(sizes)
    truncated = n_docs < len(sizes)
    if n_docs == 0:
        end = int(bounds[0]) + _tokens_within(ids, table, 0, int(bounds[1]), max_bytes)
        bounds, n_docs = np.array([0, end]), 1
    if n_docs == 1:
        take = int(bounds[1])
        if take < 2:
            raise ValueError(f"data: the token source gives {take} token(s); expected at least 2")
        at = tail_cut(take, val_fraction)
        _write_range(writer, "train", ids, counts, 0, at)
        _write_range(writer, "val", ids, counts, at, take)
        writer.n_docs.update(train=1, val=1)
        desc.update(split="single_document_tail", truncated=truncated)
        return desc
    fractions = [
        document_fraction(np.asarray(ids[bounds[i] : bounds[i + 1]]).astype("<u4").tobytes())
        for i in range(n_docs)
    ]
    mask = validation_mask(np.asarray(fractions), val_fraction)
    for i in range(n_docs):
        side = "val" if mask[i] else "train"
        _write_range(writer, side, ids, counts, int(bounds[i]), int(bounds[i + 1]))
        writer.n_docs[side] += 1
    desc.update(split="by_document", truncated=truncated)
    return desc


__all__ = [
    "BYTES",
    "CACHE_ENTRY",
    "FORMATS",
    "cache_key",
    "is_cache_entry",
    "prepare_token_cache",
    "source_format",
]
