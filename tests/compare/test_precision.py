"""Precision as a factor of the grid: arm names, the refusal of a non-training precision, the
pairing guard across precisions, bf16 and fp16 runs (skipped steps counted, not divergence)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from normlab._io import read_jsonl, write_json_atomic
from normlab.cli import app
from normlab.cli.errors import EXIT_USAGE
from normlab.data import prepare_tokens
from normlab.experiment.config import ConfigError, validate_config
from normlab.experiment.execution import grid as grid_module
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.training import train as train_module
from normlab.experiment.training.precision import PrecisionStep, autocast_for, check_precision


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x + {j}\n\n" for j in range(60))
        )
    return root


def tiny_config(corpus: Path, **top: Any) -> dict[str, Any]:
    return {
        "seeds": 1,
        "threads": 1,
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
        "train": {"steps": 4, "batch_size": 2, "warmup": 1, "eval_interval": 2, "eval_windows": 4},
        "anomaly": {"window": 3, "warmup": 3},
        "data": {"path": str(corpus)},
        **top,
    }


def _train(corpus: Path, tmp_path: Path, arm: str, **top: Any) -> tuple[dict, dict, Path]:
    cfg = validate_config(tiny_config(corpus, **top))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    spec = next(s for s in plan_runs(cfg, "cpu", 1, info) if s["arm"] == arm)
    run_dir = tmp_path / "runs" / spec["run_id"]
    write_json_atomic(run_dir / "run.json", spec)
    summary = train_module.train_run(spec, run_dir)
    return spec, summary, run_dir


# ---- config ------------------------------------------------------------------------------------


def test_default_arm_names_do_not_change_and_several_precisions_name_them() -> None:
    assert validate_config({}).arm_names() == ["layernorm-pre", "rmsnorm-pre"]
    assert validate_config({"precisions": ["bf16"]}).arm_names() == [
        "layernorm-pre",
        "rmsnorm-pre",
    ]
    cfg = validate_config({"precisions": ["fp32", "bf16"]})
    assert cfg.arm_names() == [
        "layernorm-pre-fp32",
        "rmsnorm-pre-fp32",
        "layernorm-pre-bf16",
        "rmsnorm-pre-bf16",
    ]
    assert [q for *_, q in cfg.arm_factors()] == ["fp32", "fp32", "bf16", "bf16"]
    # one norm at two precisions is a comparison too
    assert len(validate_config({"norms": ["rmsnorm"], "precisions": ["fp32", "fp16"]}).arms()) == 2


@pytest.mark.parametrize("bad", ["fp8", "float16", "int8"])
def test_a_non_training_precision_is_refused_naming_the_option(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"precisions: '{bad}' is not a training precision "
                       r"\(--precision\); expected one of fp32, bf16, fp16"):  # fmt: skip
        validate_config({"precisions": ["fp32", bad]})
    with pytest.raises(ValueError, match="precision: 'fp8' is not a training precision"):
        check_precision("fp8")
    with pytest.raises(ConfigError, match="a precision is listed twice"):
        validate_config({"precisions": ["bf16", "bf16"]})


def test_the_cli_refuses_fp8_with_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", "--precision", "fp32,fp8", "--out", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == EXIT_USAGE
    assert "'fp8' is not a training precision (--precision)" in text
    assert not out.exists()


def test_the_flag_help_comes_from_the_config_field() -> None:
    result = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    assert "--precision" in result.output
    assert "training precisions" in " ".join(result.output.split())


# ---- pairing -----------------------------------------------------------------------------------


def test_arms_differing_in_precision_share_their_initial_parameters(
    corpus: Path, tmp_path: Path
) -> None:
    cfg = validate_config(tiny_config(corpus, norms=["rmsnorm"], precisions=["fp32", "bf16"]))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    runs = plan_runs(cfg, "cpu", 1, info)
    assert [r["run_id"] for r in runs] == ["rmsnorm-pre-fp32__s0", "rmsnorm-pre-bf16__s0"]
    assert [r["precision"] for r in runs] == ["fp32", "bf16"]
    assert runs[0]["init_digest"] == runs[1]["init_digest"]
    assert "fp16_init_scale" not in runs[0]  # no scaler setting without fp16


def test_the_pairing_guard_refuses_a_precision_that_changes_initialisation(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A testbed whose initialisation read the precision would unpair the arms: refused."""
    real = grid_module.build_model

    def init_depends_on_precision(spec: dict[str, Any], seed: int) -> torch.nn.Module:
        model = real(spec, seed)
        if spec.get("precision") == "bf16":
            with torch.no_grad():
                model.head.weight.mul_(1.5)
        return model

    monkeypatch.setattr(grid_module, "build_model", init_depends_on_precision)
    cfg = validate_config(tiny_config(corpus, norms=["rmsnorm"], precisions=["fp32", "bf16"]))
    info = prepare_tokens(tmp_path / "data", cfg.data.path)
    with pytest.raises(
        ValueError,
        match=r"paired init: parameter .* differs between arms 'rmsnorm-pre-fp32' and "
        r"'rmsnorm-pre-bf16'",
    ):
        plan_runs(cfg, "cpu", 1, info)


# ---- training ----------------------------------------------------------------------------------


def test_a_bf16_run_records_its_precision(corpus: Path, tmp_path: Path) -> None:
    spec, summary, run_dir = _train(
        corpus, tmp_path, "layernorm-pre-bf16", precisions=["fp32", "bf16"]
    )
    assert spec["precision"] == "bf16"
    assert json.loads((run_dir / "run.json").read_text())["precision"] == "bf16"
    assert summary["status"] == "finished"
    assert summary["precision"] == "bf16"
    assert summary["n_skipped_steps"] == 0
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert all("skipped" not in r for r in records if r["type"] == "train")


def test_autocast_computes_the_forward_in_16_bits() -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast_for("bf16", torch.device("cpu")):
        assert layer(x).dtype == torch.bfloat16
    with autocast_for("fp32", torch.device("cpu")):
        assert layer(x).dtype == torch.float32


def test_fp16_skipped_steps_are_counted_not_divergence(corpus: Path, tmp_path: Path) -> None:
    """With a scale of 2³⁶ the fp16 gradients overflow: the scaler skips and halves the scale
    (2³⁶ → 2³⁵ → …) until they fit; the run finishes, every skip counted, no gradient anomaly."""
    spec, summary, run_dir = _train(
        corpus,
        tmp_path,
        "layernorm-pre",
        precisions=["fp16"],
        fp16_init_scale=2.0**36,
        train={**tiny_config(corpus)["train"], "steps": 40, "eval_interval": 20},
    )
    assert spec["fp16_init_scale"] == 2.0**36
    assert summary["status"] == "finished"
    assert summary["precision"] == "fp16"
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["type"] == "train"]
    skipped = [r["step"] for r in train if r["skipped"]]
    # 2³⁶ → about 2¹⁶: the first steps are all skipped (a later one may be, as gradients grow)
    assert skipped[:10] == list(range(1, 11))
    assert all(r["grad_norm"] is None for r in train if r["skipped"])  # inf, written as null
    assert summary["n_skipped_steps"] == len(skipped) < 40
    anomalies = [r for r in records if r["type"] == "anomaly"]
    assert not [a for a in anomalies if a["kind"] == "nonfinite_grad" or a["step"] in skipped]
    assert not any(r["clipped"] for r in train if r["skipped"])


def test_fp16_with_the_default_scale_skips_nothing_on_a_small_model() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = PrecisionStep("fp16", torch.device("cpu"), opt)
    before = [p.detach().clone() for p in model.parameters()]
    with step.autocast():
        loss = model(torch.randn(4, 8)).float().square().mean()
    outcome = step.run(
        loss, loss.item(), lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
    )
    assert outcome.stepped and not outcome.skipped and step.n_skipped == 0
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


# ---- post-training FP8 -------------------------------------------------------------------------


def test_fp8_rounding_keeps_three_mantissa_bits_per_row_scale() -> None:
    from normlab.experiment.measure.posttrain import FP8_MAX, fp8_quantize

    torch.manual_seed(0)
    v = torch.randn(3, 64)
    v[1] *= 1e4  # another row's scale must not cost this row its precision
    v[2] = 0.0
    q = fp8_quantize(v)
    assert FP8_MAX == 448.0
    assert torch.equal(q[2], torch.zeros(64))
    for row in (0, 1):
        amax = v[row].abs().max()
        assert q[row].abs().max() == pytest.approx(amax.item(), rel=1e-6)  # max maps to 448
        normal = v[row].abs() >= amax / FP8_MAX * 2.0**-6  # E4M3 normals: |v / s| ≥ 2⁻⁶
        rel = ((q[row] - v[row]).abs() / v[row].abs())[normal]
        assert rel.max() <= 2.0**-4 + 1e-6  # E4M3: 3 mantissa bits, half-ulp 2⁻⁴
        assert not torch.equal(q[row], v[row])  # it does round


def test_simulated_fp8_linear_is_close_to_float32_but_not_equal() -> None:
    from normlab.experiment.measure.posttrain import SimulatedFp8Linear, fp8_copy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(5, 7, 64)
    clone, method = fp8_copy(model)
    assert method == "simulated"  # this machine has no FP8 matmul
    assert isinstance(clone[0], SimulatedFp8Linear) and isinstance(model[0], torch.nn.Linear)
    ref, out = model(x), clone(x)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 1e-4 < rel < 0.1
    assert out.dtype == torch.float32 and out.shape == ref.shape


def test_the_posttrain_summary_has_an_fp8_delta(corpus: Path, tmp_path: Path) -> None:
    from normlab.experiment.measure import posttrain as PT

    _, summary, _ = _train(corpus, tmp_path, "rmsnorm-pre")
    assert summary["ptq_fp8_method"] == "simulated"
    assert math.isfinite(summary["ptq_fp8_delta"])
    assert summary["posttrain_errors"] is None or "ptq_fp8_delta" not in summary["posttrain_errors"]
    assert list(PT.POSTTRAIN_FIELDS).index("ptq_fp8_delta") < list(PT.POSTTRAIN_FIELDS).index(
        "bf16_eval_delta"
    )


# ---- analysis and report -----------------------------------------------------------------------


def _compare_in_process(cfg: Any, out: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """What ``train_grid`` writes, with every run trained in this process and the
    post-training step left out (the grid's worker processes cost seconds each)."""
    from normlab.experiment.execution.environment import environment
    from normlab.experiment.execution.own_grid import grid_record
    from normlab.experiment.measure.posttrain import POSTTRAIN_FIELDS
    from normlab.experiment.testbeds.gpt import GPTTestbed

    monkeypatch.setattr(GPTTestbed, "posttrain", lambda *a: dict.fromkeys(POSTTRAIN_FIELDS))
    info = prepare_tokens(out / "data", cfg.data.path)
    runs = plan_runs(cfg, "cpu", 1, info)
    write_json_atomic(out / "experiment.json", grid_record(cfg, runs, info, environment("cpu", 1)))
    summaries = {}
    for spec in runs:
        run_dir = out / "runs" / spec["run_id"]
        write_json_atomic(run_dir / "run.json", spec)
        summaries[spec["run_id"]] = train_module.train_run(spec, run_dir)
        write_json_atomic(run_dir / "summary.json", summaries[spec["run_id"]])
    return summaries


def test_norm_by_precision_is_compared_within_each_factor_and_reported(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from normlab.report import build_report

    cfg = validate_config(
        tiny_config(corpus, seeds=2, precisions=["fp32", "bf16"], norms=["layernorm", "rmsnorm"])
    )
    out = tmp_path / "out"
    summaries = _compare_in_process(cfg, out, monkeypatch)
    assert {s["status"] for s in summaries.values()} == {"finished"}
    assert {s["precision"] for s in summaries.values()} == {"fp32", "bf16"}
    build_report(out)
    analysis = json.loads((out / "summary.json").read_text())
    families = {
        (f["factor"], tuple(f["fixed"].items())): (f["baseline"], f["arms"])
        for f in analysis["families"]
    }
    assert families == {
        ("norm", (("precision", "fp32"),)): (
            "layernorm-pre-fp32",
            ["layernorm-pre-fp32", "rmsnorm-pre-fp32"],
        ),
        ("norm", (("precision", "bf16"),)): (
            "layernorm-pre-bf16",
            ["layernorm-pre-bf16", "rmsnorm-pre-bf16"],
        ),
        ("precision", (("norm", "layernorm"),)): (
            "layernorm-pre-fp32",
            ["layernorm-pre-fp32", "layernorm-pre-bf16"],
        ),
        ("precision", (("norm", "rmsnorm"),)): (
            "rmsnorm-pre-fp32",
            ["rmsnorm-pre-fp32", "rmsnorm-pre-bf16"],
        ),
    }
    fam = next(f for f in analysis["families"] if f["fixed"] == {"norm": "rmsnorm"})
    c = fam["comparisons"]["rmsnorm-pre-bf16"]["final_val_bpb"]
    runs = {s["run_id"]: s for s in summaries.values()}
    diffs = [
        runs[f"rmsnorm-pre-bf16__s{k}"]["final_val_bpb"]
        - runs[f"rmsnorm-pre-fp32__s{k}"]["final_val_bpb"]
        for k in (0, 1)
    ]
    assert c["mean_diff"] == pytest.approx(sum(diffs) / 2)
    assert analysis["arm_info"]["rmsnorm-pre-bf16"]["precision"] == "bf16"
    report = (out / "report.md").read_text()
    assert "## Comparisons by factor" in report
    assert "**precision at norm = rmsnorm**" in report
    assert "**norm at precision = bf16**" in report
    assert "precision = fp32, bf16" in report  # the varied factors
    assert "## Norm health" in report and (out / "plots" / "norm_health.png").is_file()
    assert "No layer flagged" in report
    html = (out / "report.html").read_text()
    assert 'id="factors"' in html and 'id="health"' in html


def test_a_single_factor_has_no_families_and_the_default_arms_record_fp32(
    corpus: Path, tmp_path: Path
) -> None:
    spec, summary, _ = _train(corpus, tmp_path, "rmsnorm-pre")
    assert spec["run_id"] == "rmsnorm-pre__s0" and spec["precision"] == "fp32"
    assert summary["precision"] == "fp32" and summary["n_skipped_steps"] == 0


def test_fp8_falls_back_to_the_simulation_where_torchao_fp8_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Told the device has FP8 matmuls, the CPU still cannot run torchao's FP8 (it refuses below
    compute capability 8.9): the delta comes from the simulation, labelled so."""
    from normlab.experiment.measure import posttrain as PT

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(16, 32)

    def metric(m: torch.nn.Module) -> float:
        return m(x).square().mean().item()

    monkeypatch.setattr(PT, "_device_runs_fp8", lambda m: True)
    with pytest.raises(Exception):  # noqa: B017 - whatever torchao raises on this device
        PT.fp8_copy(model, simulate=False)
    delta, method = PT.fp8_delta(model, metric, metric(model))
    assert method == "simulated" and delta != 0.0 and math.isfinite(delta)
    sim, _ = PT.fp8_copy(model, simulate=True)
    assert delta == pytest.approx(metric(sim) - metric(model))


def test_the_report_says_when_fp8_was_simulated() -> None:
    from normlab.report.content import _fp8_note

    assert _fp8_note({"environment": {}}) == []
    assert _fp8_note({"environment": {"runs_ptq_fp8_method": ["torchao"]}}) == []
    (line,) = _fp8_note({"environment": {"runs_ptq_fp8_method": ["simulated"]}})
    assert line.startswith("FP8 PTQ degradation was SIMULATED in every run")
    (line,) = _fp8_note({"environment": {"runs_ptq_fp8_method": ["simulated", "torchao"]}})
    assert "some runs" in line
