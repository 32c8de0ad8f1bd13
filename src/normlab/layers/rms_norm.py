"""RMSNorm in the LLaMA (gain w) and Gemma (gain 1 + w) forms."""

from __future__ import annotations

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import (
    check_bool,
    check_casting,
    check_finite_number,
    check_optional_eps,
    stats_dtype,
)
from normlab.layers.shapes import ShapeArg, norm_over_trailing, normalized_shape_tuple


class RMSNorm(nn.Module):
    """y = (o + w) ⊙ x·rsqrt(mean(x²) + ε) over the trailing ``normalized_shape`` dimensions.

    Statistics in float32 (float64 for float64 input). The positional parameters are
    ``torch.nn.RMSNorm``'s (``normalized_shape, eps, elementwise_affine, device, dtype``);
    ``eps=None`` is torch's default ε, the machine epsilon of the statistics dtype (float32 for
    16-bit input), chosen per call. ``weight_offset`` o = 0 is the LLaMA form (w starts at 1),
    o = 1 the Gemma form (w starts at 0); either way the gain starts at 1. ``casting`` is
    ``"llama"``, ``"gemma"`` or ``"fp32"`` (see :func:`normlab.functional.rms_norm`): ``"llama"``
    rounds like Hugging Face ``LlamaRMSNorm``, ``"gemma"`` like ``GemmaRMSNorm`` and like
    ``torch.nn.RMSNorm``. The state dict holds ``weight`` only, so it loads ``torch.nn.RMSNorm``'s
    and ``LlamaRMSNorm``'s; with ``weight_offset=1.0, casting="gemma"`` it loads and reproduces
    ``GemmaRMSNorm``. ``promote_output=True`` gives the output the dtype
    ``torch.promote_types(casting's output dtype, weight dtype)``: Hugging Face ``LlamaRMSNorm``
    multiplies a float32 weight by x̂ rounded to a 16-bit input's dtype and so returns float32.
    """

    def __init__(
        self,
        normalized_shape: ShapeArg,
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        weight_offset: float = 0.0,
        casting: str = "llama",
        promote_output: bool = False,
    ) -> None:
        super().__init__()
        self.normalized_shape: tuple[int, ...] = normalized_shape_tuple(normalized_shape)
        self.eps = check_optional_eps(eps)
        self.elementwise_affine = check_bool(elementwise_affine, "elementwise_affine")
        self.weight_offset = check_finite_number(weight_offset, "weight_offset")
        self.casting = check_casting(casting)
        self.promote_output = check_bool(promote_output, "promote_output")
        if self.elementwise_affine:
            self.weight = nn.Parameter(
                torch.empty(self.normalized_shape, device=device, dtype=dtype)
            )
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """w = 1 − o, so that the gain o + w starts at 1."""
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_over_trailing(self._rms_norm, x, self.normalized_shape, (self.weight,))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        out_dtype = None
        if self.promote_output and weight is not None:
            default = stats_dtype(x.dtype) if self.casting == "fp32" else x.dtype
            out_dtype = torch.promote_types(default, weight.dtype)
        return F.rms_norm(
            x, weight, self.eps, self.weight_offset, self.casting, out_dtype=out_dtype
        )

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, weight_offset={self.weight_offset}, "
            f"casting={self.casting!r}, elementwise_affine={self.elementwise_affine}"
            + (", promote_output=True" if self.promote_output else "")
        )
