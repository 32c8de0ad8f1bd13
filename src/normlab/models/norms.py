"""The norm slots of the testbeds: the GPT's (any unconditional registered kind, ``dyt`` or
``none``) and the DiT's (any conditional registered kind, or a token conditioning mode).

Importing this module registers ``"dyt"`` (:class:`normlab.layers.DynamicTanh`) and the
conditional ``"adaln"`` (:class:`AdaLayerNorm`, adaLN without the zero initialisation) and
``"adaln_zero_unit"`` (:class:`AdaLayerNormZeroUnitScale`, adaLN-Zero's function with the 1 of
1 + scale held in the modulation's bias: the DiT's A/A twin) with
:func:`normlab.register_norm`, so ``make_norm("dyt", D)`` works once ``normlab.models`` is
imported.

The DiT's arm (its ``norm``) chooses how the condition c enters the network, the one factor of
the DiT paper's conditioning ablation (Peebles & Xie 2023, Fig. 5):

- a conditional norm kind (``adaln_zero``, ``adaln``, ``adarms``, …): c modulates every norm;
- a token conditioning mode (:data:`TOKEN_CONDITIONING`): the norms are plain LayerNorms
  (:class:`UnconditionedNorm`, no modulation) and c enters as tokens: ``in_context`` prepends the
  condition tokens to the sequence (removed at the output), ``cross_attention`` adds a
  cross-attention sublayer per block that attends to them.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.layers.adaptive import AdaLayerNormZero, ZeroLinear
from normlab.layers.dyt import DynamicTanh
from normlab.layers.layer_norm import LayerNorm
from normlab.patching.arm import NO_NORM, check_slot_norm, slot_norm_kinds
from normlab.registry import available_norms, is_conditional, make_norm, register_norm

IN_CONTEXT = "in_context"
CROSS_ATTENTION = "cross_attention"
TOKEN_CONDITIONING = (IN_CONTEXT, CROSS_ATTENTION)
"""The DiT arms whose condition enters as tokens, not through the norms."""


class AdaLayerNorm(AdaLayerNormZero):
    """adaLN (DiT's ablation, without "-Zero"): (shift, scale) = Linear(SiLU(c)),
    y = x̂ ⊙ (1 + scale) + shift, x̂ = (x − μ)·rsqrt(σ² + ε); no gate (a gate fixed at 1: the
    caller adds the sublayer's output as is). The modulation Linear keeps ``torch.nn.Linear``'s
    default initialisation, W, b ~ U(−1/√cond_dim, 1/√cond_dim), so it modulates from the start.
    ``forward(x, cond)`` returns ``(y, None)``.
    """

    def __init__(
        self,
        dim: int,
        cond_dim: int,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(dim, cond_dim, eps=eps, gate=False, device=device, dtype=dtype)

    def _make_modulation(
        self, out_features: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> nn.Linear:
        """``torch.nn.Linear`` with its default W, b ~ U(−1/√cond_dim, 1/√cond_dim)."""
        return nn.Linear(self.cond_dim, out_features, device=device, dtype=dtype)


class UnitBiasLinear(ZeroLinear):
    """y = W·x + b − u, where u is 1 on the output rows [``unit_start``, ``unit_stop``) and 0
    elsewhere; ``reset_parameters`` sets W = 0 and b = u, so y starts at 0.

    The function of a :class:`~normlab.layers.adaptive.ZeroLinear` under the same updates, with
    the unit held inside b: W·x + b rounds where b ≈ 1 instead of b ≈ 0 (float32's spacing there
    is 2⁻²³ instead of far finer), and so does every optimiser step on those rows of b. The
    subtraction is exact while a row's value stays within [0.5, 2] (Sterbenz). Under a 16-bit
    autocast the Linear runs in 16 bits and b ≈ 1 rounds at that format's spacing (2⁻⁷ for
    bfloat16), a coarser perturbation than float32's: the A/A reading holds for float32 runs.
    Same parameters and state-dict keys as ``torch.nn.Linear``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        unit_start: int,
        unit_stop: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not 0 <= unit_start < unit_stop <= out_features:
            raise ValueError(
                f"unit_start, unit_stop: expected 0 <= unit_start < unit_stop <= out_features "
                f"= {out_features}, got {unit_start}, {unit_stop}"
            )
        self.unit_rows = (unit_start, unit_stop)  # read by reset_parameters, which __init__ calls
        super().__init__(in_features, out_features, bias=True, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """W = 0, b = u (1 on the unit rows, 0 elsewhere)."""
        super().reset_parameters()
        start, stop = self.unit_rows
        with torch.no_grad():
            self.bias[start:stop] = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """W·x + b − u (1 taken off the unit rows of the Linear's fresh output, in place)."""
        y = super().forward(x)
        start, stop = self.unit_rows
        y[..., start:stop] -= 1.0
        return y


class AdaLayerNormZeroUnitScale(AdaLayerNormZero):
    """adaLN-Zero with the 1 of (1 + scale) held in the modulation's bias (registered as
    ``adaln_zero_unit``): (shift, s, gate) = Linear(SiLU(c)) with the bias of s starting at 1,
    y = x̂ ⊙ s + shift, x̂ = (x − μ)·rsqrt(σ² + ε).

    At initialisation and under the same updates this is :class:`AdaLayerNormZero`'s function
    (s = 1 + scale); in float32 the two differ only in rounding (:class:`UnitBiasLinear`), as
    RMSNorm's Gemma gain 1 + w differs from LLaMA's w (in 16 bits, by the 16-bit rounding of
    b ≈ 1: not an A/A pair there). A DiT run of each is the DiT's A/A control: their
    paired difference measures the harness's resolution on that testbed. Same parameters and
    state-dict keys as ``adaln_zero`` (``modulation.weight``, ``modulation.bias``), with the
    bias of s offset by 1; ``gate=False`` as for adaLN-Zero (DiT's final layer).
    """

    def _make_modulation(
        self, out_features: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> nn.Linear:
        """(shift, scale[, gate]): the unit sits on the scale rows [dim, 2·dim)."""
        return UnitBiasLinear(
            self.cond_dim, out_features, self.dim, 2 * self.dim, device=device, dtype=dtype
        )


class UnconditionedNorm(LayerNorm):
    """A plain LayerNorm (γ, β) in a DiT norm slot, for the token conditioning modes: it takes
    no condition, and ``forward(x)`` returns ``(γ ⊙ x̂ + β, None)`` (no gate), the shape of a
    conditional norm's answer, so the DiT block adds the sublayer's output as is."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        """y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β, no gate."""
        return super().forward(x), None


if "dyt" not in available_norms():
    register_norm("dyt", DynamicTanh)
if "adaln" not in available_norms():
    register_norm("adaln", AdaLayerNorm, conditional=True)
if "adaln_zero_unit" not in available_norms():
    register_norm("adaln_zero_unit", AdaLayerNormZeroUnitScale, conditional=True)


def model_norm_kinds() -> list[str]:
    """Kinds a testbed accepts: the unconditional registered kinds, plus ``"none"`` (the kinds
    a norm slot takes, :func:`normlab.patching.arm.slot_norm_kinds`)."""
    return slot_norm_kinds()


def check_model_norm(kind: object) -> str:
    """``kind`` must name an unconditional registered norm or ``"none"``
    (:func:`normlab.patching.arm.check_slot_norm` with errors naming ``norm``; TypeError for a
    value that is not a string)."""
    if not isinstance(kind, str):
        raise TypeError(f"norm: expected a norm name (str), got {type(kind).__name__} {kind!r}")
    return check_slot_norm(kind, "norm")


def dit_norm_kinds() -> list[str]:
    """Arms the DiT accepts: the registered conditional kinds (``adaln``, ``adaln_zero``,
    ``adarms``, …) and the token conditioning modes (``cross_attention``, ``in_context``)."""
    return sorted([k for k in available_norms() if is_conditional(k)] + list(TOKEN_CONDITIONING))


def check_dit_norm(kind: object) -> str:
    """``kind`` must name a conditional registered norm (its forward is ``(x, cond) -> (y, g)``)
    or a token conditioning mode (:data:`TOKEN_CONDITIONING`)."""
    if not isinstance(kind, str):
        raise TypeError(f"norm: expected a norm name (str), got {type(kind).__name__} {kind!r}")
    if kind in TOKEN_CONDITIONING:
        return kind
    kinds = ", ".join(dit_norm_kinds())
    if kind not in available_norms():
        raise ValueError(
            f"norm: unknown norm {kind!r}; expected a conditional norm: one of {kinds} "
            "(register your own with normlab.register_norm(..., conditional=True))"
        )
    if not is_conditional(kind):
        raise ValueError(
            f"norm: {kind!r} takes no condition; the DiT modulates every norm with the time "
            f"(and label) embedding. Expected a conditional norm: one of {kinds}"
        )
    return kind


def make_model_norm(
    kind: str, dim: int, eps: float | None = None, dyt_alpha_init: float = 0.5
) -> nn.Module:
    """Build one norm slot of a testbed.

    ``"none"`` is the identity. ``"dyt"`` gets ``alpha_init=dyt_alpha_init``. Any other kind is
    built with :func:`normlab.make_norm`; when ``eps`` is given and the built norm has an ``eps``
    attribute, it is built with that ε, so every arm of a comparison can share one ε. ``kind``
    is one :class:`normlab.models.GPTConfig` validated.
    """
    if kind == NO_NORM:
        return nn.Identity()
    if kind == "dyt":
        return make_norm(kind, dim, alpha_init=dyt_alpha_init)
    norm = make_norm(kind, dim)
    if eps is not None and hasattr(norm, "eps") and norm.eps != eps:
        norm = make_norm(kind, dim, eps=eps)
    return norm
