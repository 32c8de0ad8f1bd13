"""Train/validation split by file or document, never inside one (except for a corpus of a single
file or document, split into a leading and a trailing part)."""

from __future__ import annotations

import hashlib

import numpy as np

from normlab.data.sources import SourceFile


def path_fraction(rel_path: str) -> float:
    """A number in [0, 1) fixed by the file's relative path: first 8 bytes of the sha256 of its
    bytes (UTF-8; a name that is not UTF-8 keeps its raw bytes, as ``os.fsencode`` gives them)
    / 2⁶⁴."""
    digest = hashlib.sha256(rel_path.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_val_fraction(val_fraction: object) -> float:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise TypeError(f"val_fraction: expected a float in (0, 0.5], got {val_fraction!r}")
    if not 0 < val_fraction <= 0.5:
        raise ValueError(f"val_fraction: expected a float in (0, 0.5], got {val_fraction!r}")
    return float(val_fraction)


def split_by_file(
    files: list[SourceFile], val_fraction: float
) -> tuple[list[SourceFile], list[SourceFile]]:
    """Files whose :func:`path_fraction` is below ``val_fraction`` go to validation.

    The choice depends on the path only, so it is the same on every machine and every run and
    does not move when other files are added. If no file falls below the fraction, the one with
    the smallest fraction goes to validation; at least one file always stays in training.
    Needs at least two files.
    """
    val_fraction = check_val_fraction(val_fraction)
    if len(files) < 2:
        raise ValueError(f"files: a split by file needs at least 2 files, got {len(files)}")
    ranked = sorted(files, key=lambda f: path_fraction(f.rel_path))
    n_val = sum(path_fraction(f.rel_path) < val_fraction for f in files)
    n_val = min(max(n_val, 1), len(files) - 1)
    val_paths = {f.rel_path for f in ranked[:n_val]}
    train = [f for f in files if f.rel_path not in val_paths]
    val = [f for f in files if f.rel_path in val_paths]
    return train, val


def split_single(data: bytes, val_fraction: float) -> tuple[bytes, bytes]:
    """One file: the leading ``1 − val_fraction`` of the bytes trains, the trailing part
    validates."""
    val_fraction = check_val_fraction(val_fraction)
    cut = len(data) - max(1, round(len(data) * val_fraction))
    return data[:cut], data[cut:]


def document_fraction(data: bytes) -> float:
    """A number in [0, 1) fixed by a document's content (a record has no path): first 8 bytes of
    sha256(``b"document\\0"`` ‖ data) / 2⁶⁴. Equal documents get equal fractions, so a duplicate
    never sits on both sides of the split."""
    digest = hashlib.sha256(b"document\0" + data).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def validation_mask(fractions: np.ndarray, val_fraction: float) -> np.ndarray:
    """The documents that validate, as :func:`split_by_file` chooses files: those whose fraction
    is below ``val_fraction``, at least one and at most all but one (the smallest fractions go
    first; ties keep document order). Needs at least two documents."""
    val_fraction = check_val_fraction(val_fraction)
    fractions = np.asarray(fractions, dtype=np.float64)
    if fractions.shape[0] < 2:
        raise ValueError(
            f"fractions: a split by document needs at least 2 documents, got {fractions.shape[0]}"
        )
    n_val = int(np.count_nonzero(fractions < val_fraction))
    n_val = min(max(n_val, 1), fractions.shape[0] - 1)
    mask = np.zeros(fractions.shape[0], dtype=bool)
    mask[np.argsort(fractions, kind="stable")[:n_val]] = True
    return mask


def tail_cut(n: int, val_fraction: float) -> int:
    """Where a single document splits: its first ``n − max(1, round(n · val_fraction))`` tokens
    train, the rest validate (the rule of :func:`split_single`)."""
    val_fraction = check_val_fraction(val_fraction)
    return n - max(1, round(n * val_fraction))
