"""Validation: mean cross-entropy and bits per byte on a fixed set of windows."""

from __future__ import annotations

import math

import torch

from normlab.models.gpt import GPT


@torch.no_grad()
def validation_loss(model: GPT, windows: torch.Tensor, batch_size: int, device: str) -> float:
    """Mean next-byte cross-entropy (nats per byte) over every position of every window.

    ``windows``: [n, context + 1] int64; the model sees the first ``context`` tokens of each and
    predicts the following ones. Bits per byte = loss / ln 2 (one token is one byte).
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, windows.shape[0], batch_size):
            chunk = windows[start : start + batch_size].to(device)
            logits, _ = model(chunk[:, :-1])
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                chunk[:, 1:].reshape(-1),
                reduction="sum",
            ).item()
            count += chunk[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / count


def bits_per_byte(loss_nats: float) -> float:
    """bpb = loss / ln 2 for a byte-level model."""
    return loss_nats / math.log(2)
