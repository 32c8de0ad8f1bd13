"""The sublayers of the GPT testbed: causal self-attention (optionally rotary) and the MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.models.config import GPTConfig
from normlab.models.mup import attention_scale


class Rotary(nn.Module):
    """Rotary position embedding: rotate channel pairs (i, i + d/2) by angle t·θ_i.

    θ_i = base^(−2i/d); x' = x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁].
    """

    def __init__(self, head_dim: int, context: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [B, H, T, hd]."""
        t = x.shape[-2]
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], dim=-1)
        return x * self.cos[:t].to(x.dtype) + rotated * self.sin[:t].to(x.dtype)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with ``F.scaled_dot_product_attention``; q·k is scaled by
    1/√h (h the head size), or under μP by :func:`normlab.models.mup.attention_scale`."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.scale = attention_scale(cfg)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.rotary = (
            Rotary(cfg.head_dim, cfg.context, cfg.rope_base) if cfg.positions == "rope" else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """GELU MLP: proj(gelu(fc(x))), hidden size ``mlp_ratio · d``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_hidden
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class SwiGLU(nn.Module):
    """SwiGLU MLP: proj(silu(gate(x)) ⊙ up(x)).

    The hidden size is ⅔ · ``mlp_ratio`` · d rounded up to a multiple of 8, so the parameter count
    matches the GELU MLP's.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_hidden
        self.gate = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.up(x))
