"""The numbers behind ``normlab explain``: one vector through LayerNorm and RMSNorm.

Everything is computed in float64 with the same formulas as :mod:`normlab.functional`
(ε inside the root), so a learner can check each figure by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from normlab import functional as F


@dataclass(frozen=True)
class Transform:
    """What an input transform does to each norm's x̂."""

    name: str
    layer_norm_hat: list[float]
    rms_norm_hat: list[float]
    layer_norm_unchanged: bool
    layer_norm_flipped: bool
    rms_norm_unchanged: bool
    rms_norm_flipped: bool


@dataclass(frozen=True)
class Explanation:
    """Statistics and normalised vectors of one input vector."""

    x: list[float]
    eps: float
    mean: float  # μ = mean(x)
    variance: float  # σ² = mean((x − μ)²), biased
    mean_square: float  # m = mean(x²)
    rms: float  # sqrt(m)
    layer_norm_hat: list[float]  # (x − μ)·rsqrt(σ² + ε)
    rms_norm_hat: list[float]  # x·rsqrt(m + ε)
    layer_norm_hat_mean: float
    layer_norm_hat_mean_square: float
    rms_norm_hat_mean: float
    rms_norm_hat_mean_square: float
    transforms: list[Transform]

    def to_dict(self) -> dict:
        return asdict(self)


def _hats(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return F.layer_norm(x, eps=eps, backend="torch"), F.rms_norm(x, eps=eps, backend="torch")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-4))


def _flipped(new: torch.Tensor, old: torch.Tensor) -> bool:
    return _close(new, -old) and not _close(old, torch.zeros_like(old))


def explain_vector(
    values: Sequence[float], eps: float = 1e-5, scale: float = 3.0, shift: float = 1.0
) -> Explanation:
    """Explain LayerNorm and RMSNorm on ``values``, and the effect of x → c·x, −c·x, x + a·1."""
    if len(values) == 0:
        raise ValueError("values: got an empty vector; expected at least one number")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values: expected finite numbers, got {list(values)}")
    x = torch.tensor(list(values), dtype=torch.float64)
    ln, rms = _hats(x, eps)
    transforms = []
    for name, xt in (
        (f"x → {scale:g}·x", x * scale),
        (f"x → {-scale:g}·x", x * -scale),
        (f"x → x + {shift:g}", x + shift),
    ):
        ln_t, rms_t = _hats(xt, eps)
        transforms.append(
            Transform(
                name=name,
                layer_norm_hat=ln_t.tolist(),
                rms_norm_hat=rms_t.tolist(),
                layer_norm_unchanged=_close(ln_t, ln),
                layer_norm_flipped=_flipped(ln_t, ln),
                rms_norm_unchanged=_close(rms_t, rms),
                rms_norm_flipped=_flipped(rms_t, rms),
            )
        )
    mu = x.mean()
    return Explanation(
        x=x.tolist(),
        eps=eps,
        mean=mu.item(),
        variance=(x - mu).pow(2).mean().item(),
        mean_square=x.pow(2).mean().item(),
        rms=x.pow(2).mean().sqrt().item(),
        layer_norm_hat=ln.tolist(),
        rms_norm_hat=rms.tolist(),
        layer_norm_hat_mean=ln.mean().item(),
        layer_norm_hat_mean_square=ln.pow(2).mean().item(),
        rms_norm_hat_mean=rms.mean().item(),
        rms_norm_hat_mean_square=rms.pow(2).mean().item(),
        transforms=transforms,
    )
