"""Bits per byte for any tokenizer, from per-token losses and the UTF-8 bytes each token covers.

bpb = (Σ_t nats_t) / B / ln 2, where the sum runs over the predicted tokens and B is the number
of UTF-8 bytes they cover. For the byte tokenizer B is the number of tokens, so bpb is the mean
loss in nats per token / ln 2, computed in exactly the order the byte-level evaluation always
used ((Σ nats / count) / ln 2), so its numbers do not move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from normlab.data.batches import validation_offsets


def bits_per_byte(total_nats: float, n_bytes: int) -> float:
    """bpb = (total_nats / n_bytes) / ln 2: ``total_nats`` summed over predicted tokens, ``n_bytes``
    the UTF-8 bytes those tokens cover (the number of tokens for the byte tokenizer)."""
    if isinstance(n_bytes, bool) or int(n_bytes) < 1:
        raise ValueError(f"n_bytes: expected an int >= 1, got {n_bytes!r}")
    return total_nats / int(n_bytes) / math.log(2)


def token_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy in nats, −log softmax(logits)[target], computed in float32:
    ``logits`` [..., V], ``targets`` [...] → [...]."""
    flat = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none"
    )
    return flat.reshape(targets.shape)


def window_bytes(
    token_bytes: np.ndarray | None, n_tokens: int, context: int, n_windows: int
) -> torch.Tensor:
    """The UTF-8 bytes covered by each predicted token of the windows that
    :func:`normlab.data.batches.validation_windows` cuts from ``n_tokens`` validation tokens:
    int64 [n_windows, context], entry (i, j) = bytes of token ``offset_i + 1 + j``.
    ``token_bytes`` ``None`` (the byte tokenizer): all ones."""
    offsets = validation_offsets(n_tokens, context, n_windows)
    if token_bytes is None:
        return torch.ones(len(offsets), context, dtype=torch.int64)
    if token_bytes.shape[0] != n_tokens:
        raise ValueError(
            f"token_bytes: {token_bytes.shape[0]} counts for {n_tokens} validation tokens"
        )
    index = offsets[:, None] + 1 + np.arange(context)
    return torch.from_numpy(np.asarray(token_bytes[index], dtype=np.int64))


@dataclass
class BpbTally:
    """Running sums over validation batches: ``total_nats`` (Σ per-token nats, each batch's sum
    added as a Python float, as the byte-level evaluation does), ``n_tokens``, ``n_bytes``.

    ``loss`` = total_nats / n_tokens (nats per token; per byte for the byte tokenizer);
    ``bpb`` = :func:`bits_per_byte` (total_nats, n_bytes)."""

    total_nats: float = 0.0
    n_tokens: int = 0
    n_bytes: int = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor, target_bytes: torch.Tensor) -> None:
        """Add one batch: ``logits`` [B, T, V], ``targets`` [B, T], ``target_bytes`` [B, T]."""
        if target_bytes.shape != targets.shape:
            raise ValueError(
                f"target_bytes: shape {tuple(target_bytes.shape)}; expected the targets' "
                f"{tuple(targets.shape)}"
            )
        self.total_nats += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum"
        ).item()
        self.n_tokens += targets.numel()
        self.n_bytes += int(target_bytes.sum().item())

    @property
    def loss(self) -> float:
        return self.total_nats / self.n_tokens

    @property
    def bpb(self) -> float:
        return bits_per_byte(self.total_nats, self.n_bytes)
