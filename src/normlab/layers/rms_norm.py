"""RMSNorm in the LLaMA (gain w) and Gemma (gain 1 + w) forms."""

from __future__ import annotations

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import (
    check_casting,
    check_eps,
    check_finite_number,
    check_input,
    check_last_dim,
)
from normlab.layers.layer_norm import normalized_size


class RMSNorm(nn.Module):
    """y = (o + w) ⊙ x·rsqrt(mean(x²) + ε) over the last dimension, statistics in float32.

    ``weight_offset`` o = 0 is the LLaMA form (w starts at 1), o = 1 the Gemma form (w starts at
    0); either way the gain starts at 1. ``casting`` is ``"llama"``, ``"gemma"`` or ``"fp32"``
    (see :func:`normlab.functional.rms_norm`). The state dict holds ``weight`` only, so it loads
    ``torch.nn.RMSNorm``'s and Hugging Face ``LlamaRMSNorm``'s; with ``weight_offset=1.0,
    casting="gemma"`` it loads and reproduces ``GemmaRMSNorm``.
    """

    def __init__(
        self,
        dim: int | tuple[int, ...] | list[int] | torch.Size,
        eps: float = 1e-6,
        weight_offset: float = 0.0,
        casting: str = "llama",
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        d = normalized_size(dim)
        self.normalized_shape: tuple[int, ...] = (d,)
        self.eps = check_eps(eps)
        self.weight_offset = check_finite_number(weight_offset, "weight_offset")
        self.casting = check_casting(casting)
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.empty(d, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """w = 1 − o, so that the gain o + w starts at 1."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_last_dim(check_input("x", x), self.normalized_shape[0])
        return F.rms_norm(x, self.weight, self.eps, self.weight_offset, self.casting)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, weight_offset={self.weight_offset}, "
            f"casting={self.casting!r}, elementwise_affine={self.elementwise_affine}"
        )
