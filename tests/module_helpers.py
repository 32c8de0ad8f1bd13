"""Seeded inputs and parameter perturbation shared by the module tests."""

from __future__ import annotations

import torch
from torch import nn


def seeded(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values drawn in float64 from a generator seeded by ``seed``, then cast."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def randomise(module: nn.Module, seed: int = 1) -> nn.Module:
    """Add 0.3·N(0, 1) to every parameter (opens zero-initialised gates and modulations)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g).to(p.dtype))
    return module
