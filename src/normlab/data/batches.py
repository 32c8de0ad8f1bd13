"""Batches: the same windows in the same order for every arm of one seed.

Training windows are drawn at random offsets from a generator seeded by the run's seed alone, so
for seed k every arm sees identical batches. Validation uses a fixed set of evenly spaced windows,
the same for every arm and every seed; the whole split is every non-overlapping window
(:func:`split_offsets`), cut on demand (:class:`OffsetWindows`).
"""

from __future__ import annotations

import hashlib
from typing import Any

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

    def get_state(self) -> dict[str, Any]:
        """Where the stream is: its generator's state (a copy)."""
        return {"rng": self.rng.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        """Put the stream back where :meth:`get_state` found it: the next batches are the ones
        that followed then."""
        self.rng.bit_generator.state = state["rng"]


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


def split_offsets(n_tokens: int, context: int) -> np.ndarray:
    """Start offsets of every non-overlapping window of ``context + 1`` tokens of a split of
    ``n_tokens``: 0, c + 1, 2(c + 1), … while a whole window fits (int64; the last
    n_tokens mod (c + 1) tokens are left out). Each window predicts its last c tokens."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context: expected an int >= 1, got {context!r}")
    if n_tokens < context + 1:
        raise ValueError(
            f"tokens: {n_tokens} validation tokens; expected at least context + 1 = {context + 1}"
        )
    return np.arange(0, n_tokens - context, context + 1, dtype=np.int64)


class OffsetWindows:
    """Rows ``values[o + shift : o + shift + width]`` for each offset o of ``offsets``, cut
    when sliced (a view of the whole split need not fit in memory as int64): ``shape`` is
    [len(offsets), width] and ``windows[a:b]`` an int64 tensor of rows a … b − 1.

    ``OffsetWindows(tokens, split_offsets(n, c), c + 1)`` are the whole split's windows; with
    ``shift`` 1 and ``width`` c, the entries of per-token counts aligned with their targets
    (the bytes each predicted token covers)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray, width: int, shift: int = 0) -> None:
        if offsets.size and int(offsets.max()) + shift + width > values.shape[0]:
            raise ValueError(
                f"offsets: a window of {width} at offset {int(offsets.max())} + {shift} runs "
                f"past the {values.shape[0]} values"
            )
        self.values, self.offsets = values, offsets
        self.span = shift + np.arange(width)
        self.shape = (int(offsets.shape[0]), int(width))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> torch.Tensor:
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"rows: expected a slice with step 1, got {rows!r}")
        index = self.offsets[rows][:, None] + self.span
        return torch.from_numpy(np.asarray(self.values[index], dtype=np.int64))
