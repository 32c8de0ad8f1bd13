"""LayerNorm: a drop-in for ``torch.nn.LayerNorm``."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import (
    check_bool,
    check_dim,
    check_input,
    check_layer_norm_eps,
    check_trailing_shape,
)

ShapeArg = int | tuple[int, ...] | list[int] | torch.Size


def normalized_shape_tuple(normalized_shape: ShapeArg) -> tuple[int, ...]:
    """``normalized_shape`` as torch takes it: an int D, or a non-empty shape (D₁, …, D_k)."""
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        return (check_dim(normalized_shape, "normalized_shape"),)
    if not isinstance(normalized_shape, (tuple, list, torch.Size)):
        raise TypeError(
            f"normalized_shape: got {type(normalized_shape).__name__} {normalized_shape!r}; "
            "expected an int D or a shape (D₁, …, D_k)"
        )
    shape = tuple(normalized_shape)
    if not shape:
        raise ValueError(
            "normalized_shape: got an empty shape (); expected an int D or a shape (D₁, …, D_k)"
        )
    return tuple(check_dim(d, "normalized_shape") for d in shape)


def normalized_size(normalized_shape: ShapeArg) -> int:
    """The size D of the last dimension from an int or a one-element shape."""
    shape = normalized_shape_tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(
            f"normalized_shape: got {shape}; this module works on the last dimension only, "
            "expected an int D or a one-element shape (D,)"
        )
    return shape[0]


def norm_over_trailing(
    fn: Callable[..., torch.Tensor],
    x: torch.Tensor,
    shape: tuple[int, ...],
    params: tuple[torch.Tensor | None, ...],
) -> torch.Tensor:
    """``fn(x, *params)`` normalising over the trailing dimensions ``shape`` of x.

    A k-dimensional ``normalized_shape`` (D₁, …, D_k) is one vector of D = D₁·…·D_k per token:
    x [..., D₁, …, D_k] is seen as [..., D] and the parameters of shape ``shape`` as [D].
    """
    check_trailing_shape(check_input("x", x), shape)
    if len(shape) == 1:
        return fn(x, *params)
    flat = [None if p is None else p.reshape(-1) for p in params]
    return fn(x.flatten(-len(shape)), *flat).unflatten(-1, shape)


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
