"""The data of the Hugging Face and Lightning examples: the bytes of a few modules of Python's
standard library (``plain_loop.corpus``: the plain loop's data, nothing downloaded), the first
90 % for training and the rest for validation, cut into windows of ``context + 1`` bytes.

Each item is ``{"input_ids": w, "labels": w}`` (a window of byte ids): the model predicts each
byte from the ones before it, so the loss shifts the labels by one (Hugging Face's causal LMs
do it themselves).
"""

from __future__ import annotations

import torch
from plain_loop import corpus
from torch.utils.data import Dataset

CONTEXT = 32


class ByteWindows(Dataset):
    """Every window of ``context + 1`` bytes of ``data`` that starts at a multiple of
    ``context`` (non-overlapping targets)."""

    def __init__(self, data: torch.Tensor, context: int = CONTEXT) -> None:
        self.data, self.context = data, context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.data[i * self.context : (i + 1) * self.context + 1]
        return {"input_ids": window, "labels": window}


def splits(context: int = CONTEXT, val_windows: int = 64) -> tuple[ByteWindows, ByteWindows]:
    """The training windows and the first ``val_windows`` validation windows."""
    data = corpus()
    split = int(0.9 * len(data))
    val = data[split : split + val_windows * context + 1]
    return ByteWindows(data[:split], context), ByteWindows(val, context)
