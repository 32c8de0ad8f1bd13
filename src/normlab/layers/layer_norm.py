"""LayerNorm: a drop-in for ``torch.nn.LayerNorm``."""

from __future__ import annotations

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import check_bool, check_layer_norm_eps
from normlab.layers.shapes import ShapeArg, norm_over_trailing, normalized_shape_tuple


class LayerNorm(nn.Module):
    """y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β over the trailing ``normalized_shape`` dimensions.

    Statistics in float32 (float64 for float64 input). Same arguments, attributes and
    state-dict keys (``weight``, ``bias``) as ``torch.nn.LayerNorm``; a k-dimensional
    ``normalized_shape`` normalises each token's last k dimensions as one vector, as torch does.
    """

    def __init__(
        self,
        normalized_shape: ShapeArg,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape: tuple[int, ...] = normalized_shape_tuple(normalized_shape)
        self.eps = check_layer_norm_eps(eps)
        self.elementwise_affine = check_bool(elementwise_affine, "elementwise_affine")
        bias = check_bool(bias, "bias")
        factory = {"device": device, "dtype": dtype}
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """γ = 1, β = 0."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_over_trailing(
            self._layer_norm, x, self.normalized_shape, (self.weight, self.bias)
        )

    def _layer_norm(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return F.layer_norm(x, weight, bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )
