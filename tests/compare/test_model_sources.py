"""Model sources for compare on a user's causal LM: transformers configs and factories, the
arm's norm in every norm slot, paired start, the uniform forward and the one-line errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import normlab
from normlab import registry
from normlab.audit import audit_model
from normlab.models.external import (
    DRY_BATCH,
    SourceLM,
    audit_target,
    check_same_start,
    load_model_source,
    parse_settings,
    parse_source,
    parse_value,
    shared_digests,
    shared_parameter_names,
)
from normlab.patching.slots import norm_slots

V = 256
LLAMA = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=64"
QWEN3 = (
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "intermediate_size=64,head_dim=8"
)
GPT2 = "n_embd=32,n_layer=2,n_head=4,n_positions=64"
COHERE = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=4,intermediate_size=64,use_qk_norm=true"
)
NORM_CLASSES = {"rmsnorm": normlab.RMSNorm, "layernorm": normlab.LayerNorm}


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def train_losses(model: nn.Module, steps: int = 3, seed: int = 0) -> list[float]:
    """Losses of ``steps`` AdamW steps on one fixed batch of next-token prediction."""
    gen = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, V, (4, 17), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps + 1):
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V).float(), batch[:, 1:].reshape(-1))
        losses.append(loss.item())
        if len(losses) > steps:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses


def assert_trains(model: nn.Module) -> None:
    losses = train_losses(model)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses


def modules_of(model: nn.Module, cls: type) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, cls)]


# ---------------------------------------------------------------- parsing


def test_settings_values_parse_as_int_float_bool_none_or_str() -> None:
    assert parse_value("128") == 128 and isinstance(parse_value("128"), int)
    assert parse_value("1e-5") == 1e-5 and parse_value("0.5") == 0.5
    assert parse_value("True") is True and parse_value("false") is False
    assert parse_value("none") is None and parse_value("null") is None
    assert parse_value("silu") == "silu" and parse_value("nan") == "nan"
    assert parse_settings("a=1, b=2.5,c=true,d=gelu,") == {"a": 1, "b": 2.5, "c": True, "d": "gelu"}
    assert parse_settings(None) == {} and parse_settings({"x": 3}) == {"x": 3}
    for bad, match in (("a", "key=value"), ("a=1,a=2", "twice"), ("1a=2", "key=value")):
        with pytest.raises(ValueError, match=f"^--model-set: .*{match}"):
            parse_settings(bad)


def test_source_spec_parses_hf_and_factory_and_refuses_the_rest() -> None:
    assert parse_source("hf:llama").kind == "hf" and parse_source("hf:llama").target == "llama"
    assert parse_source("pkg.mod:make").kind == "factory"
    assert str(parse_source("hf:./x")) == "hf:./x"
    for bad in ("hf:", "llama", "pkg.mod:", "", "a-b:c"):
        with pytest.raises(ValueError, match=r"^--model: "):
            parse_source(bad)


# ---------------------------------------------------------------- transformers sources


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_llama_every_rmsnorm_becomes_the_arms_norm_and_trains(transformers, kind: str) -> None:
    source = load_model_source("hf:llama", LLAMA, vocab_size=V)
    model, record = source.build(kind, 0)
    assert isinstance(model, SourceLM) and record.kind == kind and record.held == ()
    paths = [s.paths[0] for s in record.swapped]
    assert paths == [
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.norm",
    ]
    assert all(s.dim == 32 and s.original.endswith("LlamaRMSNorm") for s in record.swapped)
    assert all(s.eps == 1e-6 for s in record.swapped)  # the model's own ε, in every arm
    assert sorted(modules_of(model.net, NORM_CLASSES[kind])) == sorted(paths)
    assert not [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert model.net.config._attn_implementation == "eager"
    assert record.settings["vocab_size"] == V and record.settings["hidden_size"] == 32
    assert_trains(model)


def test_qwen3_qk_norms_are_swapped_at_the_head_size(transformers) -> None:
    source = load_model_source("hf:qwen3", QWEN3, vocab_size=V)
    model, record = source.build("layernorm", 0)
    dims = {s.paths[0]: s.dim for s in record.swapped}
    assert dims["model.layers.0.self_attn.q_norm"] == 8
    assert dims["model.layers.1.self_attn.k_norm"] == 8
    assert dims["model.layers.0.input_layernorm"] == 32 and dims["model.norm"] == 32
    assert len(record.swapped) == 2 * 4 + 1 and record.held == ()
    q_norm = model.net.get_submodule("model.layers.0.self_attn.q_norm")
    assert isinstance(q_norm, normlab.LayerNorm) and q_norm.normalized_shape == (8,)
    assert "net.model.layers.0.self_attn.q_norm.bias" in model.norm_parameter_names()
    assert_trains(model)


def test_gpt2_layernorm_with_bias_swapped_both_ways(transformers) -> None:
    source = load_model_source("hf:gpt2", GPT2, vocab_size=V)
    rms, rms_record = source.build("rmsnorm", 0)
    ln, _ = source.build("layernorm", 0)
    assert [s.paths[0] for s in rms_record.swapped] == [
        "transformer.h.0.ln_1",
        "transformer.h.0.ln_2",
        "transformer.h.1.ln_1",
        "transformer.h.1.ln_2",
        "transformer.ln_f",
    ]
    assert all(s.original == "torch.nn.modules.normalization.LayerNorm" for s in rms_record.swapped)
    assert not modules_of(rms, nn.LayerNorm) and len(modules_of(rms, normlab.RMSNorm)) == 5
    assert "net.transformer.ln_f.bias" in ln.norm_parameter_names()
    assert not any(n.endswith(".bias") for n in rms.norm_parameter_names())
    # the arms differ by exactly the LayerNorm biases
    (rms_total, rms_norms), (ln_total, ln_norms) = rms.count_parameters(), ln.count_parameters()
    assert ln_norms - rms_norms == ln_total - rms_total == 5 * 32
    # the token ids out of a 256 vocabulary are dropped, not kept pointing past it
    assert rms.net.config.bos_token_id is None and rms.net.config.eos_token_id is None
    assert_trains(rms)
    assert_trains(ln)


def test_cohere_2d_per_head_norms_are_held_alike_in_every_arm(transformers) -> None:
    source = load_model_source("hf:cohere", COHERE, vocab_size=V)
    models, records = {}, {}
    for kind in ("rmsnorm", "layernorm"):
        models[kind], records[kind] = source.build(kind, 3)
    for record in records.values():
        assert [h.paths[0] for h in record.held] == [
            "model.layers.0.self_attn.q_norm",
            "model.layers.0.self_attn.k_norm",
        ]
        assert all("weight of shape (4, 8)" in h.reason for h in record.held)
        assert [s.paths[0] for s in record.swapped] == [
            "model.layers.0.input_layernorm",
            "model.norm",
        ]
    held_weight = "net.model.layers.0.self_attn.q_norm.weight"
    assert held_weight in shared_parameter_names(models["rmsnorm"])
    check_same_start(models)
    assert_trains(models["rmsnorm"])


def test_hf_folder_source_with_settings_on_top(transformers, tmp_path) -> None:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=96
    )
    config.save_pretrained(tmp_path)
    source = load_model_source(f"hf:{tmp_path}", "hidden_size=32", vocab_size=V)
    assert source.config.hidden_size == 32 and source.config.intermediate_size == 96
    assert source.config.head_dim == 16  # written in the file: kept unless set
    source = load_model_source(f"hf:{tmp_path}", "hidden_size=32,head_dim=8", vocab_size=V)
    assert source.config.head_dim == 8
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    )
    derived = load_model_source(f"hf:{tmp_path}", "hidden_size=32", vocab_size=V)
    assert derived.config.head_dim == 8  # not in the file: derived from the settings
    model, record = source.build("rmsnorm", 0)
    assert {s.dim for s in record.swapped} == {32} and len(record.swapped) == 3
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, V)


def test_own_norms_kept_when_no_arm_is_given(transformers) -> None:
    source = load_model_source("hf:llama", LLAMA, vocab_size=V)
    model, record = source.build(None, 0)
    assert record.kind is None and record.swapped == () and len(record.held) == 5
    assert model.norm_parameter_names() == []
    assert model.count_parameters()[1] == 0


# ---------------------------------------------------------------- paired start


def test_shared_parameters_equal_across_arms_and_differ_across_seeds(transformers) -> None:
    for spec, settings in (("hf:llama", LLAMA), ("hf:gpt2", GPT2), ("hf:qwen3", QWEN3)):
        source = load_model_source(spec, settings, vocab_size=V)
        rms, _ = source.build("rmsnorm", 0)
        torch.manual_seed(1234)  # the caller's generator state must not matter
        ln, _ = source.build("layernorm", 0)
        other, _ = source.build("rmsnorm", 1)
        digest = check_same_start({"rmsnorm": rms, "layernorm": ln})
        assert len(digest) == 64
        names = shared_parameter_names(rms)
        assert names == shared_parameter_names(ln) and len(names) >= 8
        a, b, c = (dict(m.named_parameters()) for m in (rms, ln, other))
        for name in names:
            assert torch.equal(a[name], b[name]), name
        matrices = [n for n in names if a[n].dim() == 2]
        assert matrices and all(not torch.equal(a[n], c[n]) for n in matrices)
        assert shared_digests(rms) != shared_digests(other)
        with pytest.raises(ValueError, match="differs between arms"):
            check_same_start({"s0": rms, "s1": other})


def test_arm_norm_parameters_are_the_kinds_init_in_every_seed(transformers) -> None:
    source = load_model_source("hf:gpt2", GPT2, vocab_size=V)
    a, _ = source.build("layernorm", 0)
    b, _ = source.build("layernorm", 5)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    for name in a.norm_parameter_names():
        assert torch.equal(pa[name], pb[name]), name
    assert torch.equal(pa["net.transformer.ln_f.weight"], torch.ones(32))
    assert torch.equal(pa["net.transformer.ln_f.bias"], torch.zeros(32))


def test_building_leaves_the_callers_random_stream_alone(transformers) -> None:
    source = load_model_source("hf:llama", LLAMA, vocab_size=V)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    source.build("rmsnorm", 7)
    assert torch.equal(torch.rand(3), expected)


def test_a_norm_that_draws_random_values_does_not_unpair_the_arms(
    transformers, monkeypatch
) -> None:
    """A custom registered kind whose init draws from torch's generator: the shared
    parameters stay equal, and its own values are the same in every seed."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    def noisy(dim: int, **kw: object) -> nn.Module:
        norm = normlab.RMSNorm(dim, **kw)
        with torch.no_grad():
            norm.weight.add_(0.1 * torch.randn(dim))
        return norm

    normlab.register_norm("noisy_rms", noisy)
    source = load_model_source("hf:llama", LLAMA, vocab_size=V)
    plain, _ = source.build("rmsnorm", 0)
    noisy_a, _ = source.build("noisy_rms", 0)
    noisy_b, _ = source.build("noisy_rms", 1)
    check_same_start({"rmsnorm": plain, "noisy": noisy_a})
    w = "net.model.norm.weight"
    pa, pb = dict(noisy_a.named_parameters()), dict(noisy_b.named_parameters())
    assert not torch.equal(pa[w], torch.ones(32)) and torch.equal(pa[w], pb[w])
    # the same kind at two slots of one width still gets its own values per slot
    assert not torch.equal(pa[w], pa["net.model.layers.0.input_layernorm.weight"])
    # a factory builds its norms between the shared layers: they must not shift their values
    factory = load_model_source(f"{HERE}:tiny_lm", None, vocab_size=V)
    check_same_start(
        {"rmsnorm": factory.build("rmsnorm", 2)[0], "noisy": factory.build("noisy_rms", 2)[0]}
    )


# ---------------------------------------------------------------- factory sources


class TinyLM(nn.Module):
    """Embedding → blocks of (norm → causal running mean → MLP, residual) → norm → head."""

    def __init__(self, make_norm, vocab_size: int, d: int, n_layers: int, own_norm: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d)
        self.blocks = nn.ModuleList()
        for _ in range(n_layers):
            block = nn.Module()
            block.norm = make_norm(d, eps=1e-5)
            block.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            self.blocks.append(block)
        self.final = nn.LayerNorm(d) if own_norm else make_norm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        steps = torch.arange(1, tokens.shape[1] + 1, device=h.device).view(1, -1, 1)
        for block in self.blocks:
            mixed = block.norm(h).cumsum(1) / steps  # causal: token t sees tokens <= t
            h = h + block.mlp(mixed)
        return self.head(self.final(h))


def tiny_lm(make_norm, vocab_size: int, d_model: int = 32, n_layers: int = 2) -> nn.Module:
    return TinyLM(make_norm, vocab_size, d_model, n_layers, own_norm=False)


def tiny_lm_own_final_norm(make_norm, vocab_size: int) -> nn.Module:
    return TinyLM(make_norm, vocab_size, 32, 1, own_norm=True)


class WithLogits(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=self.inner(tokens))


def tiny_lm_output_object(make_norm, **settings: object) -> nn.Module:
    return WithLogits(TinyLM(make_norm, V, 32, 1, own_norm=False))


def no_make_norm(vocab_size: int) -> nn.Module:
    return nn.Embedding(vocab_size, vocab_size)


def wrong_vocab(make_norm) -> nn.Module:
    return TinyLM(make_norm, 100, 16, 1, own_norm=False)


def not_a_module(make_norm) -> object:
    return "a model"


def float_only(make_norm) -> nn.Module:
    return nn.Linear(4, V)  # raises on integer token ids


NOT_CALLABLE = 3
HERE = __name__


def test_factory_source_builds_swaps_and_trains() -> None:
    source = load_model_source(f"{HERE}:tiny_lm", "d_model=32,n_layers=2", vocab_size=V)
    model, record = source.build("rmsnorm", 0)
    assert [s.paths[0] for s in record.swapped] == ["blocks.0.norm", "blocks.1.norm", "final"]
    assert [s.eps for s in record.swapped] == [1e-5, 1e-5, 1e-6]  # as the factory asked
    assert all(s.kind == "rmsnorm" and s.dim == 32 for s in record.swapped)
    assert record.held == ()
    assert model.blocks is model.net.blocks
    assert set(model.parameter_groups()) == {
        "embed",
        "block0.norms",
        "block0.mlp",
        "block1.norms",
        "block1.mlp",
        "norms",
    }
    assert_trains(model)


def test_factory_paired_start_and_held_own_norms() -> None:
    source = load_model_source(f"{HERE}:tiny_lm_own_final_norm", None, vocab_size=V)
    models = {k: source.build(k, 4)[0] for k in ("rmsnorm", "layernorm", "dyt", "none")}
    check_same_start(models)
    record = models["dyt"].record
    assert [s.paths[0] for s in record.swapped] == ["blocks.0.norm"]
    assert [(h.paths[0], h.original) for h in record.held] == [
        ("final", "torch.nn.modules.normalization.LayerNorm")
    ]
    assert "net.final.weight" in shared_parameter_names(models["none"])
    assert models["none"].count_parameters()[1] == 0
    other = source.build("rmsnorm", 5)[0]
    with pytest.raises(ValueError, match="differs between arms"):
        check_same_start({"s4": models["rmsnorm"], "s5": other})


def test_factory_output_with_logits_attribute() -> None:
    source = load_model_source(f"{HERE}:tiny_lm_output_object", "anything=1", vocab_size=V)
    model, _ = source.build("layernorm", 0)
    assert model(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, V)


# ---------------------------------------------------------------- errors


def test_unknown_model_type_names_the_option_and_valid_ones(transformers) -> None:
    with pytest.raises(
        ValueError, match=r"^--model: unknown model_type 'lama'; did you mean llama"
    ):
        load_model_source("hf:lama", None, vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: transformers has no causal-LM class for .*t5"):
        load_model_source("hf:t5", None, vocab_size=V)


def test_folder_without_config_json_and_hub_names(transformers, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"^--model: folder .* has no config.json"):
        load_model_source(f"hf:{tmp_path}", None, vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: .*never downloaded"):
        load_model_source("hf:meta-llama/Llama-3.2-1B", None, vocab_size=V)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 3}))
    with pytest.raises(ValueError, match=r"^--model: cannot read"):
        load_model_source(f"hf:{tmp_path}", None, vocab_size=V)


def test_unknown_setting_key_names_the_option(transformers) -> None:
    with pytest.raises(ValueError, match=r"^--model-set: the llama config has no 'hiden_size'"):
        load_model_source("hf:llama", "hiden_size=32", vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model-set: vocab_size is the tokenizer's \(256\)"):
        load_model_source("hf:llama", "vocab_size=1000", vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model-set: .* takes no 'width'; its settings are"):
        load_model_source(f"{HERE}:tiny_lm", "width=3", vocab_size=V)


def test_factory_errors_name_the_option_and_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"^--model: .*no make_norm parameter; expected"):
        load_model_source(f"{HERE}:no_make_norm", None, vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: cannot import module 'no_such_pkg_x.models'"):
        load_model_source("no_such_pkg_x.models:build", None, vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: module .* has no attribute 'missing'"):
        load_model_source(f"{HERE}:missing", None, vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: .*:NOT_CALLABLE is a int, not callable"):
        load_model_source(f"{HERE}:NOT_CALLABLE", None, vocab_size=V)
    source = load_model_source(f"{HERE}:wrong_vocab", None, vocab_size=V)
    b, t = DRY_BATCH
    shape = rf"\[{b}, {t}, 100\].*expected .*\[{b}, {t}, 256\]"
    with pytest.raises(ValueError, match=rf"^--model: .*wrong_vocab returned .*{shape}"):
        source.build("rmsnorm", 0)
    with pytest.raises(ValueError, match=r"^--model: .*returned str; expected a torch.nn.Module"):
        load_model_source(f"{HERE}:not_a_module", None, vocab_size=V).build("rmsnorm", 0)
    with pytest.raises(ValueError, match=r"^--model: .*float_only failed on a dry batch .*Error"):
        load_model_source(f"{HERE}:float_only", None, vocab_size=V).build("rmsnorm", 0)


def test_arm_norm_and_argument_errors(transformers) -> None:
    source = load_model_source("hf:llama", LLAMA, vocab_size=V)
    with pytest.raises(ValueError, match=r"^norm: 'adarms' is a conditional norm"):
        source.build("adarms", 0)
    with pytest.raises(ValueError, match=r"^norm: unknown norm 'batchnorm'"):
        source.build("batchnorm", 0)
    with pytest.raises(ValueError, match=r"^vocab_size: "):
        load_model_source("hf:llama", LLAMA, vocab_size=0)
    with pytest.raises(ValueError, match=r"^attn_implementation: "):
        load_model_source("hf:llama", LLAMA, vocab_size=V, attn_implementation="flash")
    model, _ = source.build("rmsnorm", 0)
    with pytest.raises(ValueError, match=r"^tokens: expected token ids of shape \[B, T\]"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^tokens: expected int64"):
        model(torch.zeros(1, 4))


# ---------------------------------------------------------------- testbed interface, audit


def test_groups_cover_every_parameter_once_and_blocks_are_found(transformers) -> None:
    source = load_model_source("hf:qwen3", QWEN3, vocab_size=V)
    model, _ = source.build("rmsnorm", 0)
    groups = model.parameter_groups()
    flat = [n for names in groups.values() for n in names]
    assert sorted(flat) == sorted(n for n, _ in model.named_parameters())
    assert {"embed", "head", "norms", "block0.norms", "block1.self_attn", "block1.mlp"} <= set(
        groups
    )
    assert "net.model.layers.0.self_attn.q_norm.weight" in groups["block0.norms"]
    assert model.blocks is model.net.model.layers
    total, in_norms = model.count_parameters()
    assert in_norms == 2 * (32 + 32 + 8 + 8) + 32
    assert total == sum(p.numel() for p in model.parameters())


def test_audit_target_gives_model_and_inputs(transformers) -> None:
    model, inputs = audit_target("hf:llama", LLAMA, norm="layernorm")
    assert inputs[0].shape == (2, 16) and inputs[0].dtype == torch.int64
    audit = audit_model(model, *inputs)
    assert audit.placement == "pre"
    roles = {site.name: site.role for site in audit.norms}
    assert roles["net.model.norm"] == "final"
    own, _ = audit_target("hf:gpt2", GPT2)
    assert len(modules_of(own, nn.LayerNorm)) == 5  # no arm: the model's own norms


# ---------------------------------------------------------------- norm slots


class FusedAddNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x + residual, (x.shape[-1],), self.weight)


class MixingNorm(nn.Module):
    """Normalises over tokens: not a per-vector norm."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x - x.mean(-2, keepdim=True))


class HeadNorms(nn.Module):
    """Holds one LayerNorm per head and no parameters of its own: a container, not a slot."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_norm_slots_swappable_held_and_containers() -> None:
    model = nn.Module()
    model.ln = nn.LayerNorm(16)
    model.rms = nn.RMSNorm(16, eps=1e-6)
    model.group = nn.GroupNorm(2, 16)
    model.fused = FusedAddNorm(16)
    model.mixing = MixingNorm(16)
    model.wide = nn.LayerNorm((4, 16))
    model.per_head = HeadNorms(8)
    model.shared = model.ln  # one module, two paths
    slots = {s.paths[0]: s for s in norm_slots(model)}
    assert slots["ln"].paths == ("ln", "shared") and slots["ln"].dim == 16
    assert slots["rms"].swappable and slots["rms"].eps == 1e-6
    assert "over the batch or over channel groups" in slots["group"].held
    assert "residual" in slots["fused"].held
    assert "depends on other tokens" in slots["mixing"].held
    assert "several trailing dimensions" in slots["wide"].held
    assert "per_head" not in slots and slots["per_head.heads.0"].dim == 8


def test_sdpa_attention_matches_eager(transformers) -> None:
    tokens = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(0))
    logits = {}
    for attn in ("eager", "sdpa"):
        source = load_model_source("hf:llama", LLAMA, vocab_size=V, attn_implementation=attn)
        model, _ = source.build("rmsnorm", 0)
        assert model.net.config._attn_implementation == attn
        with torch.no_grad():
            logits[attn] = model(tokens)
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-4, atol=1e-5)


class TwoStepNorm(nn.Module):
    """A custom kind built from a torch LayerNorm: its inner norm is part of the arm's norm."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.inner = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 0.5


def test_a_kind_built_from_other_norms_is_one_swapped_norm(transformers, monkeypatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    normlab.register_norm("two_step", TwoStepNorm)
    factory = load_model_source(f"{HERE}:tiny_lm", None, vocab_size=V)
    model, record = factory.build("two_step", 0)
    assert [s.paths[0] for s in record.swapped] == ["blocks.0.norm", "blocks.1.norm", "final"]
    assert record.held == ()
    assert "net.final.inner.weight" in model.norm_parameter_names()
    hf = load_model_source("hf:gpt2", GPT2, vocab_size=V)
    model, record = hf.build("two_step", 0)
    assert len(record.swapped) == 5 and record.held == ()
    assert "net.transformer.ln_f.inner.bias" in model.norm_parameter_names()
    assert_trains(model)


def test_a_factory_that_raises_is_a_one_line_model_error() -> None:
    source = load_model_source(f"{HERE}:tiny_lm", "d_model=-4", vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model: .*:tiny_lm\(make_norm, \*\*settings\) raised"):
        source.build("rmsnorm", 0)


# ---- memory estimate before anything is built ----------------------------------------------


HUGE_LLAMA = (
    "hidden_size=65536,num_hidden_layers=96,num_attention_heads=64,intermediate_size=262144"
)


@pytest.mark.parametrize(
    ("source", "settings"),
    [("hf:llama", LLAMA), ("hf:qwen3", QWEN3), ("hf:gpt2", GPT2), ("hf:llama", HUGE_LLAMA)],
)
def test_the_configs_parameter_estimate_is_within_a_small_factor(
    transformers, source: str, settings: str
) -> None:
    """The config's formula against the parameters of the model built on the meta device
    (no memory, whatever its size)."""
    from normlab.models.external.footprint import config_footprint, meta_parameter_count

    loaded = load_model_source(source, settings, vocab_size=V)
    estimate = config_footprint(loaded.config, batch_size=4, context=16)
    counted = meta_parameter_count(loaded, "rmsnorm")
    assert counted is not None and estimate.parameters is not None
    assert counted / 1.5 <= estimate.parameters <= counted * 1.5, (estimate, counted)
    twice = config_footprint(loaded.config, batch_size=8, context=16)
    assert twice.activation_bytes == 2 * estimate.activation_bytes > 0  # linear in the batch


def test_a_model_beyond_the_memory_is_refused_from_its_config_alone(
    transformers, monkeypatch: pytest.MonkeyPatch
) -> None:
    from normlab._resources import available_memory
    from normlab.models.external import check_source_fits, footprint

    def no_build(*args: object) -> None:
        raise AssertionError("the model was built before the config's estimate refused it")

    huge = load_model_source("hf:llama", HUGE_LLAMA, vocab_size=V)
    monkeypatch.setattr(footprint, "meta_parameter_count", no_build)
    with pytest.raises(ValueError, match=r"^--model hf:llama --model-set hidden_size=65536,") as e:
        check_source_fits(
            huge, batch_size=4, context=16, norm="rmsnorm", available=available_memory()
        )
    assert "TiB to train" in str(e.value) and "is available in memory" in str(e.value)
    monkeypatch.undo()
    small = load_model_source("hf:llama", LLAMA, vocab_size=V)
    need = check_source_fits(small, batch_size=4, context=16, norm="rmsnorm", available=1 << 30)
    assert need.parameters == sum(p.numel() for p in small.build("rmsnorm", 0)[0].parameters())
    with pytest.raises(ValueError, match=r"× 3 at once.*fewer runs in parallel"):
        check_source_fits(small, batch_size=4, context=16, norm="rmsnorm", available=1, copies=3)


def test_a_factory_is_counted_on_the_meta_device() -> None:
    from normlab.models.external import check_source_fits

    source = load_model_source(f"{HERE}:tiny_lm", "d_model=32,n_layers=2", vocab_size=V)
    need = check_source_fits(source, batch_size=2, context=8, norm="layernorm", available=1 << 30)
    built, _ = source.build("layernorm", 0)
    assert need.parameters == sum(p.numel() for p in built.parameters())
    big = load_model_source(f"{HERE}:tiny_lm", "d_model=100000,n_layers=40", vocab_size=V)
    with pytest.raises(ValueError, match=r"^--model .*:tiny_lm --model-set d_model=100000"):
        check_source_fits(big, batch_size=2, context=8, norm="layernorm", available=1 << 30)


def test_audit_model_refuses_a_model_beyond_the_memory(transformers) -> None:
    with pytest.raises(ValueError, match=r"needs about .* to build and run"):
        audit_target("hf:llama", HUGE_LLAMA)
