"""Testbed models for comparing norms: a small decoder-only GPT (norm kind × placement) and a
small DiT for flow matching (conditional norm kind), with the flow-matching objective and sampler,
and their validated configuration (:mod:`normlab.models.config`, the one source of the testbeds'
settings and defaults).

Importing this package registers the ``"dyt"`` norm kind (Dynamic Tanh).
"""

from normlab.models.config import (
    DEFAULT_CFG_SCALE,
    DEFAULT_LABEL_DROPOUT,
    DIT_POSITION_KINDS,
    GUIDANCE_NEUTRAL,
    MLP_KINDS,
    PLACEMENTS,
    POSITION_KINDS,
    TIME_DISTRIBUTIONS,
    ConfigModel,
    DiTArchitecture,
    DiTConfig,
    DiTSettings,
    GPTConfig,
    GPTSettings,
)
from normlab.models.dit import DiT, DiTBlock, build_dit, init_dit_paired_, make_dit_norm
from normlab.models.flow import (
    drop_labels,
    euler_sample,
    flow_matching_loss,
    guided_velocity,
    interpolate,
    label_dropout_mask,
    random_projections,
    sample_noise,
    sample_time,
    sliced_wasserstein2,
    target_velocity,
)
from normlab.models.gpt import GPT, Block
from normlab.models.init import (
    check_paired,
    combined_digest,
    init_gpt_paired_,
    parameter_seed,
    shared_parameter_digests,
    tensor_digest,
)
from normlab.models.norms import (
    NO_NORM,
    check_dit_norm,
    check_model_norm,
    dit_norm_kinds,
    make_model_norm,
    model_norm_kinds,
)

__all__ = [
    "DEFAULT_CFG_SCALE",
    "DEFAULT_LABEL_DROPOUT",
    "DIT_POSITION_KINDS",
    "GPT",
    "GUIDANCE_NEUTRAL",
    "MLP_KINDS",
    "NO_NORM",
    "PLACEMENTS",
    "POSITION_KINDS",
    "TIME_DISTRIBUTIONS",
    "Block",
    "ConfigModel",
    "DiT",
    "DiTArchitecture",
    "DiTBlock",
    "DiTConfig",
    "DiTSettings",
    "GPTConfig",
    "GPTSettings",
    "build_dit",
    "build_gpt",
    "check_dit_norm",
    "check_model_norm",
    "check_paired",
    "combined_digest",
    "dit_norm_kinds",
    "drop_labels",
    "euler_sample",
    "flow_matching_loss",
    "guided_velocity",
    "init_dit_paired_",
    "init_gpt_paired_",
    "interpolate",
    "label_dropout_mask",
    "make_dit_norm",
    "make_model_norm",
    "model_norm_kinds",
    "parameter_seed",
    "random_projections",
    "sample_noise",
    "sample_time",
    "shared_parameter_digests",
    "sliced_wasserstein2",
    "target_velocity",
    "tensor_digest",
]


def build_gpt(cfg: GPTConfig, seed: int) -> GPT:
    """A :class:`GPT` with the paired initialisation for ``seed`` (see :func:`init_gpt_paired_`)."""
    return init_gpt_paired_(GPT(cfg), seed)
