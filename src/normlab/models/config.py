"""The GPT testbed's configuration: sizes, MLP kind, positions, norm kind and placement."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from normlab.models.norms import check_model_norm

PLACEMENTS = ("pre", "post", "sandwich")
MLP_KINDS = ("gelu", "swiglu")
POSITION_KINDS = ("learned", "rope")


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of :class:`normlab.models.GPT`.

    ``placement``: ``pre`` h + F(N(h)); ``post`` N(h + F(h)); ``sandwich`` h + N₂(F(N₁(h))).
    ``norm_eps`` (None: each norm's own default) is passed to every norm that has an ε.
    ``init_std`` is the GPT-2 standard deviation; residual projections use
    ``init_std / sqrt(2 · n_layers)``.
    """

    vocab_size: int = 256
    context: int = 128
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp: str = "gelu"
    mlp_ratio: float = 4.0
    positions: str = "learned"
    rope_base: float = 10000.0
    norm: str = "layernorm"
    placement: str = "pre"
    norm_eps: float | None = 1e-5
    dyt_alpha_init: float = 0.5
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"positions: rope needs an even head size, got {self.d_model // self.n_heads}"
            )
        _check_choice("mlp", self.mlp, MLP_KINDS)
        _check_choice("positions", self.positions, POSITION_KINDS)
        _check_choice("placement", self.placement, PLACEMENTS)
        check_model_norm(self.norm)
        for name in ("mlp_ratio", "init_std", "rope_base"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a number > 0, got {getattr(self, name)!r}")
        if self.norm_eps is not None and not self.norm_eps > 0:
            raise ValueError(f"norm_eps: expected a float > 0 or None, got {self.norm_eps!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def has_final_norm(self) -> bool:
        """Pre and sandwich leave the residual stream un-normalised, so a final norm is needed."""
        return self.placement in ("pre", "sandwich")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: got {value!r}; expected one of {', '.join(choices)}")
