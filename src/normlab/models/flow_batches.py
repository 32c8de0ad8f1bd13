"""Paired batches for flow matching: the same images, noises and times for every arm of a seed.

Training: images are visited in a fresh random order each epoch (a permutation drawn from a
generator seeded by the run's seed alone), and for each batch the times t and the noises x0 are
drawn, in that order, from a CPU ``torch.Generator`` seeded by the run's seed alone. With label
dropout p > 0 (classifier-free guidance), each label is then replaced by the null class with
probability p, the mask m_i = [u_i < p] drawn from a third CPU generator seeded by the run's seed
alone (stream ``flow-label-dropout``; :func:`normlab.models.flow.drop_labels`). So for seed k
every arm sees identical (x1, label, x0, t), dropped labels included, at every step, whatever
the device; and since the mask has its own stream, the order, x0 and t do not depend on p.

Validation: a fixed set of (x1, label, x0, t), one per validation image, with x0 and t drawn from
a generator seeded by the data seed: the same for every arm and every seed. Its labels are the
true classes, never dropped, so the validation loss measures the conditional model whatever p is.

Sampling: the noises x0 the Euler sampler starts from at the end of a run, and their labels
(balanced over the classes), also follow from the data seed alone (:func:`sample_inputs`), so
every arm and every seed carries the same noise to its samples.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from normlab.models.flow import drop_labels, sample_noise, sample_time

__all__ = ["FlowBatch", "FlowBatches", "flow_seed", "sample_inputs", "validation_triples"]

FlowBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(x1 [B, T, C] float32, label [B] int64, x0 [B, T, C] float32, t [B] float32), on the CPU."""


def flow_seed(seed: int, tag: str) -> int:
    """A 63-bit generator seed for the stream ``tag`` of run (or data) seed ``seed``."""
    digest = hashlib.sha256(f"{seed}:{tag}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _draw(
    x1: torch.Tensor, generator: torch.Generator, distribution: str
) -> tuple[torch.Tensor, torch.Tensor]:
    t = sample_time(x1.shape[0], generator, distribution=distribution)
    return sample_noise(x1, generator), t


def _check_dropout(label_dropout: object, null_class: object) -> tuple[float, int | None]:
    """(p, null class) of :class:`FlowBatches`: p in [0, 1), and a null class when p > 0."""
    if (
        isinstance(label_dropout, bool)
        or not isinstance(label_dropout, int | float)
        or not 0 <= label_dropout < 1
    ):
        raise ValueError(f"label_dropout: expected a number in [0, 1), got {label_dropout!r}")
    if null_class is not None and (
        isinstance(null_class, bool) or not isinstance(null_class, int) or null_class < 0
    ):
        raise ValueError(f"null_class: expected an int >= 0 or None, got {null_class!r}")
    if label_dropout > 0 and null_class is None:
        raise ValueError(
            f"null_class: label_dropout={label_dropout} replaces labels by the null class; "
            "expected its index (an int >= 0), got None"
        )
    return float(label_dropout), null_class


class FlowBatches:
    """``next()`` returns the step's :data:`FlowBatch` (see the module docstring).

    ``label_dropout`` p: each label of a batch becomes ``null_class`` with probability p
    (classifier-free guidance training; 0, the default, keeps every label). With a
    ``null_class`` the dropout mask is drawn at every step, even for p = 0, from the run seed's
    ``flow-label-dropout`` stream.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        batch_size: int,
        seed: int,
        distribution: str = "logit_normal",
        *,
        label_dropout: float = 0.0,
        null_class: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        self.label_dropout, self.null_class = _check_dropout(label_dropout, null_class)
        if images.shape[0] != labels.shape[0] or images.shape[0] < 1:
            raise ValueError(
                f"images: expected one label per image and at least one image, got "
                f"{images.shape[0]} images and {labels.shape[0]} labels"
            )
        self.images = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
        self.labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        self.batch_size = batch_size
        self.distribution = distribution
        self.order_rng = np.random.Generator(np.random.PCG64(flow_seed(seed, "flow-order")))
        self.generator = torch.Generator(device="cpu").manual_seed(flow_seed(seed, "flow-noise"))
        self.dropout_generator = torch.Generator(device="cpu").manual_seed(
            flow_seed(seed, "flow-label-dropout")
        )
        self._order = np.empty(0, dtype=np.int64)

    def next_indices(self) -> np.ndarray:
        """Indices of the next batch's images: the current epoch's permutation, continued into
        a new one when it runs out."""
        while self._order.size < self.batch_size:
            perm = self.order_rng.permutation(self.images.shape[0])
            self._order = np.concatenate([self._order, perm])
        idx, self._order = self._order[: self.batch_size], self._order[self.batch_size :]
        return idx

    def next(self) -> FlowBatch:
        idx = torch.from_numpy(self.next_indices())
        x1, label = self.images[idx], self.labels[idx]
        x0, t = _draw(x1, self.generator, self.distribution)
        if self.null_class is not None:
            label = drop_labels(label, self.label_dropout, self.dropout_generator, self.null_class)
        return x1, label, x0, t

    def get_state(self) -> dict[str, Any]:
        """Where the stream is (copies): the order generator's state, the rest of the current
        epoch's permutation, and the states of the noise and label-dropout generators."""
        return {
            "order_rng": self.order_rng.bit_generator.state,
            "order": self._order.copy(),
            "noise": self.generator.get_state(),
            "dropout": self.dropout_generator.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Put the stream back where :meth:`get_state` found it: the next batches are the ones
        that followed then."""
        self.order_rng.bit_generator.state = state["order_rng"]
        self._order = state["order"].copy()
        self.generator.set_state(state["noise"])
        self.dropout_generator.set_state(state["dropout"])


def validation_triples(
    images: np.ndarray, labels: np.ndarray, data_seed: int, distribution: str = "logit_normal"
) -> FlowBatch:
    """One (x1, label, x0, t) per validation image, x0 and t drawn from a generator seeded by
    ``data_seed`` alone: identical for every arm and every run seed."""
    x1 = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    label = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    generator = torch.Generator(device="cpu").manual_seed(flow_seed(data_seed, "flow-validation"))
    x0, t = _draw(x1, generator, distribution)
    return x1, label, x0, t


def sample_inputs(
    n: int, seq_len: int, channels: int, n_classes: int, data_seed: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The start of the end-of-run sampling: (x0 [n, seq_len, channels] float32, labels).

    x0 ~ N(0, I) is drawn from a CPU generator seeded by ``data_seed`` alone (stream
    ``flow-samples``): identical for every arm and every run seed. Labels are balanced over the
    classes in a fixed cycle, label_i = i mod ``n_classes`` (so any 4 · n_classes consecutive
    samples hold 4 of each class), int64 [n]; None when ``n_classes`` is 0 (unconditional).
    """
    for name, value, low in (("n", n, 1), ("seq_len", seq_len, 1), ("channels", channels, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 0:
        raise ValueError(f"n_classes: expected an int >= 0, got {n_classes!r}")
    generator = torch.Generator(device="cpu").manual_seed(flow_seed(data_seed, "flow-samples"))
    x0 = torch.randn((n, seq_len, channels), generator=generator, dtype=torch.float32)
    labels = torch.arange(n, dtype=torch.int64) % n_classes if n_classes > 0 else None
    return x0, labels
