"""Batches: the same windows in the same order for every arm of one seed.

Training windows are drawn at random offsets from a generator seeded by the run's seed alone, so
for seed k every arm sees identical batches. Validation uses a fixed set of evenly spaced windows,
the same for every arm and every seed.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def batch_seed(seed: int) -> int:
    """The data-order seed of run seed ``seed`` (independent of the parameter seeds)."""
    digest = hashlib.sha256(f"{seed}:train-batches".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class TrainBatches:
    """Random windows of ``context + 1`` tokens; ``x`` is the first ``context``, ``y`` the next.

    ``next()`` returns the step's (x, y) as int64 tensors of shape [batch_size, context].
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, context: int, seed: int) -> None:
        for name, value in (("batch_size", batch_size), ("context", context)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if tokens.shape[0] < context + 2:
            raise ValueError(
                f"tokens: {tokens.shape[0]} training tokens; expected at least context + 2 = "
                f"{context + 2}"
            )
        self.tokens = tokens
        self.batch_size = batch_size
        self.context = context
        self.rng = np.random.Generator(np.random.PCG64(batch_seed(seed)))
        self.span = np.arange(context + 1)

    def next_offsets(self) -> np.ndarray:
        """Start offsets of the next batch's windows."""
        high = self.tokens.shape[0] - self.context - 1
        return self.rng.integers(0, high, size=self.batch_size, endpoint=True)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        windows = torch.from_numpy(
            np.asarray(self.tokens[self.next_offsets()[:, None] + self.span], dtype=np.int64)
        )
        return windows[:, :-1], windows[:, 1:]


def validation_offsets(n_tokens: int, context: int, n_windows: int) -> np.ndarray:
    """Start offsets of the validation windows: ``n_windows`` values evenly spaced over
    [0, n_tokens − context − 1], rounded (int64)."""
    if isinstance(n_windows, bool) or not isinstance(n_windows, int) or n_windows < 1:
        raise ValueError(f"n_windows: expected an int >= 1, got {n_windows!r}")
    last = n_tokens - context - 1
    if last < 0:
        raise ValueError(
            f"tokens: {n_tokens} validation tokens; expected at least context + 1 = {context + 1}"
        )
    return np.linspace(0, last, n_windows).round().astype(np.int64)


def validation_windows(tokens: np.ndarray, context: int, n_windows: int) -> torch.Tensor:
    """``n_windows`` evenly spaced windows of ``context + 1`` tokens, shape [n, context + 1].

    Windows overlap only when the validation set is shorter than ``n_windows · (context + 1)``.
    """
    offsets = validation_offsets(tokens.shape[0], context, n_windows)
    return torch.from_numpy(
        np.asarray(tokens[offsets[:, None] + np.arange(context + 1)], dtype=np.int64)
    )
