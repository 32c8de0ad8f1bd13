"""Shape helpers of the layers: ``normalized_shape`` as torch takes it, and norms over the
trailing dimensions of a tensor (a k-dimensional shape is one vector of D = D₁·…·D_k per token)."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import torch

from normlab._checks import check_dim, check_input, check_trailing_shape

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
