"""The ``"triton"`` backend: the reference backend's functions on the fused Triton kernels.

float64 input is handed to the reference backend (its statistics must be float64).
"""

from __future__ import annotations

from normlab.kernels.triton.adaptive import (
    ada_layer_norm,
    ada_rms_norm,
    gated_add_ada_rms_norm,
    gated_residual,
)
from normlab.kernels.triton.layer_norm import add_layer_norm, layer_norm
from normlab.kernels.triton.rms_norm import add_rms_norm, rms_norm

__all__ = [
    "ada_layer_norm",
    "ada_rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "gated_add_ada_rms_norm",
    "gated_residual",
    "layer_norm",
    "rms_norm",
]
