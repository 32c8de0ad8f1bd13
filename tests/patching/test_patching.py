"""normlab.replace_norms: every norm of a model swapped for the normlab layer that computes the
same function, verified before the swap, with the original Parameter objects kept.

The Hugging Face norms are written out here (their formulas, their attribute names), so the
tests run without transformers; the last test uses transformers' own models when installed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import normlab
from module_helpers import randomise, seeded
from normlab.patching import NormReplacement, replace_norms
from test_casting import GemmaRMSNorm, LlamaRMSNorm


class T5LayerNorm(nn.Module):
    """T5's RMS norm: x̂ in float32, rounded to a 16-bit weight's dtype, then times the weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = x * torch.rsqrt(m + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            h = h.to(self.weight.dtype)
        return self.weight * h


class OutsideRootRMSNorm(nn.Module):
    """y = w ⊙ x / (sqrt(mean(x²)) + ε): ε outside the root, which normlab never computes."""

    def __init__(self, dim: int, eps: float = 1e-3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (self.weight * xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)).to(x.dtype)


class UnbiasedLayerNorm(nn.Module):
    """LayerNorm with the unbiased (D − 1) variance."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        var = xf.var(-1, keepdim=True, unbiased=True)
        y = (xf - xf.mean(-1, keepdim=True)) * torch.rsqrt(var + self.eps)
        return (y * self.weight + self.bias).to(x.dtype)


class WrongEpsRMSNorm(LlamaRMSNorm):
    """Says ε = 1e-6 in its attribute but uses 1e-3."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-3)).to(x.dtype)


class _HalfGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        return 0.5 * g


class WrongGradientRMSNorm(LlamaRMSNorm):
    """The right forward with half the right gradient for x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_HalfGradient.apply(x))


class BiasedRMSNorm(LlamaRMSNorm):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.bias


class NoEpsRMSNorm(nn.Module):
    """ε = 1e-6 in the code, in no attribute."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hf_like(x, self.weight)


class OddEpsRMSNorm(NoEpsRMSNorm):
    """ε = 1.5e-5 in the code: not a one-digit number, so the rounded estimate is wrong."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1.5e-5)).to(
            x.dtype
        )


class OlmoLayerNorm(nn.Module):
    """OLMo's LayerNorm: no parameters, ε = 1e-5 in the code, in float32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.normalized_shape = (dim,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.layer_norm(x.float(), self.normalized_shape, None, None, eps=1e-5)
        return y.to(x.dtype)


class WeightlessRMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.normalized_shape = dim
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)


def hf_like(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


class Block(nn.Module):
    """One of each norm a model may hold, applied in a chain after a Linear."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.ln_nobias = nn.LayerNorm(d, bias=False)
        self.rms = nn.RMSNorm(d)
        self.llama = LlamaRMSNorm(d)
        self.gemma = GemmaRMSNorm(d)
        self.t5 = T5LayerNorm(d)
        self.ours = normlab.RMSNorm(d)
        self.group = nn.GroupNorm(4, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        for norm in (self.ln, self.ln_nobias, self.rms, self.llama, self.gemma, self.t5, self.ours):
            h = norm(h) + 0.5 * h
        return h


def _by_name(reports: list[NormReplacement]) -> dict[str, NormReplacement]:
    return {name: r for r in reports for name in r.names}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_supported_norm_is_replaced_and_the_model_computes_the_same(
    dtype: torch.dtype,
) -> None:
    model = randomise(Block()).to(dtype)
    x = seeded(3, 5, 32, seed=2, dtype=dtype)
    before = model(x)
    keys = list(model.state_dict())
    weights = {n: p for n, p in model.named_parameters()}
    reports = _by_name(replace_norms(model))

    expected = {
        "ln": normlab.LayerNorm,
        "ln_nobias": normlab.LayerNorm,
        "rms": normlab.RMSNorm,
        "llama": normlab.RMSNorm,
        "gemma": normlab.RMSNorm,
        "t5": normlab.RMSNorm,
    }
    if dtype != torch.float32:  # T5LayerNorm gives float32 input its 16-bit weight's dtype
        del expected["t5"]
        assert "float32 input" in reports["t5"].reason and isinstance(model.t5, T5LayerNorm)
    for name, cls in expected.items():
        assert reports[name].replaced, reports[name].describe()
        assert type(getattr(model, name)) is cls
    assert not reports["ours"].replaced and "already" in reports["ours"].reason
    assert not reports["group"].replaced and isinstance(model.group, nn.GroupNorm)
    assert model.gemma.weight_offset == 1.0 and model.gemma.casting == "gemma"
    assert model.rms.casting == "gemma"
    # the same Parameter objects, under the same names: state dict and optimizers stay valid
    assert list(model.state_dict()) == keys
    for n, p in model.named_parameters():
        assert p is weights[n]
    after = model(x)
    if dtype == torch.float32:
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(after, before)


def test_float32_weights_with_16_bit_input_keep_each_modules_output_dtype() -> None:
    """LlamaRMSNorm and T5LayerNorm return float32 for a float32 weight and bfloat16 input (the
    LLaMA one with x̂ rounded to bfloat16 first); torch's norms return bfloat16."""
    model = randomise(Block())
    x = seeded(4, 32, seed=3, dtype=torch.bfloat16)
    want = {name: getattr(model, name)(x) for name in ("ln", "rms", "llama", "gemma", "t5")}
    replace_norms(model)
    assert model.llama.promote_output and model.llama.casting == "llama"
    assert model.t5.casting == "fp32"
    for name, y in want.items():
        got = getattr(model, name)(x)
        assert got.dtype == y.dtype, name
        exact = (got == y).float().mean().item()
        assert exact >= 0.99, (name, exact)


def test_gradients_and_an_optimizer_built_before_the_swap() -> None:
    torch.manual_seed(0)
    ref = randomise(Block())
    model = copy.deepcopy(ref)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    replace_norms(model)
    x = seeded(4, 6, 32, seed=5)
    for m, o in ((ref, opt_ref), (model, opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    assert model.llama.weight.grad is not None


def test_a_module_shared_by_two_paths_is_replaced_in_both() -> None:
    shared = LlamaRMSNorm(16)
    model = nn.Sequential(nn.Linear(16, 16), shared, nn.Linear(16, 16), shared)
    (report,) = replace_norms(model)
    assert report.names == ("1", "3") and report.replaced
    assert model[1] is model[3] and isinstance(model[1], normlab.RMSNorm)
    assert model[1].weight is shared.weight


def test_dry_run_changes_nothing() -> None:
    model = Block()
    before = {n: type(m) for n, m in model.named_children()}
    reports = _by_name(replace_norms(model, dry_run=True))
    assert {n: type(m) for n, m in model.named_children()} == before
    assert reports["llama"].replacement is not None and not reports["llama"].replaced
    assert "would be replaced" in reports["llama"].describe()


def test_strict_refuses_before_changing_anything() -> None:
    model = nn.Sequential(nn.LayerNorm(16), OutsideRootRMSNorm(16))
    with pytest.raises(ValueError, match=r"model: 1 norm module.*OutsideRootRMSNorm"):
        replace_norms(model, strict=True)
    assert isinstance(model[0], nn.LayerNorm)
    # a normlab module does not count as a failure
    ok = nn.Sequential(nn.LayerNorm(16), normlab.RMSNorm(16))
    replace_norms(ok, strict=True)
    assert isinstance(ok[0], normlab.LayerNorm)


def test_names_restrict_the_swap() -> None:
    model = Block()
    reports = replace_norms(model, names=["llama", "ln"])
    assert {n for r in reports for n in r.names} == {"llama", "ln"}
    assert isinstance(model.llama, normlab.RMSNorm) and isinstance(model.rms, nn.RMSNorm)
    with pytest.raises(ValueError, match="names: 'nope' names no sub-module"):
        replace_norms(model, names=["nope"])
    with pytest.raises(TypeError, match="names: expected an iterable"):
        replace_norms(model, names="llama")


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (OutsideRootRMSNorm(16), "ε placement: outside the root"),
        (UnbiasedLayerNorm(16), "unbiased"),
        (BiasedRMSNorm(16), "an RMS norm with a bias"),
        (OddEpsRMSNorm(16), "no normlab layer reproduced it"),
        (WrongEpsRMSNorm(16), "no normlab layer reproduced it"),
        (WrongGradientRMSNorm(16), "gradient of x"),
        (nn.GroupNorm(2, 16), "channel groups"),
        (normlab.AdaRMSNorm(16, 8), "already a normlab module"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_modules_normlab_cannot_reproduce_are_kept_with_the_reason(
    module: nn.Module, reason: str
) -> None:
    model = nn.Sequential(nn.Linear(16, 16), module)
    (report,) = replace_norms(model)
    assert model[1] is module
    assert not report.replaced and report.replacement is None
    assert reason in report.reason, report.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_parameterless_norms_and_eps_in_no_attribute(dtype: torch.dtype) -> None:
    """OLMo's LayerNorm has neither parameters nor an ε attribute: the audit's ε estimate,
    rounded to one digit, is verified like everything else."""
    model = nn.ModuleDict(
        {"olmo": OlmoLayerNorm(32), "rms": WeightlessRMSNorm(32), "noeps": NoEpsRMSNorm(32)}
    ).to(dtype)
    x = seeded(3, 32, seed=12, dtype=dtype)
    before = {name: m(x) for name, m in model.items()}
    reports = _by_name(replace_norms(model, strict=True))
    assert model["olmo"].eps == 1e-5 and not model["olmo"].elementwise_affine
    assert "ε = 1e-05 (estimated by the audit)" in reports["olmo"].reason
    assert model["rms"].eps == 1e-6 and model["rms"].weight is None
    assert model["noeps"].eps == 1e-6 and "estimated" in reports["noeps"].reason
    for name, y in before.items():
        torch.testing.assert_close(model[name](x), y, rtol=1e-5, atol=1e-5)


def test_hooks_buffers_and_conditional_norms_are_kept() -> None:
    hooked = LlamaRMSNorm(16)
    hooked.register_forward_hook(lambda *_: None)
    buffered = LlamaRMSNorm(16)
    buffered.register_buffer("scale", torch.ones(1))
    ada = normlab.AdaLayerNormZero(16, 8)

    class CondNorm(nn.Module):  # someone else's conditional norm
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(16))

        def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
            return x

    model = nn.ModuleDict({"hooked": hooked, "buffered": buffered, "ada": ada, "cond": CondNorm()})
    reports = _by_name(replace_norms(model))
    assert "hooks" in reports["hooked"].reason
    assert "buffers" in reports["buffered"].reason
    assert "already" in reports["ada"].reason
    assert "conditional" in reports["cond"].reason
    assert not any(r.replaced for r in reports.values())


def test_float64_models_are_verified_in_float64() -> None:
    """LlamaRMSNorm takes float64 input to float32 for its statistic; normlab keeps float64, so
    the two agree to float32 rounding only, and that is what the check allows."""
    model = randomise(nn.Sequential(LlamaRMSNorm(16), nn.LayerNorm(16))).double()
    x = seeded(3, 16, seed=7, dtype=torch.float64)
    before = model(x)
    reports = replace_norms(model)
    assert all(r.replaced for r in reports)
    assert all(set(r.max_error) == {"float64"} for r in reports)
    torch.testing.assert_close(model(x), before, rtol=1e-6, atol=1e-6)
    assert max(r.max_error["float64"] for r in reports) > 1e-12  # LlamaRMSNorm's float32


def test_the_model_itself_as_a_norm_is_reported_not_swapped() -> None:
    norm = nn.LayerNorm(8)
    (report,) = replace_norms(norm)
    assert report.names == () and not report.replaced and "model itself" in report.reason


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module"):
        replace_norms("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dry_run"):
        replace_norms(Block(), dry_run=1)  # type: ignore[arg-type]


def test_rms_norm_promote_output_is_hf_llama_bit_for_bit() -> None:
    from test_casting import hf_llama

    w = 1 + 0.3 * seeded(64, seed=8)
    norm = normlab.RMSNorm(64, promote_output=True)
    with torch.no_grad():
        norm.weight.copy_(w)
    for dtype in (torch.bfloat16, torch.float16):
        x = (3 * seeded(8, 64, seed=9)).to(dtype)
        y = norm(x)
        assert y.dtype == torch.float32
        exact = (y == hf_llama(x, w, 1e-6)).float().mean().item()
        assert exact >= 0.99
    assert norm(seeded(2, 64)).dtype == torch.float32
    with pytest.raises(TypeError, match="promote_output"):
        normlab.RMSNorm(64, promote_output="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["llama", "gemma", "qwen3", "t5", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_transformers_models_when_installed(arch: str, dtype: torch.dtype) -> None:
    """Tiny models built from configs (no download): every norm replaced, same logits."""
    T = pytest.importorskip("transformers")
    small = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    builders = {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**small)),
        "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(**small, head_dim=8)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**small, head_dim=8)),
        "t5": lambda: T.T5ForConditionalGeneration(
            T.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        ),
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)
        ),
    }
    torch.manual_seed(0)
    model = randomise(builders[arch]()).to(dtype).eval()
    ids = torch.randint(0, 64, (2, 8))
    extra = {"decoder_input_ids": ids} if arch == "t5" else {}
    with torch.no_grad():
        before = model(input_ids=ids, **extra).logits
    if arch == "t5" and dtype != torch.float32:
        # T5LayerNorm rounds x̂ to a 16-bit weight's dtype, float32 input too (float16 T5 feeds
        # it float32 from its float32 ``wo``): no normlab layer does, so every one is kept
        reports = replace_norms(model)
        assert reports and all("float32 input" in r.reason for r in reports)
    else:
        reports = replace_norms(model, strict=True)
        assert reports and all(r.replaced for r in reports)
    with torch.no_grad():
        after = model(input_ids=ids, **extra).logits
    if dtype == torch.bfloat16:
        assert torch.equal(after, before)
    else:
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


# --- side effects, autograd modes, devices ---------------------------------------------------


def test_torchs_random_number_generator_is_left_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(16, 16), LlamaRMSNorm(16), nn.LayerNorm(16))
    torch.manual_seed(0)
    replace_norms(model)
    after = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(4))


def test_the_originals_parameters_are_never_written() -> None:
    """The audit sets a random gain for its casting check: on a copy, not on the model."""
    model = randomise(nn.Sequential(LlamaRMSNorm(16), GemmaRMSNorm(16)))
    saved = [(p.detach().clone(), p._version) for p in model.parameters()]
    replace_norms(model, dry_run=True)
    for p, (value, version) in zip(model.parameters(), saved, strict=True):
        assert torch.equal(p, value) and p._version == version


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "built_in_inference_mode"])
def test_works_under_no_grad_and_inference_mode(mode: str) -> None:
    def build() -> nn.Module:
        return randomise(nn.Sequential(nn.Linear(16, 16), LlamaRMSNorm(16), nn.LayerNorm(16)))

    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    if mode == "built_in_inference_mode":
        with context:
            model = build()
        context = torch.inference_mode()
    else:
        model = build()
    with context:
        x = seeded(2, 16, seed=4)
        before = model(x)
        reports = replace_norms(model)
        after = model(x)
    assert all(r.replaced for r in reports), [r.describe() for r in reports]
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_a_model_on_the_meta_device_is_verified_with_stand_in_values() -> None:
    """A model built on the meta device (to be loaded later): the swap keeps its meta
    Parameters, and once loaded it computes what the original does."""
    ref = randomise(nn.Sequential(nn.Linear(16, 16), LlamaRMSNorm(16), GemmaRMSNorm(16)))
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 16), LlamaRMSNorm(16), GemmaRMSNorm(16))
    weights = [p for p in model.parameters()]
    reports = replace_norms(model)
    assert all(r.replaced and "meta-device" in r.reason for r in reports)
    assert [p for p in model.parameters()] == weights and all(p.is_meta for p in weights)
    model.load_state_dict(ref.state_dict(), assign=True)
    x = seeded(3, 16, seed=6)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)


def test_frozen_parameters_and_modulelist_moduledict_parents() -> None:
    model = nn.ModuleDict(
        {"layers": nn.ModuleList([LlamaRMSNorm(16), nn.LayerNorm(16)]), "norm": GemmaRMSNorm(16)}
    ).requires_grad_(False)
    reports = replace_norms(model)
    assert [r.names for r in reports] == [("layers.0",), ("layers.1",), ("norm",)]
    assert all(r.replaced for r in reports)
    assert isinstance(model["layers"][0], normlab.RMSNorm)
    assert isinstance(model["norm"], normlab.RMSNorm)
    assert not any(p.requires_grad for p in model.parameters())


# --- what a verification must catch ----------------------------------------------------------


class ChannelsFirstLayerNorm(nn.LayerNorm):
    """Normalises dim 1 (a [B, C, H, W] image's channels); on [N, C] that is the last one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


class ConvNextLayerNorm(nn.LayerNorm):
    """Hugging Face ConvNeXt's channels-first LayerNorm: 4-D input only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@pytest.mark.parametrize(
    "cls", [ChannelsFirstLayerNorm, ConvNextLayerNorm], ids=lambda c: c.__name__
)
def test_a_channels_first_layer_norm_is_kept(cls: type[nn.Module]) -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 1), cls(8))
    x = seeded(2, 3, 6, 6, seed=9)
    before = model(x)
    (report,) = replace_norms(model)
    assert not report.replaced and "took none of the probe inputs" in report.reason
    assert torch.equal(model(x), before)


class TupleRMSNorm(LlamaRMSNorm):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return super().forward(x), None


class ThreeDimsOnlyRMSNorm(LlamaRMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 3, "expected [B, T, D]"
        return super().forward(x)


class FusedAddRMSNorm(LlamaRMSNorm):
    """vLLM's form: norm(x) or, with a residual, (norm(x + residual), x + residual)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):  # type: ignore[override]
        if residual is None:
            return super().forward(x)
        h = x + residual
        return super().forward(h), h


class NoGradRMSNorm(LlamaRMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return super().forward(x)


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (TupleRMSNorm(16), "returned tuple"),
        (NoGradRMSNorm(16), "no gradient of its output"),
        (WrongGradientRMSNorm(16).bfloat16(), "gradient of x (torch.bfloat16)"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_what_only_the_call_shows_is_caught(module: nn.Module, reason: str) -> None:
    model = nn.ModuleDict({"norm": module})
    (report,) = replace_norms(model)
    assert model["norm"] is module
    assert not report.replaced and reason in report.reason, report.reason


def test_a_norm_that_takes_only_b_t_d_input_is_audited_and_verified_on_it() -> None:
    model = nn.Sequential(ThreeDimsOnlyRMSNorm(16))
    (report,) = replace_norms(model)
    assert report.replaced, report.describe()
    assert isinstance(model[0], normlab.RMSNorm)


def test_float32_input_into_16_bit_norms_is_verified() -> None:
    """float16 T5 from_pretrained keeps ``wo`` in float32, so its 16-bit T5LayerNorm gets
    float32 input and returns float16; a replacement returning float32 broke the next Linear."""
    model = randomise(nn.Sequential(nn.Linear(32, 32), T5LayerNorm(32), LlamaRMSNorm(32))).half()
    model[0].float()
    x = seeded(2, 32, seed=10)
    before = model(x)
    reports = _by_name(replace_norms(model))
    assert not reports["1"].replaced and "float32 input" in reports["1"].reason
    assert reports["2"].replaced and set(reports["2"].max_error) == {"float16", "float32"}
    assert torch.equal(model(x), before)


class Scaled(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


class LayerNormWithStep(nn.LayerNorm):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.register_buffer("step", torch.zeros(()))


class LayerNormWithExtra(nn.LayerNorm):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.extra = nn.Parameter(torch.zeros(()))


def _accelerate_like(module: nn.Module) -> nn.Module:
    """accelerate's add_hook_to_module sets the instance's forward (device placement)."""
    old = module.forward
    module.forward = lambda x: old(x)
    return module


def _state_dict_hooked(module: nn.Module) -> nn.Module:
    module._register_load_state_dict_pre_hook(lambda *args: None)
    return module


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _accelerate_like(LlamaRMSNorm(16)), "forward is set on the instance"),
        (lambda: FusedAddRMSNorm(16), "takes residual besides the input"),
        (lambda: _state_dict_hooked(nn.LayerNorm(16)), "hooks"),
        (lambda: _parametrized(nn.LayerNorm(16)), "parametrized"),
        (lambda: _parametrized(LlamaRMSNorm(16)), "parametrized"),
        (lambda: LayerNormWithStep(16), "buffers"),
        (lambda: LayerNormWithExtra(16), "state dict holds weight, bias, extra"),
    ],
    ids=[
        "accelerate",
        "fused_add",
        "state_dict_hook",
        "param_ln",
        "param_llama",
        "buffer",
        "extra_param",
    ],
)
def test_modules_whose_swap_would_lose_more_than_their_function_are_kept(
    make: Callable[[], nn.Module], reason: str
) -> None:
    module = make()
    model = nn.Sequential(nn.Linear(16, 16), module)
    keys = list(model.state_dict())
    (report,) = replace_norms(model)
    assert model[1] is module and list(model.state_dict()) == keys
    assert not report.replaced and reason in report.reason, report.reason


def _parametrized(module: nn.Module) -> nn.Module:
    parametrize.register_parametrization(module, "weight", Scaled())
    return module


class PerHeadLayerNorm(nn.Module):
    """StableLM's q/k norm: one LayerNorm per head, no parameters of its own."""

    def __init__(self, heads: int, dim: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(dim, bias=False) for _ in range(heads)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, 1, dim=1)
        return torch.cat([n(p) for n, p in zip(self.norms, parts, strict=True)], dim=1)


def test_a_container_of_norms_is_left_and_its_norms_replaced_even_when_strict() -> None:
    model = nn.Sequential(nn.Linear(16, 16), PerHeadLayerNorm(2, 16))
    reports = _by_name(replace_norms(model, strict=True))
    assert not reports["1"].replaced and "holds norm modules" in reports["1"].reason
    assert reports["1.norms.0"].replaced and isinstance(model[1].norms[1], normlab.LayerNorm)


def test_names_select_the_norms_under_a_path() -> None:
    model = nn.ModuleDict({"a": Block(), "b": Block()})
    reports = replace_norms(model, names=["a"])
    assert {n.split(".")[0] for r in reports for n in r.names} == {"a"}
    assert isinstance(model["a"].llama, normlab.RMSNorm) and isinstance(model["b"].ln, nn.LayerNorm)
    with pytest.raises(ValueError, match=r"names: 'a\.fc' is not a norm module and holds none"):
        replace_norms(model, names=["a.fc"])
    with pytest.raises(TypeError, match="names: expected attribute paths"):
        replace_norms(model, names=[1])  # type: ignore[list-item]


def test_the_audit_runs_once_per_class_and_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100-layer model needs its Llama norms audited once; each one is still verified."""
    from normlab.patching import candidates

    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs["target"])
        return normlab.audit.audit_norm(*args, **kwargs)

    monkeypatch.setattr(candidates, "audit_norm", counting)
    model = randomise(nn.ModuleList([LlamaRMSNorm(16) for _ in range(4)] + [LlamaRMSNorm(32)]))
    model.append(WrongEpsRMSNorm(16))
    reports = replace_norms(model)
    assert len(calls) == 3  # LlamaRMSNorm(16), LlamaRMSNorm(32), WrongEpsRMSNorm(16)
    assert [r.replaced for r in reports] == [True] * 5 + [False]


def hf_like_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """A factory for ``normlab audit model test_patching:hf_like_model``."""
    return randomise(Block()), (seeded(2, 3, 32, seed=11),)


def test_cli_audit_model_replaceable() -> None:
    import json

    from typer.testing import CliRunner

    from normlab.cli import app

    args = ["audit", "model", "test_patching:hf_like_model", "--replaceable"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    swaps = {r["names"][0]: r for r in json.loads(result.output)["replacements"]}
    assert swaps["llama"]["replacement"].startswith("normlab.RMSNorm(")
    assert not swaps["llama"]["replaced"]  # a dry run
    assert swaps["group"]["replacement"] is None
    table = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    assert "normlab replacement" in table.output and "already a normlab module" in table.output
