"""The testbeds' configuration, validated once: the only place their settings and defaults live.

Two kinds of class per testbed:

- the *settings* a user gives (a YAML section, command-line flags), held equal across the arms
  of a comparison: :class:`GPTSettings` (the experiment's ``model`` section) and
  :class:`DiTSettings` (its ``dit`` section);
- the *config* a model is built from: the settings plus what an arm chooses (the norm, the
  placement) and what the data fixes (vocabulary, token shapes, classes): :class:`GPTConfig`
  and :class:`DiTConfig`.

A config extends its settings, so both share one set of fields, defaults and checks. The
defaults are those of ``normlab compare`` (``examples/default.yaml`` and ``examples/dit.yaml``
spell them out). Unknown keys, values of the wrong type (no silent casts: ``True`` is not an
int) and non-finite floats are refused; constructing one with a bad value raises ``ValueError``
naming the key (``TypeError`` for a norm that is not a string).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from normlab.models.norms import check_dit_norm, check_model_norm

PLACEMENTS = ("pre", "post", "sandwich")
MLP_KINDS = ("gelu", "swiglu")
POSITION_KINDS = ("learned", "rope")
PARAMETRIZATIONS = ("sp", "mup")
DIT_POSITION_KINDS = ("sincos", "learned")
TIME_DISTRIBUTIONS = ("logit_normal", "uniform")

DEFAULT_LABEL_DROPOUT = 0.1
"""The DiT testbed's label dropout: the probability that a training label becomes the null
class (DiT's 0.1), which trains the unconditional model classifier-free guidance needs."""
DEFAULT_CFG_SCALE = 1.5
"""The guidance scale w of the DiT testbed's samples, v = v_∅ + w · (v_c − v_∅)."""
GUIDANCE_NEUTRAL: dict[str, float] = {"label_dropout": 0.0, "cfg_scale": 1.0}
"""The values of the guidance settings that change nothing: no label dropout, no guidance."""


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem, each starting with the key it is about: ``key: what is wrong (got
    value)``; a check across keys names its key itself."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        given = e.get("input")
        shown = "" if isinstance(given, dict) or not key else f" (got {given!r})"
        lines.append(msg if not key or msg.startswith(f"{key}:") else f"{key}: {msg}{shown}")
    return "\n".join(lines)


class ConfigModel(BaseModel):
    """A validated, immutable group of settings: unknown keys, wrong types and non-finite
    floats (inf, nan) are errors. Built directly (``GPTConfig(d_model=…)``), a bad value raises
    ``ValueError`` whose message starts with the key; nested in a larger config (the
    experiment's sections), the larger config reports it with its dotted path."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise ValueError(describe_validation_error(err)) from None

    # Pydantic's own marker (as its RootModel sets it): validating this class nested in another
    # model (an experiment config's section) goes through the schema, not this __init__, so the
    # outer config still reports each error with its full dotted key.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready data, in declaration order."""
        return self.model_dump(mode="json")


# ----------------------------------------------------------------------------------------------
# the GPT testbed
# ----------------------------------------------------------------------------------------------
class GPTSettings(ConfigModel):
    """The GPT testbed's architecture, held equal across arms (the experiment's ``model``
    section).

    ``d_model`` channels, ``n_layers`` blocks, ``n_heads`` attention heads (they divide
    ``d_model``), ``context`` tokens per window. ``mlp``: ``gelu`` (proj(GELU(fc(x))), hidden
    ``mlp_ratio · d_model``) or ``swiglu``. ``positions``: ``rope`` (rotary, needs an even head
    size) or ``learned``. ``norm_eps`` (None: each norm's own default) is passed to every norm
    that has an ε; ``dyt_alpha_init`` is Dynamic Tanh's initial α, and ``dyt_alpha_attn``,
    ``dyt_alpha_mlp``, ``dyt_alpha_final`` override it per position (None: ``dyt_alpha_init``)
    for the norms before attention (and after it, in sandwich), before the MLP (and after it)
    and at the end, the DyT authors' LLaMA recipe of one α₀ per position.
    ``dyt_embed_scale`` (None: off) gives a ``dyt`` arm a learnable scalar s after the token
    embedding, h₀ = s · E[idx], starting at this value (the DyT authors' LLaMA code has such a
    scalar, started at √d_model there): DyT does not rescale its input as a norm does, so
    without it the embedding's entries (std ``init_std``) reach the first tanh far below the
    unit scale a norm hands on; s₀ = 1 / ``init_std`` brings them to unit scale.
    The scalar is the arm's own parameter; other arms ignore the setting. ``bias``: biases in the
    Linears; ``tie_embeddings``: the output head shares the token embedding. ``init_std`` is the
    GPT-2 standard deviation; residual projections use ``init_std / sqrt(2 · n_layers)``.

    ``parametrization``: ``sp`` (the standard one above) or ``mup`` (maximal update
    parametrisation, width-wise, :mod:`normlab.models.mup`): the hidden matrices' initial
    standard deviation and Adam rate, the attention scale and an output multiplier follow the
    width d_model relative to ``base_d_model``, the width at which ``mup`` is ``sp`` exactly
    (the same model, the same numbers; the width the rates were tuned at). ``sp`` ignores
    ``base_d_model``; under ``mup`` it must suit ``n_heads`` as ``d_model`` does.
    """

    d_model: int = Field(64, ge=8, description="Channels of the residual stream.")
    n_layers: int = Field(4, ge=1, description="Transformer blocks.")
    n_heads: int = Field(4, ge=1, description="Attention heads (they divide d_model).")
    context: int = Field(64, ge=2, description="Tokens per training window.")
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = Field(4.0, gt=0)
    positions: Literal["learned", "rope"] = "rope"
    norm_eps: float | None = Field(1e-5, gt=0)
    dyt_alpha_init: float = 0.5
    dyt_alpha_attn: float | None = None
    dyt_alpha_mlp: float | None = None
    dyt_alpha_final: float | None = None
    dyt_embed_scale: float | None = Field(None, gt=0)
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)
    parametrization: Literal["sp", "mup"] = Field(
        "sp", description="gpt: sp (standard) or mup (width-wise muP, base width base_d_model)."
    )
    base_d_model: int = Field(
        64, ge=8, description="mup: the width at which mup equals sp (sp ignores it)."
    )

    @model_validator(mode="after")
    def _check_heads(self) -> GPTSettings:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"positions: rope needs an even head size, got {self.d_model // self.n_heads}"
            )
        if self.parametrization == "mup" and self.base_d_model % self.n_heads:
            raise ValueError(
                f"base_d_model: {self.base_d_model} is not divisible by n_heads={self.n_heads} "
                "(mup's base model has the same heads)"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden size: ``mlp_ratio · d_model`` (``gelu``), or ⅔ of it rounded up to a
        multiple of 8 (``swiglu``, whose three matrices then hold as many parameters)."""
        if self.mlp == "swiglu":
            return -(-int(2 * self.mlp_ratio * self.d_model / 3) // 8) * 8
        return int(self.mlp_ratio * self.d_model)

    def dyt_alpha(self, position: Literal["attn", "mlp", "final"]) -> float:
        """Dynamic Tanh's initial α at ``position``: ``dyt_alpha_<position>``, or
        ``dyt_alpha_init`` when that is None."""
        value = getattr(self, f"dyt_alpha_{position}")
        return self.dyt_alpha_init if value is None else value


class GPTConfig(GPTSettings):
    """Hyper-parameters of :class:`normlab.models.GPT`: the :class:`GPTSettings` plus one arm's
    ``norm`` (an unconditional registered kind, ``dyt`` or ``none``) and ``placement``:
    ``pre`` h + F(N(h)); ``post`` N(h + F(h)); ``sandwich`` h + N₂(F(N₁(h))).
    ``vocab_size`` is 256 for bytes; ``rope_base`` is the rotary base of θ_i = base^(−2i/d).
    """

    norm: str = "layernorm"
    placement: Literal["pre", "post", "sandwich"] = "pre"
    vocab_size: int = Field(256, ge=1)
    rope_base: float = Field(10000.0, gt=0)

    @field_validator("norm", mode="before")
    @classmethod
    def _check_norm(cls, v: object) -> str:
        return check_model_norm(v)

    @property
    def has_final_norm(self) -> bool:
        """Pre and sandwich leave the residual stream un-normalised, so a final norm is needed."""
        return self.placement in ("pre", "sandwich")


# ----------------------------------------------------------------------------------------------
# the DiT testbed
# ----------------------------------------------------------------------------------------------
class DiTArchitecture(ConfigModel):
    """The DiT's sizes, shared by :class:`DiTSettings` and :class:`DiTConfig`.

    ``d_model`` channels (even with ``sincos`` positions), ``n_layers`` blocks, ``n_heads``
    heads (they divide ``d_model``), MLP hidden size ``mlp_ratio · d_model``. ``positions``:
    ``sincos`` (fixed sinusoids) or ``learned``. ``norm_eps`` (None: each norm's own default)
    is passed to every norm that has an ε. ``time_freq_dim`` (even) sinusoidal features of the
    flow time. ``bias``: biases in the Linears. ``init_std`` is the standard deviation of the
    embedding tables (labels, learned positions); Linear weights use Xavier's variance
    2 / (fan_in + fan_out).
    """

    d_model: int = Field(64, ge=8)
    n_layers: int = Field(4, ge=1)
    n_heads: int = Field(4, ge=1)
    mlp_ratio: float = Field(4.0, gt=0)
    positions: Literal["sincos", "learned"] = "sincos"
    norm_eps: float | None = Field(1e-6, gt=0)
    time_freq_dim: int = Field(128, ge=2)
    bias: bool = True
    init_std: float = Field(0.02, gt=0)

    @model_validator(mode="after")
    def _check_shapes(self) -> DiTArchitecture:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: d_model={self.d_model} is not divisible by n_heads={self.n_heads}"
            )
        if self.time_freq_dim % 2:
            raise ValueError(
                f"time_freq_dim: expected an even number (cos and sin pairs), "
                f"got {self.time_freq_dim}"
            )
        if self.positions == "sincos" and self.d_model % 2:
            raise ValueError(f"d_model: sincos positions need an even d_model, got {self.d_model}")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class DiTConfig(DiTArchitecture):
    """Hyper-parameters of :class:`normlab.models.DiT`: the :class:`DiTArchitecture` plus what
    the data and the arm fix.

    ``in_channels`` C_in and ``seq_len`` T (the most tokens a sequence may have) describe the
    data; ``n_classes`` = 0 makes the model unconditional on labels, n > 0 adds a label
    embedding with n + 1 rows, the last (index n) being the null class (see
    :attr:`null_class`). ``norm`` is a conditional norm kind. The time features are sinusoids
    of ``time_scale`` · t with ``time_freq_dim`` channels and periods up to
    ``time_max_period`` (see :func:`normlab.models.dit.timestep_features`).
    """

    in_channels: int = Field(4, ge=1)
    seq_len: int = Field(16, ge=1)
    n_classes: int = Field(0, ge=0)
    norm: str = "adaln_zero"
    time_scale: float = Field(1000.0, gt=0)
    time_max_period: float = Field(10000.0, gt=0)

    @field_validator("norm", mode="before")
    @classmethod
    def _check_norm(cls, v: object) -> str:
        return check_dit_norm(v)

    @property
    def null_class(self) -> int | None:
        """The label index that means "no class" (``n_classes``), or None when unconditional."""
        return self.n_classes if self.n_classes > 0 else None


class DiTSettings(DiTArchitecture):
    """The DiT testbed, held equal across arms (the experiment's ``dit`` section): the
    :class:`DiTArchitecture` plus how it is conditioned and trained by flow matching.

    ``class_conditional`` adds a label embedding (the shape's class) to the time embedding that
    modulates every norm. ``time_distribution`` is how training draws the flow time t (and how
    the fixed validation times were drawn): ``logit_normal`` (loc 0, scale 1) or ``uniform``.

    Classifier-free guidance, for a class-conditional DiT only: ``label_dropout`` p ∈ [0, 1) is
    the probability that training replaces a label by the null class (DiT: 0.1; the same draws
    for every arm of a seed, see :mod:`normlab.data.flow_batches`), and ``cfg_scale`` w ≥ 0 the
    guidance scale of the samples a finished run generates, v = v_∅ + w · (v_c − v_∅)
    (1: no guidance, 0: unconditional). The validation loss always uses the true labels. With
    ``class_conditional: false`` both must stay at their defaults or at their neutral values
    (0 and 1), which is what such a run records (:meth:`resolved`).
    """

    class_conditional: bool = True
    label_dropout: float = Field(DEFAULT_LABEL_DROPOUT, ge=0, lt=1)
    cfg_scale: float = Field(DEFAULT_CFG_SCALE, ge=0)
    time_distribution: Literal["logit_normal", "uniform"] = "logit_normal"

    @model_validator(mode="after")
    def _check_guidance_needs_labels(self) -> DiTSettings:
        if self.class_conditional:
            return self
        for name, neutral in GUIDANCE_NEUTRAL.items():
            value = getattr(self, name)
            if value not in (type(self).model_fields[name].default, neutral):
                raise ValueError(
                    f"{name}: {value} needs class_conditional: true (classifier-free guidance "
                    f"drops and guides class labels, and this DiT has none); expected it left "
                    f"out or {neutral}"
                )
        return self

    def guidance(self) -> dict[str, float]:
        """``label_dropout`` and ``cfg_scale`` as a run uses them: the neutral 0 and 1 for a
        DiT without class labels."""
        if not self.class_conditional:
            return dict(GUIDANCE_NEUTRAL)
        return {"label_dropout": self.label_dropout, "cfg_scale": self.cfg_scale}

    def resolved(self) -> DiTSettings:
        """These settings as a run uses them (:meth:`guidance` in place of the values given)."""
        return type(self)(**{**self.model_dump(), **self.guidance()})

    def dit_config(self, in_channels: int, seq_len: int, n_classes: int, norm: str) -> DiTConfig:
        """The :class:`DiTConfig` of one arm on data with these token shapes and ``n_classes``
        classes (the label embedding is left out unless ``class_conditional``)."""
        fields = {k: getattr(self, k) for k in DiTArchitecture.model_fields}
        return DiTConfig(
            **fields,
            in_channels=in_channels,
            seq_len=seq_len,
            n_classes=n_classes if self.class_conditional else 0,
            norm=norm,
        )
