"""Dynamic Tanh (DyT): an element-wise stand-in for a norm, with no statistics at all."""

from __future__ import annotations

import torch
from torch import nn

from normlab._checks import check_finite_number, check_input, check_last_dim, stats_dtype
from normlab.layers.shapes import normalized_size


class DynamicTanh(nn.Module):
    """y = γ ⊙ tanh(α·x) + β over the last dimension.

    α is one learnable scalar (``alpha_init``, 0.5 by default), γ starts at 1 and β at 0. Unlike
    LayerNorm and RMSNorm nothing is computed across the vector: each element is squashed on its
    own, so DyT bounds activations without normalising them.

    The output has x's dtype, as LayerNorm's and RMSNorm's: tanh(α·x), γ and β are computed in
    float32 (float64 for float64 input) and the result is cast once at the end, whatever the
    parameters' dtype.
    """

    def __init__(
        self,
        dim: int | tuple[int, ...] | list[int] | torch.Size,
        alpha_init: float = 0.5,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        d = normalized_size(dim)
        self.normalized_shape: tuple[int, ...] = (d,)
        self.alpha_init = check_finite_number(alpha_init, "alpha_init")
        factory = {"device": device, "dtype": dtype}
        self.alpha = nn.Parameter(torch.empty((), **factory))
        self.weight = nn.Parameter(torch.empty(d, **factory))
        self.bias = nn.Parameter(torch.empty(d, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """α = ``alpha_init``, γ = 1, β = 0."""
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y = γ ⊙ tanh(α·x) + β in float32 (float64 for float64 x), returned in x's dtype."""
        check_last_dim(check_input("x", x), self.normalized_shape[0])
        sd = stats_dtype(x.dtype)
        y = torch.tanh(self.alpha.to(sd) * x.to(sd)) * self.weight.to(sd)
        if self.bias is not None:
            y = y + self.bias.to(sd)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, alpha_init={self.alpha_init}, bias={self.bias is not None}"
        )
