"""Norm health: the statistics of every norm layer on a fixed batch, the drift flag on a broken
norm (ε that dominates, a forgotten root) and none on correct ones, HF-style norms found by
class name, health records written during training without changing it, and the report's
figure of them (what moves in training; mean(x̂²) only when it leaves 1)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import normlab
from normlab._io import read_jsonl, write_json_atomic
from normlab.analysis.health import health_flags, health_matrix, health_value
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
    for name, stats in health.items():  # the returned x̂ is the recomputed one
        assert stats["out_xhat_ms"] == pytest.approx(stats["xhat_ms"], rel=1e-5), name
    assert health["norms.1"]["xhat_mean_rms"] == pytest.approx(0.0, abs=1e-6)  # centred
    assert _flagged(health) == {}


def _rms_norm_reference(x: torch.Tensor, eps: float) -> tuple[float, float]:
    """(mean(x̂²), √mean_t m_t²) of RMSNorm's x̂ in float64, m_t the mean of token t's x̂."""
    v = x.double()
    xh = v / (v.square().mean(-1, keepdim=True) + eps).sqrt()
    return xh.square().mean().item(), xh.mean(-1).square().mean().sqrt().item()


def test_the_new_statistics_match_a_float64_reference() -> None:
    """Inputs with a per-token mean of either sign (so mean(x̂) cancels across tokens while
    the RMS of the token means does not) and a non-uniform gain."""
    gen = torch.Generator().manual_seed(1)
    sign = torch.where(torch.arange(8) % 2 == 0, 1.0, -1.0).reshape(1, 8, 1)
    x = torch.randn(4, 8, 32, generator=gen) + 0.7 * sign
    norm = normlab.RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(32, generator=gen) + 0.5)
    stats = layer_health(x, norm(x), norm)
    ms, mean_rms = _rms_norm_reference(x, 1e-5)
    assert stats["xhat_ms"] == pytest.approx(ms, rel=1e-5)
    assert stats["xhat_mean_rms"] == pytest.approx(mean_rms, rel=1e-5)
    assert abs(stats["xhat_mean"]) < 0.1 * mean_rms  # the plain mean cancels
    assert stats["out_xhat_ms"] == pytest.approx(ms, rel=1e-5)
    # a LayerNorm with a bias: the bias is taken off before the output is read
    ln = normlab.LayerNorm(32)
    with torch.no_grad():
        ln.bias.copy_(torch.randn(32, generator=gen))
    ln_stats = layer_health(x, ln(x), ln)
    assert ln_stats["out_xhat_ms"] == pytest.approx(ln_stats["xhat_ms"], rel=1e-5)


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
    """Its x̂ is x / (mean(x²) + ε): mean(x̂²) = mean_t m_t / (m_t + ε)², about 1/9 for inputs
    of RMS 3, though x̂ recomputed from its input by its class's formula looks right."""
    model = Tower([ForgetsTheRoot(32), normlab.RMSNorm(32)])
    x = _batch(3.0)
    health = norm_health(model, lambda m: m(x))
    m = x.double().square().mean(-1)
    expected = (m / (m + model.norms[0].eps) ** 2).mean().item()
    assert health["norms.0"]["out_xhat_ms"] == pytest.approx(expected, rel=1e-5)
    assert health["norms.0"]["xhat_ms"] == pytest.approx(1.0, abs=1e-3)
    flags = health_flags([{"type": HEALTH_RECORD, "step": 50, "layers": health}])
    assert [(f.layer, f.stat, f.first_step) for f in flags] == [
        ("norms.0", "xhat_ms", 50),
        ("norms.0", "formula_err", 50),
    ]
    assert flags[0].worst == pytest.approx(expected, rel=1e-5)
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


def test_records_without_the_newer_fields_fall_back() -> None:
    """A record written before ``xhat_mean_rms`` and ``out_xhat_ms`` existed: mean(x̂²) is the
    recomputed one, and the RMS of the token means follows from mean(x̂²) − mean_t var_t(x̂)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 8, 32, generator=gen) + 0.5
    norm = normlab.RMSNorm(32)
    new = layer_health(x, norm(x), norm)
    old = {k: v for k, v in new.items() if k not in ("xhat_mean_rms", "out_xhat_ms")}
    assert health_value(old, "out_xhat_ms") == new["xhat_ms"]
    assert health_value(old, "xhat_mean_rms") == pytest.approx(new["xhat_mean_rms"], abs=1e-3)
    assert health_value({"xhat_ms": 0.5}, "out_xhat_ms") == 0.5
    assert health_value({"in_rms": 1.0}, "xhat_mean_rms") is None
    assert health_value({"xhat_ms": 0.5, "out_xhat_ms": None}, "out_xhat_ms") == 0.5
    broken = {"type": HEALTH_RECORD, "step": 0, "layers": {"a": {"xhat_ms": 0.5}}}
    assert [f.stat for f in health_flags([broken])] == ["xhat_ms"]


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


# ---- the figure -------------------------------------------------------------------------------


def _health_records(model: nn.Module, scales: list[float]) -> list[dict[str, Any]]:
    """One ``health`` record per input scale, steps 0, 10, …, the gains growing by 10 % each."""
    records = []
    for i, scale in enumerate(scales):
        with torch.no_grad():
            for norm in model.norms:
                norm.weight.mul_(1.1)
        layers = norm_health(model, lambda m, s=scale: m(_batch(s)))
        records.append({"type": HEALTH_RECORD, "step": 10 * i, "layers": layers})
    return records


def _panel_values(fig: Any, stat: str) -> dict[str, Any]:
    """{arm: the heatmap array} of the column of ``stat``, found by the axes' gids."""
    import numpy as np

    out = {}
    for ax in fig.axes:
        gid = ax.get_gid() or ""
        if gid.startswith(f"{stat}:"):
            out[gid.split(":", 1)[1]] = np.ma.filled(ax.images[0].get_array(), np.nan)
    return out


def test_a_trained_runs_figure_shows_what_moves_and_no_flag(corpus: Path, tmp_path: Path) -> None:
    """mean(x̂²) is 1 in every layer of a correct run (the old figure's uniform rectangle);
    the input RMS varies over layers and steps, on a log colour scale."""
    import numpy as np
    from matplotlib.colors import LogNorm

    from normlab.report.plots import plot_norm_health

    records, _ = _run(corpus, tmp_path, record_health=True)
    fig = plot_norm_health({"rmsnorm-pre": records}, {})
    (in_rms,) = _panel_values(fig, "in_rms").values()
    assert in_rms.shape == (5, 3) and np.isfinite(in_rms).all()
    assert np.ptp(np.log(in_rms)) > 0.05  # not one colour
    assert len({round(float(v), 6) for v in in_rms.ravel()}) > 5
    (ax,) = [a for a in fig.axes if a.get_gid() == "in_rms:rmsnorm-pre"]
    assert isinstance(ax.images[0].norm, LogNorm)
    assert set(_panel_values(fig, "gain_mean")) == {"rmsnorm-pre"}
    assert set(_panel_values(fig, "xhat_mean_rms")) == {"rmsnorm-pre"}
    assert _panel_values(fig, "out_xhat_ms") == {}
    assert not [a for a in fig.axes if "x̂²" in a.get_title()]


def test_the_mean_square_column_appears_for_a_broken_norm_only() -> None:
    torch.manual_seed(0)
    correct = _health_records(Tower([normlab.RMSNorm(32), normlab.LayerNorm(32)]), [1, 2, 4])
    broken = _health_records(Tower([ForgetsTheRoot(32), normlab.RMSNorm(32)]), [1, 2, 4])
    from normlab.report.plots import plot_norm_health

    fig = plot_norm_health({"correct": correct}, {})
    assert _panel_values(fig, "out_xhat_ms") == {}
    fig = plot_norm_health({"correct": correct, "broken": broken}, {})
    flag = _panel_values(fig, "out_xhat_ms")
    assert set(flag) == {"correct", "broken"}
    assert abs(flag["broken"][0, 2] - 1 / 16) < 0.01  # inputs of RMS 4: mean(x̂²) ≈ 1/16
    assert abs(flag["correct"] - 1).max() < 1e-3
    (title,) = [a.get_title() for a in fig.axes if a.get_gid() == "out_xhat_ms:correct"]
    assert "x̂²" in title


def test_old_records_still_draw() -> None:
    """Records with none of the newer fields (and no gain fields at all) still give a figure:
    the input RMS, and the mean of x̂ from mean(x̂²) − var(x̂)."""
    torch.manual_seed(0)
    records = _health_records(Tower([normlab.RMSNorm(32), normlab.RMSNorm(32)]), [1, 3])
    keep = ("kind", "in_rms", "out_rms", "xhat_ms", "xhat_mean", "xhat_var", "calls")
    for r in records:
        r["layers"] = {k: {f: v for f, v in s.items() if f in keep} for k, s in r["layers"].items()}
    from normlab.report.plots import plot_norm_health

    fig = plot_norm_health({"old": records}, {})
    assert _panel_values(fig, "gain_mean") == {}  # no arm has a gain: the column is dropped
    assert set(_panel_values(fig, "xhat_mean_rms")) == {"old"}
    assert set(_panel_values(fig, "in_rms")) == {"old"}


@pytest.mark.parametrize("n_arms", [1, 2, 3, 6])
@pytest.mark.parametrize("broken", [False, True])
def test_the_figure_has_no_overlapping_text(n_arms: int, broken: bool) -> None:
    from test_figures import LONG_ARMS, _overlapping_texts

    from normlab.report.plots import plot_norm_health
    from normlab.report.style import arm_colors

    layers = [f"model.layers.{i}.post_attention_layernorm" for i in range(12)] + ["model.norm"]
    steps = list(range(0, 601, 50))
    arms = LONG_ARMS[:n_arms]
    gen = torch.Generator().manual_seed(0)

    def stats(i: int, j: int) -> dict[str, Any]:
        noise = 0.05 * torch.randn(4, generator=gen)
        return {
            "kind": "rmsnorm",
            "in_rms": float(0.5 * (1 + i) * (1 + 0.01 * j)),
            "gain_mean": float(1 + noise[0]),
            "gain_max_abs": float(2 + noise[1]),
            "xhat_mean_rms": float(0.2 + noise[2]),
            "out_xhat_ms": float(0.7 if broken and i == 3 else 1 + 1e-4 * noise[3]),
        }

    def record(j: int, step: int) -> dict[str, Any]:
        return {
            "type": HEALTH_RECORD,
            "step": step,
            "layers": {name: stats(i, j) for i, name in enumerate(layers)},
        }

    records = {arm: [record(j, s) for j, s in enumerate(steps)] for arm in arms}
    records[arms[0]][0]["layers"][layers[3]] = {"kind": None, "in_rms": 1.0}  # unknown formula
    fig = plot_norm_health(records, arm_colors(arms))
    assert _overlapping_texts(fig) == []
    columns = 5 if broken else 4
    heatmaps = [a for a in fig.axes if a.get_gid()]
    assert len(heatmaps) == n_arms * columns
    assert len(fig.axes) == n_arms * columns + columns  # a colour bar per column
