"""Conditional norms: π0.5-style AdaRMSNorm and DiT-style adaLN-Zero."""

from __future__ import annotations

import torch
from torch import nn

from normlab import functional as F
from normlab._checks import (
    check_bool,
    check_cond,
    check_dim,
    check_input,
    check_last_dim,
    check_layer_norm_eps,
    check_optional_eps,
    per_sequence_view,
)


class ZeroLinear(nn.Linear):
    """A ``torch.nn.Linear`` whose ``reset_parameters`` sets weight and bias to 0.

    The modulation of a conditional norm must start at zero however it is (re)initialised:
    deferred initialisation (meta device, ``to_empty``, then ``reset_parameters`` on every
    module, parents before children as ``model.modules()`` and FSDP visit them) would otherwise
    give the Linear its Kaiming default and open every gate. Same parameters and state-dict keys
    as ``torch.nn.Linear``.
    """

    def reset_parameters(self) -> None:
        """W = 0, b = 0."""
        nn.init.zeros_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)


def _check_cond_dtype(cond: torch.Tensor, modulation: nn.Linear) -> None:
    """cond must have the modulation Linear's dtype, unless autocast chooses the dtypes."""
    weight = modulation.weight
    if cond.dtype != weight.dtype and not torch.is_autocast_enabled(cond.device.type):
        raise TypeError(
            f"cond: dtype {cond.dtype} differs from the modulation Linear's {weight.dtype}; "
            f"expected cond in {weight.dtype} (cast it, or run under torch.autocast)"
        )


def _broadcastable_gate(gate: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-sequence gate [B, D] for x of shape [B, T, D] gets a token axis: [B, 1, D] (and
    [B, 1, …, 1, D] for more token axes), so that ``h + gate ⊙ out`` broadcasts per sample."""
    return per_sequence_view(gate, x)


class AdaRMSNorm(nn.Module):
    """AdaRMS (π0.5): [s, t, g] = Linear(c); y = x·rsqrt(mean(x²) + ε) ⊙ (1 + s) + t.

    ``forward(x, cond)`` returns ``(y, g)`` (``g`` is ``None`` when ``gate=False``); use
    ``h + g ⊙ sublayer(y)`` (:func:`normlab.functional.gated_residual`). The Linear starts at
    zero, so at initialisation the layer is a unit-gain RMSNorm and the gate closes the residual
    branch. No static gain is kept: the Linear's bias plays that role. ``cond`` is already
    embedded (e.g. by a timestep MLP); it is [B, C] (per sequence, also for x with several token
    axes [B, …, D]: the returned gate is then [B, 1, …, 1, D]) or [B, T, C] (per token).
    ``eps=None`` is the machine epsilon of the statistics dtype, chosen per call, as for
    :class:`~normlab.RMSNorm`. Positional parameters: ``(dim, cond_dim, eps, gate, device,
    dtype)``, the same order as :class:`AdaLayerNormZero`.
    """

    def __init__(
        self,
        dim: int,
        cond_dim: int,
        eps: float | None = 1e-6,
        gate: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_dim(dim, "dim")
        self.cond_dim = check_dim(cond_dim, "cond_dim")
        self.eps = check_optional_eps(eps)
        self.gate = check_bool(gate, "gate")
        chunks = 3 if self.gate else 2
        self.modulation = ZeroLinear(self.cond_dim, chunks * self.dim, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Zero the modulation Linear (weight and bias)."""
        self.modulation.reset_parameters()

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_last_dim(check_input("x", x), self.dim, "dim")
        check_cond(cond, x, self.cond_dim)
        _check_cond_dtype(cond, self.modulation)
        mod = self.modulation(cond)
        if self.gate:
            scale, shift, gate = mod.chunk(3, dim=-1)
        else:
            (scale, shift), gate = mod.chunk(2, dim=-1), None
        y = F.ada_rms_norm(x, scale, shift, self.eps)
        return y, None if gate is None else _broadcastable_gate(gate, x)

    def extra_repr(self) -> str:
        return f"{self.dim}, cond_dim={self.cond_dim}, eps={self.eps}, gate={self.gate}"


class AdaLayerNormZero(nn.Module):
    """adaLN-Zero (DiT): (shift, scale, gate) = Linear(SiLU(c)); y = x̂ ⊙ (1 + scale) + shift.

    x̂ = (x − μ)·rsqrt(σ² + ε), a LayerNorm with no affine. ``forward(x, cond)`` returns
    ``(y, gate)`` (``gate`` is ``None`` with ``gate=False``: (shift, scale) = Linear(SiLU(c)),
    as DiT's final layer); the Linear starts at zero, so every gated branch starts closed.
    ``cond`` is [B, C] (per sequence) or [B, T, C] (per token), as for :class:`AdaRMSNorm`.
    The SiLU is this module's ``act``. ``eps`` is a float > 0 (``None`` is refused, as by
    ``torch.nn.LayerNorm``). Positional parameters: ``(dim, cond_dim, eps, gate, device,
    dtype)``, the same order as :class:`AdaRMSNorm`.
    """

    def __init__(
        self,
        dim: int,
        cond_dim: int,
        eps: float = 1e-6,
        gate: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_dim(dim, "dim")
        self.cond_dim = check_dim(cond_dim, "cond_dim")
        self.eps = check_layer_norm_eps(eps)
        self.gate = check_bool(gate, "gate")
        self.act = nn.SiLU()
        chunks = 3 if self.gate else 2
        self.modulation = self._make_modulation(chunks * self.dim, device, dtype)

    def _make_modulation(
        self, out_features: int, device: torch.device | str | None, dtype: torch.dtype | None
    ) -> nn.Linear:
        """The modulation Linear, ``cond_dim`` → ``out_features`` ((shift, scale[, gate]) ×
        ``dim``): a :class:`ZeroLinear`. A variant that starts or parametrises the modulation
        otherwise overrides this alone."""
        return ZeroLinear(self.cond_dim, out_features, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        """Reset the modulation Linear (zero, for adaLN-Zero)."""
        self.modulation.reset_parameters()

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        check_last_dim(check_input("x", x), self.dim, "dim")
        check_cond(cond, x, self.cond_dim)
        _check_cond_dtype(cond, self.modulation)
        mod = self.modulation(self.act(cond))
        if self.gate:
            shift, scale, gate = mod.chunk(3, dim=-1)
        else:
            (shift, scale), gate = mod.chunk(2, dim=-1), None
        y = F.ada_layer_norm(x, scale, shift, self.eps)
        return y, None if gate is None else _broadcastable_gate(gate, x)

    def extra_repr(self) -> str:
        return f"{self.dim}, cond_dim={self.cond_dim}, eps={self.eps}, gate={self.gate}"
