"""The GPT testbed: every norm × placement runs forward and backward with the right shapes."""

from __future__ import annotations

import math

import pytest
import torch

import normlab
from normlab.layers import DynamicTanh
from normlab.models import GPT, GPTConfig, build_gpt, make_model_norm, model_norm_kinds

KINDS = ["layernorm", "layernorm_nobias", "rmsnorm", "rmsnorm_gemma", "dyt", "none"]
PLACEMENTS = ["pre", "post", "sandwich"]


def tiny(**kw: object) -> GPTConfig:
    base = {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 8, "positions": "learned"}
    return GPTConfig(**{**base, **kw})


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_backward_every_norm_and_placement(kind: str, placement: str) -> None:
    model = build_gpt(tiny(norm=kind, placement=placement), seed=0)
    idx = torch.randint(0, 256, (3, 8))
    logits, loss = model(idx, idx.roll(-1, dims=1))
    assert logits.shape == (3, 8, 256)
    assert loss is not None and loss.shape == () and math.isfinite(loss.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_options_shapes_and_shorter_sequences(mlp: str, positions: str) -> None:
    model = build_gpt(tiny(mlp=mlp, positions=positions), seed=1)
    logits, loss = model(torch.randint(0, 256, (2, 5)))
    assert logits.shape == (2, 5, 256) and loss is None
    assert (model.pos_emb is None) == (positions == "rope")


def test_final_norm_only_where_the_placement_needs_it() -> None:
    assert isinstance(GPT(tiny(placement="pre")).norm_final, normlab.LayerNorm)
    assert isinstance(GPT(tiny(placement="sandwich")).norm_final, normlab.LayerNorm)
    assert GPT(tiny(placement="post")).norm_final is None
    sandwich = GPT(tiny(placement="sandwich")).blocks[0]
    assert hasattr(sandwich, "norm_attn_out") and hasattr(sandwich, "norm_mlp_out")
    assert not hasattr(GPT(tiny(placement="pre")).blocks[0], "norm_attn_out")


def test_placements_compute_their_formulas() -> None:
    """pre h + F(N(h)); post N(h + F(h)); sandwich h + N₂(F(N₁(h)))."""
    torch.manual_seed(0)
    h = torch.randn(2, 4, 16)
    for placement in PLACEMENTS:
        block = build_gpt(tiny(placement=placement, norm="rmsnorm"), seed=0).blocks[0]
        a = block.attn
        m = block.mlp
        if placement == "pre":
            mid = h + a(block.norm_attn(h))
            want = mid + m(block.norm_mlp(mid))
        elif placement == "post":
            mid = block.norm_attn(h + a(h))
            want = block.norm_mlp(mid + m(mid))
        else:
            mid = h + block.norm_attn_out(a(block.norm_attn(h)))
            want = mid + block.norm_mlp_out(m(block.norm_mlp(mid)))
        torch.testing.assert_close(block(h), want)


def test_attention_is_causal() -> None:
    model = build_gpt(tiny(positions="rope"), seed=0).eval()
    idx = torch.randint(0, 256, (1, 8))
    changed = idx.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 256
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_tied_embeddings_and_gpt2_init() -> None:
    cfg = tiny(d_model=64, n_layers=4, n_heads=4)
    model = build_gpt(cfg, seed=0)
    assert model.head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names  # counted once
    params = dict(model.named_parameters())
    assert params["tok_emb.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    proj = params["blocks.0.attn.proj.weight"]
    assert proj.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.1)
    assert set(model.residual_projection_names()) == {
        f"blocks.{i}.{s}.proj.weight" for i in range(4) for s in ("attn", "mlp")
    }
    untied = GPT(tiny(tie_embeddings=False))
    assert untied.head.weight is not untied.tok_emb.weight


def test_norm_eps_reaches_every_norm() -> None:
    model = GPT(tiny(norm="rmsnorm", norm_eps=1e-3))
    eps = {m.eps for m in model.modules() if isinstance(m, normlab.RMSNorm)}
    assert eps == {1e-3}
    default = GPT(tiny(norm="rmsnorm", norm_eps=None))
    assert {m.eps for m in default.modules() if isinstance(m, normlab.RMSNorm)} == {1e-6}


def test_dyt_formula_and_registration() -> None:
    assert "dyt" in normlab.available_norms()
    dyt = normlab.make_norm("dyt", 4, alpha_init=0.7)
    assert isinstance(dyt, DynamicTanh)
    assert dyt.alpha.shape == () and dyt.alpha.item() == pytest.approx(0.7)
    with torch.no_grad():
        dyt.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
        dyt.bias.copy_(torch.tensor([0.0, 0.1, 0.2, 0.3]))
    x = torch.randn(3, 4)
    torch.testing.assert_close(dyt(x), dyt.weight * torch.tanh(0.7 * x) + dyt.bias)
    model = GPT(tiny(norm="dyt", dyt_alpha_init=0.25))
    assert {m.alpha.item() for m in model.modules() if isinstance(m, DynamicTanh)} == {0.25}


def test_none_is_identity_and_has_no_parameters() -> None:
    model = GPT(tiny(norm="none"))
    assert model.count_parameters()[1] == 0
    assert isinstance(make_model_norm("none", 16), torch.nn.Identity)


def test_norm_parameter_names_and_counts() -> None:
    model = GPT(tiny(norm="layernorm", placement="sandwich", n_layers=2))
    names = model.norm_parameter_names()
    # 4 norms per sandwich block × 2 blocks + final, each with weight and bias
    assert len(names) == (4 * 2 + 1) * 2
    total, in_norms = model.count_parameters()
    assert in_norms == 9 * 2 * 16
    assert total == sum(p.numel() for p in model.parameters())
    groups = model.parameter_groups()
    assert {"embed", "block0.attn", "block0.mlp", "block0.norms", "norm_final"} <= set(groups)
    assert sorted(n for g in groups.values() for n in g) == sorted(
        n for n, _ in model.named_parameters()
    )


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"norm": "adarms"}, "conditional"),
        ({"norm": "batchnorm"}, "unknown norm"),
        ({"placement": "middle"}, "placement"),
        ({"d_model": 15, "n_heads": 2}, "divisible"),
        ({"mlp": "relu"}, "mlp"),
        ({"n_layers": 0}, "n_layers"),
    ],
)
def test_config_errors_name_the_argument(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tiny(**kw)


def test_sequence_longer_than_context_is_refused() -> None:
    with pytest.raises(ValueError, match="context"):
        GPT(tiny())(torch.zeros(1, 9, dtype=torch.long))


def test_model_norm_kinds_lists_unconditional_kinds_and_none() -> None:
    kinds = model_norm_kinds()
    assert {"layernorm", "rmsnorm", "rmsnorm_gemma", "dyt", "none"} <= set(kinds)
    assert "adarms" not in kinds and "adaln_zero" not in kinds
