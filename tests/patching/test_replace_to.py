"""replace_norms(model, to=kind): the kind's norm in every norm slot that can take it (the slot's
width and ε), the rest held and reported; the same code as compare --model's arms."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import normlab
from normlab import registry
from normlab.patching.arm import ArmNorm
from normlab.patching.swap import swap_norms
from normlab.track import shared_digests


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        rms_norm_eps=1e-5,
    )
    return LlamaForCausalLM(config)


def layer_norm_64(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """γ ⊙ (x − μ)·rsqrt(σ² + ε) + β in float64 (biased variance)."""
    x, w, b = x.double(), w.double(), b.double()
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm_64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """w ⊙ x·rsqrt(mean(x²) + ε) in float64."""
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def close_to_float32(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal within float32 rounding of the statistic (not bit-equal: CPUs differ)."""
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_tiny_llama_takes_layernorm_in_every_slot() -> None:
    model = tiny_llama()
    before = {n: p for n, p in model.named_parameters() if "norm" not in n}
    values = {n: p.detach().clone() for n, p in before.items()}
    state = torch.get_rng_state()
    reports = normlab.replace_norms(model, to="layernorm")
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the caller's stream
    paths = [r.names[0] for r in reports]
    assert paths == [
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.norm",
    ]
    for r in reports:
        assert r.replaced and r.replacement is not None and r.replacement.startswith("normlab.")
        assert (r.dim, r.eps) == (16, 1e-5)  # the slot's width, and ε from variance_epsilon
        assert r.original.endswith("LlamaRMSNorm") and not r.max_error
        module = model.get_submodule(r.names[0])
        assert isinstance(module, normlab.LayerNorm) and module.eps == 1e-5
        x = torch.randn(3, 5, 16) * 4 + 1
        close_to_float32(module(x), layer_norm_64(x, module.weight, module.bias, 1e-5))
    # every other parameter is the very same object with the same values
    after = {n: p for n, p in model.named_parameters() if "norm" not in n}
    assert after.keys() == before.keys()
    for name, p in after.items():
        assert p is before[name] and torch.equal(p, values[name]), name
    logits = model(torch.randint(0, 64, (2, 7))).logits
    assert logits.shape == (2, 7, 64) and bool(torch.isfinite(logits).all())


class FusedAddRMSNorm(nn.Module):
    """A fused add + norm: its forward takes a residual besides x (no slot: a swap drops it)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x = x + residual
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Custom(nn.Module):
    """A hidden-size LayerNorm (ε 1e-3), a per-head q norm of width 4, a fused norm that takes a
    residual, a GroupNorm (another axis) and one norm with a hook: only the first two are slots."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8, eps=1e-3)
        self.q_norm = nn.RMSNorm(4, eps=1e-6)
        self.fused = FusedAddRMSNorm(8)
        self.group = nn.GroupNorm(2, 8)
        self.hooked = nn.LayerNorm(8)
        self.hooked.register_forward_hook(lambda m, i, o: o)


def test_a_custom_model_swaps_its_slots_and_holds_the_rest_with_the_reason() -> None:
    model = Custom()
    old = {n: getattr(model, n) for n in ("fused", "group", "hooked")}
    reports = {r.names[0]: r for r in normlab.replace_norms(model, to="rmsnorm")}
    assert list(reports) == ["ln", "q_norm", "fused", "group", "hooked"]
    assert [n for n, r in reports.items() if r.replaced] == ["ln", "q_norm"]
    assert (reports["ln"].dim, reports["ln"].eps) == (8, 1e-3)
    assert (reports["q_norm"].dim, reports["q_norm"].eps) == (4, 1e-6)
    assert "residual besides the input" in reports["fused"].reason
    assert "batch or over channel groups" in reports["group"].reason
    assert "hooks" in reports["hooked"].reason
    for name, module in old.items():
        assert getattr(model, name) is module and reports[name].replacement is None
        assert f"{name}: " in reports[name].describe() and "kept (" in reports[name].describe()
    for name, eps, shape in (("ln", 1e-3, (2, 3, 8)), ("q_norm", 1e-6, (2, 3, 2, 4))):
        module = getattr(model, name)
        assert isinstance(module, normlab.RMSNorm) and module.eps == eps
        with torch.no_grad():
            module.weight.copy_(torch.linspace(0.5, 1.5, shape[-1]))
        x = torch.randn(shape) * 3
        close_to_float32(module(x), rms_norm_64(x, module.weight, eps))


def test_dry_run_strict_and_names_with_to() -> None:
    model = Custom()
    ln = model.ln
    planned = normlab.replace_norms(model, to="layernorm_nobias", dry_run=True)
    assert model.ln is ln and [r.replaced for r in planned] == [False] * 5
    assert "would be replaced by normlab.LayerNorm" in planned[0].describe()
    with pytest.raises(
        ValueError, match=r"^model: 3 norm module\(s\) cannot take 'rmsnorm': fused"
    ):
        normlab.replace_norms(model, to="rmsnorm", strict=True)
    assert model.ln is ln  # refused before anything changed
    only = normlab.replace_norms(model, to="none", names=["q_norm"])
    assert [r.names for r in only] == [("q_norm",)]
    assert isinstance(model.q_norm, nn.Identity) and model.ln is ln
    assert only[0].eps is None  # the identity has no ε


def test_an_unknown_or_conditional_name_is_refused_in_one_line_naming_to() -> None:
    model = Custom()
    for bad, words in (("bogus", "unknown norm 'bogus'"), ("adarms", "'adarms' is a conditional")):
        with pytest.raises(ValueError) as err:
            normlab.replace_norms(model, to=bad)
        message = str(err.value)
        assert message.startswith(f"to: {words}") and "\n" not in message
        for kind in ("layernorm", "rmsnorm", "rmsnorm_gemma", "none"):
            assert re.search(rf"\b{kind}\b", message), kind
    with pytest.raises(ValueError, match=r"^to: expected a norm name \(str\), got int 3"):
        normlab.replace_norms(model, to=3)  # type: ignore[arg-type]


def _noisy_norm(dim: int, eps: float = 1e-5) -> nn.Module:
    """A registered norm whose initialisation draws random numbers."""
    norm = normlab.RMSNorm(dim, eps)
    with torch.no_grad():
        norm.weight.add_(0.1 * torch.randn(dim))
    return norm


def test_the_arms_start_alike_and_match_compare_models_arm_swap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # gone after the test
    normlab.register_norm("noisy_rms_for_test", _noisy_norm)
    arms = {}
    for kind in ("layernorm", "noisy_rms_for_test"):
        model = tiny_llama(seed=3)
        normlab.replace_norms(model, to=kind)
        arms[kind] = (model, torch.randn(4))  # the stream after the swap: the same in both arms
        same = tiny_llama(seed=3)
        swapped, held = swap_norms(same, ArmNorm(kind))  # what compare --model does to an arm
        assert not held and len(swapped) == 5
        assert same.state_dict().keys() == model.state_dict().keys()
        for key, value in same.state_dict().items():
            assert torch.equal(value, model.state_dict()[key]), key
    (ln, after_ln), (noisy, after_noisy) = arms.values()
    assert torch.equal(after_ln, after_noisy)
    assert shared_digests(ln) == shared_digests(noisy)  # the pairing guard's evidence agrees
    # the noisy norm's own draws depend on the kind and the slot's path, not on the seed
    again = tiny_llama(seed=4)
    normlab.replace_norms(again, to="noisy_rms_for_test")
    assert torch.equal(again.model.norm.weight, noisy.model.norm.weight)
    assert not torch.equal(noisy.model.norm.weight, noisy.model.layers[0].input_layernorm.weight)
