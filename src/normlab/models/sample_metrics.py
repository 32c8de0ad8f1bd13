"""Quality of a DiT run's generated images, judged by the shape classifier.

Two numbers complement the pixel-space sliced Wasserstein-2 distance ``final_sample_sw2``:

* class accuracy: does the model draw the class it was asked for?
  acc = (1/n) Σᵢ [argmax_k f_k(x̂ᵢ) = yᵢ] for samples x̂ᵢ generated with label yᵢ and the
  classifier's logits f (:func:`sample_class_accuracy`);
* Fréchet distance of classifier features, the FID of this data: with μ, Σ the mean and the
  covariance of the penultimate-layer features φ(x) of the samples (1) and of the validation
  images (2), FD = ‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2 (Σ₁Σ₂)^{1/2}) (:func:`frechet_distance`).

The classifier comes from the cache
(:func:`~normlab.models.classifier_cache.load_shape_classifier`),
trained in seconds on the first use. Images are [n, H, W] in the data's range [−1, 1]; the
classifier clips its input to that range (an overshooting generated pixel reads as ±1).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from normlab.data.shapes import SHAPE_CLASSES
from normlab.models.classifier_cache import load_shape_classifier
from normlab.models.shape_classifier import ClassifierSettings, ShapeClassifier, predict

__all__ = [
    "SAMPLE_QUALITY_FIELDS",
    "classifier_features",
    "feature_statistics",
    "frechet_distance",
    "sample_class_accuracy",
    "sample_quality",
]

SAMPLE_QUALITY_FIELDS: dict[str, str] = {
    "final_sample_class_acc": "fraction of samples classified as their requested label, "
    "in [0, 1], higher is better (chance 0.25)",
    "final_sample_fd": "Fréchet distance of classifier features, samples vs validation images, "
    "in squared feature units, >= 0, lower is better",
}
"""The fields :func:`sample_quality` returns, with unit and direction (for a report legend)."""

_BATCH = 1024


def _images(name: str, images: object) -> np.ndarray:
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    if not isinstance(images, np.ndarray) or not np.issubdtype(images.dtype, np.floating):
        raise TypeError(
            f"{name}: expected a float array or tensor [n, H, W], got {type(images).__name__}"
        )
    if images.ndim != 3 or images.shape[0] < 1 or images.shape[1] != images.shape[2]:
        raise ValueError(f"{name}: expected shape [n, S, S] with n >= 1, got {images.shape}")
    if not np.all(np.isfinite(images)):
        raise ValueError(f"{name}: expected finite pixel values, got NaN or inf")
    return images.astype(np.float32, copy=False)


@torch.no_grad()
def classifier_features(model: ShapeClassifier, images: np.ndarray | torch.Tensor) -> np.ndarray:
    """φ(xᵢ) for every image: the classifier's penultimate layer, [n, F] float64."""
    x = torch.from_numpy(_images("images", images))
    was_training = model.training
    model.eval()
    try:
        out = [model.features(x[i : i + _BATCH]) for i in range(0, x.shape[0], _BATCH)]
    finally:
        model.train(was_training)
    return torch.cat(out).to(torch.float64).numpy()


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(μ, Σ) of features [n, F] in float64: μ = (1/n) Σᵢ φᵢ, Σ = (1/(n−1)) Σᵢ (φᵢ−μ)(φᵢ−μ)ᵀ."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"features: expected shape [n, F] with n >= 2, got {f.shape}")
    mu = f.mean(axis=0)
    centred = f - mu
    sigma = centred.T @ centred / (f.shape[0] - 1)
    return mu, sigma


def _psd_sqrt(a: np.ndarray) -> np.ndarray:
    """The PSD square root of a symmetric matrix, negative eigenvalues (rounding) set to 0."""
    w, v = np.linalg.eigh((a + a.T) / 2)
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def frechet_distance(features_1: np.ndarray, features_2: np.ndarray) -> float:
    """The Fréchet distance between Gaussians fitted to two feature sets [n₁, F], [n₂, F]:

        FD = ‖μ₁ − μ₂‖² + Tr(Σ₁) + Tr(Σ₂) − 2 Tr((Σ₁Σ₂)^{1/2})

    with μ, Σ from :func:`feature_statistics`. Σ₁Σ₂ is not symmetric and may be singular (a
    feature that is always 0, fewer samples than features), where a general matrix square root
    turns complex; the trace is computed instead from the symmetric PSD matrix
    M = Σ₁^{1/2} Σ₂ Σ₁^{1/2}, which has the same eigenvalues λᵢ ≥ 0 as Σ₁Σ₂:
    Tr((Σ₁Σ₂)^{1/2}) = Σᵢ √max(λᵢ, 0), all in float64. FD ≥ 0 (up to rounding, clipped at 0),
    0 for identical sets, and symmetric in its arguments up to rounding.
    """
    f1 = np.asarray(features_1, dtype=np.float64)
    f2 = np.asarray(features_2, dtype=np.float64)
    if f1.ndim != 2 or f2.ndim != 2 or f1.shape[1] != f2.shape[1]:
        raise ValueError(
            f"features_2: expected [n, F] arrays of the same F, got {f1.shape} and {f2.shape}"
        )
    mu1, s1 = feature_statistics(f1)
    mu2, s2 = feature_statistics(f2)
    root1 = _psd_sqrt(s1)
    m = root1 @ s2 @ root1
    eig = np.linalg.eigvalsh((m + m.T) / 2)
    tr_sqrt = float(np.sqrt(np.clip(eig, 0.0, None)).sum())
    fd = float(np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2.0 * tr_sqrt)
    return max(fd, 0.0)


def sample_class_accuracy(
    model: ShapeClassifier, images: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor
) -> float:
    """acc = (1/n) Σᵢ [argmax_k f_k(x̂ᵢ) = yᵢ] ∈ [0, 1]: the fraction of samples x̂ᵢ the
    classifier f assigns to the class yᵢ they were generated with (chance 1/4)."""
    x = _images("images", images)
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    y = np.asarray(labels)
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels: expected {x.shape[0]} integer labels, got shape {y.shape}")
    if y.min() < 0 or y.max() >= len(SHAPE_CLASSES):
        raise ValueError(
            f"labels: expected classes in [0, {len(SHAPE_CLASSES)}), got {y.min()}..{y.max()}"
        )
    was_training = model.training
    model.eval()
    try:
        pred = predict(model, x)
    finally:
        model.train(was_training)
    return float(np.mean(pred == y))


def sample_quality(
    sample_images: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor | None,
    val_images: np.ndarray | torch.Tensor,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The classifier's verdict on a run's generated images, for the run summary.

    ``sample_images`` [n, S, S] are the generated images (as generated, unclipped), ``labels``
    [n] the classes they were generated with (None for an unconditional model), ``val_images``
    [m, S, S] the validation images. The classifier for S × S images comes from ``cache_dir``
    (default: :func:`~normlab.models.classifier_cache.default_cache_dir`), trained there on
    first use. Returns

    * ``final_sample_class_acc``: :func:`sample_class_accuracy` (None without labels),
      a fraction in [0, 1], higher is better;
    * ``final_sample_fd``: :func:`frechet_distance` between the features of the samples and
      of the validation images, squared feature units, lower is better.
    """
    x = _images("sample_images", sample_images)
    v = _images("val_images", val_images)
    if x.shape[1:] != v.shape[1:]:
        raise ValueError(
            f"val_images: expected images of the samples' size {x.shape[1:]}, got {v.shape[1:]}"
        )
    if x.shape[0] < 2 or v.shape[0] < 2:
        raise ValueError(
            f"sample_images: the Fréchet distance needs >= 2 images per set, got {x.shape[0]} "
            f"samples and {v.shape[0]} validation images"
        )
    model = load_shape_classifier(ClassifierSettings(image_size=x.shape[1]), cache_dir).model
    acc = None if labels is None else sample_class_accuracy(model, x, labels)
    fd = frechet_distance(classifier_features(model, x), classifier_features(model, v))
    return {"final_sample_class_acc": acc, "final_sample_fd": fd}
