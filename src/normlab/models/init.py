"""Paired initialisation: every shared parameter drawn from its own seeded generator.

For seed k the parameter called ``name`` is drawn from a generator seeded by
``sha256(f"{k}:{name}")``, independently of the module structure, the order of construction and
the device. Two models that differ only in their norms therefore start from identical values of
every parameter they share; the norms keep their own initialisation (``reset_parameters``).
"""

from __future__ import annotations

import hashlib
import math

import torch

from normlab._seeds import parameter_seed
from normlab.models.gpt import GPT
from normlab.models.mup import init_std_multipliers


def init_gpt_paired_(model: GPT, seed: int) -> GPT:
    """GPT-2 initialisation in place, paired across models by parameter name.

    Matrices and embeddings ~ N(0, σ²) with σ = ``init_std``; residual projections use
    σ / sqrt(2 · n_layers); biases are zero; norm parameters are left to their module. Under μP
    each hidden matrix's deviation is multiplied by √(fan_in₀ / fan_in)
    (:func:`normlab.models.mup.init_std_multipliers`; 1 at the base width), with the same draws.
    Values are drawn in float32 on the CPU and then copied, so they do not depend on the device.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__} {seed!r}")
    cfg = model.config
    norms = set(model.norm_parameter_names())
    residual = set(model.residual_projection_names())
    width = init_std_multipliers(model)
    for name, param in model.named_parameters():
        if name in norms:
            continue
        if param.dim() < 2:
            values = torch.zeros(param.shape)
        else:
            std = cfg.init_std / math.sqrt(2 * cfg.n_layers) if name in residual else cfg.init_std
            if name in width:
                std *= width[name]
            gen = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
        with torch.no_grad():
            param.copy_(values)
    return model


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (a 0-dimensional tensor too)."""
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def shared_parameter_digests(model: GPT) -> dict[str, str]:
    """{name: digest} of every parameter outside the norms."""
    norms = set(model.norm_parameter_names())
    return {n: tensor_digest(p) for n, p in model.named_parameters() if n not in norms}


def combined_digest(digests: dict[str, str]) -> str:
    """One digest over {name: digest}, independent of dict order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}={digests[name]};".encode())
    return h.hexdigest()


def check_paired(models: dict[str, GPT]) -> str:
    """Check that the models (by arm) share the same non-norm parameters with equal values.

    Returns the combined digest of the shared parameters. Raises ``ValueError`` naming the arm
    and parameter when one arm has a non-norm parameter that another lacks, or different values.
    """
    if not models:
        raise ValueError("models: expected at least one model")
    digests = {arm: shared_parameter_digests(m) for arm, m in models.items()}
    ref_arm, ref = next(iter(digests.items()))
    for arm, d in digests.items():
        missing = sorted(set(ref) ^ set(d))
        if missing:
            raise ValueError(
                f"paired init: arms {ref_arm!r} and {arm!r} do not share the non-norm parameter "
                f"{missing[0]!r}; only the norms may differ between arms"
            )
        for name in ref:
            if d[name] != ref[name]:
                raise ValueError(
                    f"paired init: parameter {name!r} differs between arms {ref_arm!r} and "
                    f"{arm!r}; shared parameters must start from the same values"
                )
    return combined_digest(ref)
