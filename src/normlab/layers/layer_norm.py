"""LayerNorm: a drop-in for ``torch.nn.LayerNorm`` over the last dimension."""

from __future__ import annotations

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import check_dim, check_eps, check_input, check_last_dim


def normalized_size(normalized_shape: int | tuple[int, ...] | list[int] | torch.Size) -> int:
    """The size D of the last dimension from an int or a one-element shape."""
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return check_dim(normalized_shape, "normalized_shape")
    if not isinstance(normalized_shape, (tuple, list, torch.Size)):
        raise TypeError(
            f"normalized_shape: got {type(normalized_shape).__name__} {normalized_shape!r}; "
            "expected an int D or a one-element shape (D,)"
        )
    shape = tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(
            f"normalized_shape: got {shape}; normlab normalises over the last dimension only, "
            "expected an int D or a one-element shape (D,)"
        )
    return check_dim(shape[0], "normalized_shape")


class LayerNorm(nn.Module):
    """y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β over the last dimension, statistics in float32.

    Same arguments, attributes and state-dict keys (``weight``, ``bias``) as
    ``torch.nn.LayerNorm`` for a one-dimensional ``normalized_shape``.
    """

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...] | list[int] | torch.Size,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dim = normalized_size(normalized_shape)
        self.normalized_shape: tuple[int, ...] = (dim,)
        self.eps = check_eps(eps)
        self.elementwise_affine = bool(elementwise_affine)
        factory = {"device": device, "dtype": dtype}
        if self.elementwise_affine:
            self.weight = nn.Parameter(torch.empty(dim, **factory))
            if bias:
                self.bias = nn.Parameter(torch.empty(dim, **factory))
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
        check_last_dim(check_input("x", x), self.normalized_shape[0])
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )
