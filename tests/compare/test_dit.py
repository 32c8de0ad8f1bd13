"""The DiT testbed and flow matching: shapes, zero-init, pairing, formulas, training, audit."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import normlab
from normlab.audit import audit_model
from normlab.cli import app
from normlab.experiment.config import ConfigError, validate_config
from normlab.models import (
    DiT,
    DiTConfig,
    DiTSettings,
    build_dit,
    check_paired,
    dit_norm_kinds,
    drop_labels,
    euler_sample,
    flow_matching_loss,
    guided_velocity,
    init_dit_paired_,
    interpolate,
    label_dropout_mask,
    sample_noise,
    sample_time,
    target_velocity,
)
from normlab.models.dit import sincos_positions, timestep_features

NORMS = ["adaln_zero", "adarms"]


def tiny(**kw: object) -> DiTConfig:
    base: dict[str, object] = {
        "in_channels": 3,
        "seq_len": 6,
        "d_model": 16,
        "n_layers": 2,
        "n_heads": 2,
        "time_freq_dim": 16,
    }
    return DiTConfig(**{**base, **kw})  # type: ignore[arg-type]


def perturb_(model: nn.Module, seed: int = 0, std: float = 0.2) -> nn.Module:
    """Add noise to every parameter, so that gates are open and the output depends on t, label."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
    return model


def test_registry_conditional_kinds_are_the_ones_tested() -> None:
    assert set(NORMS) <= set(dit_norm_kinds())
    assert "rmsnorm" not in dit_norm_kinds()


# ----------------------------------------------------------------------------------------------
# the network
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["sincos", "learned"])
@pytest.mark.parametrize("norm", NORMS)
def test_shapes_labels_and_shorter_sequences(norm: str, positions: str) -> None:
    model = build_dit(tiny(norm=norm, positions=positions, n_classes=5), seed=0)
    perturb_(model)
    x = torch.randn(4, 6, 3)
    out = model(x, torch.rand(4), torch.tensor([0, 1, 4, 5]))
    assert out.shape == (4, 6, 3) and torch.isfinite(out).all()
    assert model(x[:, :2], torch.rand(4)).shape == (4, 2, 3)
    out.square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert isinstance(model.pos_emb, nn.Parameter) == (positions == "learned")


@pytest.mark.parametrize("norm", NORMS)
def test_output_is_exactly_zero_and_every_block_the_identity_at_init(norm: str) -> None:
    torch.manual_seed(1)
    model = DiT(tiny(norm=norm, n_classes=3))
    cls = normlab.AdaRMSNorm if norm == "adarms" else normlab.AdaLayerNormZero
    assert isinstance(model.blocks[0].norm_attn, cls) and isinstance(model.norm_final, cls)
    x = torch.randn(5, 6, 3) * 3
    out = model(x, torch.rand(5), torch.tensor([0, 1, 2, 3, 0]))
    assert torch.equal(out, torch.zeros_like(out))
    h, c = torch.randn(5, 6, 16), torch.randn(5, 16)
    for block in model.blocks:
        assert torch.equal(block(h, c), h)
    perturb_(model)  # the same checks fail once the modulation is not zero
    assert not torch.equal(model.blocks[0](h, c), h)
    assert model(x, torch.rand(5)).abs().max() > 0


@pytest.mark.parametrize("norm", NORMS)
def test_every_arm_modulates_from_silu_of_the_condition(norm: str) -> None:
    """Only the norm may differ between arms: adaLN-Zero computes Linear(SiLU(c)) itself, so
    AdaRMS must be handed SiLU(c) too, or its modulation is linear in the time MLP's output and
    the label embedding (time and class could not interact in it)."""
    torch.manual_seed(2)
    model = perturb_(DiT(tiny(norm=norm, n_classes=3)))
    seen: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name.endswith("modulation"):
            module.register_forward_hook(
                lambda _m, args, _out, name=name: seen.__setitem__(name, args[0])
            )
    t, label = torch.rand(4), torch.tensor([0, 1, 2, 3])
    model(torch.randn(4, 6, 3), t, label)
    expected = torch.nn.functional.silu(model.condition(t, label))
    assert len(seen) == 2 * model.config.n_layers + 1
    for name, given in seen.items():
        torch.testing.assert_close(given, expected, msg=name)


def test_time_and_class_interact_in_the_adarms_modulation() -> None:
    torch.manual_seed(3)
    model = perturb_(DiT(tiny(norm="adarms", n_classes=2)))
    norm = model.blocks[0].norm_attn

    def modulation(t: float, label: int) -> torch.Tensor:
        captured: list[torch.Tensor] = []
        hook = norm.modulation.register_forward_hook(lambda _m, _a, out: captured.append(out))
        model(torch.zeros(1, 6, 3), torch.tensor([t]), torch.tensor([label]))
        hook.remove()
        return captured[0]

    interaction = (modulation(0.2, 0) - modulation(0.2, 1)) - (
        modulation(0.8, 0) - modulation(0.8, 1)
    )
    assert interaction.abs().max() > 1e-3


def test_the_final_norm_has_no_gate_parameters() -> None:
    """DiT's final layer modulates with (shift, scale) only: 2·D outputs, whatever the kind."""
    for norm in NORMS:
        model = DiT(tiny(norm=norm))
        assert model.norm_final.modulation.out_features == 2 * 16, norm
    sizes = {norm: sum(p.numel() for p in DiT(tiny(norm=norm)).parameters()) for norm in NORMS}
    assert sizes["adaln_zero"] == sizes["adarms"]


@pytest.mark.parametrize("norm", NORMS)
def test_zero_init_does_not_block_learning(norm: str) -> None:
    """At step 0 only the output Linear gets a gradient (everything else sits behind its zero
    weight); after one step the output moves, and the next gradient reaches every modulation
    Linear (through the gate rows, since g multiplies the sublayer output)."""
    model = build_dit(tiny(norm=norm), seed=2)
    gen = torch.Generator().manual_seed(0)
    x, t = torch.randn(8, 6, 3, generator=gen), torch.rand(8, generator=gen)
    target = torch.randn(8, 6, 3, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step() -> None:
        opt.zero_grad()
        (model(x, t) - target).square().mean().backward()

    step()
    grads = {n: p.grad.abs().sum().item() for n, p in model.named_parameters()}
    assert grads["head.weight"] > 0 and grads["head.bias"] > 0
    assert all(g == 0 for n, g in grads.items() if not n.startswith("head.")), grads
    before = model(x, t).detach()
    opt.step()
    assert (model(x, t) - before).abs().max() > 1e-4
    step()
    modulations = [m for n, m in model.named_modules() if n.endswith("modulation")]
    assert len(modulations) == 2 * 2 + 1
    for linear in modulations:
        assert linear.weight.grad.abs().sum() > 0 and linear.bias.grad.abs().sum() > 0
    gate_rows = model.blocks[0].norm_attn.modulation.weight.grad[-16:]  # last chunk: the gate
    assert gate_rows.abs().sum() > 0


def test_shared_parameters_are_identical_across_norm_kinds() -> None:
    a = build_dit(tiny(norm="adaln_zero", n_classes=4, positions="learned"), seed=7)
    b = build_dit(tiny(norm="adarms", n_classes=4, positions="learned"), seed=7)
    digest = check_paired({"adaln_zero": a, "adarms": b})
    shared = {n for n, _ in a.named_parameters()} - set(a.norm_parameter_names())
    assert shared == {n for n, _ in b.named_parameters()} - set(b.norm_parameter_names())
    assert {"x_embed.weight", "pos_emb", "label_embed.weight", "head.weight"} <= shared
    params_b = dict(b.named_parameters())
    for name, p in a.named_parameters():
        if name in shared:
            assert torch.equal(p, params_b[name]), name
    # the draw depends on the seed; the values do not depend on the order of construction
    c = build_dit(tiny(norm="adarms", n_classes=4, positions="learned"), seed=8)
    with pytest.raises(ValueError, match="differs between arms"):
        check_paired({"adaln_zero": a, "seed8": c})
    assert check_paired({"b": init_dit_paired_(c, 7)}) == digest
    # deterministic under torch.manual_seed, and still paired across kinds
    torch.manual_seed(3)
    d = DiT(tiny(norm="adaln_zero", n_classes=4, positions="learned"))
    torch.manual_seed(3)
    e = DiT(tiny(norm="adarms", n_classes=4, positions="learned"))
    check_paired({"d": d, "e": e})
    torch.manual_seed(4)
    f = DiT(tiny(norm="adaln_zero", n_classes=4, positions="learned"))
    assert not torch.equal(d.x_embed.weight, f.x_embed.weight)


def test_initialisation_values() -> None:
    model = build_dit(tiny(n_classes=2, positions="learned", init_std=0.05), seed=0)
    assert torch.equal(model.head.weight, torch.zeros_like(model.head.weight))
    assert torch.equal(model.head.bias, torch.zeros_like(model.head.bias))
    assert torch.equal(model.blocks[0].attn.qkv.bias, torch.zeros(48))
    for linear in (m for n, m in model.named_modules() if n.endswith("modulation")):
        assert torch.equal(linear.weight, torch.zeros_like(linear.weight))
    fc = model.blocks[0].mlp.fc.weight  # Xavier variance 2 / (16 + 64)
    assert fc.std().item() == pytest.approx(math.sqrt(2 / 80), rel=0.1)
    assert model.pos_emb.std().item() == pytest.approx(0.05, rel=0.2)


def test_time_is_per_sample_and_a_scalar_broadcasts() -> None:
    model = perturb_(build_dit(tiny(), seed=0), seed=1)
    x = torch.randn(4, 6, 3)
    t = torch.tensor([0.0, 0.3, 0.6, 1.0])
    out = model(x, t)
    for i in range(4):
        torch.testing.assert_close(out[i : i + 1], model(x[i : i + 1], t[i : i + 1]))
    torch.testing.assert_close(model(x, 0.3), model(x, torch.full((4,), 0.3)))
    torch.testing.assert_close(model(x, torch.tensor(0.3)), model(x, torch.full((4,), 0.3)))
    moved = model(x, torch.tensor([0.9, 0.3, 0.6, 1.0]))
    assert (moved[0] - out[0]).abs().max() > 1e-4
    torch.testing.assert_close(moved[1:], out[1:])


def test_attention_is_bidirectional() -> None:
    """Every token sees every other: changing the last token moves the first token's output."""
    model = perturb_(build_dit(tiny(), seed=0), seed=3)
    x, t = torch.randn(1, 6, 3), torch.rand(1)
    moved = x.clone()
    moved[0, -1] += 1.0
    assert (model(moved, t)[0, 0] - model(x, t)[0, 0]).abs().max() > 1e-4


def test_labels_condition_the_output_and_none_is_the_null_class() -> None:
    cfg = tiny(n_classes=3)
    model = perturb_(build_dit(cfg, seed=0), seed=2)
    x, t = torch.randn(2, 6, 3), torch.rand(2)
    null = torch.full((2,), cfg.null_class)
    torch.testing.assert_close(model(x, t), model(x, t, null))
    assert (model(x, t, torch.tensor([0, 0])) - model(x, t, torch.tensor([1, 1]))).abs().max() > 0
    assert tiny().null_class is None


def test_sinusoidal_features_formulas() -> None:
    pe = sincos_positions(5, 8)
    p, i = 3, 1
    assert pe[p, i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 8)), abs=1e-6)
    assert pe[p, 4 + i].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 8)), abs=1e-6)
    f = timestep_features(torch.tensor([0.0, 0.5]), 8, scale=1000.0, max_period=10000.0)
    assert torch.equal(f[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    assert f[1, 2].item() == pytest.approx(math.cos(500 * 10000 ** (-2 / 4)), abs=1e-5)
    assert f[1, 6].item() == pytest.approx(math.sin(500 * 10000 ** (-2 / 4)), abs=1e-5)


# ----------------------------------------------------------------------------------------------
# flow matching
# ----------------------------------------------------------------------------------------------
def test_path_endpoints_and_velocity() -> None:
    gen = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(3, 4, 2, generator=gen), torch.randn(3, 4, 2, generator=gen)
    torch.testing.assert_close(interpolate(x0, x1, torch.zeros(3)), x0)
    torch.testing.assert_close(interpolate(x0, x1, torch.ones(3)), x1)
    mixed = interpolate(x0, x1, torch.tensor([0.0, 0.25, 1.0]))
    torch.testing.assert_close(mixed[1], 0.75 * x0[1] + 0.25 * x1[1])
    torch.testing.assert_close(target_velocity(x0, x1), x1 - x0)


def test_flow_matching_loss_equals_the_hand_computed_value() -> None:
    """v̂(x, t) = 2x + t. Sample 0: x_t = 0.75·[1, −2] + 0.25·[3, 1] = [1.5, −1.25],
    v̂ = [3.25, −2.25], v = [2, 3], squared errors 1.5625 and 27.5625. Sample 1:
    x_t = ½·[0.5, 3] + ½·[−1, 2] = [−0.25, 2.5], v̂ = [0, 5.5], v = [−1.5, −1], squared errors
    2.25 and 42.25. Mean: 73.625 / 4 = 18.40625."""
    f64 = torch.float64
    x0 = torch.tensor([[[1.0, -2.0]], [[0.5, 3.0]]], dtype=f64)
    x1 = torch.tensor([[[3.0, 1.0]], [[-1.0, 2.0]]], dtype=f64)
    t = torch.tensor([0.25, 0.5], dtype=f64)
    loss = flow_matching_loss(lambda x, tt: 2 * x + tt[:, None, None], x1, x0, t)
    assert loss.dtype == f64 and loss.shape == ()
    assert loss.item() == 18.40625
    seen = {}

    def with_label(x: torch.Tensor, tt: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        seen["label"] = label
        return 2 * x + tt[:, None, None]

    labels = torch.tensor([1, 0])
    assert flow_matching_loss(with_label, x1, x0, t, labels).item() == 18.40625
    assert seen["label"] is labels


def test_sample_time_distributions() -> None:
    def draw(seed: int, **kw: object) -> torch.Tensor:
        return sample_time(20000, torch.Generator().manual_seed(seed), **kw)  # type: ignore[arg-type]

    torch.testing.assert_close(draw(0), draw(0))
    assert not torch.equal(draw(0), draw(1))
    u = draw(0, distribution="uniform")
    assert u.min() >= 0 and u.max() < 1 and u.mean().item() == pytest.approx(0.5, abs=0.01)
    ln = draw(0)  # logit-normal, loc 0, scale 1 by default
    assert ln.min() > 0 and ln.max() < 1 and ln.median().item() == pytest.approx(0.5, abs=0.02)
    logit = torch.logit(draw(0, loc=0.5, scale=0.7, dtype=torch.float64))
    assert logit.mean().item() == pytest.approx(0.5, abs=0.02)
    assert logit.std().item() == pytest.approx(0.7, rel=0.03)
    noise = sample_noise(torch.zeros(2, 3, dtype=torch.float64), torch.Generator().manual_seed(0))
    assert noise.dtype == torch.float64 and noise.shape == (2, 3)


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_euler_reaches_the_endpoint_of_a_straight_path(steps: int) -> None:
    """Data x1 = a·x0 + b: the exact field of the straight path is
    v(x, t) = (a − 1)(x − t·b) / (1 + t(a − 1)) + b, constant (= x1 − x0) along the path."""
    f64 = torch.float64
    gen = torch.Generator().manual_seed(steps)
    x0 = torch.randn(3, 4, 2, generator=gen, dtype=f64)
    a, b = 0.5, torch.randn(1, 4, 2, generator=gen, dtype=f64)
    times: list[float] = []

    def field(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        times.append(t[0].item())
        tb = t[:, None, None]
        return (a - 1) * (x - tb * b) / (1 + tb * (a - 1)) + b

    out = euler_sample(field, x0, steps)
    torch.testing.assert_close(out, a * x0 + b, rtol=1e-12, atol=1e-12)
    assert times == pytest.approx([k / steps for k in range(steps)])


def test_euler_on_a_curved_field_is_first_order() -> None:
    """dx/dt = x: Euler with n steps gives x0 · (1 + 1/n)^n, not x0 · e."""
    x0 = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    out = euler_sample(lambda x, t: x, x0, 4)
    torch.testing.assert_close(out, x0 * 1.25**4, rtol=1e-15, atol=0)
    label = torch.tensor([2])
    out = euler_sample(lambda x, t, y: x * y, x0, 2, label)
    torch.testing.assert_close(out, x0 * 4.0, rtol=1e-15, atol=0)  # (1 + 2/2)^2


# ----------------------------------------------------------------------------------------------
# classifier-free guidance: label dropout and the guided sampler
# ----------------------------------------------------------------------------------------------
def test_label_dropout_mask_drops_a_fraction_p_from_its_own_generator() -> None:
    draws = label_dropout_mask(200_000, 0.1, torch.Generator().manual_seed(0))
    assert draws.dtype == torch.bool and draws.float().mean().item() == pytest.approx(
        0.1, abs=0.003
    )
    again = label_dropout_mask(200_000, 0.1, torch.Generator().manual_seed(0))
    other = label_dropout_mask(200_000, 0.1, torch.Generator().manual_seed(1))
    assert torch.equal(draws, again) and not torch.equal(draws, other)
    # the same uniforms for every p: nothing dropped at 0, nested masks, the stream advances alike
    small = label_dropout_mask(1000, 0.05, torch.Generator().manual_seed(3))
    large = label_dropout_mask(1000, 0.5, torch.Generator().manual_seed(3))
    assert small.any() and not (small & ~large).any()
    g0, g1 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert not label_dropout_mask(1000, 0.0, g0).any()
    label_dropout_mask(1000, 0.3, g1)
    assert torch.equal(g0.get_state(), g1.get_state())


def test_drop_labels_replaces_exactly_the_masked_labels_by_the_null_class() -> None:
    label = torch.arange(64) % 4
    dropped = drop_labels(label, 0.5, torch.Generator().manual_seed(0), null_class=4)
    mask = label_dropout_mask(64, 0.5, torch.Generator().manual_seed(0))
    assert torch.equal(dropped, torch.where(mask, 4, label)) and 0 < mask.sum() < 64
    assert dropped.dtype == torch.long and torch.equal(label, torch.arange(64) % 4)  # untouched


def _guided_setup() -> tuple[DiT, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    cfg = tiny(n_classes=3)
    model = perturb_(build_dit(cfg, seed=0), seed=4).eval()
    gen = torch.Generator().manual_seed(5)
    x, t = torch.randn(5, 6, 3, generator=gen), torch.rand(5, generator=gen)
    return model, x, t, torch.tensor([0, 1, 2, 0, 1]), cfg.null_class  # type: ignore[return-value]


def test_guidance_scale_one_is_the_unguided_sampler_exactly() -> None:
    model, x, t, label, null = _guided_setup()
    with torch.no_grad():
        assert torch.equal(guided_velocity(model, x, t, label, null, 1.0), model(x, t, label))
        unguided = euler_sample(model, x, 4, label)
        assert torch.equal(
            euler_sample(model, x, 4, label, cfg_scale=1.0, null_label=null), unguided
        )
        assert torch.equal(euler_sample(model, x, 4, label, cfg_scale=1), unguided)
        guided = euler_sample(model, x, 4, label, cfg_scale=2.0, null_label=null)
    assert (guided - unguided).abs().max() > 1e-3  # guidance does change the samples


def test_guidance_scale_zero_is_the_unconditional_model_and_w_extrapolates() -> None:
    model, x, t, label, null = _guided_setup()
    with torch.no_grad():
        v_cond, v_uncond = model(x, t, label), model(x, t)  # no label: the null class
        tol = {"rtol": 1e-5, "atol": 1e-6}
        torch.testing.assert_close(guided_velocity(model, x, t, label, null, 0.0), v_uncond, **tol)
        torch.testing.assert_close(
            guided_velocity(model, x, t, label, null, 2.5),
            v_uncond + 2.5 * (v_cond - v_uncond),
            **tol,
        )
        nulls = torch.full_like(label, null)
        torch.testing.assert_close(
            euler_sample(model, x, 3, label, cfg_scale=0.0, null_label=null),
            euler_sample(model, x, 3, nulls),
            **tol,
        )


def test_guidance_makes_one_forward_of_conditional_and_null_labels_per_step() -> None:
    model, x, _, label, null = _guided_setup()
    calls: list[tuple[int, list[int]]] = []

    def counted(xx: torch.Tensor, tt: torch.Tensor, yy: torch.Tensor) -> torch.Tensor:
        calls.append((xx.shape[0], yy.tolist()))
        return model(xx, tt, yy)

    with torch.no_grad():
        euler_sample(counted, x, 3, label, cfg_scale=1.5, null_label=null)
    assert calls == [(10, [*label.tolist(), *[null] * 5])] * 3


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (
            lambda m, x, y: euler_sample(m, x, 2, None, cfg_scale=2.0, null_label=3),
            ValueError,
            "label",
        ),
        (
            lambda m, x, y: euler_sample(m, x, 2, y.float(), cfg_scale=2.0, null_label=3),
            TypeError,
            "label",
        ),
        (
            lambda m, x, y: euler_sample(m, x, 2, y[:2], cfg_scale=2.0, null_label=3),
            ValueError,
            "label",
        ),
        (lambda m, x, y: label_dropout_mask(4, 0.1, None), TypeError, "generator"),
        (lambda m, x, y: drop_labels(y, 0.1, None, 3), TypeError, "generator"),
        (lambda m, x, y: drop_labels(y.float(), 0.1, torch.Generator(), 3), TypeError, "label"),
    ],
)
def test_guidance_errors_name_the_argument(call: object, exc: type[Exception], name: str) -> None:
    model, x, _, label, _ = _guided_setup()
    with pytest.raises(exc, match=rf"^{name}:"):
        call(model, x, label)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"dit": {"cfg_scale": -0.5}}, "dit.cfg_scale"),
        ({"dit": {"cfg_scale": math.inf}}, "dit.cfg_scale"),
        ({"dit": {"cfg_scale": True}}, "dit.cfg_scale"),
        ({"dit": {"class_conditional": False, "cfg_scale": 2.0}}, "cfg_scale"),
        ({"dit": {"label_dropout": 1.0}}, "dit.label_dropout"),
        ({"dit": {"label_dropout": -0.1}}, "dit.label_dropout"),
        ({"dit": {"time_distribution": "beta"}}, "dit.time_distribution"),
        ({"train": {"batch_size": 0}}, "train.batch_size"),
        ({"seeds": "1"}, "seeds"),
        ({"seeds": [True]}, "seeds"),
    ],
)
def test_flow_settings_are_refused_by_the_config(data: dict, key: str) -> None:
    """The flow functions and the DiT take these settings unchecked: the config refuses a bad
    value (guidance scale, label dropout, time distribution, batch size, seed), naming it."""
    with pytest.raises(ConfigError, match=re.escape(key)):
        validate_config({"testbed": "dit", **data})
    if "dit" in data:
        with pytest.raises(ValueError, match=rf"^{key.removeprefix('dit.')}:"):
            DiTSettings(**data["dit"])


_MODES = torch.tensor([[1.0, -0.5], [0.5, 1.0], [-1.0, 0.5], [0.0, -1.0]])


def _mixture(n: int, gen: torch.Generator) -> torch.Tensor:
    """Two equally likely sequences ±MODES ([4 tokens, 2 channels]) plus N(0, 0.1²) noise."""
    sign = (2 * torch.randint(0, 2, (n,), generator=gen) - 1).float()[:, None, None]
    return sign * _MODES + 0.1 * torch.randn(n, 4, 2, generator=gen)


@pytest.mark.parametrize("norm", NORMS)
def test_tiny_training_run_lowers_the_loss_and_samples_the_modes(norm: str) -> None:
    cfg = DiTConfig(
        in_channels=2, seq_len=4, d_model=32, n_layers=2, n_heads=2, norm=norm, time_freq_dim=32
    )
    model = build_dit(cfg, seed=0)
    held = torch.Generator().manual_seed(123)
    x1_eval = _mixture(256, held)
    x0_eval, t_eval = sample_noise(x1_eval, held), sample_time(256, held)
    with torch.no_grad():
        initial = flow_matching_loss(model, x1_eval, x0_eval, t_eval).item()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(150):
        x1 = _mixture(64, gen)
        loss = flow_matching_loss(model, x1, sample_noise(x1, gen), sample_time(64, gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = flow_matching_loss(model, x1_eval, x0_eval, t_eval).item()
        samples = euler_sample(model, torch.randn(256, 4, 2, generator=held), 20)
    assert initial == pytest.approx(1.6, abs=0.15)  # the model outputs 0: E‖x1 − x0‖² / 8
    assert final < 0.45 * initial, (initial, final)
    to_plus = (samples - _MODES).square().sum((1, 2)).sqrt()
    to_minus = (samples + _MODES).square().sum((1, 2)).sqrt()
    assert (torch.minimum(to_plus, to_minus) < 0.6).float().mean() > 0.7
    assert 0.3 < (to_plus < to_minus).float().mean() < 0.7  # both modes, not one


# ----------------------------------------------------------------------------------------------
# errors name the argument
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "exc", "name"),
    [
        ({"norm": "rmsnorm"}, ValueError, "norm"),
        ({"norm": "no_such"}, ValueError, "norm"),
        ({"norm": 3}, TypeError, "norm"),
        ({"d_model": 30, "n_heads": 4}, ValueError, "n_heads"),
        ({"in_channels": 0}, ValueError, "in_channels"),
        ({"seq_len": True}, ValueError, "seq_len"),
        ({"positions": "rope"}, ValueError, "positions"),
        ({"n_classes": -1}, ValueError, "n_classes"),
        ({"time_freq_dim": 7}, ValueError, "time_freq_dim"),
        ({"norm_eps": 0.0}, ValueError, "norm_eps"),
        ({"mlp_ratio": 0}, ValueError, "mlp_ratio"),
        ({"time_scale": -1.0}, ValueError, "time_scale"),
        ({"d_model": 15, "n_heads": 1}, ValueError, "d_model"),
    ],
)
def test_config_errors_name_the_argument(kw: dict, exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=rf"^{name}:"):
        tiny(**kw)


def test_forward_errors_name_the_argument() -> None:
    model = build_dit(tiny(), seed=0)
    labelled = build_dit(tiny(n_classes=2), seed=0)
    x, t = torch.randn(2, 6, 3), torch.rand(2)
    cases: list[tuple[object, type[Exception], str]] = [
        (lambda: model(x[0], t), ValueError, "x"),
        (lambda: model(torch.randn(2, 6, 4), t), ValueError, "x"),
        (lambda: model(torch.randn(2, 7, 3), t), ValueError, "x"),
        (lambda: model(x.long(), t), TypeError, "x"),
        (lambda: model(x, torch.rand(3)), ValueError, "t"),
        (lambda: model(x, torch.tensor([0, 1])), TypeError, "t"),
        (lambda: model(x, "0.5"), TypeError, "t"),
        (lambda: model(x, t, torch.tensor([0, 1])), ValueError, "label"),
        (lambda: labelled(x, t, torch.tensor([0, 3])), ValueError, "label"),
        (lambda: labelled(x, t, torch.tensor([0.0, 1.0])), TypeError, "label"),
        (lambda: labelled(x, t, torch.tensor([0])), ValueError, "label"),
        (lambda: DiT({"d_model": 8}), TypeError, "cfg"),  # type: ignore[arg-type]
    ]
    for call, exc, name in cases:
        with pytest.raises(exc, match=rf"^{name}:"):
            call()  # type: ignore[operator]


def test_flow_errors_name_the_argument() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3)
    ident = lambda z, t: z  # noqa: E731
    cases: list[tuple[object, type[Exception], str]] = [
        (lambda: euler_sample(lambda z, t: z[:1], x, 2), ValueError, "model"),
        (lambda: euler_sample(None, x, 2), TypeError, "model"),
        (lambda: euler_sample(ident, x.long(), 2), TypeError, "x0"),
        (lambda: sample_time(4, None), TypeError, "generator"),
        (lambda: sample_time(4, gen, distribution="beta"), ValueError, "distribution"),
        (lambda: sample_noise(x.long(), gen), TypeError, "x1"),
        (lambda: sample_noise(x, 0), TypeError, "generator"),
        (lambda: interpolate(torch.randn(2, 4), x, torch.rand(2)), ValueError, "x0"),
        (lambda: interpolate(x, x, torch.rand(3)), ValueError, "t"),
        (lambda: interpolate(x, x, torch.rand(2, 1)), ValueError, "t"),
        (lambda: target_velocity(x, torch.randn(3, 3)), ValueError, "x0"),
        (
            lambda: flow_matching_loss(lambda z, t: z.sum(-1), x, x, torch.rand(2)),
            ValueError,
            "model",
        ),
    ]
    for call, exc, name in cases:
        with pytest.raises(exc, match=rf"^{name}:"):
            call()  # type: ignore[operator]


# ----------------------------------------------------------------------------------------------
# the audit finds the DiT's norms
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", NORMS)
def test_audit_finds_the_dit_norms_as_conditional_pre_norms(norm: str) -> None:
    model = build_dit(tiny(norm=norm, n_classes=2), seed=0)
    a = audit_model(model, torch.randn(2, 6, 3), torch.rand(2), torch.tensor([0, 1]))
    assert a.placement == "pre" and a.blocks == {"blocks.0": "pre", "blocks.1": "pre"}
    sites = {s.name: s for s in a.norms}
    assert set(sites) == {
        f"blocks.{i}.{n}" for i in range(2) for n in ("norm_attn", "norm_mlp")
    } | {"norm_final"}
    for name, s in sites.items():
        assert s.role == ("final" if name == "norm_final" else "pre"), name
        assert s.conditioning == "per sequence", name
        assert s.returns_gate == (name != "norm_final"), name
    assert a.n_norm_params == sum(
        p.numel() for n, p in model.named_parameters() if n in set(model.norm_parameter_names())
    )


def test_cli_audit_model_dit() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["audit", "model", "dit", "--norm", "adarms", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["placement"] == "pre"
    assert {s["cls"] for s in data["norms"]} == {"AdaRMSNorm"}
    assert {s["conditioning"] for s in data["norms"]} == {"per sequence"}
    default = runner.invoke(app, ["audit", "model", "dit"], env={"COLUMNS": "200"})
    assert default.exit_code == 0, default.output
    assert "AdaLayerNormZero" in default.output and "per sequence, gate" in default.output
    for args, flag in (
        (["--norm", "rmsnorm"], "--norm"),
        (["--norm", "layernorm"], "--norm"),
        (["--placement", "post"], "--placement"),
    ):
        bad = runner.invoke(app, ["audit", "model", "dit", *args])
        assert bad.exit_code == 2 and f"Invalid value for {flag}" in bad.output, bad.output


def test_compiles_as_one_graph_and_still_refuses_a_bad_label() -> None:
    """The label range check must not break the graph (or sync a GPU): under torch.compile it is
    an asynchronous device assertion, which still fails a label out of range."""
    torch._dynamo.reset()
    model = perturb_(DiT(tiny(n_classes=3), seed=0))
    x, t = torch.randn(2, 6, 3), torch.rand(2)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(
        compiled(x, t, torch.tensor([1, 3])), model(x, t, torch.tensor([1, 3]))
    )
    with pytest.raises(RuntimeError, match="label"):
        compiled(x, t, torch.tensor([1, 4]))
    torch._dynamo.reset()
