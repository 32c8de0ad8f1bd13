"""μP for the GPT testbed (normlab.models.mup): sp is untouched, mup at the base width is sp bit
for bit, and away from it the initial deviations, the Adam rates, the attention scale and the
output multiplier follow the width."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normlab.models import GPT, GPTConfig, build_gpt
from normlab.models.mup import (
    attention_scale,
    fan_in_ratios,
    hidden_names,
    lr_multipliers,
    param_groups,
    set_lr,
)

SMALL = {"n_layers": 2, "n_heads": 2, "context": 16}


def cfg(**kw: object) -> GPTConfig:
    return GPTConfig(**{**SMALL, **kw})


def tokens(n: int = 2, t: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"mlp": "swiglu", "tie_embeddings": False, "positions": "learned", "bias": True},
        {"placement": "sandwich", "norm": "rmsnorm"},
    ],
)
def test_mup_at_the_base_width_is_sp_bit_for_bit(kw: dict[str, object]) -> None:
    sp = build_gpt(cfg(d_model=32, **kw), seed=3)
    mup = build_gpt(cfg(d_model=32, parametrization="mup", base_d_model=32, **kw), seed=3)
    sp_params, mup_params = dict(sp.named_parameters()), dict(mup.named_parameters())
    assert sp_params.keys() == mup_params.keys()
    for name, p in sp_params.items():
        assert torch.equal(p, mup_params[name]), name
    x = tokens()
    (a, loss_a), (b, loss_b) = sp(x, x), mup(x, x)
    assert torch.equal(a, b) and torch.equal(loss_a, loss_b)
    assert mup.blocks[0].attn.scale is None and mup.output_multiplier == 1.0
    # and the same Adam groups: one rate for all
    assert {g["lr_mult"] for g in param_groups(mup, 1e-3, 0.1)} == {1.0}


def test_sp_ignores_the_base_width_and_draws_the_same_numbers() -> None:
    """sp's initial values do not depend on base_d_model, and building a mup model consumes no
    global random numbers (the paired initialisation draws from its own generators)."""
    a = build_gpt(cfg(d_model=64), seed=0)
    b = build_gpt(cfg(d_model=64, base_d_model=16), seed=0)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    torch.manual_seed(0)
    build_gpt(cfg(d_model=64), seed=0)
    after_sp = torch.rand(3)
    torch.manual_seed(0)
    build_gpt(cfg(d_model=64, parametrization="mup", base_d_model=16), seed=0)
    assert torch.equal(torch.rand(3), after_sp)


def test_mup_scales_hidden_init_by_the_fan_in_ratio_with_the_same_draws() -> None:
    base, wide = 32, 128
    sp = build_gpt(cfg(d_model=wide), seed=5)
    mup = build_gpt(cfg(d_model=wide, parametrization="mup", base_d_model=base), seed=5)
    hidden = set(hidden_names(mup))
    assert hidden == {
        f"blocks.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    }
    for (name, p), q in zip(sp.named_parameters(), mup.parameters(), strict=True):
        if name in hidden:  # same draws, deviation × sqrt(base / width)
            torch.testing.assert_close(q, p * math.sqrt(base / wide), rtol=1e-6, atol=0)
        else:  # embeddings (tied head), norms: as sp
            assert torch.equal(p, q), name


def test_swiglu_ratios_follow_the_rounded_hidden_size() -> None:
    model = GPT(cfg(d_model=96, mlp="swiglu", parametrization="mup", base_d_model=32))
    ratios = fan_in_ratios(model)
    base_hidden, hidden = GPTConfig(d_model=32, mlp="swiglu").mlp_hidden, model.config.mlp_hidden
    assert model.blocks[0].mlp.proj.weight.shape[1] == hidden
    assert ratios["blocks.0.mlp.proj.weight"] == base_hidden / hidden
    assert ratios["blocks.0.mlp.up.weight"] == 32 / 96


def test_param_groups_give_the_lr_and_decay_multipliers() -> None:
    lr, wd = 0.01, 0.1
    model = build_gpt(cfg(d_model=128, parametrization="mup", base_d_model=32, bias=True), 0)
    groups = param_groups(model, lr, wd)
    by_name = {n: g for g in groups for n in g["param_names"]}
    assert sorted(by_name) == sorted(n for n, _ in model.named_parameters())  # tied: once
    norms = set(model.norm_parameter_names())
    for name, p in model.named_parameters():
        g = by_name[name]
        if name in hidden_names(model):
            assert g["lr_mult"] == 0.25 and g["lr"] == lr * 0.25
            assert g["weight_decay"] == pytest.approx(wd / 0.25)  # lr · wd as at the base
        else:
            assert g["lr_mult"] == 1.0 and g["lr"] == lr, name
            decays = p.dim() >= 2 and name not in norms
            assert g["weight_decay"] == (wd if decays else 0.0), name
    assert by_name["tok_emb.weight"]["lr_mult"] == 1.0  # the (tied) readout is not scaled
    assert by_name["blocks.0.attn.qkv.bias"]["lr_mult"] == 1.0  # biases are vectors
    assert by_name["blocks.0.norm_attn.weight"]["lr_mult"] == 1.0  # norm gains too
    opt = torch.optim.AdamW(groups, lr=lr)
    set_lr(opt, 0.5)
    assert {(g["lr_mult"], g["lr"]) for g in opt.param_groups} == {(0.25, 0.125), (1.0, 0.5)}
    assert set(lr_multipliers(build_gpt(cfg(d_model=128), 0)).values()) == {1.0}


def test_param_groups_refuse_bad_rates() -> None:
    model = GPT(cfg(d_model=32))
    with pytest.raises(ValueError, match=r"^lr:"):
        param_groups(model, 0.0)
    with pytest.raises(ValueError, match=r"^weight_decay:"):
        param_groups(model, 1e-3, -1.0)


def test_attention_uses_sqrt_base_head_over_head() -> None:
    c = cfg(d_model=64, parametrization="mup", base_d_model=16)  # heads of 32, base heads of 8
    assert attention_scale(c) == math.sqrt(8) / 32
    assert attention_scale(cfg(d_model=64)) is None
    attn = GPT(c).blocks[0].attn
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    attn = attn.double()
    q, k, v = attn.qkv(x).split(64, dim=-1)
    q, k, v = (z.view(2, 16, 2, 32).transpose(1, 2) for z in (q, k, v))
    q, k = attn.rotary(q), attn.rotary(k)
    scores = (q @ k.transpose(-1, -2)) * (math.sqrt(8) / 32)
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), -math.inf)
    want = attn.proj((F.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 16, 64))
    torch.testing.assert_close(attn(x), want)


def test_logits_are_multiplied_by_base_over_width() -> None:
    c = cfg(d_model=64, parametrization="mup", base_d_model=16)
    model = build_gpt(c, 0)
    x = tokens()
    logits, _ = model(x)
    model.output_multiplier = 1.0
    plain, _ = model(x)
    torch.testing.assert_close(logits, plain * 0.25)


def test_config_refuses_a_base_width_the_heads_do_not_divide() -> None:
    with pytest.raises(ValueError, match=r"^base_d_model: 30 is not divisible by n_heads=4"):
        GPTConfig(parametrization="mup", base_d_model=30)
    GPTConfig(base_d_model=30)  # sp ignores it
    with pytest.raises(ValueError, match="parametrization"):
        GPTConfig(parametrization="ntk")
