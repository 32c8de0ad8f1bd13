"""normlab: normalization layers done right.

Exact LayerNorm, RMSNorm (LLaMA ``w`` and Gemma ``1 + w`` gains), AdaRMS and adaLN-Zero, with
statistics per token over the last dimension in float32 and ε inside the square root.
"""

from normlab import functional
from normlab._version import __version__
from normlab.kernels import (
    BackendUnavailableError,
    available_backends,
    register_backend,
    set_default_backend,
)
from normlab.layers import AdaLayerNormZero, AdaRMSNorm, LayerNorm, RMSNorm
from normlab.modulation import dit_to_pi05, pi05_to_dit, reorder_chunks, reorder_linear
from normlab.patching import NormReplacement, replace_norms
from normlab.registry import available_norms, is_conditional, make_norm, register_norm

__all__ = [
    "AdaLayerNormZero",
    "AdaRMSNorm",
    "BackendUnavailableError",
    "LayerNorm",
    "NormReplacement",
    "RMSNorm",
    "__version__",
    "available_backends",
    "available_norms",
    "dit_to_pi05",
    "functional",
    "is_conditional",
    "make_norm",
    "pi05_to_dit",
    "register_backend",
    "register_norm",
    "reorder_chunks",
    "reorder_linear",
    "replace_norms",
    "set_default_backend",
]
