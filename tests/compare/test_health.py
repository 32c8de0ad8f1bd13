"""Norm health: the statistics of every norm layer on a fixed batch, the drift flag on a broken
norm (ε that dominates, a forgotten root) and none on correct ones, HF-style norms found by
class name, and health records written during training without changing it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import normlab
from normlab._io import read_jsonl, write_json_atomic
from normlab.analysis.health import health_flags, health_matrix
from normlab.data import prepare_tokens
from normlab.experiment.config import validate_config
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.measure.health import (
    NormFormula,
    formula_of,
    layer_health,
    norm_health,
    norm_layers,
    normalized,
)
from normlab.experiment.training import train as train_module
from normlab.run_format import HEALTH_RECORD, HEALTH_STATS


class ForgetsTheRoot(normlab.RMSNorm):
    """An RMSNorm that divides by mean(x²) + ε instead of its root (a DESIGN §1 defect)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x / (x.square().mean(-1, keepdim=True) + self.eps)


class FooRMSNorm(nn.Module):
    """A norm of a class normlab does not know (as a Hugging Face model's), found by name."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 2.0))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)


class Tower(nn.Module):
    def __init__(self, norms: list[nn.Module], dim: int = 32) -> None:
        super().__init__()
        self.norms = nn.ModuleList(norms)
        self.mix = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm in self.norms:
            x = x + self.mix(norm(x))
        return x


def _batch(scale: float, dim: int = 32) -> torch.Tensor:
    return scale * torch.randn(4, 8, dim, generator=torch.Generator().manual_seed(0))


def _flagged(health: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    flags = health_flags([{"type": HEALTH_RECORD, "step": 0, "layers": health}])
    out: dict[str, set[str]] = {}
    for f in flags:
        out.setdefault(f.layer, set()).add(f.stat)
    return out


def test_the_worked_examples_of_the_design() -> None:
    x = torch.tensor([[1.0, 2.0]])
    ln = normalized(x, NormFormula("layernorm", 0.0))
    rms = normalized(x, NormFormula("rmsnorm", 0.0))
    assert ln.tolist()[0] == pytest.approx([-1.0, 1.0])
    assert rms.tolist()[0] == pytest.approx([0.632, 1.265], abs=1e-3)


def test_correct_norms_are_not_flagged_and_their_statistics_hold() -> None:
    torch.manual_seed(0)
    model = Tower(
        [
            normlab.RMSNorm(32),
            normlab.LayerNorm(32),
            nn.LayerNorm(32),
            nn.RMSNorm(32),
            normlab.RMSNorm(32, weight_offset=1.0),
        ]
    )
    health = norm_health(model, lambda m: m(_batch(3.0)))
    assert list(health) == ["norms.0", "norms.1", "norms.2", "norms.3", "norms.4"]
    for name, stats in health.items():
        assert set(HEALTH_STATS) <= set(stats), name
        assert stats["xhat_ms"] == pytest.approx(1.0, abs=1e-3), name
        assert stats["formula_err"] < 1e-5, name
        assert stats["calls"] == 1
    assert health["norms.1"]["xhat_mean"] == pytest.approx(0.0, abs=1e-5)
    assert health["norms.1"]["xhat_var"] == pytest.approx(1.0, abs=1e-3)
    assert health["norms.0"]["kind"] == "rmsnorm" and health["norms.1"]["kind"] == "layernorm"
    assert health["norms.4"]["gain_mean"] == pytest.approx(1.0)  # o + w = 1 + 0
    assert health["norms.0"]["in_rms"] == pytest.approx(3.0, rel=0.1)
    assert _flagged(health) == {}


def test_a_norm_whose_eps_dominates_is_flagged() -> None:
    """Inputs of RMS 0.01 against ε = 1e-3: m = 1e-4 ≪ ε, mean(x̂²) = m / (m + ε) ≈ 0.09."""
    model = Tower([normlab.RMSNorm(32, eps=1e-3), normlab.RMSNorm(32, eps=1e-12)])
    health = norm_health(model, lambda m: m(_batch(0.01)))
    assert health["norms.0"]["xhat_ms"] == pytest.approx(1e-4 / (1e-4 + 1e-3), rel=0.1)
    flagged = _flagged(health)
    assert flagged.get("norms.0") == {"xhat_ms"}
    # the second layer's input is the first's output plus a residual: its own ε is tiny
    assert "norms.1" not in flagged


def test_a_norm_that_forgets_the_root_is_flagged() -> None:
    model = Tower([ForgetsTheRoot(32), normlab.RMSNorm(32)])
    health = norm_health(model, lambda m: m(_batch(3.0)))
    flags = health_flags([{"type": HEALTH_RECORD, "step": 50, "layers": health}])
    assert [(f.layer, f.stat, f.first_step) for f in flags] == [("norms.0", "formula_err", 50)]
    assert "forgets" not in flags[0].describe() and "norms.0" in flags[0].describe()


def test_unknown_norms_are_found_by_class_name_and_record_input_and_output_only() -> None:
    dyt = normlab.layers.dyt.DynamicTanh(32)
    model = Tower([FooRMSNorm(32), dyt])
    assert [n for n, _ in norm_layers(model)] == ["norms.0", "norms.1"]
    assert formula_of(model.norms[0]) is None
    health = norm_health(model, lambda m: m(_batch(1.0)))
    for stats in health.values():
        assert stats["kind"] is None
        assert stats["xhat_ms"] is None and stats["formula_err"] is None
        assert stats["in_rms"] > 0 and stats["out_rms"] > 0
    assert health["norms.0"]["gain_max_abs"] == pytest.approx(2.0)
    assert _flagged(health) == {}


def test_a_norm_called_twice_is_averaged_and_hooks_are_removed() -> None:
    norm = normlab.LayerNorm(32)
    model = Tower([norm, norm])
    model.train()
    health = norm_health(model, lambda m: m(_batch(1.0)))
    assert list(health) == ["norms.0"] and health["norms.0"]["calls"] == 2
    assert model.training
    assert not norm._forward_hooks


def test_conditional_norms_get_xhat_but_no_formula_check() -> None:
    ada = normlab.AdaRMSNorm(32, cond_dim=8)
    stats = layer_health(_batch(2.0), ada(_batch(2.0), torch.randn(4, 8))[0], ada)
    assert stats["xhat_ms"] == pytest.approx(1.0, abs=1e-3)
    assert stats["formula_err"] is None


def test_the_matrix_is_layers_by_steps() -> None:
    records = [
        {"type": HEALTH_RECORD, "step": 10, "layers": {"a": {"xhat_ms": 0.5}}},
        {"type": "eval", "step": 10},
        {"type": HEALTH_RECORD, "step": 0, "layers": {"a": {"xhat_ms": 1.0}, "b": {}}},
    ]
    layers, steps, values = health_matrix(records)
    assert layers == ["a", "b"] and steps == [0, 10]
    assert values[0] == [1.0, 0.5] and all(math.isnan(v) for v in values[1])
    (flag,) = health_flags(records)
    assert (flag.layer, flag.first_step, flag.worst, flag.n_steps) == ("a", 10, 0.5, 1)


# ---- during training ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    return root


def _run(corpus: Path, tmp_path: Path, record_health: bool) -> tuple[list, dict]:
    cfg = validate_config(
        {
            "seeds": 1,
            "threads": 1,
            "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "context": 16},
            "train": {
                "steps": 6,
                "batch_size": 2,
                "warmup": 1,
                "eval_interval": 3,
                "eval_windows": 4,
            },
            "anomaly": {"window": 3, "warmup": 3},
            "data": {"path": str(corpus)},
        }
    )
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    spec = plan_runs(cfg, "cpu", 1, info)[1]  # rmsnorm-pre
    run_dir = tmp_path / "runs" / f"{spec['run_id']}-{record_health}"
    write_json_atomic(run_dir / "run.json", spec)
    if not record_health:
        real = train_module.health_record
        train_module.health_record = lambda *a: None  # type: ignore[assignment]
    try:
        summary = train_module.train_run(spec, run_dir)
    finally:
        if not record_health:
            train_module.health_record = real  # type: ignore[assignment]
    return read_jsonl(run_dir / "metrics.jsonl"), summary


def test_training_writes_health_at_every_evaluation_and_changes_nothing(
    corpus: Path, tmp_path: Path
) -> None:
    records, summary = _run(corpus, tmp_path, record_health=True)
    health = [r for r in records if r["type"] == HEALTH_RECORD]
    evals = [r for r in records if r["type"] == "eval"]
    assert [h["step"] for h in health] == [e["step"] for e in evals] == [0, 3, 6]
    layers = health[0]["layers"]
    assert list(layers) == ["blocks.0.norm_attn", "blocks.0.norm_mlp", "blocks.1.norm_attn",
                            "blocks.1.norm_mlp", "norm_final"]  # fmt: skip
    assert all(v["kind"] == "rmsnorm" and v["xhat_ms"] is not None for v in layers.values())
    assert health_flags(records) == []
    baseline, summary_without = _run(corpus, tmp_path, record_health=False)
    assert not [r for r in baseline if r["type"] == HEALTH_RECORD]
    strip = ("step_time_s", "elapsed_s")
    same = [
        {k: v for k, v in r.items() if k not in strip} for r in records if r["type"] != "health"
    ]
    other = [{k: v for k, v in r.items() if k not in strip} for r in baseline]
    assert same == other
    assert summary["final_val_bpb"] == summary_without["final_val_bpb"]


# ---- the heatmap -------------------------------------------------------------------------------


@pytest.mark.parametrize("n_arms", [1, 2, 3, 6])
def test_the_heatmap_has_no_overlapping_text(n_arms: int) -> None:
    from test_figures import LONG_ARMS, _overlapping_texts

    from normlab.report.plots import plot_norm_health
    from normlab.report.style import arm_colors

    layers = [f"model.layers.{i}.post_attention_layernorm" for i in range(12)] + ["model.norm"]
    steps = list(range(0, 601, 50))
    arms = LONG_ARMS[:n_arms]
    rng = torch.Generator().manual_seed(0)
    matrices = {
        arm: (
            layers,
            steps,
            (1 + 0.1 * torch.randn(len(layers), len(steps), generator=rng)).tolist(),
        )
        for arm in arms
    }
    matrices[arms[0]][2][3] = [math.nan] * len(steps)  # a layer of unknown formula: grey
    fig = plot_norm_health(matrices, arm_colors(arms))
    assert _overlapping_texts(fig) == []
    assert len([ax for ax in fig.axes if ax.get_visible()]) == n_arms + 1  # panels and the bar
