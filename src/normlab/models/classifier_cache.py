"""The trained shape classifier on disk: trained once, verified before every use.

A classifier is stored as two files in the cache folder (:func:`default_cache_dir`), both named
by its key, the fingerprint of what determines it:

    key = first 16 hex digits of sha256(JSON{format, settings, shapes_version})

where ``shapes_version`` is the fingerprint of a probe of the shapes stream the classifier
trains on (:func:`shapes_version`), so a change to :mod:`normlab.data.shapes`' generator gives
a new key instead of a stale classifier. ``shape-classifier-<key>.pt`` holds the weights
(``torch.save`` of the state dict); ``shape-classifier-<key>.json`` the metadata: the settings,
the held-out accuracy, the training's wall and CPU time, the torch version and the sha256 of
the weights file.
Each is written atomically, the weights first, so the metadata marks a complete entry. Before
use the weights' sha256 must equal the metadata's and the state dict must load; otherwise (a
damaged, truncated or foreign file) the classifier is trained again and both files replaced.
Training is deterministic (:func:`~normlab.models.shape_classifier.train_shape_classifier`), so
two processes that build the same entry at once write the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from normlab._io import write_bytes_atomic, write_json_atomic
from normlab.data.shapes import make_shapes, shapes_fingerprint
from normlab.models.shape_classifier import (
    ClassifierSettings,
    ShapeClassifier,
    train_shape_classifier,
)

__all__ = [
    "CachedClassifier",
    "classifier_key",
    "default_cache_dir",
    "load_shape_classifier",
    "shapes_version",
]

FORMAT = 1
"""Version of the cache entry's layout (part of the key)."""
_PROBE = 64
"""Images per set of the probe that :func:`shapes_version` fingerprints."""


def default_cache_dir() -> Path:
    """``$NORMLAB_CACHE_DIR/shape-classifier``, else
    ``${XDG_CACHE_HOME:-~/.cache}/normlab/shape-classifier`` (as the C++ kernels' cache)."""
    if os.environ.get("NORMLAB_CACHE_DIR"):
        return Path(os.environ["NORMLAB_CACHE_DIR"]) / "shape-classifier"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normlab" / "shape-classifier"


def shapes_version(settings: ClassifierSettings) -> str:
    """The fingerprint of the first 64 + 64 images (and labels) of the shapes stream at the
    classifier's image size and data seed: it changes whenever the generator's output does."""
    return shapes_fingerprint(*make_shapes(_PROBE, _PROBE, settings.image_size, settings.data_seed))


def classifier_key(settings: ClassifierSettings, version: str | None = None) -> str:
    """sha256 of the canonical JSON of {format, settings, shapes_version}, first 16 hex digits
    (``version``: :func:`shapes_version` of ``settings`` when already known)."""
    identity = {
        "format": FORMAT,
        "settings": settings.as_dict(),
        "shapes_version": version if version is not None else shapes_version(settings),
    }
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class CachedClassifier:
    """A classifier from the cache: the model (eval mode, no gradients needed), its metadata
    (``heldout_accuracy`` and the rest, see the module docstring), the weights file, and whether
    this call trained it (``built``: no valid entry was there)."""

    model: ShapeClassifier
    metadata: dict[str, Any]
    weights_path: Path
    built: bool


def _paths(cache_dir: Path, key: str) -> tuple[Path, Path]:
    stem = f"shape-classifier-{key}"
    return cache_dir / f"{stem}.pt", cache_dir / f"{stem}.json"


def _model(settings: ClassifierSettings) -> ShapeClassifier:
    return ShapeClassifier(settings.image_size, settings.channels, settings.features)


def _read_valid(
    weights_path: Path, meta_path: Path, key: str, settings: ClassifierSettings
) -> CachedClassifier | None:
    """The entry if it is complete and intact, else None."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        data = weights_path.read_bytes()
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None
    if meta.get("settings") != settings.as_dict():
        return None
    if meta.get("weights_sha256") != hashlib.sha256(data).hexdigest():
        return None
    model = _model(settings)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception:  # a file that hashes right but does not load is rebuilt too
        return None
    model.eval().requires_grad_(False)
    return CachedClassifier(model, meta, weights_path, built=False)


def load_shape_classifier(
    settings: ClassifierSettings | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> CachedClassifier:
    """The classifier for ``settings`` (default :class:`ClassifierSettings`) from
    ``cache_dir`` (default :func:`default_cache_dir`), trained and stored first when the folder
    holds no intact entry for its key (see the module docstring for the checks)."""
    s = settings if settings is not None else ClassifierSettings()
    if not isinstance(s, ClassifierSettings):
        raise TypeError(f"settings: expected ClassifierSettings, got {type(s).__name__}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    version = shapes_version(s)
    key = classifier_key(s, version)
    weights_path, meta_path = _paths(folder, key)
    cached = _read_valid(weights_path, meta_path, key, s)
    if cached is not None:
        return cached
    trained = train_shape_classifier(s)
    buf = io.BytesIO()
    torch.save(trained.model.state_dict(), buf)
    data = buf.getvalue()
    meta = {
        "key": key,
        "format": FORMAT,
        "settings": s.as_dict(),
        "shapes_version": version,
        "heldout_accuracy": trained.heldout_accuracy,
        "n_heldout": s.n_heldout,
        "train_seconds": trained.train_seconds,
        "train_cpu_seconds": trained.train_cpu_seconds,
        "torch": torch.__version__,
        "weights_sha256": hashlib.sha256(data).hexdigest(),
    }
    write_bytes_atomic(weights_path, data)
    write_json_atomic(meta_path, meta)
    model = trained.model.eval().requires_grad_(False)
    return CachedClassifier(model, meta, weights_path, built=True)
