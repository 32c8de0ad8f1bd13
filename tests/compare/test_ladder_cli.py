"""``normlab compare --ladder``: μP in training, the ladder as a grid of rungs, its refusals and
its summary, end to end through the command line on tiny models."""

from __future__ import annotations

import pytest
import torch

from normlab.experiment.training.schedule import lr_at, make_optimizer
from normlab.models import GPTConfig, build_gpt
from normlab.models.mup import hidden_names, set_lr


def _gpt(d_model: int, parametrization: str) -> torch.nn.Module:
    cfg = GPTConfig(
        d_model=d_model,
        n_layers=1,
        n_heads=2,
        context=8,
        norm="layernorm",
        placement="pre",
        parametrization=parametrization,
        base_d_model=8,
    )
    return build_gpt(cfg, 0)


def test_mup_optimizer_groups_keep_their_multipliers_after_a_schedule_step() -> None:
    model = _gpt(32, "mup")
    opt = make_optimizer(model, 0.01, 0.1, (0.9, 0.95))
    lr = lr_at(2, 0.01, 10, 4, 0.1)  # inside the warm-up: half the peak
    set_lr(opt, lr)
    hidden = set(hidden_names(model))
    params = dict(model.named_parameters())
    by_id = {id(p): n for n, p in params.items()}
    seen = set()
    for group in opt.param_groups:
        for p in group["params"]:
            name = by_id[id(p)]
            seen.add(name)
            expected = lr * (8 / 32 if name in hidden else 1.0)
            assert group["lr"] == pytest.approx(expected, rel=1e-12), name
    assert seen == set(params)
    assert any(by_id[id(p)] in hidden for g in opt.param_groups for p in g["params"])


def test_sp_optimizer_has_todays_two_groups_in_parameter_order() -> None:
    model = _gpt(16, "sp")
    opt = make_optimizer(model, 0.01, 0.1, (0.9, 0.95))
    norms = set(model.norm_parameter_names())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in norms]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in norms)]
    groups = {g["weight_decay"]: g for g in opt.param_groups}
    assert len(opt.param_groups) == 2
    assert [id(p) for p in groups[0.1]["params"]] == [id(p) for p in decay]
    assert [id(p) for p in groups[0.0]["params"]] == [id(p) for p in rest]
    set_lr(opt, 0.003)
    assert all(g["lr"] == 0.003 for g in opt.param_groups)
