"""Text sources as a sequence of documents: a text file, a folder of text files, JSON Lines,
Parquet, or a folder written by ``datasets``' ``save_to_disk``.

Every reader yields :class:`Document` objects in a fixed order, one at a time (a corpus larger than
memory is never held whole). A document's ``key`` decides its side of the train/validation split
(:func:`normlab.data.split.document_fraction`): the relative path for a file of a folder, the
content itself for a record, so that a duplicated record always lands on one side.
pyarrow and datasets are imported only when their format is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from normlab.data.sources import list_stdlib_files, list_text_files, read_head

STDLIB = "stdlib"
TEXT = "text"
FOLDER = "folder"
JSONL = "jsonl"
PARQUET = "parquet"
HF_DISK = "hf_disk"
TEXT_FORMATS = (STDLIB, TEXT, FOLDER, JSONL, PARQUET, HF_DISK)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
HF_EXTRA = "pip install 'normlab[hf]'"


@dataclass(frozen=True)
class Document:
    """One document: its split key (a relative path, or ``None`` when the split hashes the
    content) and its bytes (UTF-8 for records; a text file's raw bytes)."""

    key: str | None
    data: bytes


def is_hf_disk(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk`` (it holds
    ``dataset_info.json`` and ``state.json``, or a ``DatasetDict``'s ``dataset_dict.json``)."""
    return path.is_dir() and (
        (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
    )


def detect_format(path: Path) -> str:
    """The text format of an existing path: ``jsonl`` (``.jsonl``/``.ndjson``), ``parquet``
    (``.parquet``/``.pq``), ``hf_disk`` (a ``save_to_disk`` folder), ``folder`` (any other
    folder) or ``text`` (any other file)."""
    if path.is_dir():
        return HF_DISK if is_hf_disk(path) else FOLDER
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return JSONL
    if suffix in PARQUET_SUFFIXES:
        return PARQUET
    return TEXT


def iter_documents(
    path: Path, fmt: str, text_field: str = "text", limit: int | None = None
) -> Iterator[Document]:
    """The documents of ``path`` read as ``fmt`` (one of :data:`TEXT_FORMATS`), in order.

    A text file is one document (its raw bytes); ``stdlib`` (``path``: the standard library's
    folder) and a folder give one document per file, keyed by relative path, in the order of
    :func:`normlab.data.sources.list_stdlib_files` or ``list_text_files``; a JSON Lines
    file, a Parquet file and a ``save_to_disk`` folder give one document per record, the UTF-8 of
    its ``text_field``. Raises ``ValueError`` naming ``data`` and the file for an unreadable
    record or a missing field. ``limit`` caps how much of a single text file is read.
    """
    if fmt == TEXT:
        yield Document(None, path.read_bytes() if limit is None else read_head(path, limit))
    elif fmt in (FOLDER, STDLIB):
        for file in list_stdlib_files(path) if fmt == STDLIB else list_text_files(path):
            yield Document(file.relative_to(path).as_posix(), file.read_bytes())
    elif fmt == JSONL:
        yield from _jsonl(path, text_field)
    elif fmt == PARQUET:
        yield from _parquet(path, text_field)
    elif fmt == HF_DISK:
        yield from _hf_disk(path, text_field)
    else:
        raise ValueError(f"data_format: expected one of {', '.join(TEXT_FORMATS)}, got {fmt!r}")


def _text_of(value: object, where: str, text_field: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(
            f"text_field: {where} has {text_field!r} of type {type(value).__name__}; "
            "expected a string"
        )
    return value.encode("utf-8", errors="surrogatepass")


def _jsonl(path: Path, text_field: str) -> Iterator[Document]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"line {number} of {str(path)!r}"
            try:
                record = json.loads(line)
            except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
                raise ValueError(f"data: {where} is not valid JSON ({err})") from None
            if not isinstance(record, dict) or text_field not in record:
                raise ValueError(
                    f"text_field: {where} has no field {text_field!r}; expected a JSON object "
                    f"with a {text_field!r} string (set text_field to the field that holds the "
                    "text)"
                )
            yield Document(None, _text_of(record[text_field], where, text_field))


def _parquet(path: Path, text_field: str) -> Iterator[Document]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"data: reading the Parquet file {str(path)!r} needs pyarrow; {HF_EXTRA}"
        ) from None
    try:
        file = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError, … for a damaged file
        raise ValueError(
            f"data: {str(path)!r} is not a readable Parquet file ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'})"
        ) from None
    names = file.schema_arrow.names
    if text_field not in names:
        raise ValueError(
            f"text_field: the Parquet file {str(path)!r} has no column {text_field!r}; its "
            f"columns are {', '.join(names)}"
        )
    for group in range(file.num_row_groups):
        try:
            column = file.read_row_group(group, columns=[text_field]).column(0)
        except Exception as err:
            raise ValueError(
                f"data: {str(path)!r} is not a readable Parquet file (row group {group}: "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'})"
            ) from None
        for row, value in enumerate(column.to_pylist()):
            yield Document(
                None,
                _text_of(value, f"row {row} of row group {group} of {str(path)!r}", text_field),
            )


def _hf_disk(path: Path, text_field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"data: {str(path)!r} is a datasets save_to_disk folder; reading it needs the "
            f"datasets package: {HF_EXTRA}"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as err:
        raise ValueError(
            f"data: cannot load the datasets folder {str(path)!r} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'})"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(
                f"data: the DatasetDict in {str(path)!r} has no 'train' split (it has "
                f"{', '.join(loaded)}); save the split to use with save_to_disk on its own"
            )
        loaded = loaded["train"]
    if text_field not in loaded.column_names:
        raise ValueError(
            f"text_field: the dataset in {str(path)!r} has no column {text_field!r}; its "
            f"columns are {', '.join(loaded.column_names)}"
        )
    column = loaded.select_columns([text_field])
    for start in range(0, len(column), 1024):
        rows = column[start : start + 1024][text_field]
        for offset, value in enumerate(rows):
            yield Document(
                None, _text_of(value, f"row {start + offset} of {str(path)!r}", text_field)
            )
