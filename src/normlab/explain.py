"""The numbers behind ``normlab explain``: one vector through LayerNorm and RMSNorm.

The formulas are those of :mod:`normlab.functional`, ε inside the root:
x̂_LN = (x − μ)/√(σ² + ε) and x̂_RMS = x/√(m + ε), so a learner can check each figure by hand.

They are evaluated exactly, in rational arithmetic on the float64 values of x, ε, c and a,
and each result is then rounded to float64: μ, σ² and m once; x̂ as
sign(x − μ)·√((x − μ)² / (σ² + ε)), so rounded once before and once after the root (within
about one unit in the last place). Nothing overflows or underflows on the way, so huge or tiny
finite inputs give the right x̂ (``explain 1e200 -1e200``: LayerNorm x̂ = [1, −1], not
[0, −0] as float64 squares, which overflow to inf, would give), and ε is never dropped or
scaled. A statistic whose value lies beyond float64's range (σ² = 1e400 above) is reported as
``inf``; :meth:`Explanation.to_json` writes it as ``null``, so the JSON stays valid.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import torch

from normlab._checks import check_eps, check_finite_number


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
    variance: float  # σ² = mean((x − μ)²), biased; inf if beyond float64's range
    mean_square: float  # m = mean(x²); inf if beyond float64's range
    rms: float  # sqrt(m)
    layer_norm_hat: list[float]  # (x − μ)·rsqrt(σ² + ε)
    rms_norm_hat: list[float]  # x·rsqrt(m + ε)
    layer_norm_hat_mean: float
    layer_norm_hat_mean_square: float
    rms_norm_hat_mean: float
    rms_norm_hat_mean_square: float
    transforms: list[Transform]

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain Python data (floats may be ``inf``, as computed)."""
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """Valid JSON (RFC 8259, no ``Infinity`` or ``NaN``): a non-finite float, such as a σ²
        beyond float64's range, is written as ``null``."""
        return json.dumps(
            _json_ready(self.to_dict()), indent=indent, ensure_ascii=False, allow_nan=False
        )


def _json_ready(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    return obj


def _to_float(q: Fraction) -> float:
    """``q`` rounded to float64; ±inf if it lies beyond float64's range (``float`` raises)."""
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def _sqrt(q: Fraction) -> float:
    """√q for an exact q ≥ 0, within about an ulp, for any magnitude: q = r·4ᵏ with r near 1,
    so √q = √r·2ᵏ without overflow or underflow on the way (inf if √q itself is beyond
    float64's range)."""
    if q == 0:
        return 0.0
    k = (q.numerator.bit_length() - q.denominator.bit_length()) // 2
    r = q / Fraction(4) ** k
    try:
        return math.ldexp(math.sqrt(float(r)), k)
    except OverflowError:
        return math.inf


def _scaled(d: list[Fraction], denominator_sq: Fraction) -> list[float]:
    """dᵢ/√(denominator_sq) for each dᵢ, computed as sign(dᵢ)·√(dᵢ² / denominator_sq): the
    ratio is exact and at most the length of d, so neither overflows nor underflows."""
    hats = []
    for di in d:
        size = _sqrt(di * di / denominator_sq) if di else 0.0
        hats.append(-size if di < 0 else size)
    return hats


def _mean(q: list[Fraction]) -> Fraction:
    return sum(q, Fraction(0)) / len(q)


def _hats(x: list[Fraction], eps: Fraction) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerNorm x̂ = (x − μ)/√(σ² + ε) and RMSNorm x̂ = x/√(m + ε) of the exact vector ``x``,
    each element rounded to float64 (see the module docstring)."""
    mu = _mean(x)
    d = [xi - mu for xi in x]
    variance = _mean([di * di for di in d])
    mean_square = _mean([xi * xi for xi in x])
    ln = _scaled(d, variance + eps)
    rms = _scaled(x, mean_square + eps)
    return torch.tensor(ln, dtype=torch.float64), torch.tensor(rms, dtype=torch.float64)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-4))


def _flipped(new: torch.Tensor, old: torch.Tensor) -> bool:
    return _close(new, -old) and not _close(old, torch.zeros_like(old))


def _check_values(values: Iterable[float]) -> list[float]:
    """A non-empty vector of finite real numbers, as a list of floats."""
    try:
        items = list(values)
    except TypeError:
        raise TypeError(
            f"values: got {type(values).__name__} {values!r}; expected a sequence of numbers"
        ) from None
    if not items:
        raise ValueError("values: got an empty vector; expected at least one number")
    bad = [v for v in items if isinstance(v, bool) or not isinstance(v, numbers.Real)]
    if bad:
        raise TypeError(
            f"values: got {type(bad[0]).__name__} {bad[0]!r}; expected real numbers only"
        )
    if not all(math.isfinite(v) for v in items):
        raise ValueError(f"values: expected finite numbers, got {items}")
    return [float(v) for v in items]


def explain_vector(
    values: Iterable[float], eps: float = 1e-5, scale: float = 3.0, shift: float = 1.0
) -> Explanation:
    """Explain LayerNorm and RMSNorm on ``values``, and the effect of x → c·x, −c·x, x + a·1.

    x̂_LN = (x − μ)/√(σ² + ε), x̂_RMS = x/√(mean(x²) + ε); c = ``scale``, a = ``shift``, ε =
    ``eps`` (finite numbers, ε > 0). Computed exactly from the float64 values and then rounded
    (see the module docstring), so any finite input, however large or small, gives the right
    x̂, also for the transformed vectors (c·x may exceed float64's range; x̂ is still exact).
    σ² and m beyond float64's range are ``inf``; :meth:`Explanation.to_json` writes ``null``.
    """
    floats = _check_values(values)
    eps = check_eps(eps, "eps")
    scale = check_finite_number(scale, "scale")
    shift = check_finite_number(shift, "shift")
    x_q, eps_q = [Fraction(v) for v in floats], Fraction(eps)
    c_q, a_q = Fraction(scale), Fraction(shift)
    ln, rms = _hats(x_q, eps_q)
    transforms = []
    for name, xt in (
        (f"x → {scale:g}·x", [c_q * v for v in x_q]),
        (f"x → {-scale:g}·x", [-c_q * v for v in x_q]),
        (f"x → x + {shift:g}", [v + a_q for v in x_q]),
    ):
        ln_t, rms_t = _hats(xt, eps_q)
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
    mu = _mean(x_q)
    mean_square = _mean([v * v for v in x_q])
    return Explanation(
        x=floats,
        eps=eps,
        mean=_to_float(mu),
        variance=_to_float(_mean([(v - mu) ** 2 for v in x_q])),
        mean_square=_to_float(mean_square),
        rms=_sqrt(mean_square),
        layer_norm_hat=ln.tolist(),
        rms_norm_hat=rms.tolist(),
        layer_norm_hat_mean=ln.mean().item(),
        layer_norm_hat_mean_square=ln.pow(2).mean().item(),
        rms_norm_hat_mean=rms.mean().item(),
        rms_norm_hat_mean_square=rms.pow(2).mean().item(),
        transforms=transforms,
    )
