"""The norm registry: the built-in kinds, the unknown-kind error, and registering new kinds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import normlab
from normlab import registry

BUILT_IN = ["adaln_zero", "adarms", "layernorm", "layernorm_nobias", "rmsnorm", "rmsnorm_gemma"]


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kinds registered by a test disappear after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_CONDITIONAL", set(registry._CONDITIONAL))


def test_built_in_kinds_are_registered() -> None:
    assert set(BUILT_IN) <= set(normlab.available_norms())
    assert normlab.available_norms() == sorted(normlab.available_norms())


@pytest.mark.parametrize(
    ("kind", "cls", "attrs"),
    [
        ("layernorm", normlab.LayerNorm, {"eps": 1e-5}),
        ("rmsnorm", normlab.RMSNorm, {"weight_offset": 0.0, "casting": "llama", "eps": 1e-6}),
        ("rmsnorm_gemma", normlab.RMSNorm, {"weight_offset": 1.0, "casting": "gemma"}),
    ],
)
def test_make_norm_builds_the_kind(kind: str, cls: type, attrs: dict) -> None:
    norm = normlab.make_norm(kind, 12)
    assert type(norm) is cls and norm.normalized_shape == (12,)
    for k, v in attrs.items():
        assert getattr(norm, k) == v


def test_layernorm_nobias() -> None:
    norm = normlab.make_norm("layernorm_nobias", 12)
    assert isinstance(norm, normlab.LayerNorm) and norm.bias is None and norm.weight is not None
    assert list(norm.state_dict()) == ["weight"]


def test_keyword_arguments_reach_the_constructor() -> None:
    norm = normlab.make_norm("rmsnorm_gemma", 12, casting="fp32", eps=1e-5)
    assert (norm.weight_offset, norm.casting, norm.eps) == (1.0, "fp32", 1e-5)
    ln = normlab.make_norm("layernorm", 12, elementwise_affine=False)
    assert ln.weight is None
    with pytest.raises(TypeError):
        normlab.make_norm("rmsnorm", 12, no_such_argument=1)


@pytest.mark.parametrize(
    ("kind", "cls"), [("adarms", "AdaRMSNorm"), ("adaln_zero", "AdaLayerNormZero")]
)
def test_conditional_kinds(kind: str, cls: str) -> None:
    norm = normlab.make_norm(kind, 12, cond_dim=4)
    assert type(norm) is getattr(normlab, cls)
    assert normlab.is_conditional(kind)
    y, gate = norm(torch.randn(2, 3, 12), torch.randn(2, 4))
    assert y.shape == (2, 3, 12) and gate.shape == (2, 1, 12)
    for plain in ("layernorm", "layernorm_nobias", "rmsnorm", "rmsnorm_gemma"):
        assert not normlab.is_conditional(plain)


@pytest.mark.parametrize("kind", ["batchnorm", "RMSNorm", "", None, 3])
def test_unknown_kind_lists_the_valid_ones(kind: object) -> None:
    with pytest.raises(ValueError) as info:
        normlab.make_norm(kind, 8)
    msg = str(info.value)
    assert "kind" in msg and repr(kind) in msg and "expected" in msg
    for name in normlab.available_norms():
        assert name in msg
    with pytest.raises(ValueError, match="unknown norm"):
        normlab.is_conditional(kind)


class Scaled(nn.Module):
    def __init__(self, dim: int, factor: float = 2.0) -> None:
        super().__init__()
        self.dim, self.factor = dim, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * x


@pytest.mark.usefixtures("clean_registry")
def test_register_norm() -> None:
    normlab.register_norm("scaled", Scaled)
    assert "scaled" in normlab.available_norms()
    norm = normlab.make_norm("scaled", 5, factor=3.0)
    assert isinstance(norm, Scaled) and norm.dim == 5 and norm.factor == 3.0
    assert not normlab.is_conditional("scaled")

    with pytest.raises(ValueError, match="already registered"):
        normlab.register_norm("scaled", Scaled)
    normlab.register_norm("scaled", lambda dim, **kw: Scaled(dim, factor=-1.0), overwrite=True)
    assert normlab.make_norm("scaled", 5).factor == -1.0

    normlab.register_norm("my_adarms", normlab.AdaRMSNorm, conditional=True)
    assert normlab.is_conditional("my_adarms")
    normlab.register_norm("my_adarms", Scaled, overwrite=True)
    assert not normlab.is_conditional("my_adarms")


@pytest.mark.usefixtures("clean_registry")
def test_register_norm_rejects_bad_arguments() -> None:
    for bad in ("has space", "", "1st", None):
        with pytest.raises(ValueError, match="kind"):
            normlab.register_norm(bad, Scaled)
    with pytest.raises(TypeError, match="factory"):
        normlab.register_norm("fine", "not callable")
    assert "fine" not in normlab.available_norms()


def test_registered_kinds_do_not_leak() -> None:
    """The clean_registry fixture of the tests above restored the registry."""
    assert "scaled" not in normlab.available_norms()
    assert "my_adarms" not in normlab.available_norms()


# ----------------------------------------------------------------------------------------------
# Found in review of the public API
# ----------------------------------------------------------------------------------------------
D = 16


def test_other_flags_must_be_bools() -> None:
    with pytest.raises(TypeError, match=r"^gate: expected a bool"):
        normlab.dit_to_pi05(nn.Linear(4, 3 * D), gate="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^overwrite: expected a bool"):
        normlab.register_norm("layernorm", normlab.LayerNorm, overwrite="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^conditional: expected a bool"):
        normlab.register_norm("review_flag", normlab.LayerNorm, conditional=1)  # type: ignore[arg-type]
    assert "review_flag" not in normlab.available_norms()


def test_dyt_from_the_registry_keeps_bf16_like_layernorm() -> None:
    import normlab.models  # registers "dyt"

    x = torch.randn(2, 8).bfloat16()
    for kind in ("dyt", "layernorm", "rmsnorm"):
        assert normlab.make_norm(kind, 8)(x).dtype == torch.bfloat16, kind
