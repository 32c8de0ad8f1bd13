"""Size ladders and μP for ``--model hf:…`` (the lm testbed): the size rule of a transformers
config (heads and MLP width follow the width, any other key changes alone), its refusals, the
rung parameter counts against built models, μP's groups, initial values and logits multiplier
at two widths, mup at the base width bit for bit sp, and a tiny ladder planned through the
command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from normlab.cli import app
from normlab.experiment.testbeds.lm import lm_source
from normlab.experiment.training.schedule import make_optimizer
from normlab.models.external import load_model_source
from normlab.models.external.mup import LogitMultiplier, MupError, hidden_ratios
from normlab.models.external.scaling import ScalingError, scaled_keys, with_changes
from normlab.models.mup import set_lr
from normlab.study.loader import study_configs
from normlab.study.rungs import plan_ladder
from normlab.study.sweep import sweep_plan

transformers = pytest.importorskip("transformers")

V = 64
BYTES = 256
LLAMA = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 88,
    "max_position_embeddings": 32,
}
HIDDEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama(**changes: object) -> str:
    return ",".join(f"{k}={v}" for k, v in {**LLAMA, **changes}.items())


def lm_config(ladder: dict[str, list[int]], **lm: object) -> object:
    """The ladder of an ``hf:`` model's config, as a YAML file would give it."""
    section = {"model": "hf:llama", "model_set": llama(), "context": 16, **lm}
    return study_configs(
        {"lm": section, "ladder": ladder, "norms": ["layernorm", "rmsnorm"]}
    ).ladder


def source(width: int = 32, **kw: object):
    d = width / 32
    sizes = {
        "hidden_size": width,
        "num_attention_heads": int(4 * d),
        "num_key_value_heads": int(2 * d),
        "intermediate_size": round(88 * d),
    }
    return load_model_source("hf:llama", llama(**sizes), vocab_size=V, **kw)


# ---- the size rule ------------------------------------------------------------------------


def test_a_width_brings_heads_and_mlp_along_and_depth_changes_alone() -> None:
    config = source().config
    assert scaled_keys(config, "hidden_size", 48) == {
        "hidden_size": 48,
        "num_attention_heads": 6,  # head size 8 kept
        "num_key_value_heads": 3,  # 2 query heads per key/value head kept
        "intermediate_size": 132,  # 88 / 32 · 48
    }
    assert scaled_keys(config, "hidden_size", 80)["intermediate_size"] == 220
    assert scaled_keys(config, "hidden_size", 16)["intermediate_size"] == 44
    assert scaled_keys(config, "num_hidden_layers", 3) == {"num_hidden_layers": 3}
    assert scaled_keys(config, "intermediate_size", 40) == {"intermediate_size": 40}
    # GPT-2 names its width n_embd: a hidden_size ladder sets n_embd and n_head, and a
    # setting given under the other name is dropped so the config sees each size once
    gpt2 = load_model_source("hf:gpt2", "hidden_size=32,n_head=2,n_layer=1", vocab_size=V).config
    changes = scaled_keys(gpt2, "hidden_size", 64)
    assert changes == {"n_embd": 64, "n_head": 4}  # n_inner None follows the width itself
    assert with_changes(gpt2, {"hidden_size": 32, "n_head": 2, "n_layer": 1}, changes) == {
        "n_layer": 1,
        "n_embd": 64,
        "n_head": 4,
    }


def test_ladder_rungs_follow_the_rule_and_record_it() -> None:
    plan = plan_ladder(lm_config({"hidden_size": [64, 16, 32]}, parametrization="mup"))
    assert plan.values == (16, 32, 64)
    assert plan.parametrization == "mup" and "head size fixed" in plan.rule
    for value, rung, changes in zip(plan.values, plan.configs, plan.changes, strict=True):
        assert not hasattr(rung, "ladder") and rung.lm.base_hidden_size == 16
        built = lm_source(rung.lm.model_dump(mode="json"), V).config
        sizes = (built.hidden_size, built.num_attention_heads, built.num_key_value_heads)
        assert sizes == (value, value // 8, value // 16)
        assert built.head_dim == 8 and built.intermediate_size == round(88 * value / 32)
        assert built.num_hidden_layers == 1
        assert changes == {
            "hidden_size": value,
            "num_attention_heads": value // 8,
            "num_key_value_heads": value // 16,
            "intermediate_size": round(88 * value / 32),
            "base_hidden_size": 16,
        }
    record = plan.record()
    assert record["changes"]["hidden_size=64"]["num_attention_heads"] == 8
    depth = plan_ladder(lm_config({"num_hidden_layers": [1, 2]}, parametrization="mup"))
    assert depth.changes == ({"num_hidden_layers": 1}, {"num_hidden_layers": 2})
    assert all(c.lm.base_hidden_size is None for c in depth.configs)  # depth is not μP's
    # --lr-sweep: a μP width ladder is swept at its ends and runs the smallest rung's rates;
    # a depth ladder (and any sp ladder) is swept at every rung
    assert sweep_plan(plan).swept == ("hidden_size=16", "hidden_size=64")
    assert set(sweep_plan(plan).chosen_at.values()) == {"hidden_size=16"}
    assert sweep_plan(depth).swept == ("num_hidden_layers=1", "num_hidden_layers=2")
    sp = plan_ladder(lm_config({"hidden_size": [16, 32]}))
    assert sweep_plan(sp).swept == ("hidden_size=16", "hidden_size=32")


@pytest.mark.parametrize(
    ("ladder", "message"),
    [
        ({"hidden_size": [16, 40]}, "hidden_size=40 cannot keep the head size"),
        ({"hidden_size": [16, 32]}, "must be a multiple of 32"),
        ({"foo": [1, 2]}, "the llama config has no 'foo'"),
        ({"rms_norm_eps": [1, 2]}, "rms_norm_eps is 1e-06, not an integer size"),
        ({"vocab_size": [64, 128]}, "vocab_size is the tokenizer's"),
        ({"max_position_embeddings": [8, 32]}, "lm.context: 16 tokens per window"),
    ],
)
def test_bad_rungs_are_refused_in_one_line_naming_the_option(ladder, message) -> None:
    if ladder == {"hidden_size": [16, 32]}:  # 1 key/value head at 32: 0.5 at 16
        section = {"model": "hf:llama", "model_set": llama(num_key_value_heads=1)}
        cfg = study_configs({"lm": section, "ladder": ladder}).ladder
    else:
        cfg = lm_config(ladder)
    with pytest.raises(ValueError) as err:
        plan_ladder(cfg)
    text = str(err.value)
    assert text.startswith("--ladder: ") and message in text and "\n" not in text


def test_a_factory_source_has_no_ladder_and_no_mup() -> None:
    factory = {"model": "test_model_sources:tiny_lm", "model_set": "d_model=16"}
    cfg = study_configs({"lm": factory, "ladder": {"d_model": [16, 32]}}).ladder
    with pytest.raises(ValueError, match=r"^--ladder: .* is a factory"):
        plan_ladder(cfg)
    with pytest.raises(MupError, match=r"^--parametrization: mup scales a transformers"):
        load_model_source(factory["model"], "d_model=16", vocab_size=V, parametrization="mup")
    with pytest.raises(MupError, match=r"^--parametrization: the base model at hidden_size=24"):
        source(32, parametrization="mup", base_hidden_size=24)


@pytest.mark.parametrize("tied", [False, True])
def test_rung_parameter_counts_are_those_of_the_built_baseline(tied: bool) -> None:
    """Counted on the meta device with the baseline's norms (layernorm: a bias the model's
    own RMSNorm lacks), equal to the built model's count."""
    section = {"model_set": llama(tie_word_embeddings=tied)}
    plan = plan_ladder(lm_config({"hidden_size": [16, 32]}, **section))
    for rung, n in zip(plan.configs, plan.n_params, strict=True):
        rung_source = lm_source(rung.lm.model_dump(mode="json"), BYTES)  # no tokenizer: bytes
        built, _ = rung_source.build("layernorm", 0)
        assert n == built.count_parameters()[0]
        own, _ = rung_source.build(None, 0)
        assert n > own.count_parameters()[0]  # the swapped norms' biases are counted


# ---- μP -----------------------------------------------------------------------------------


def test_mup_scales_hidden_init_rates_and_logits_by_the_width() -> None:
    """At width 64 against base 32: hidden matrices drawn as sp times √(32/64), their Adam
    rate and decay × and ÷ 32/64; embeddings, head and norm gains as sp; logits × 32/64."""
    sp, _ = source(64).build("rmsnorm", 0)
    mup, _ = source(64, parametrization="mup", base_hidden_size=32).build("rmsnorm", 0)
    sp_params = dict(sp.named_parameters())
    hidden = {n for n, _ in mup.named_parameters() if n.split(".")[-2] in HIDDEN}
    assert len(hidden) == len(HIDDEN)
    for name, p in mup.named_parameters():
        factor = math.sqrt(0.5) if name in hidden else 1.0
        torch.testing.assert_close(p, sp_params[name] * factor, rtol=0, atol=0)
    weights = torch.cat([p.flatten() for n, p in mup.named_parameters() if n in hidden])
    assert weights.std().item() == pytest.approx(0.02 * math.sqrt(0.5), rel=0.05)
    mults = mup.lr_multipliers()
    assert {n for n, m in mults.items() if m != 1.0} == hidden
    assert all(mults[n] == 0.5 for n in hidden)
    opt = make_optimizer(mup, 0.01, 0.1, (0.9, 0.95))
    set_lr(opt, 0.004)
    names = {id(p): n for n, p in mup.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            name = names[id(p)]
            assert group["lr"] == pytest.approx(0.004 * mults[name], rel=1e-12)
            decayed = p.dim() >= 2 and name not in mup.norm_parameter_names()
            assert group["weight_decay"] == pytest.approx(0.1 / mults[name] if decayed else 0.0)
    x = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(3))
    hooks = list(mup.net.lm_head._forward_hooks.values())
    assert len(hooks) == 1 and isinstance(hooks[0], LogitMultiplier)
    with torch.no_grad():
        last = mup.net.model(input_ids=x).last_hidden_state
        torch.testing.assert_close(mup(x), 0.5 * mup.net.lm_head.weight.matmul(last.mT).mT)
    # the head size is the base model's, so the module's 1/√d_head is left as it is
    assert all(m.scaling == 8**-0.5 for m in mup.modules() if hasattr(m, "scaling"))


def test_mup_at_the_base_width_is_sp_bit_for_bit() -> None:
    sp, _ = source(32).build("layernorm", 1)
    mup, _ = source(32, parametrization="mup", base_hidden_size=32).build("layernorm", 1)
    assert mup.mup is not None and mup.mup.ratios == {} and not mup.net.lm_head._forward_hooks
    x = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(4))
    y = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(5))
    opts = [make_optimizer(m, 0.01, 0.1, (0.9, 0.95)) for m in (sp, mup)]
    for step in range(2):
        losses = []
        for model, opt in zip((sp, mup), opts, strict=True):
            set_lr(opt, 0.01 * (step + 1) / 2)
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)
        assert torch.equal(losses[0], losses[1])
    for (name, a), (_, b) in zip(sp.named_parameters(), mup.named_parameters(), strict=True):
        assert torch.equal(a, b), name


class _Toy(nn.Module):
    def __init__(self, d: int, fixed: int, odd: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.hidden = nn.Linear(d, 2 * d)
        self.narrow = nn.Linear(2 * d, fixed)  # fan-in grows, fan-out fixed, not the head
        self.lm_head = nn.Linear(d, V)
        if odd:
            self.table = nn.Parameter(torch.zeros(d, d))

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_mup_refuses_what_it_cannot_scale() -> None:
    with pytest.raises(MupError, match=r"^--parametrization: .*'narrow.weight'.* fan-out does"):
        hidden_ratios(_Toy(64, 5, False), _Toy(32, 5, False))
    toy, base = _Toy(64, 5, True), _Toy(32, 5, True)
    del toy.narrow, base.narrow
    with pytest.raises(MupError, match=r"^--parametrization: .*'table'.*cannot be told"):
        hidden_ratios(toy, base)
    toy.table, base.table = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(3))
    assert hidden_ratios(toy, base) == {"hidden.weight": 0.5}  # head and embedding: as sp
    with pytest.raises(ScalingError, match="expected an integer size >= 1"):
        scaled_keys(source().config, "hidden_size", 0)


# ---- end to end ---------------------------------------------------------------------------


def test_tiny_hf_ladder_is_planned_through_the_command_line(tmp_path: Path) -> None:
    """``compare --model hf:llama --ladder hidden_size=16,32 --parametrization mup --plan``
    (the flag goes to ``lm.parametrization``): ladder.json records each rung's changed
    settings, every rung's runs are prepared with the rung's sizes and base width, and the
    counts are the runs' own."""
    config = tmp_path / "c.yaml"
    small = llama(num_attention_heads=2, num_key_value_heads=2, intermediate_size=64)
    lm = {"context": 8}
    train = {"eval_interval": 2, "eval_windows": 2, "batch_size": 2, "warmup": 1}
    config.write_text(json.dumps({"lm": lm, "train": train, "data": {"max_bytes": 20_000}}))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "compare", "--config", str(config), "--model", "hf:llama",
            "--model-set", small, "--ladder", "hidden_size=16,32", "--seeds", "2",
            "--parametrization", "mup",
            "--steps", "2", "--threads", "1", "--device", "cpu", "--plan", "--out", str(out),
        ],
        env={"COLUMNS": "1000"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "ladder.json").read_text())
    assert plan["parametrization"] == "mup"
    assert plan["rungs"] == ["hidden_size=16", "hidden_size=32"]
    assert plan["changes"]["hidden_size=16"] == {
        "hidden_size": 16,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "intermediate_size": 32,
        "base_hidden_size": 16,
    }
    ids = [line.split("--run ")[1] for line in result.output.splitlines() if "--run " in line]
    assert len(ids) == 8  # 2 rungs × 2 arms × 2 seeds
    for setting, n in zip(plan["rungs"], plan["n_params"], strict=True):
        experiment = json.loads((out / setting / "experiment.json").read_text())
        assert experiment["parameter_counts"]["layernorm-pre"]["n_params"] == n
        run = json.loads((out / setting / "runs" / "rmsnorm-pre__s1" / "run.json").read_text())
        assert run["lm"]["parametrization"] == "mup" and run["lm"]["base_hidden_size"] == 16
        width = int(setting.partition("=")[2])
        assert run["lm"]["model_set"]["hidden_size"] == width
        assert run["lm"]["model_set"]["num_attention_heads"] == width // 16


def test_parametrization_flag_is_refused_for_the_dit_testbed(tmp_path: Path) -> None:
    """The DiT has no parametrization: ``--parametrization`` is refused in one line naming it,
    exit 2, nothing written."""
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"testbed": "dit"}))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        ["compare", "--config", str(config), "--parametrization", "mup", "--out", str(out)],
        env={"COLUMNS": "1000"},
    )
    assert result.exit_code == 2, result.output
    assert "--parametrization:" in result.output and "dit testbed has none" in result.output
    assert not out.exists()
