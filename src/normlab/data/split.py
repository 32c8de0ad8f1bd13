"""Train/validation split by file, never inside one (except for a single-file corpus)."""

from __future__ import annotations

import hashlib

from normlab.data.sources import SourceFile


def path_fraction(rel_path: str) -> float:
    """A number in [0, 1) fixed by the file's relative path: first 8 bytes of its sha256 / 2⁶⁴."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
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
