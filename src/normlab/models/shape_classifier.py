"""A small classifier of the embedded shapes, the judge of the DiT testbed's samples.

:class:`ShapeClassifier` is a two-convolution network on one ``size × size`` grayscale image in
[−1, 1] (inputs are clipped to that range first, so generated images that overshoot are read as
the nearest valid image):

    x → conv3×3(1→c₁) → ReLU → maxpool 2 → conv3×3(c₁→c₂) → ReLU → maxpool 2
      → flatten → Linear(c₂·⌊⌊size/2⌋/2⌋² → F) → ReLU  =  φ(x) ∈ R^F   (the features)
      → Linear(F → 4)                              =  logits

:func:`train_shape_classifier` trains it with Adam on cross-entropy, on images drawn by
:func:`normlab.data.shapes.make_shapes` from the classifier's own data seed, and measures its
accuracy on held-out images of the same stream. Training is deterministic: the initial weights
and the batch order come from explicit generators seeded by :attr:`ClassifierSettings.seed`, and
it runs in one thread (a different thread count changes the order of floating-point sums), so
two trainings with the same settings give bit-identical weights on the same machine and torch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from normlab.data.shapes import SHAPE_CLASSES, make_shapes

__all__ = [
    "ClassifierSettings",
    "ShapeClassifier",
    "TrainedClassifier",
    "classifier_accuracy",
    "predict",
    "single_thread",
    "train_shape_classifier",
]


@dataclass(frozen=True)
class ClassifierSettings:
    """Everything that determines a trained classifier (the cache is keyed by these).

    ``data_seed`` seeds the shapes stream the images are drawn from (not the DiT's data seed 0,
    so the DiT's validation images are new to the classifier); the first ``n_train`` distinct
    images train it, the next ``n_heldout`` measure its accuracy. ``seed`` seeds the initial
    weights and the batch order.
    """

    image_size: int = 16
    n_train: int = 8192
    n_heldout: int = 2048
    data_seed: int = 20261201
    seed: int = 0
    channels: tuple[int, int] = (16, 32)
    features: int = 64
    epochs: int = 4
    batch_size: int = 64
    lr: float = 3e-3

    def __post_init__(self) -> None:
        for name in ("n_train", "n_heldout", "epochs", "batch_size", "features"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        size = self.image_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 4:
            raise ValueError(f"image_size: expected an int >= 4, got {size!r}")
        for name in ("data_seed", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
        if len(self.channels) != 2 or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in self.channels
        ):
            raise ValueError(f"channels: expected two ints >= 1, got {self.channels!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: expected a finite float > 0, got {self.lr!r}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values (``channels`` as a list)."""
        d = asdict(self)
        d["channels"] = list(self.channels)
        return d


class ShapeClassifier(nn.Module):
    """The network of the module docstring: ``features(x)`` is φ(x) [n, F], ``forward(x)`` the
    logits [n, 4]; ``x`` is [n, size, size] (or [n, 1, size, size]) in [−1, 1]."""

    def __init__(
        self, image_size: int = 16, channels: tuple[int, int] = (16, 32), features: int = 64
    ) -> None:
        super().__init__()
        if image_size < 4:
            raise ValueError(f"image_size: expected an int >= 4, got {image_size}")
        c1, c2 = channels
        self.image_size = image_size
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc = nn.Linear(c2 * (image_size // 2 // 2) ** 2, features)
        self.head = nn.Linear(features, len(SHAPE_CLASSES))

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x: expected a floating-point tensor, got {type(x).__name__}")
        if x.dim() == 3:
            x = x.unsqueeze(1)
        s = self.image_size
        if x.dim() != 4 or tuple(x.shape[1:]) != (1, s, s):
            raise ValueError(
                f"x: expected shape [n, {s}, {s}] or [n, 1, {s}, {s}], got {tuple(x.shape)}"
            )
        return x.to(self.fc.weight.dtype).clamp(-1.0, 1.0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ(x): the penultimate layer, ReLU(fc(flatten(conv stack(clip(x, −1, 1)))))."""
        h = F.max_pool2d(F.relu(self.conv1(self._input(x))), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return F.relu(self.fc(h.flatten(1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits head(φ(x)), [n, 4] in the order of :data:`~normlab.data.shapes.SHAPE_CLASSES`."""
        return self.head(self.features(x))


@dataclass
class TrainedClassifier:
    """A trained :class:`ShapeClassifier` (eval mode) with its settings, its accuracy on the
    ``n_heldout`` held-out images, the training's wall time and its CPU time (this process,
    all threads) in seconds."""

    model: ShapeClassifier
    settings: ClassifierSettings
    heldout_accuracy: float
    train_seconds: float
    train_cpu_seconds: float


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(1)``, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def predict(
    model: ShapeClassifier, images: np.ndarray | torch.Tensor, batch: int = 1024
) -> np.ndarray:
    """argmax_k logits_k(x_i) for every image, int64 [n]."""
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    out = [model(x[i : i + batch]).argmax(dim=1) for i in range(0, x.shape[0], batch)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


def classifier_accuracy(
    model: ShapeClassifier, images: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor
) -> float:
    """acc = (1/n) Σᵢ [argmax_k logits_k(xᵢ) = yᵢ], in [0, 1]."""
    y = np.asarray(labels).astype(np.int64).reshape(-1)
    if len(images) != y.shape[0] or y.shape[0] == 0:
        raise ValueError(
            f"labels: expected one label per image ({len(images)} images), got {y.shape[0]}"
        )
    was_training = model.training
    model.eval()
    try:
        pred = predict(model, images)
    finally:
        model.train(was_training)
    return float(np.mean(pred == y))


def train_shape_classifier(settings: ClassifierSettings | None = None) -> TrainedClassifier:
    """Train a :class:`ShapeClassifier` from ``settings`` (defaults: :class:`ClassifierSettings`).

    Minimises the mean cross-entropy −(1/B) Σᵢ log softmax(logits(xᵢ))_{yᵢ} with Adam (lr
    ``settings.lr``, cosine decay to 0 over all steps), ``epochs`` passes over the ``n_train``
    images in an order drawn per epoch from a generator seeded by ``settings.seed`` (which also
    seeds the initial weights). Runs in one thread (:func:`single_thread`), so the weights are
    bit-identical for the same settings. Returns the model in eval mode with its accuracy on
    the ``n_heldout`` held-out images.
    """
    s = settings if settings is not None else ClassifierSettings()
    if not isinstance(s, ClassifierSettings):
        raise TypeError(f"settings: expected ClassifierSettings, got {type(s).__name__}")
    start, start_cpu = time.perf_counter(), time.process_time()
    x_tr, y_tr, x_ho, y_ho = make_shapes(s.n_train, s.n_heldout, s.image_size, s.data_seed)
    x = torch.from_numpy(x_tr)
    y = torch.from_numpy(y_tr)
    with single_thread():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s.seed)
            model = ShapeClassifier(s.image_size, s.channels, s.features)
        generator = torch.Generator().manual_seed(s.seed + 1)
        steps_per_epoch = math.ceil(s.n_train / s.batch_size)
        total = s.epochs * steps_per_epoch
        opt = torch.optim.Adam(model.parameters(), lr=s.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda k: 0.5 * (1.0 + math.cos(math.pi * k / total))
        )
        model.train()
        for _ in range(s.epochs):
            order = torch.randperm(s.n_train, generator=generator)
            for i in range(0, s.n_train, s.batch_size):
                idx = order[i : i + s.batch_size]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
        model.eval()
        accuracy = classifier_accuracy(model, x_ho, y_ho)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return TrainedClassifier(model, s, accuracy, wall, cpu)
