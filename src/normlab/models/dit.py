"""A small Diffusion Transformer (DiT) for flow matching over token sequences.

The network maps noisy tokens x_t ∈ [B, T, C_in], a flow time t ∈ [0, 1] per sample and an
optional class label to a velocity of the same shape as x_t (see :mod:`normlab.models.flow`)::

    c = TimeMLP(sinusoid(t)) (+ LabelEmbedding(label))            condition, [B, D]
    h = Linear(x_t) + pos                                         tokens, [B, T, D]
    per block:  y, g = N₁(h; c);  h ← h + g ⊙ Attn(y)
                y, g = N₂(h; c);  h ← h + g ⊙ MLP(y)
    y, _ = N_final(h; c);  v = Linear₀(y)                         [B, T, C_in]

The final norm is modulated (shift, scale) and built without a gate where the kind offers that
(``adarms`` and ``adaln_zero`` do); a kind that always returns one has it left unused there.

Every arm computes its modulation as Linear(SiLU(c)): adaLN-Zero applies the SiLU itself (its
``act``), and every other conditional norm (AdaRMS: [s, t, g] = Linear(c′)) receives c′ = SiLU(c),
the π0.5 convention, where the condition that reaches AdaRMS ends in a swish. Without that, the
AdaRMS arm's modulation would be a linear function of the time MLP's output plus the label
embedding (time and class could not interact in it), a difference beyond the norm.

Every N is the same *conditional* norm kind of :mod:`normlab.registry` (``adaln_zero``,
``adarms``, or any kind registered with ``conditional=True``), modulated by c. Its modulation
Linear starts at zero, so every gate g is 0 at initialisation (each block is the identity), and
the output Linear₀ starts at zero too: the network outputs exactly 0 before training.

Norm modules live in attributes whose names start with ``norm_`` (``norm_attn``, ``norm_mlp``,
``norm_final``), as in the GPT testbed; :meth:`DiT.norm_parameter_names` relies on that, and so
does the paired initialisation (:func:`init_dit_paired_`).

Conditioning ablation (DiT paper, Fig. 5): the arm may instead be a way of feeding the condition
as tokens (:data:`normlab.models.norms.TOKEN_CONDITIONING`); every norm is then a plain
LayerNorm (γ, β; no modulation, no gate) and the condition tokens are K = [TimeMLP(φ(t)),
E[label]] ([B, K, D], K = 1 without labels), built from the same parameters that make c:

- ``in_context``: h = [K tokens ; Linear(x_t) + pos], the blocks run on T + K tokens, and the
  K condition tokens are dropped before the final norm;
- ``cross_attention``: each block gains y = N_x(h); h ← h + CrossAttn(y, K) between its
  attention and its MLP (queries from y, keys and values from K).

Modules that only one such arm has (the cross-attention sublayers) live in attributes whose
names start with ``cond_``; their parameters are the arm's own, like a norm's, so the pairing
check compares only what every arm shares (:meth:`DiT.norm_parameter_names`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normlab.functional import gated_residual
from normlab.models.config import DIT_POSITION_KINDS, DiTConfig
from normlab.models.gpt import NORM_PREFIX
from normlab.models.init import parameter_seed
from normlab.models.norms import (
    CROSS_ATTENTION,
    IN_CONTEXT,
    TOKEN_CONDITIONING,
    AdaLayerNorm,
    UnconditionedNorm,
    check_dit_norm,
    dit_norm_kinds,
)
from normlab.registry import make_norm

__all__ = [
    "COND_PREFIX",
    "DIT_POSITION_KINDS",
    "DiT",
    "DiTBlock",
    "DiTConfig",
    "build_dit",
    "check_dit_norm",
    "dit_norm_kinds",
    "init_dit_paired_",
    "make_dit_norm",
    "sincos_positions",
    "timestep_features",
]


COND_PREFIX = "cond_"
"""Attribute prefix of the modules that exist only in some conditioning arms (their own
parameters, as a norm's)."""


def make_dit_norm(
    kind: str, dim: int, cond_dim: int, eps: float | None = None, gate: bool = True
) -> nn.Module:
    """One norm slot of the DiT: ``make_norm(kind, dim, cond_dim=cond_dim)``.

    When ``eps`` is given and the built norm has an ``eps`` attribute, it is built with that ε,
    so every arm of a comparison shares one ε. ``gate=False`` asks for a norm without a gate
    where the kind offers one (a boolean ``gate`` attribute, as ``AdaRMSNorm(gate=False)``:
    [s, t] = Linear(c), and ``AdaLayerNormZero(gate=False)``); a kind that always returns a gate
    keeps it and the caller ignores it. ``kind`` is one :class:`DiTConfig` validated; a token
    conditioning mode (``in_context``, ``cross_attention``) gets a :class:`UnconditionedNorm`.
    """
    if kind in TOKEN_CONDITIONING:
        return UnconditionedNorm(dim) if eps is None else UnconditionedNorm(dim, eps=eps)
    kw: dict[str, Any] = {"cond_dim": cond_dim}
    norm = make_norm(kind, dim, **kw)
    if eps is not None and hasattr(norm, "eps") and norm.eps != eps:
        kw["eps"] = eps
    if not gate and getattr(norm, "gate", None) is True:
        kw["gate"] = False
    return make_norm(kind, dim, **kw) if len(kw) > 1 else norm


def timestep_features(
    t: torch.Tensor, dim: int, scale: float = 1000.0, max_period: float = 10000.0
) -> torch.Tensor:
    """Sinusoidal features of the flow time, [B] → [B, dim], computed in float32 (or float64).

    With half = dim / 2 and ω_i = max_period^(−i / half), i = 0 … half − 1:
    φ(t) = [cos(scale · t · ω_0), …, cos(scale · t · ω_{half−1}), sin(scale · t · ω_0), …].
    ``scale`` stretches t ∈ [0, 1] so that the fastest frequency tells steps of 1/scale apart.
    """
    half = dim // 2
    dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=dtype, device=t.device) / half
    )
    angles = scale * t.to(dtype)[:, None] * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def sincos_positions(length: int, dim: int) -> torch.Tensor:
    """Fixed 1-D sinusoidal positions [length, dim] (dim even), as in "Attention is all you need".

    For position p and i = 0 … dim/2 − 1, with ω_i = 10000^(−2i / dim):
    pe[p, i] = sin(p · ω_i), pe[p, dim/2 + i] = cos(p · ω_i).
    """
    omega = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).float()


class TimestepEmbedder(nn.Module):
    """c_t = W₂ · SiLU(W₁ · φ(t) + b₁) + b₂, φ from :func:`timestep_features`."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.freq_dim = cfg.time_freq_dim
        self.scale = cfg.time_scale
        self.max_period = cfg.time_max_period
        self.mlp = nn.Sequential(
            nn.Linear(cfg.time_freq_dim, cfg.d_model),
            nn.SiLU(),
            nn.Linear(cfg.d_model, cfg.d_model),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``t``: [B] → [B, D]."""
        features = timestep_features(t, self.freq_dim, self.scale, self.max_period)
        return self.mlp(features.to(self.mlp[0].weight.dtype))


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention: proj(softmax(q kᵀ / √d_h) v), with
    ``F.scaled_dot_product_attention``."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class CrossAttention(nn.Module):
    """Multi-head attention from the tokens y [B, T, D] to the condition tokens k [B, K, D]:
    proj(softmax(q kᵀ / √d_h) v), q = W_q y, [k, v] = W_kv k."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``x``: [B, T, D]; ``tokens``: [B, K, D] → [B, T, D]."""
        b, t, d = x.shape
        k_len = tokens.shape[1]
        h = self.n_heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)
        k, v = (
            z.view(b, k_len, h, d // h).transpose(1, 2)
            for z in self.kv(tokens.to(x.dtype)).split(d, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    """proj(GELU_tanh(fc(x))), hidden size ``mlp_ratio · d`` (the DiT MLP)."""

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def applies_own_activation(norm: nn.Module) -> bool:
    """Whether a conditional norm puts its condition through SiLU itself (adaLN-Zero's ``act``:
    Linear(SiLU(c))). Such a norm is given c; every other one SiLU(c) (see the module docstring)."""
    return isinstance(getattr(norm, "act", None), nn.SiLU)


def _norm_cond(norm: nn.Module, c: torch.Tensor, c_act: torch.Tensor) -> torch.Tensor:
    return c if applies_own_activation(norm) else c_act


def _apply_norm(
    norm: nn.Module, h: torch.Tensor, c: torch.Tensor, c_act: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y, gate) of one norm slot: a plain norm (the token conditioning modes) gets no
    condition, a conditional one c or SiLU(c) (:func:`_norm_cond`)."""
    if isinstance(norm, UnconditionedNorm):
        return norm(h)
    return norm(h, _norm_cond(norm, c, c_act))


def _gated_add(h: torch.Tensor, out: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """h + g ⊙ out (:func:`normlab.functional.gated_residual`); h + out for a norm with no gate."""
    return h + out if gate is None else gated_residual(h, out, gate)


class DiTBlock(nn.Module):
    """One DiT block, pre-norm with gated residuals, both norms modulated by c:

    y, g = N₁(h; c);  h ← h + g ⊙ Attn(y)
    y, g = N₂(h; c);  h ← h + g ⊙ MLP(y)

    (a norm that does not apply SiLU to its condition itself is given ``c_act`` = SiLU(c)).
    With ``cross_attention`` (plain norms, no gates) a third sublayer sits between the two:
    y = N_x(h); h ← h + CrossAttn(y, K).
    """

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.norm_attn = make_dit_norm(cfg.norm, cfg.d_model, cfg.d_model, cfg.norm_eps)
        self.attn = SelfAttention(cfg)
        if cfg.norm == CROSS_ATTENTION:
            self.norm_xattn = make_dit_norm(cfg.norm, cfg.d_model, cfg.d_model, cfg.norm_eps)
            self.cond_xattn = CrossAttention(cfg)
        self.norm_mlp = make_dit_norm(cfg.norm, cfg.d_model, cfg.d_model, cfg.norm_eps)
        self.mlp = FeedForward(cfg)

    def forward(
        self,
        h: torch.Tensor,
        c: torch.Tensor,
        c_act: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``h``: [B, T, D]; ``c``: [B, D]; ``c_act``: SiLU(c), computed here when not given;
        ``tokens``: the condition tokens [B, K, D] (needed with cross-attention)."""
        c_act = F.silu(c) if c_act is None else c_act
        y, gate = _apply_norm(self.norm_attn, h, c, c_act)
        h = _gated_add(h, self.attn(y), gate)
        if hasattr(self, "cond_xattn"):
            if tokens is None:
                raise ValueError("tokens: a cross-attention block needs the condition tokens")
            y, _ = self.norm_xattn(h)
            h = h + self.cond_xattn(y, tokens)
        y, gate = _apply_norm(self.norm_mlp, h, c, c_act)
        return _gated_add(h, self.mlp(y), gate)


class DiT(nn.Module):
    """Velocity network v̂(x_t, t, label) of flow matching; see the module docstring.

    Built from a config alone, its parameters follow the paired initialisation
    (:func:`init_dit_paired_`) with a seed drawn from torch's global generator before any
    submodule is built: deterministic under ``torch.manual_seed``, and two DiTs that differ only
    in their norm kind get identical values for every parameter they share. Pass ``seed`` (or use
    :func:`build_dit`) to choose it explicitly.
    """

    def __init__(self, cfg: DiTConfig, seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(cfg, DiTConfig):
            raise TypeError(f"cfg: expected a DiTConfig, got {type(cfg).__name__}")
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self.config = cfg
        self.x_embed = nn.Linear(cfg.in_channels, cfg.d_model, bias=cfg.bias)
        if cfg.positions == "learned":
            self.pos_emb = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        else:
            self.register_buffer(
                "pos_emb", sincos_positions(cfg.seq_len, cfg.d_model), persistent=False
            )
        self.time_embed = TimestepEmbedder(cfg)
        self.label_embed = (
            nn.Embedding(cfg.n_classes + 1, cfg.d_model) if cfg.n_classes > 0 else None
        )
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.n_layers))
        self.norm_final = make_dit_norm(
            cfg.norm, cfg.d_model, cfg.d_model, cfg.norm_eps, gate=False
        )
        self.head = nn.Linear(cfg.d_model, cfg.in_channels)
        init_dit_paired_(self, seed)

    def condition_tokens(self, t: torch.Tensor, label: torch.Tensor | None = None) -> torch.Tensor:
        """K = [TimeMLP(φ(t)), E[label]] ([B, K, D]; K = 1, the time alone, without labels);
        label None means the null class (if any). :meth:`condition` is their sum."""
        parts = [self.time_embed(t)]
        if self.label_embed is not None:
            if label is None:
                label = torch.full_like(t, self.config.n_classes, dtype=torch.long)
            parts.append(self.label_embed(label))
        return torch.stack(parts, dim=1)

    def condition(self, t: torch.Tensor, label: torch.Tensor | None = None) -> torch.Tensor:
        """c = TimeMLP(φ(t)) + E[label] ([B, D]); label None means the null class (if any)."""
        c = self.time_embed(t)
        if self.label_embed is not None:
            if label is None:
                label = torch.full_like(t, self.config.n_classes, dtype=torch.long)
            c = c + self.label_embed(label)
        return c

    def forward(
        self, x: torch.Tensor, t: torch.Tensor | float, label: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Velocity [B, T, C_in] at noisy tokens ``x`` [B, T, C_in] (T ≤ seq_len) and flow time
        ``t``: [B] per sample, or a number / 0-d tensor shared by the batch. ``label``: None or
        int64 [B] in 0 … n_classes (n_classes is the null class); only when n_classes > 0."""
        self._check_x(x)
        t = self._check_t(t, x)
        label = self._check_label(label, x)
        h = self.x_embed(x) + self.pos_emb[: x.shape[1]].to(self.x_embed.weight.dtype)
        if self.config.norm in TOKEN_CONDITIONING:
            return self._forward_tokens(h, t, label)
        c = self.condition(t, label)
        c_act = F.silu(c)
        for block in self.blocks:
            h = block(h, c, c_act)
        # modulated (shift, scale); no gate, or one left unused
        y, _ = self.norm_final(h, _norm_cond(self.norm_final, c, c_act))
        return self.head(y)

    def _forward_tokens(
        self, h: torch.Tensor, t: torch.Tensor, label: torch.Tensor | None
    ) -> torch.Tensor:
        """The token conditioning modes: the condition enters as tokens K, every norm plain."""
        tokens = self.condition_tokens(t, label).to(h.dtype)
        n_cond = tokens.shape[1] if self.config.norm == IN_CONTEXT else 0
        if n_cond:
            h = torch.cat([tokens, h], dim=1)
        for block in self.blocks:
            h = block(h, tokens, tokens, tokens)
        y, _ = self.norm_final(h[:, n_cond:])
        return self.head(y)

    def _check_x(self, x: object) -> None:
        cfg = self.config
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x: dtype {x.dtype} is not a floating dtype; expected a float tensor")
        if x.dim() != 3 or x.shape[-1] != cfg.in_channels:
            raise ValueError(
                f"x: expected shape [B, T, {cfg.in_channels}] (in_channels), got {tuple(x.shape)}"
            )
        if not 1 <= x.shape[1] <= cfg.seq_len:
            raise ValueError(
                f"x: sequence length {x.shape[1]} is outside 1 … seq_len={cfg.seq_len}"
            )
        if x.shape[0] < 1:
            raise ValueError(f"x: expected a batch of at least one sequence, got {tuple(x.shape)}")

    @staticmethod
    def _check_t(t: object, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        if isinstance(t, bool) or not isinstance(t, int | float | torch.Tensor):
            raise TypeError(f"t: expected a number or a float tensor [B], got {type(t).__name__}")
        if not isinstance(t, torch.Tensor):
            return torch.full((b,), float(t), device=x.device)
        if not t.is_floating_point():
            raise TypeError(f"t: dtype {t.dtype} is not a floating dtype; expected a float tensor")
        if t.device != x.device:
            raise ValueError(
                f"t: is on {t.device} but x is on {x.device}; expected the same device"
            )
        if t.dim() == 0:
            return t.expand(b)
        if t.shape != (b,):
            raise ValueError(
                f"t: expected shape [B] = [{b}] (one time per sample) or a scalar, "
                f"got {tuple(t.shape)}"
            )
        return t

    def _check_label(self, label: object, x: torch.Tensor) -> torch.Tensor | None:
        if label is None:
            return None
        n = self.config.n_classes
        if n == 0:
            raise ValueError(
                "label: this DiT has no label embedding (n_classes=0); leave label out or "
                "build it with n_classes > 0"
            )
        if not isinstance(label, torch.Tensor) or label.dtype != torch.long:
            raise TypeError(f"label: expected an int64 tensor [B], got {_describe(label)}")
        if label.shape != (x.shape[0],):
            raise ValueError(
                f"label: expected shape [B] = [{x.shape[0]}], got {tuple(label.shape)}"
            )
        if label.device != x.device:
            raise ValueError(
                f"label: is on {label.device} but x is on {x.device}; expected the same device"
            )
        in_range = ((label >= 0) & (label <= n)).all()
        if label.device.type != "cpu" or torch.compiler.is_compiling():
            # No host sync (and no graph break): the device checks and fails the next sync.
            torch._assert_async(in_range, f"label: values must lie in 0 … {n}")
        elif not bool(in_range):
            raise ValueError(
                f"label: values must lie in 0 … {n} ({n} is the null class), got "
                f"{int(label.min())} … {int(label.max())}"
            )
        return label

    def norm_parameter_names(self) -> list[str]:
        """Names of the arm's own parameters: those of norm modules (their modulation Linears)
        and of the modules only some conditioning arms have (``cond_*``, the cross-attention)."""
        return [
            name
            for name, _ in self.named_parameters()
            if any(part.startswith((NORM_PREFIX, COND_PREFIX)) for part in name.split(".")[:-1])
        ]

    def modulation_names(self) -> list[str]:
        """Names of the modules whose output is the norms' modulation (shift, scale, gate)."""
        return [
            name
            for name, module in self.named_modules()
            if isinstance(module, nn.Linear)
            and any(part.startswith(NORM_PREFIX) for part in name.split("."))
        ]

    def embedding_parameter_names(self) -> list[str]:
        """Names of the embeddings' parameters, which a non-embedding count leaves out, as a
        language model's token, position and output embeddings are: the patch embedding
        (``x_embed``, a patch's pixels to the width), the learned position embedding
        (``positions: learned``), the class-label embedding and the output projection
        (``head``, the width back to a patch's pixels). The time embedding is an MLP on
        sinusoidal features, computed like the blocks, and counts."""
        modules = [m for m in (self.x_embed, self.label_embed, self.head) if m is not None]
        ids = {id(p) for m in modules for p in m.parameters()}
        if isinstance(self.pos_emb, nn.Parameter):
            ids.add(id(self.pos_emb))
        return [name for name, p in self.named_parameters() if id(p) in ids]

    def count_parameters(self) -> tuple[int, int]:
        """(all parameters, parameters inside norms)."""
        norms = set(self.norm_parameter_names())
        total = sum(p.numel() for p in self.parameters())
        return total, sum(p.numel() for n, p in self.named_parameters() if n in norms)


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def init_dit_paired_(model: DiT, seed: int) -> DiT:
    """Initialise a DiT in place, paired across models by parameter name (as the GPT testbed).

    The parameter called ``name`` is drawn from a generator seeded by
    :func:`normlab.models.parameter_seed` (``seed``, ``name``): Linear weights ~ N(0, σ²) with
    Xavier's σ² = 2 / (fan_in + fan_out); embedding tables (labels, learned positions)
    ~ N(0, ``init_std``²); biases 0; the output Linear (``head``) 0, so the network outputs
    exactly 0; norm parameters are left to their module (the conditional norms zero their
    modulation, so every gate starts closed), except adaLN's modulation (:class:`AdaLayerNorm`),
    drawn by name from torch's default U(−1/√fan_in, 1/√fan_in) so that it too is a function of
    (``seed``, name); the ``cond_*`` modules (cross-attention) follow the rule of the shared
    parameters. Values are drawn in float32 on the CPU and then copied, so they do not depend on
    the device.
    """
    norms = {
        n
        for n, _ in model.named_parameters()
        if any(part.startswith(NORM_PREFIX) for part in n.split(".")[:-1])
    }
    fans = {
        f"{name}.weight": (m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    }
    for name, param in model.named_parameters():
        if name in norms:
            continue
        if param.dim() < 2 or name.startswith("head."):
            values = torch.zeros(param.shape)
        else:
            fan_in, fan_out = fans.get(name, (0, 0))
            std = math.sqrt(2.0 / (fan_in + fan_out)) if name in fans else model.config.init_std
            gen = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, name))
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
        with torch.no_grad():
            param.copy_(values)
    for prefix, module in model.named_modules():
        if isinstance(module, AdaLayerNorm):
            _init_default_linear_(module.modulation, f"{prefix}.modulation", seed)
    return model


def _init_default_linear_(linear: nn.Linear, name: str, seed: int) -> None:
    """W, b ~ U(−1/√fan_in, 1/√fan_in) (``torch.nn.Linear``'s default), each drawn from the
    generator of (``seed``, its parameter name)."""
    bound = 1.0 / math.sqrt(linear.in_features)
    for pname, param in linear.named_parameters():
        gen = torch.Generator(device="cpu").manual_seed(parameter_seed(seed, f"{name}.{pname}"))
        values = (torch.rand(param.shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound
        with torch.no_grad():
            param.copy_(values)


def build_dit(cfg: DiTConfig, seed: int) -> DiT:
    """A :class:`DiT` with the paired initialisation for ``seed`` (see :func:`init_dit_paired_`).
    ``seed`` is a run's seed, an int the experiment config validated."""
    return DiT(cfg, seed=seed)
