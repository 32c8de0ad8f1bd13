"""Row views that the fused kernels take: token tensors as [N, D], modulation as [M, D].

A modulation tensor (scale, shift, gate) arrives as a view that broadcasts over x [..., D]. The
kernels read row r // (N / M) of an [M, D] tensor for token row r, which covers a tensor shared
by all tokens (M = 1), one row per leading group such as per sequence [B, 1, D] (M = B), and per
token (M = N). Other broadcast patterns (say [1, T, D] over [B, T, D]) are expanded to per-token
rows; autograd then sums their gradient back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from normlab.kernels.triton.helpers import KERNELS_INTERPRETED


def uses_reference(x: torch.Tensor) -> bool:
    """float64 input runs the reference backend: its statistics must be float64 too."""
    return x.dtype == torch.float64


def check_device(x: torch.Tensor) -> None:
    """Compiled kernels need a GPU tensor; interpreted ones (``TRITON_INTERPRET=1``) take any."""
    if x.device.type != "cuda" and not KERNELS_INTERPRETED:
        raise ValueError(
            f"backend: 'triton' got a tensor on {x.device.type}; expected a CUDA tensor "
            "(or set TRITON_INTERPRET=1 before importing triton to run on the CPU interpreter)"
        )


def token_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] as [N, D] (a view when the leading dimensions merge)."""
    return x.reshape(-1, x.shape[-1])


def modulation_rows(m: torch.Tensor, x_shape: Sequence[int]) -> torch.Tensor:
    """[M, D] rows of a modulation view ``m`` broadcasting over ``x_shape`` (see module doc)."""
    lead = tuple(x_shape[:-1])
    m_lead = (1,) * (len(lead) - (m.dim() - 1)) + tuple(m.shape[:-1])
    varying = [i for i, size in enumerate(m_lead) if size != 1]
    last = varying[-1] if varying else -1
    if all(m_lead[i] == lead[i] for i in range(last + 1)):
        return m.reshape(math.prod(lead[: last + 1]), x_shape[-1])
    return m.expand(*x_shape).reshape(-1, x_shape[-1])


def align_reduced_rows(
    n_rows: int, mods: Sequence[torch.Tensor | None]
) -> list[torch.Tensor | None]:
    """Give every modulation tensor whose gradient is summed over tokens the same group size.

    The backward kernel reduces over one segment size per launch; a tensor with larger segments
    (say shared, while another is per sequence) is repeated to the finer rows, and autograd adds
    the repeats back. Only tensors that require grad count; the common case needs no copy.
    """
    if not torch.is_grad_enabled():
        return list(mods)
    groups = {
        n_rows // m.shape[0]
        for m in mods
        if m is not None and m.requires_grad and 0 < m.shape[0] < n_rows
    }
    if len(groups) <= 1:
        return list(mods)
    target = min(groups)
    aligned: list[torch.Tensor | None] = []
    for m in mods:
        group = n_rows // m.shape[0] if m is not None and m.shape[0] else 0
        if m is None or not m.requires_grad or group in (0, 1, target):
            aligned.append(m)
        elif group % target == 0:
            reps = group // target
            aligned.append(m.unsqueeze(1).expand(-1, reps, -1).reshape(-1, m.shape[-1]))
        else:
            aligned.append(m.unsqueeze(1).expand(-1, group, -1).reshape(-1, m.shape[-1]))
    return aligned


def residual_dtype(x: torch.Tensor, residual_in_fp32: bool) -> torch.dtype:
    """Dtype of the returned residual stream h: float32 when asked (16-bit x), else x's."""
    return torch.float32 if residual_in_fp32 and x.dtype != torch.float64 else x.dtype
