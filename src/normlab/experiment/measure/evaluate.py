"""Validation: mean cross-entropy and bits per byte on a fixed set of windows (GPT); the
flow-matching loss on a fixed set of (x1, x0, t) triples (DiT), and the DiT's samples from fixed
noises (:func:`generate_samples`)."""

from __future__ import annotations

import math

import torch

from normlab.data.batches import OffsetWindows
from normlab.models.flow import euler_sample, flow_matching_loss
from normlab.models.gpt import GPT


@torch.no_grad()
def validation_loss(
    model: GPT, windows: torch.Tensor | OffsetWindows, batch_size: int, device: str
) -> float:
    """Mean next-byte cross-entropy (nats per byte) over every position of every window.

    ``windows``: [n, context + 1] int64 (a tensor, or windows cut as they are read,
    :class:`normlab.data.OffsetWindows`); the model sees the first ``context`` tokens of each
    and predicts the following ones. Bits per byte = loss / ln 2 (one token is one byte).
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


@torch.no_grad()
def flow_validation_loss(
    model: torch.nn.Module,
    x1: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    label: torch.Tensor | None,
    batch_size: int,
    device: torch.device | str,
) -> float:
    """Mean flow-matching loss over fixed triples: (1 / N) Σ_i mean((v̂(x_t,i, t_i) − (x1_i −
    x0_i))²), x_t = (1 − t)·x0 + t·x1, N = x1.shape[0] samples, in chunks of ``batch_size``
    (each chunk's mean weighted by its number of samples). ``label`` is passed when given."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, x1.shape[0], batch_size):
            chunk = slice(start, start + batch_size)
            lab = None if label is None else label[chunk].to(device)
            loss = flow_matching_loss(
                model, x1[chunk].to(device), x0[chunk].to(device), t[chunk].to(device), lab
            )
            n = x1[chunk].shape[0]
            total += loss.item() * n
            count += n
    finally:
        model.train(was_training)
    return total / count


@torch.no_grad()
def generate_samples(
    model: torch.nn.Module,
    x0: torch.Tensor,
    label: torch.Tensor | None,
    steps: int,
    batch_size: int,
    device: torch.device | str,
    cfg_scale: float = 1.0,
    null_label: int | None = None,
) -> torch.Tensor:
    """Samples of a flow model: :func:`normlab.models.flow.euler_sample` with ``steps`` Euler
    steps from each noise x0_i (``label_i`` passed when given), in eval mode without gradients,
    in chunks of ``batch_size``; returns them on the CPU in float32, shaped like ``x0``.

    ``cfg_scale`` w ≠ 1 samples with classifier-free guidance, v = v_∅ + w · (v_c − v_∅) with
    ∅ = ``null_label`` (:func:`normlab.models.flow.guided_velocity`); w = 1 is unguided."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, x0.shape[0], batch_size):
            chunk = slice(start, start + batch_size)
            lab = None if label is None else label[chunk].to(device)
            x = euler_sample(model, x0[chunk].to(device), steps, lab, cfg_scale, null_label)
            out.append(x.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)
