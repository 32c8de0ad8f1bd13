"""Paired control: shared parameters start equal across arms, batches match, configs are
guarded."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from normlab.data import TrainBatches
from normlab.experiment.config import validate_config
from normlab.experiment.execution.grid import check_only_factors_differ, plan_runs
from normlab.models import (
    GPT,
    GPTConfig,
    build_gpt,
    check_paired,
    init_gpt_paired_,
    shared_parameter_digests,
)

SMALL = {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 8, "positions": "learned"}


def arm(norm: str, placement: str = "pre", seed: int = 0, **kw: object) -> GPT:
    return build_gpt(GPTConfig(**{**SMALL, **kw}, norm=norm, placement=placement), seed)


def test_shared_parameters_equal_across_norms_and_placements() -> None:
    models = {
        f"{n}-{p}": arm(n, p)
        for n in ("layernorm", "rmsnorm", "rmsnorm_gemma", "dyt", "none")
        for p in ("pre", "post", "sandwich")
    }
    check_paired(models)  # raises if any shared parameter differs
    ref = dict(models["layernorm-pre"].named_parameters())
    other = dict(models["dyt-sandwich"].named_parameters())
    shared = set(shared_parameter_digests(models["layernorm-pre"]))
    assert "blocks.1.mlp.fc.weight" in shared and "tok_emb.weight" in shared
    for name in shared:
        assert torch.equal(ref[name], other[name]), name


def test_norm_parameters_keep_their_own_init_and_differ() -> None:
    ln = dict(arm("layernorm").named_parameters())
    gemma = dict(arm("rmsnorm_gemma").named_parameters())
    rms = dict(arm("rmsnorm").named_parameters())
    assert torch.equal(ln["blocks.0.norm_attn.weight"], torch.ones(16))
    assert torch.equal(ln["blocks.0.norm_attn.bias"], torch.zeros(16))
    assert "blocks.0.norm_attn.bias" not in rms
    assert torch.equal(gemma["blocks.0.norm_attn.weight"], torch.zeros(16))  # gain 1 + w
    assert not torch.equal(gemma["blocks.0.norm_attn.weight"], rms["blocks.0.norm_attn.weight"])
    assert "blocks.0.norm_attn.alpha" in dict(arm("dyt").named_parameters())


def test_init_does_not_depend_on_construction_order_or_other_modules() -> None:
    torch.manual_seed(123)
    a = arm("rmsnorm", seed=5)
    torch.manual_seed(999)
    _ = torch.randn(1000)  # global RNG state must not matter
    b = arm("rmsnorm", seed=5)
    assert shared_parameter_digests(a) == shared_parameter_digests(b)
    swiglu = arm("rmsnorm", seed=5, mlp="swiglu")
    assert torch.equal(
        dict(a.named_parameters())["tok_emb.weight"],
        dict(swiglu.named_parameters())["tok_emb.weight"],
    )


def test_different_seeds_give_different_inits() -> None:
    a = shared_parameter_digests(arm("rmsnorm", seed=0))
    b = shared_parameter_digests(arm("rmsnorm", seed=1))
    assert all(a[n] != b[n] for n in a if "weight" in n)


def test_check_paired_refuses_unshared_or_unequal_parameters() -> None:
    a = arm("layernorm")
    b = arm("rmsnorm")
    with torch.no_grad():
        dict(b.named_parameters())["blocks.0.attn.qkv.weight"].add_(1e-3)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv\.weight"):
        check_paired({"a": a, "b": b})
    with pytest.raises(ValueError, match="do not share"):
        check_paired({"a": arm("layernorm"), "b": arm("layernorm", mlp="swiglu")})
    with pytest.raises(ValueError, match="do not share"):
        check_paired({"a": arm("layernorm"), "b": arm("layernorm", bias=True)})


def test_reinit_is_idempotent() -> None:
    model = arm("layernorm", seed=3)
    before = shared_parameter_digests(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    init_gpt_paired_(model, 3)
    assert shared_parameter_digests(model) == before


def test_every_arm_sees_the_same_batches_for_a_seed() -> None:
    tokens = np.random.default_rng(0).integers(0, 256, 5000).astype(np.uint8)
    first = TrainBatches(tokens, 4, 16, seed=7)
    second = TrainBatches(tokens, 4, 16, seed=7)
    other_seed = TrainBatches(tokens, 4, 16, seed=8)
    for _ in range(5):
        (x1, y1), (x2, y2) = first.next(), second.next()
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
        assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(first.next()[0], other_seed.next()[0])


def _runs() -> list[dict[str, object]]:
    cfg = validate_config({"norms": ["layernorm", "rmsnorm"], "seeds": 2, "model": SMALL})
    info = {"fingerprint": "sha256:test", "python_version": "3", "source": "test"}
    return plan_runs(cfg, "cpu", 1, info)


def test_plan_runs_pairs_every_seed_and_reports_counts() -> None:
    runs = _runs()
    assert [r["run_id"] for r in runs] == [
        "layernorm-pre__s0",
        "rmsnorm-pre__s0",
        "layernorm-pre__s1",
        "rmsnorm-pre__s1",
    ]
    assert runs[0]["init_digest"] == runs[1]["init_digest"] != runs[2]["init_digest"]
    assert runs[0]["n_params"] > runs[1]["n_params"]  # LayerNorm's biases
    assert runs[0]["n_params"] - runs[0]["n_norm_params"] == (
        runs[1]["n_params"] - runs[1]["n_norm_params"]
    )


@pytest.mark.parametrize(
    ("path", "value"),
    [(("train", "lr"), 0.1), (("model", "d_model"), 32), (("threads",), 7)],
)
def test_config_guard_refuses_and_names_the_field(path: tuple[str, ...], value: object) -> None:
    runs = _runs()[:2]
    check_only_factors_differ(
        runs, ("run_id", "arm", "norm", "placement", "n_params", "n_norm_params")
    )
    bad = copy.deepcopy(runs)
    node = bad[1]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValueError, match=rf"differ in '{'.'.join(path)}'"):
        check_only_factors_differ(
            bad, ("run_id", "arm", "norm", "placement", "n_params", "n_norm_params")
        )


def test_config_guard_catches_a_field_only_one_arm_has() -> None:
    runs = copy.deepcopy(_runs()[:2])
    runs[1]["train"]["extra_trick"] = True
    with pytest.raises(ValueError, match="extra_trick"):
        check_only_factors_differ(
            runs, ("run_id", "arm", "norm", "placement", "n_params", "n_norm_params")
        )
