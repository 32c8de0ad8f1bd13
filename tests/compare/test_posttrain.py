"""Post-training effects: activation statistics, outlier channels, PTQ and bf16 deltas."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from normlab.experiment.measure import posttrain as PT
from normlab.experiment.measure.evaluate import bits_per_byte, validation_loss
from normlab.models import GPTConfig, build_gpt
from normlab.report import build_report


def test_input_stats_match_numpy_on_heavy_tailed_activations() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_t(df=5, size=(4, 32, 24)).astype(np.float32)
    got = PT.input_stats(torch.from_numpy(x))
    v = x.astype(np.float64).ravel()
    assert got.kurtosis == pytest.approx(stats.kurtosis(v, fisher=False, bias=True), rel=1e-9)
    assert got.max_over_rms == pytest.approx(np.abs(v).max() / np.sqrt(np.mean(v**2)), rel=1e-9)
    assert got.outlier_channels == int((np.abs(x).reshape(-1, 24).max(axis=0) >= 6).sum())
    channel_rms = np.sqrt(np.mean(x.astype(np.float64).reshape(-1, 24) ** 2, axis=0))
    expected = stats.kurtosis(channel_rms, fisher=False, bias=True)
    assert got.channel_rms_kurtosis == pytest.approx(expected, rel=1e-9)


def test_channel_rms_kurtosis_grows_when_one_channel_carries_the_energy() -> None:
    """Channel RMS values (1, 1, 1, 3): mean 1.5, deviations (−.5, −.5, −.5, 1.5), σ² = 0.75,
    E[d⁴] = (3 · 0.0625 + 5.0625) / 4 = 1.3125, kurtosis 1.3125 / 0.5625 = 7 / 3. Equal channel
    RMS values (whatever the signs) give NaN: no spread to measure."""
    x = torch.tensor([[1.0, -1.0, 1.0, 3.0], [-1.0, 1.0, -1.0, -3.0]])
    assert PT.input_stats(x).channel_rms_kurtosis == pytest.approx(7 / 3)
    assert math.isnan(PT.input_stats(torch.tensor([[1.0, -1.0], [-1.0, 1.0]])).channel_rms_kurtosis)
    rng = np.random.default_rng(1)
    plain = rng.standard_normal((64, 128))
    hot = plain.copy()
    hot[:, 7] *= 30.0  # one channel far louder than the rest
    k_plain = PT.input_stats(torch.from_numpy(plain)).channel_rms_kurtosis
    k_hot = PT.input_stats(torch.from_numpy(hot)).channel_rms_kurtosis
    assert k_hot > 50 > k_plain


def test_input_stats_hand_values() -> None:
    # ±1 alternating: μ = 0, σ² = 1, E[x⁴] = 1, so kurtosis 1; max|x| = RMS = 1.
    flat = PT.input_stats(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
    assert (flat.kurtosis, flat.max_over_rms, flat.outlier_channels) == (1.0, 1.0, 0)
    # one spike 4 among three zeros: μ = 1, σ² = (9 + 3) / 4 = 3, E[(x − μ)⁴] = (81 + 3) / 4
    # = 21, kurtosis 21 / 9; RMS = √(16 / 4) = 2, max / RMS = 2.
    spike = PT.input_stats(torch.tensor([[0.0, 0.0, 0.0, 4.0]]))
    assert spike.kurtosis == pytest.approx(21 / 9)
    assert spike.max_over_rms == pytest.approx(2.0)
    constant = PT.input_stats(torch.zeros(3, 2))
    assert math.isnan(constant.kurtosis) and math.isnan(constant.max_over_rms)
    with pytest.raises(TypeError, match="floating"):
        PT.input_stats(torch.ones(2, 2, dtype=torch.long))


def test_outlier_channels_count_channels_whose_max_reaches_the_threshold() -> None:
    x = torch.zeros(2, 3, 5)
    x[0, 1, 1] = 6.0  # exactly at the threshold: counts
    x[1, 2, 3] = -7.5  # |x| counts, whatever the sign
    x[1, 0, 3] = 9.0  # the same channel again: still one channel
    x[0, 0, 2] = 5.99  # below
    assert PT.input_stats(x).outlier_channels == 2
    assert PT.input_stats(x, threshold=5.0).outlier_channels == 3


class _Blocks(nn.Module):
    """A model with Linear layers inside ``blocks`` and one outside (the head)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(2)
        )
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_activation_outliers_reduce_the_block_linear_inputs_and_remove_their_hooks() -> None:
    model = _Blocks().train()
    x = torch.randn(4, 6, 8)
    x[0, 0, 5] = 20.0
    seen: list[torch.Tensor] = []
    handles = [
        m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
        for m in model.blocks.modules()
        if isinstance(m, nn.Linear)
    ]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    expected = [PT.input_stats(s) for s in seen]
    got = PT.activation_outliers(model, lambda m: m(x))
    assert got == {
        "act_kurtosis_max": max(s.kurtosis for s in expected),
        "act_max_over_rms": max(s.max_over_rms for s in expected),
        "channel_rms_kurtosis_max": max(s.channel_rms_kurtosis for s in expected),
        "outlier_channels": sum(s.outlier_channels for s in expected),
    }
    assert got["outlier_channels"] >= 1
    assert all(not m._forward_pre_hooks for m in model.modules())
    assert model.training

    def broken(m: nn.Module) -> None:
        m(x)
        raise RuntimeError("batch failed")

    with pytest.raises(RuntimeError, match="batch failed"):
        PT.activation_outliers(model, broken)
    assert all(not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ValueError, match="no `blocks`"):
        PT.activation_outliers(nn.Linear(2, 2), lambda m: m(torch.ones(1, 2)))


@pytest.fixture(scope="module")
def trained_gpt() -> tuple[nn.Module, torch.Tensor]:
    """A tiny GPT trained for a few steps on a repeating byte pattern, and validation windows."""
    torch.manual_seed(0)
    model = build_gpt(GPTConfig(d_model=32, n_layers=2, n_heads=2, context=16), 0)
    text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 40), dtype=torch.long)
    windows = text[: 17 * 32].reshape(32, 17)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(20):
        batch = windows[(step % 4) * 8 : (step % 4) * 8 + 8]
        _, loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, windows


def _bpb(windows: torch.Tensor):
    return lambda m: bits_per_byte(validation_loss(m, windows, 8, "cpu"))


def test_posttrain_deltas_are_small_and_leave_the_model_untouched(
    trained_gpt: tuple[nn.Module, torch.Tensor],
) -> None:
    model, windows = trained_gpt
    metric = _bpb(windows)
    reference = metric(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = PT.posttrain_summary(model, reference, metric, metric, lambda m: m(windows[:8, :-1]))
    assert list(out) == list(PT.POSTTRAIN_FIELDS)
    assert out["posttrain_errors"] is None, out["posttrain_errors"]
    for field in ("ptq_int8wo_delta", "ptq_w8a8_delta", "bf16_eval_delta"):
        assert math.isfinite(out[field]) and abs(out[field]) < 0.05, (field, out[field])
    assert out["act_kurtosis_max"] > 1.0 and out["act_max_over_rms"] > 1.0
    assert isinstance(out["outlier_channels"], int) and out["posttrain_s"] > 0
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) and after[k].dtype == torch.float32 for k in after)
    assert all(type(p) is nn.Parameter for p in model.parameters())
    assert metric(model) == reference
    assert model.training


def test_a_failing_scheme_or_missing_torchao_gives_null_and_a_reason(
    trained_gpt: tuple[nn.Module, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, windows = trained_gpt
    metric = _bpb(windows)

    def unsupported() -> object:
        raise NotImplementedError("int8 is not supported on this device")

    quantization = PT.import_torchao()
    deltas, errors = PT.ptq_deltas(
        model,
        metric,
        metric(model),
        {"ptq_w8a8_delta": unsupported, "ptq_int8wo_delta": quantization.Int8WeightOnlyConfig},
    )
    assert deltas["ptq_w8a8_delta"] is None and math.isfinite(deltas["ptq_int8wo_delta"])
    assert errors == {"ptq_w8a8_delta": "NotImplementedError: int8 is not supported on this device"}

    def no_torchao() -> None:
        raise ImportError("torchao is needed for post-training quantization: no module")

    monkeypatch.setattr(PT, "import_torchao", no_torchao)
    out = PT.posttrain_summary(model, 1.0, metric, metric, lambda m: m(windows[:8, :-1]))
    assert out["ptq_int8wo_delta"] is None and out["ptq_w8a8_delta"] is None
    assert set(out["posttrain_errors"]) == {"ptq_int8wo_delta", "ptq_w8a8_delta"}
    assert out["posttrain_errors"]["ptq_w8a8_delta"].startswith("ImportError: torchao is needed")
    assert out["bf16_eval_delta"] is not None and out["act_kurtosis_max"] is not None


def test_bf16_inputs_cast_floats_in_and_return_float32() -> None:
    inner = nn.Linear(4, 2).to(torch.bfloat16)
    out = PT.BFloat16Inputs(inner)(torch.randn(3, 4))
    assert out.dtype == torch.float32


def test_importing_normlab_does_not_import_torchao() -> None:
    code = (
        "import sys, normlab, normlab.experiment, normlab.experiment.testbeds\n"
        "assert 'torchao' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
NEW_METRICS = PT.POSTTRAIN_FIELDS[:6]  # the numeric ones, compared in the report


def test_old_summaries_without_posttrain_fields_still_analyse_and_report(tmp_path: Path) -> None:
    out = tmp_path / "compare_run"
    shutil.copytree(FIXTURE, out)
    build_report(out)
    analysis = json.loads((out / "summary.json").read_text())
    for name in NEW_METRICS:
        assert analysis["arms"]["rmsnorm-pre"][name]["n"] == 0
        assert analysis["comparisons"]["rmsnorm-pre"][name]["n_pairs"] == 0
    assert analysis["recommendation"]["choice"] == "rmsnorm-pre"
    assert "PTQ" not in (out / "report.md").read_text()  # no row for metrics nobody recorded
    with (out / "runs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(r["ptq_w8a8_delta"] == "" and r["posttrain_errors"] == "" for r in rows)


def test_posttrain_metrics_are_compared_and_shown_but_leave_the_verdict_alone(
    tmp_path: Path,
) -> None:
    plain, out = tmp_path / "plain", tmp_path / "with_posttrain"
    shutil.copytree(FIXTURE, plain)
    shutil.copytree(FIXTURE, out)
    for i, path in enumerate(sorted((out / "runs").glob("*/summary.json"))):
        summary = json.loads(path.read_text())
        rms = summary["arm"] == "rmsnorm-pre"
        summary.update(
            ptq_int8wo_delta=0.00012 + 1e-5 * i,
            ptq_w8a8_delta=(0.004 if rms else 0.002) + 1e-4 * i,
            bf16_eval_delta=0.0031 - 1e-5 * i,
            act_kurtosis_max=(40.0 if rms else 12.0) + i,
            act_max_over_rms=25.0 + 0.5 * i,
            channel_rms_kurtosis_max=(9.0 if rms else 4.0) + 0.1 * i,
            outlier_channels=3 + i,
            posttrain_errors=None,
        )
        path.write_text(json.dumps(summary))
    build_report(plain)
    build_report(out)
    before = json.loads((plain / "summary.json").read_text())
    after = json.loads((out / "summary.json").read_text())
    assert after["verdicts"] == before["verdicts"]
    assert after["recommendation"] == before["recommendation"]
    kurt = after["comparisons"]["rmsnorm-pre"]["act_kurtosis_max"]
    assert kurt["n_pairs"] == 3 and kurt["verdict"] == "worse"
    report = (out / "report.md").read_text()
    assert "int8 W8A8 PTQ degradation (bits per byte)" in report
    assert "0.00012" in report or "0.00013" in report  # five decimals for the deltas
    assert "max Linear-input kurtosis (Gaussian = 3)" in report
    assert "max kurtosis of Linear-input channel RMS (no unit)" in report
    channel = after["comparisons"]["rmsnorm-pre"]["channel_rms_kurtosis_max"]
    assert channel["verdict"] == "worse" and channel["mean_diff"] == pytest.approx(5.3)
    assert r"outlier channels (max \|x\| ≥ 6) (count)" in report  # pipes escaped
