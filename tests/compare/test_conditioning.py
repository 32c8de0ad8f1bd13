"""The DiT conditioning ablation (Peebles & Xie 2023, Fig. 5): in-context, cross-attention,
adaLN, adaLN-Zero and AdaRMS arms build, train, pair, audit, and differ only where they should."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from normlab.audit import audit_model
from normlab.data import prepare_shapes
from normlab.experiment.config import validate_config
from normlab.experiment.execution.grid import plan_runs
from normlab.models import DiTConfig, build_dit, check_paired, dit_norm_kinds
from normlab.models.dit import COND_PREFIX
from normlab.models.norms import (
    AdaLayerNorm,
    AdaLayerNormZeroUnitScale,
    UnconditionedNorm,
    UnitBiasLinear,
)

MODES = ["adaln_zero", "adaln", "adarms", "cross_attention", "in_context"]


def tiny(norm: str, **kw: object) -> DiTConfig:
    base: dict[str, object] = {
        "in_channels": 3,
        "seq_len": 6,
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 2,
        "time_freq_dim": 16,
        "n_classes": 4,
    }
    return DiTConfig(**{**base, **kw}, norm=norm)  # type: ignore[arg-type]


def own_names(norm: str, seed: int = 0) -> set[str]:
    return set(build_dit(tiny(norm), seed).norm_parameter_names())


def test_every_mode_is_a_dit_arm() -> None:
    assert set(MODES) <= set(dit_norm_kinds())
    for mode in MODES:
        assert DiTConfig(norm=mode).norm == mode
    with pytest.raises(ValueError, match="norm"):
        DiTConfig(norm="in_kontext")


@pytest.mark.parametrize("norm", MODES)
def test_each_mode_trains_a_few_steps(norm: str) -> None:
    torch.manual_seed(0)
    model = build_dit(tiny(norm), seed=0)
    x = torch.randn(8, 6, 3)
    t = torch.rand(8)
    label = torch.randint(0, 5, (8,))
    target = torch.randn(8, 6, 3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = (model(x, t, label) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    out = model(x, t, label)
    assert out.shape == (8, 6, 3)
    assert model(x[:, :4], t, label).shape == (8, 4, 3)  # shorter sequences still work


@pytest.mark.parametrize("norm", MODES)
def test_the_condition_reaches_the_output(norm: str) -> None:
    model = build_dit(tiny(norm), seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # open the zero-init gates and head
            if name.startswith("head") or "modulation" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    x = torch.randn(2, 6, 3)
    t = torch.tensor([0.3, 0.3])
    a = model(x, t, torch.tensor([0, 0]))
    b = model(x, t, torch.tensor([1, 1]))
    c = model(x, torch.tensor([0.9, 0.9]), torch.tensor([0, 0]))
    assert not torch.allclose(a, b) and not torch.allclose(a, c)


def test_all_modes_pair_on_their_shared_parameters() -> None:
    models = {m: build_dit(tiny(m), seed=3) for m in MODES}
    digest = check_paired(models)
    assert digest == check_paired({m: build_dit(tiny(m), seed=3) for m in MODES})
    assert digest != check_paired({m: build_dit(tiny(m), seed=4) for m in MODES})
    shared = {
        m: {n for n, _ in model.named_parameters()} - set(model.norm_parameter_names())
        for m, model in models.items()
    }
    assert all(s == shared["adaln_zero"] for s in shared.values())
    assert "time_embed.mlp.0.weight" in shared["in_context"]
    assert "label_embed.weight" in shared["cross_attention"]


def test_the_modes_differ_only_in_how_the_condition_enters() -> None:
    """The parameter-name diff: what each arm owns beyond the shared network."""
    names = {m: own_names(m) for m in MODES}

    def suffixes(norm: str) -> set[str]:
        return {n.split(".", 2)[-1] if n.startswith("blocks.") else n for n in names[norm]}

    modulation = {
        f"{slot}.modulation.{p}" for slot in ("norm_attn", "norm_mlp") for p in ("weight", "bias")
    } | {"norm_final.modulation.weight", "norm_final.modulation.bias"}
    assert suffixes("adaln_zero") == suffixes("adaln") == suffixes("adarms") == modulation
    plain = {f"{slot}.{p}" for slot in ("norm_attn", "norm_mlp") for p in ("weight", "bias")}
    final = {"norm_final.weight", "norm_final.bias"}
    assert suffixes("in_context") == plain | final
    xattn = {f"norm_xattn.{p}" for p in ("weight", "bias")} | {
        f"{COND_PREFIX}xattn.{m}.{p}" for m in ("q", "kv", "proj") for p in ("weight", "bias")
    }
    assert suffixes("cross_attention") == plain | final | xattn
    d = 16
    zero, ada = build_dit(tiny("adaln_zero"), 0), build_dit(tiny("adaln"), 0)
    assert zero.blocks[0].norm_attn.modulation.weight.shape == (3 * d, d)  # shift, scale, gate
    assert ada.blocks[0].norm_attn.modulation.weight.shape == (2 * d, d)  # shift, scale, no gate


def test_adaln_starts_modulating_and_adaln_zero_does_not() -> None:
    a0, a0_again, a1 = (build_dit(tiny("adaln"), s) for s in (0, 0, 1))
    zero = build_dit(tiny("adaln_zero"), 0)
    w = a0.blocks[0].norm_attn.modulation.weight
    assert isinstance(a0.blocks[0].norm_attn, AdaLayerNorm)
    assert w.abs().max() > 0 and w.abs().max() <= 1 / 16**0.5  # U(−1/√fan_in, 1/√fan_in)
    assert torch.equal(w, a0_again.blocks[0].norm_attn.modulation.weight)  # a function of seed
    assert not torch.equal(w, a1.blocks[0].norm_attn.modulation.weight)
    assert zero.blocks[0].norm_attn.modulation.weight.abs().max() == 0
    y, gate = a0.blocks[0].norm_attn(torch.randn(2, 6, 16), torch.randn(2, 16))
    assert gate is None and y.shape == (2, 6, 16)


@pytest.mark.parametrize("norm", ["in_context", "cross_attention"])
def test_token_modes_use_plain_layernorms(norm: str) -> None:
    model = build_dit(tiny(norm, norm_eps=1e-4), seed=0)
    slots = [m for n, m in model.named_modules() if n.split(".")[-1].startswith("norm_")]
    assert slots and all(type(m) is UnconditionedNorm for m in slots)
    assert all(m.eps == 1e-4 for m in slots)
    assert not model.modulation_names()
    x = torch.randn(2, 5, 16)
    y, gate = slots[0](x)
    assert gate is None
    assert torch.allclose(y, torch.nn.functional.layer_norm(x, (16,), eps=1e-4), atol=1e-6)


def test_in_context_prepends_and_removes_the_condition_tokens() -> None:
    model = build_dit(tiny("in_context"), seed=0)
    seen: list[tuple[int, ...]] = []
    model.blocks[0].attn.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    x = torch.randn(2, 6, 3)
    assert model(x, torch.rand(2), torch.tensor([0, 1])).shape == (2, 6, 3)
    assert seen == [(2, 8, 16)]  # 6 image tokens + time token + label token
    model.eval()
    uncond = build_dit(tiny("in_context", n_classes=0), seed=0)
    seen.clear()
    uncond.blocks[0].attn.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    uncond(x, torch.rand(2))
    assert seen == [(2, 7, 16)]  # the time token alone


@pytest.mark.parametrize("norm", ["adaln", "in_context", "cross_attention"])
def test_audit_still_finds_pre_norms(norm: str) -> None:
    model = build_dit(tiny(norm, n_classes=2), seed=0)
    a = audit_model(model, torch.randn(2, 6, 3), torch.rand(2), torch.tensor([0, 1]))
    assert a.placement == "pre"
    sites = {s.name: s for s in a.norms}
    assert {"blocks.0.norm_attn", "blocks.0.norm_mlp", "norm_final"} <= set(sites)
    assert (norm == "cross_attention") == ("blocks.0.norm_xattn" in sites)
    for name, s in sites.items():
        assert s.role == ("final" if name == "norm_final" else "pre"), name
        # modulated norms see c per sequence; the token modes' plain norms see no condition
        assert s.conditioning == ("per sequence" if norm == "adaln" else "none"), name
        assert not s.returns_gate, name


def test_compare_plans_the_five_arms_paired(tmp_path: Path) -> None:
    cfg = validate_config(
        {
            "testbed": "dit",
            "norms": MODES,
            "seeds": 2,
            "device": "cpu",
            "threads": 1,
            "dit": {"d_model": 16, "n_layers": 1, "n_heads": 2, "time_freq_dim": 16},
            "shapes": {"image_size": 8, "patch_size": 4, "n_train": 64, "n_val": 16},
            "train": {"batch_size": 4, "warmup": 1, "eval_interval": 2},
        }
    )
    s = cfg.shapes
    info = prepare_shapes(tmp_path / "data", s.image_size, s.patch_size, s.n_train, s.n_val, s.seed)
    runs = plan_runs(cfg, "cpu", 1, info)
    assert len(runs) == 10
    by_seed: dict[int, set[str]] = {}
    for r in runs:
        by_seed.setdefault(r["seed"], set()).add(r["init_digest"])
    assert all(len(d) == 1 for d in by_seed.values())
    assert by_seed[0] != by_seed[1]


# --- the DiT's A/A twin: adaLN-Zero with the 1 of (1 + scale) in the modulation's bias ---------


def _unit_offset_state(model: torch.nn.Module, d: int) -> dict[str, torch.Tensor]:
    """``model``'s state with 1 added to the scale rows [d, 2d) of every modulation bias: the
    twin's parameters for the same function."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for key, value in state.items():
        if key.endswith("modulation.bias"):
            value[d : 2 * d] += 1.0
    return state


def test_adaln_zero_unit_starts_bit_identical_and_pairs() -> None:
    d = 16
    zero, unit = build_dit(tiny("adaln_zero"), 5), build_dit(tiny("adaln_zero_unit"), 5)
    assert "adaln_zero_unit" in dit_norm_kinds()
    check_paired({"adaln_zero": zero, "adaln_zero_unit": unit})  # shared parameters equal
    assert zero.state_dict().keys() == unit.state_dict().keys()
    for name, module in unit.named_modules():
        if isinstance(module, UnitBiasLinear):
            bias = module.bias.detach()
            assert torch.equal(bias[d : 2 * d], torch.ones(d)), name  # scale rows start at 1
            assert not bias[:d].any() and not bias[2 * d :].any() and not module.weight.any()
    norm_z, norm_u = zero.blocks[0].norm_attn, unit.blocks[0].norm_attn
    assert type(norm_u) is AdaLayerNormZeroUnitScale
    x, c = torch.randn(3, 6, d), torch.randn(3, d)
    (yz, gz), (yu, gu) = norm_z(x, c), norm_u(x, c)
    assert torch.equal(yz, yu) and torch.equal(gz, gu)  # the same numbers at initialisation
    # DiT's final layer asks for no gate: (shift, scale), the unit on the scale rows still
    assert unit.norm_final.gate is False
    assert torch.equal(unit.norm_final.modulation.bias.detach()[d:], torch.ones(d))


def test_adaln_zero_unit_is_adaln_zeros_function_up_to_rounding() -> None:
    """Opened (random modulation and head) and trained one SGD step side by side, the twin
    stays within float32 rounding of adaLN-Zero, with its bias 1 above on the scale rows.
    (SGD, not Adam: Adam's first step is lr·sign(g), and a gradient that is zero but for
    rounding, as that of the keys' bias, gets a sign of its own in each arm: the way the two
    arms of an A/A run part in training.)"""
    d = 16
    zero = build_dit(tiny("adaln_zero"), 0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in zero.named_parameters():  # open the zero-init gates and head
            if name.startswith("head") or "modulation" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    unit = build_dit(tiny("adaln_zero_unit"), 0)
    unit.load_state_dict(_unit_offset_state(zero, d))
    x, t, label = torch.randn(8, 6, 3), torch.rand(8), torch.randint(0, 4, (8,))
    target = torch.randn(8, 6, 3)
    out_z, out_u = zero(x, t, label), unit(x, t, label)
    assert out_z.abs().max() > 0.1  # the condition and the blocks reach the output
    torch.testing.assert_close(out_u, out_z, rtol=1e-5, atol=1e-5)
    for model in (zero, unit):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        (model(x, t, label) - target).square().mean().backward()
        opt.step()
    expected = _unit_offset_state(zero, d)
    for key, value in unit.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=1e-5, atol=1e-5, msg=key)
    torch.testing.assert_close(unit(x, t, label), zero(x, t, label), rtol=1e-4, atol=1e-5)


def test_unit_bias_linear_keeps_its_unit_through_deferred_init() -> None:
    """meta device, ``to_empty``, then ``reset_parameters`` on every module, parents first (as
    ``model.modules()`` and FSDP visit them): the scale rows are 1 again, the rest 0."""
    with torch.device("meta"):
        norm = AdaLayerNormZeroUnitScale(8, 4, gate=False)
    norm.to_empty(device="cpu")
    for module in norm.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    bias = norm.modulation.bias.detach()
    assert torch.equal(bias, torch.cat([torch.zeros(8), torch.ones(8)]))
    assert not norm.modulation.weight.any()
    assert torch.equal(norm.modulation(torch.randn(2, 4)), torch.zeros(2, 16))


@pytest.mark.parametrize(("start", "stop"), [(-1, 4), (4, 4), (2, 9)])
def test_unit_bias_linear_refuses_rows_outside_its_output(start: int, stop: int) -> None:
    with pytest.raises(ValueError, match=r"^unit_start, unit_stop: expected 0 <= unit_start"):
        UnitBiasLinear(4, 8, start, stop)
