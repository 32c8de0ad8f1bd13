"""normlab.replace_norms: every norm of a model swapped for the normlab layer that computes the
same function, verified before the swap, with the original Parameter objects kept.

The Hugging Face norms are written out here (their formulas, their attribute names), so the
tests run without transformers; the last test uses transformers' own models when installed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

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
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hf_like(x, self.weight)


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
        (NoEpsRMSNorm(16), "no ε attribute"),
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
    reports = replace_norms(model, strict=True)
    assert reports and all(r.replaced for r in reports)
    with torch.no_grad():
        after = model(input_ids=ids, **extra).logits
    if dtype == torch.bfloat16:
        assert torch.equal(after, before)
    else:
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


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
