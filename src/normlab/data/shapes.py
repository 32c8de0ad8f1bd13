"""The embedded data of the DiT testbed: tiny grayscale images of shapes, made procedurally.

Nothing is downloaded and nothing is stored: the images follow from a data seed, so every worker
makes the same set again and checks its fingerprint. Each image is ``size × size`` pixels with
one shape on a black background; its class label is the shape:

=====  ==========  =================================================================
label  shape       inside when (pixel centre (x, y), shape centre (cx, cy), size r)
=====  ==========  =================================================================
0      ``disc``    √((x − cx)² + (y − cy)²) ≤ r
1      ``square``  max(|x − cx|, |y − cy|) ≤ r
2      ``hbar``    |x − cx| ≤ r and |y − cy| ≤ r / 3
3      ``vbar``    |x − cx| ≤ r / 3 and |y − cy| ≤ r
=====  ==========  =================================================================

with r ~ U[0.15, 0.35] · size, the centre uniform where the shape fits inside the image, and the
brightness a ~ U[0.4, 1]. Edges are antialiased: a pixel's coverage is clip(r − d + ½, 0, 1) for
its distance d in the shape's own metric. Pixel values are 2 · a · coverage − 1 ∈ [−1, 1]
(background −1).

The train and validation images are disjoint by construction: one stream of images is drawn,
duplicates (identical bytes) are dropped, the first ``n_train`` train and the next ``n_val``
validate. :func:`patchify` cuts images into the token sequences the DiT reads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from normlab._io import write_json_atomic
from normlab.run_format import DATA_INFO_FILE as _INFO_FILE

__all__ = [
    "SHAPES",
    "SHAPE_CLASSES",
    "ShapeData",
    "balanced_selection",
    "load_shapes",
    "make_shape_images",
    "make_shapes",
    "patchify",
    "prepare_shapes",
    "shapes_fingerprint",
    "shapes_request",
    "unpatchify",
]

SHAPES = "shapes"
SHAPE_CLASSES: tuple[str, ...] = ("disc", "square", "hbar", "vbar")
CHUNK = 256
"""Images drawn at a time (the stream of images does not depend on how many are wanted)."""


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    return int(value)


def _stream_seed(seed: int, tag: str) -> int:
    digest = hashlib.sha256(f"{seed}:{tag}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def make_shape_images(n: int, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` images ([n, size, size] float32 in [−1, 1]) and their labels ([n] int64).

    The shapes and their parameters are those of the module docstring; draws come from ``rng``
    in a fixed order (labels, sizes, centres, brightness), so the same generator state gives the
    same images.
    """
    n = _check_int("n", n, 0)
    size = _check_int("size", size, 4)
    labels = rng.integers(0, len(SHAPE_CLASSES), size=n)
    r = rng.uniform(0.15, 0.35, size=n) * size
    # the shape's half extent along x and y: bars are a third as thick across
    thin = r / 3
    half_x = np.where(labels == 3, thin, r)
    half_y = np.where(labels == 2, thin, r)
    cx = half_x + rng.uniform(0.0, 1.0, size=n) * (size - 2 * half_x)
    cy = half_y + rng.uniform(0.0, 1.0, size=n) * (size - 2 * half_y)
    brightness = rng.uniform(0.4, 1.0, size=n)

    centres = np.arange(size, dtype=np.float64) + 0.5
    dx = np.abs(centres[None, None, :] - cx[:, None, None])  # [n, 1, size]
    dy = np.abs(centres[None, :, None] - cy[:, None, None])  # [n, size, 1]
    rr = r[:, None, None]
    inside = np.empty((n, size, size))
    disc = np.sqrt(dx**2 + dy**2) - rr
    square = np.maximum(dx, dy) - rr
    hbar = np.maximum(dx - rr, dy - rr / 3)
    vbar = np.maximum(dx - rr / 3, dy - rr)
    for label, signed in enumerate((disc, square, hbar, vbar)):
        sel = labels == label
        inside[sel] = signed[sel]
    coverage = np.clip(0.5 - inside, 0.0, 1.0)
    images = 2.0 * brightness[:, None, None] * coverage - 1.0
    return images.astype(np.float32), labels.astype(np.int64)


def make_shapes(
    n_train: int, n_val: int, size: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, validation images, validation labels), disjoint.

    Images are drawn from one generator seeded by ``seed`` in chunks of :data:`CHUNK`; an image
    whose bytes equal an earlier one is dropped, so no image is in both sets (or twice in one).
    The stream depends on (``size``, ``seed``) only: the sets are its first ``n_train`` and next
    ``n_val`` distinct images, so other sizes cut the same stream elsewhere instead of redrawing
    it.
    """
    n_train = _check_int("n_train", n_train, 1)
    n_val = _check_int("n_val", n_val, 1)
    size = _check_int("size", size, 4)
    seed = _check_int("seed", seed, 0)
    rng = np.random.Generator(np.random.PCG64(_stream_seed(seed, "shapes")))
    wanted = n_train + n_val
    seen: set[bytes] = set()
    images: list[np.ndarray] = []
    labels: list[int] = []
    while len(images) < wanted:
        batch, batch_labels = make_shape_images(CHUNK, size, rng)
        for image, label in zip(batch, batch_labels, strict=True):
            key = image.tobytes()
            if key not in seen:
                seen.add(key)
                images.append(image)
                labels.append(int(label))
            if len(images) == wanted:
                break
    x = np.stack(images)
    y = np.asarray(labels, dtype=np.int64)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """[n, H, W] → [n, (H / p) · (W / p), p²]: non-overlapping p × p patches in row-major order,
    each flattened row by row (the DiT's tokens: T = (H / p)(W / p), C_in = p²)."""
    patch = _check_int("patch", patch, 1)
    if images.ndim != 3:
        raise ValueError(f"images: expected shape [n, H, W], got {images.shape}")
    n, h, w = images.shape
    if h % patch or w % patch:
        raise ValueError(f"patch: {patch} does not divide the image size {h} × {w}")
    x = images.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(x.reshape(n, (h // patch) * (w // patch), patch * patch))


def unpatchify(tokens: np.ndarray, size: int) -> np.ndarray:
    """The inverse of :func:`patchify` for square images of ``size × size`` pixels."""
    n, t, c = tokens.shape
    patch = round(c**0.5)
    side = size // patch
    if patch * patch != c or side * side != t or side * patch != size:
        raise ValueError(f"tokens: shape {tokens.shape} is not patches of a {size} × {size} image")
    x = tokens.reshape(n, side, side, patch, patch).transpose(0, 1, 3, 2, 4)
    return np.ascontiguousarray(x.reshape(n, size, size))


def balanced_selection(
    labels: np.ndarray, n: int, n_classes: int, wrap: bool = False
) -> np.ndarray:
    """Indices of ``n`` images whose labels follow the cycle 0, 1, …, n_classes − 1, 0, 1, …
    (the labels the DiT's samples are generated with): position i holds the k-th image, in
    order, of label i mod ``n_classes``, k = i // n_classes. With ``n_classes`` 0: the first
    ``n`` images. A class with fewer than k + 1 images raises ``ValueError``, or with ``wrap``
    starts over at its first image (k taken modulo its count; an empty class still raises)."""
    n = _check_int("n", n, 0)
    n_classes = _check_int("n_classes", n_classes, 0)
    labels = np.asarray(labels)
    if n_classes == 0:
        if labels.shape[0] < n and not (wrap and labels.shape[0]):
            raise ValueError(f"labels: {labels.shape[0]} images, expected at least {n}")
        return np.arange(n) % max(1, labels.shape[0])
    by_class = [np.flatnonzero(labels == c) for c in range(n_classes)]
    out = []
    for i in range(n):
        members, k = by_class[i % n_classes], i // n_classes
        if k >= members.size and not (wrap and members.size):
            raise ValueError(
                f"labels: class {i % n_classes} has {members.size} images, expected at least "
                f"{k + 1}"
            )
        out.append(members[k % members.size])
    return np.asarray(out, dtype=np.int64)


def shapes_fingerprint(*arrays: np.ndarray) -> str:
    """``sha256:`` + first 16 hex digits of the hash of the arrays' dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape};".encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()[:16]


@dataclass(frozen=True)
class ShapeData:
    """The dataset as tokens: ``train`` [n_train, T, C] and ``val`` [n_val, T, C] float32,
    their labels (int64), and the description that ``data.json`` holds."""

    train: np.ndarray
    train_labels: np.ndarray
    val: np.ndarray
    val_labels: np.ndarray
    info: dict[str, Any]


def shapes_request(
    image_size: int, patch_size: int, n_train: int, n_val: int, seed: int
) -> dict[str, Any]:
    """What identifies the dataset (the keys of ``data.json`` a later command must match)."""
    return {
        "source": SHAPES,
        "image_size": image_size,
        "patch_size": patch_size,
        "n_train": n_train,
        "n_val": n_val,
        "seed": seed,
    }


def load_shapes(image_size: int, patch_size: int, n_train: int, n_val: int, seed: int) -> ShapeData:
    """Make the dataset and describe it: the request, the fingerprint, the classes, token counts
    (``n_train_tokens`` = n_train · T, as the GPT testbed counts bytes) and T, C."""
    x_tr, y_tr, x_va, y_va = make_shapes(n_train, n_val, image_size, seed)
    train, val = patchify(x_tr, patch_size), patchify(x_va, patch_size)
    seq_len, channels = train.shape[1], train.shape[2]
    info = {
        **shapes_request(image_size, patch_size, n_train, n_val, seed),
        "source_kind": SHAPES,
        "classes": list(SHAPE_CLASSES),
        "fingerprint": shapes_fingerprint(x_tr, y_tr, x_va, y_va),
        "seq_len": seq_len,
        "in_channels": channels,
        "n_train_tokens": n_train * seq_len,
        "n_val_tokens": n_val * seq_len,
    }
    return ShapeData(train, y_tr, val, y_va, info)


def prepare_shapes(
    data_dir: Path, image_size: int, patch_size: int, n_train: int, n_val: int, seed: int
) -> dict[str, Any]:
    """Write ``data_dir/data.json`` for the shapes dataset (once) and return its content.

    The images themselves are not stored: every worker makes them again from the seed and checks
    the fingerprint. Raises ``ValueError`` naming the field when the folder already describes
    other data (another request, or the GPT testbed's byte corpus), since its finished runs were
    trained on that.
    """
    data_dir = Path(data_dir)
    info_path = data_dir / _INFO_FILE
    request = shapes_request(image_size, patch_size, n_train, n_val, seed)
    if info_path.exists():
        old = json.loads(info_path.read_text(encoding="utf-8"))
        for key, value in request.items():
            if old.get(key) != value:
                name = "data" if key == "source" else f"shapes.{key}"
                raise ValueError(
                    f"{name}: the folder's data in {str(data_dir)!r} was made with {key}="
                    f"{old.get(key)!r}, this run asks for {key}={value!r}; use another --out"
                )
    info = load_shapes(image_size, patch_size, n_train, n_val, seed).info
    if info_path.exists():
        if old.get("fingerprint") != info["fingerprint"]:
            raise ValueError(
                f"data: the shapes in {str(data_dir)!r} had fingerprint {old.get('fingerprint')}, "
                f"they now come out as {info['fingerprint']}; use another --out"
            )
        return old
    write_json_atomic(info_path, info)
    return info
