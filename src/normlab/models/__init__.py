"""Testbed models for comparing norms: a small decoder-only GPT (norm kind × placement).

Importing this package registers the ``"dyt"`` norm kind (Dynamic Tanh).
"""

from normlab.models.config import MLP_KINDS, PLACEMENTS, POSITION_KINDS, GPTConfig
from normlab.models.gpt import GPT, Block
from normlab.models.init import (
    check_paired,
    combined_digest,
    init_gpt_paired_,
    parameter_seed,
    shared_parameter_digests,
    tensor_digest,
)
from normlab.models.norms import NO_NORM, check_model_norm, make_model_norm, model_norm_kinds

__all__ = [
    "GPT",
    "MLP_KINDS",
    "NO_NORM",
    "PLACEMENTS",
    "POSITION_KINDS",
    "Block",
    "GPTConfig",
    "build_gpt",
    "check_model_norm",
    "check_paired",
    "combined_digest",
    "init_gpt_paired_",
    "make_model_norm",
    "model_norm_kinds",
    "parameter_seed",
    "shared_parameter_digests",
    "tensor_digest",
]


def build_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """A :class:`GPT` with the paired initialisation for ``seed`` (see :func:`init_gpt_paired_`)."""
    return init_gpt_paired_(GPT(cfg), seed)
