"""A small decoder-only GPT whose norm kind and placement are configuration.

Norm modules live in attributes whose names start with ``norm_`` (``norm_attn``, ``norm_mlp``,
``norm_attn_out``, ``norm_mlp_out``, ``norm_final``); :meth:`GPT.norm_parameter_names` relies on
that, and so does the paired initialisation.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from normlab.models.config import GPTConfig
from normlab.models.layers import MLP, CausalSelfAttention, SwiGLU
from normlab.models.mup import output_multiplier, scale_logits
from normlab.models.norms import make_model_norm

NORM_PREFIX = "norm_"


class Block(nn.Module):
    """One Transformer block; ``placement`` decides where its norms sit.

    pre:      h ← h + Attn(N₁(h));           h ← h + MLP(N₂(h))
    post:     h ← N₁(h + Attn(h));           h ← N₂(h + MLP(h))
    sandwich: h ← h + N₁'(Attn(N₁(h)));      h ← h + N₂'(MLP(N₂(h)))
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.placement = cfg.placement
        self.norm_attn = self._norm(cfg, "attn")
        self.attn = CausalSelfAttention(cfg)
        self.norm_mlp = self._norm(cfg, "mlp")
        self.mlp = SwiGLU(cfg) if cfg.mlp == "swiglu" else MLP(cfg)
        if cfg.placement == "sandwich":
            self.norm_attn_out = self._norm(cfg, "attn")
            self.norm_mlp_out = self._norm(cfg, "mlp")

    @staticmethod
    def _norm(cfg: GPTConfig, position: Literal["attn", "mlp"]) -> nn.Module:
        return make_model_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.dyt_alpha(position))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.placement == "pre":
            h = h + self.attn(self.norm_attn(h))
            return h + self.mlp(self.norm_mlp(h))
        if self.placement == "post":
            h = self.norm_attn(h + self.attn(h))
            return self.norm_mlp(h + self.mlp(h))
        h = h + self.norm_attn_out(self.attn(self.norm_attn(h)))
        return h + self.norm_mlp_out(self.mlp(self.norm_mlp(h)))


class EmbedScale(nn.Module):
    """A learnable scalar s after the token embedding, h₀ = s · E[idx], s₀ = ``init`` (the DyT
    arm's ``dyt_embed_scale``)."""

    def __init__(self, init: float) -> None:
        super().__init__()
        self.init = float(init)
        self.scale = nn.Parameter(torch.empty(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """s = ``init``."""
        nn.init.constant_(self.scale, self.init)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """s · h."""
        return h * self.scale.to(h.dtype)


class GPT(nn.Module):
    """Token embedding (+ learned positions) → blocks → final norm (pre, sandwich) → tied head.

    Under μP (``parametrization: mup``) the logits are multiplied by d₀ / d
    (:func:`normlab.models.mup.output_multiplier`) and attention uses
    :func:`normlab.models.mup.attention_scale`; the initial deviations are those of
    :func:`normlab.models.init.init_gpt_paired_`, the rates those of
    :func:`normlab.models.mup.param_groups`.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.norm == "dyt" and cfg.dyt_embed_scale is not None:  # the arm's own (norm_)
            self.norm_embed_scale = EmbedScale(cfg.dyt_embed_scale)
        self.pos_emb = (
            nn.Embedding(cfg.context, cfg.d_model) if cfg.positions == "learned" else None
        )
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_final = (
            make_model_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.dyt_alpha("final"))
            if cfg.has_final_norm
            else None
        )
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.output_multiplier = output_multiplier(cfg)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``idx``: [B, T] token ids, T ≤ context. Returns logits [B, T, V] and the mean
        cross-entropy against ``targets`` (nats per token) when they are given."""
        if idx.dim() != 2:
            raise ValueError(f"idx: expected shape [B, T], got {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"idx: sequence length {t} exceeds context {self.config.context}")
        h = self.tok_emb(idx)
        if hasattr(self, "norm_embed_scale"):
            h = self.norm_embed_scale(h)
        if self.pos_emb is not None:
            h = h + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            h = block(h)
        if self.norm_final is not None:
            h = self.norm_final(h)
        logits = scale_logits(self.head(h), self.output_multiplier)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        return logits, loss

    def norm_parameter_names(self) -> list[str]:
        """Names of the parameters that belong to norm modules."""
        return [
            name
            for name, _ in self.named_parameters()
            if any(part.startswith(NORM_PREFIX) for part in name.split(".")[:-1])
        ]

    def residual_projection_names(self) -> list[str]:
        """Weights of the linear layers that write into the residual stream."""
        return [
            name
            for name, _ in self.named_parameters()
            if name.endswith(("attn.proj.weight", "mlp.proj.weight"))
        ]

    def parameter_groups(self) -> dict[str, list[str]]:
        """Parameter names grouped for per-layer gradient norms.

        Groups: ``embed``, ``block{i}.attn``, ``block{i}.mlp``, ``block{i}.norms``, ``norm_final``.
        """
        groups: dict[str, list[str]] = {}
        norms = set(self.norm_parameter_names())
        for name, _ in self.named_parameters():
            parts = name.split(".")
            if parts[0] == "blocks":
                sub = "norms" if name in norms else parts[2]
                key = f"block{parts[1]}.{sub}"
            elif name in norms:
                key = "norm_final"
            else:
                key = "embed"
            groups.setdefault(key, []).append(name)
        return groups

    def embedding_parameter_names(self) -> list[str]:
        """Names of the embeddings' parameters, which a non-embedding count leaves out: the
        token embedding, the learned position embedding (``positions: learned``) and the output
        embedding (``head``) when it is not tied to the token embedding (tied, it is the token
        embedding's weight, named once)."""
        modules = [m for m in (self.tok_emb, self.pos_emb, self.head) if m is not None]
        ids = {id(p) for m in modules for p in m.parameters()}
        return [name for name, p in self.named_parameters() if id(p) in ids]

    def count_parameters(self) -> tuple[int, int]:
        """(all parameters, parameters inside norms); tied weights are counted once."""
        norms = set(self.norm_parameter_names())
        total = sum(p.numel() for p in self.parameters())
        in_norms = sum(p.numel() for n, p in self.named_parameters() if n in norms)
        return total, in_norms
