"""``normlab report --import``: a tiny store of each kind, written by the tracker's own library
(TensorBoard's ``SummaryWriter`` through PyTorch, MLflow's file store, W&B offline runs) or as a
plain CSV / JSON Lines table, is imported and judged.

Every store holds the same runs: arms ``ln`` and ``rms`` × seeds 0 and 1, ``val/loss`` at steps
2 and 4 and ``loss`` at steps 1–4 (:data:`CURVES`), plus one run whose name the rules do not
match; the imported summaries must hold the values logged and the analysis a paired verdict.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from normlab.analysis.runs import load_compare_folder
from normlab.analysis.summary import analyze
from normlab.run_format.folder import read_experiment, read_records, read_summary
from normlab.run_format.imported import import_record
from normlab.trackers.importing import import_runs

ARMS = ("ln", "rms")
SEEDS = (0, 1)
STEPS = (1, 2, 3, 4)
EVAL_STEPS = (2, 4)


def _val(arm: str, seed: int, step: int) -> float:
    """A validation loss that falls with the step, with a per-seed offset shared by the arms
    (the pairing) and a small arm effect."""
    return 3.0 / step + 0.05 * seed + (0.01 if arm == "rms" else 0.0) + 0.001 * step * seed


def _loss(arm: str, seed: int, step: int) -> float:
    return 4.0 / step + 0.02 * seed + (0.005 if arm == "rms" else 0.0)


CURVES: dict[tuple[str, int], dict[str, list[tuple[int, float]]]] = {
    (arm, seed): {
        "val/loss": [(s, _val(arm, seed, s)) for s in EVAL_STEPS],
        "loss": [(s, _loss(arm, seed, s)) for s in STEPS],
    }
    for arm in ARMS
    for seed in SEEDS
}
"""{(arm, seed): {metric: [(step, value)]}}: what every store holds."""
STRAY = "scratch-run"
"""A run in every store whose name no rule matches."""
NAME_RULES = (r"^(ln|rms)_s\d+$", r"_s(\d+)$")


def _name(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def _check_imported(out: Path, skipped: list[str]) -> dict[str, Any]:
    """The imported folder holds every run with the values logged (to float32's precision, as
    TensorBoard stores them), lists the stray run as skipped, and gets a paired verdict."""
    record = import_record(read_experiment(out))
    assert record is not None
    assert [s["run"] for s in record["skipped"]] == skipped
    paired = {k: v for k, v in record["seeds"].items() if int(k) in SEEDS}
    assert paired == {str(s): {a: STEPS[-1] for a in ARMS} for s in SEEDS}
    for (arm, seed), curves in CURVES.items():
        run = out / "runs" / f"{arm}__s{seed}"
        summary = read_summary(run)
        assert summary is not None and summary["status"] == "finished", summary
        values = [v for _, v in curves["val/loss"]]
        assert summary["final_val_loss"] == pytest.approx(values[-1], rel=1e-6)
        assert summary["best_val_loss"] == pytest.approx(min(values), rel=1e-6)
        assert summary["final_train_loss"] == pytest.approx(curves["loss"][-1][1], rel=1e-6)
        evals = read_records(run, "eval")
        assert [r["step"] for r in evals] == list(EVAL_STEPS)
        assert [r["step"] for r in read_records(run, "train")] == list(STEPS)
    analysis = analyze(load_compare_folder(out))
    comparison = analysis["comparisons"]["rms"]["final_val_loss"]
    assert comparison["n_pairs"] == len(SEEDS)
    assert comparison["mean_diff"] == pytest.approx(0.01, abs=1e-5)
    return analysis


def test_tensorboard_summary_writer(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    logs = tmp_path / "tb"
    for (arm, seed), curves in CURVES.items():
        with SummaryWriter(log_dir=str(logs / _name(arm, seed))) as writer:
            for metric, points in curves.items():
                for step, value in points:
                    writer.add_scalar(metric, value, step)
    with SummaryWriter(log_dir=str(logs / STRAY)) as writer:
        writer.add_scalar("val/loss", 1.0, 1)
    out = tmp_path / "out"
    plan = import_runs(f"tensorboard:{logs}", *NAME_RULES, "val/loss", out, margin=0.05)
    assert plan.arms == ["ln", "rms"] and plan.seeds == [0, 1]
    _check_imported(out, [STRAY])


def test_mlflow_file_store_with_param_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 writes a file store so
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.create_experiment("norms")
    for i, ((arm, seed), curves) in enumerate(sorted(CURVES.items())):
        run = client.create_run(experiment, run_name=f"trial-{i}")
        client.log_param(run.info.run_id, "norm", arm)
        client.log_param(run.info.run_id, "seed", seed)
        for metric, points in curves.items():
            for step, value in points:
                client.log_metric(run.info.run_id, metric, value, step=step)
        client.set_terminated(run.info.run_id)
    failed = client.create_run(experiment, run_name="trial-failed")
    client.log_param(failed.info.run_id, "norm", "rms")
    client.log_param(failed.info.run_id, "seed", 2)
    client.log_metric(failed.info.run_id, "val/loss", 9.0, step=4)
    client.set_terminated(failed.info.run_id, status="FAILED")
    stray = client.create_run(experiment, run_name=STRAY)  # no params: the rules skip it
    client.log_metric(stray.info.run_id, "val/loss", 1.0, step=1)
    client.set_terminated(stray.info.run_id)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")

    out = tmp_path / "out"
    import_runs(f"mlflow:{store}", "param:norm", "param:seed", "val/loss", out, margin=0.05)
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set only while reading
    crashed = read_summary(out / "runs" / "rms__s2")
    assert crashed is not None and crashed["status"] == "crashed"
    assert "MLflow recorded the run as FAILED" in crashed["error"]
    record = import_record(read_experiment(out))
    assert record is not None and record["status_recorded"]
    assert record["seeds"]["2"] == {"rms": 4}  # seed 2 has no ln run: unpaired
    assert "param:norm" in record["skipped"][0]["reason"]
    _check_imported(out, [STRAY])


def test_wandb_offline_runs_with_config_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # wandb.init sets it; undone after
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # wandb.init replaces it
    settings = wandb.Settings(
        silent=True, console="off", x_disable_stats=True, disable_git=True, save_code=False
    )
    runs = [(_name(a, s), {"norm": a, "seed": s}, CURVES[a, s], 0) for a, s in sorted(CURVES)]
    runs.append((STRAY, {}, {"val/loss": [(1, 1.0)]}, 0))
    runs.append(("broken", {"norm": "ln", "seed": 7}, {"val/loss": [(1, 1.0)]}, 3))
    try:
        for name, config, curves, exit_code in runs:
            run = wandb.init(
                mode="offline", dir=tmp_path, project="norms", name=name, config=config,
                settings=settings,
            )  # fmt: skip
            for step in STEPS:
                logged = {m: v for m, points in curves.items() for s, v in points if s == step}
                if logged:
                    run.log(logged, step=step)
            run.finish(exit_code=exit_code)
    finally:
        wandb.teardown()  # stops wandb's service process
    out = tmp_path / "out"
    import_runs(
        f"wandb:{tmp_path / 'wandb'}", "config:norm", "config:seed", "val/loss", out, margin=0.05
    )
    broken = read_summary(out / "runs" / "ln__s7")
    assert broken is not None and broken["status"] == "crashed"
    assert "exit code 3" in broken["error"]
    record = import_record(read_experiment(out))
    assert record is not None and record["seeds"]["7"] == {"ln": 1}
    _check_imported(out, [STRAY])


def test_csv_long_layout(tmp_path: Path) -> None:
    table = tmp_path / "runs.csv"
    lines = ["run,step,metric,value"]
    for (arm, seed), curves in CURVES.items():
        for metric, points in curves.items():
            lines += [f"{_name(arm, seed)},{step},{metric},{value!r}" for step, value in points]
    lines.append(f"{STRAY},1,val/loss,1.0")
    table.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    import_runs(f"csv:{table}", *NAME_RULES, "val/loss", out, margin=0.05)
    _check_imported(out, [STRAY])


def test_jsonl_wide_layout_one_file_per_run(tmp_path: Path) -> None:
    """No run column: each file is a run, named by its path under PATH (a Lightning-like
    ``<run>/metrics.jsonl``); a step without a metric leaves it out (null or absent)."""
    logs = tmp_path / "logs"
    for (arm, seed), curves in CURVES.items():
        folder = logs / _name(arm, seed)
        folder.mkdir(parents=True)
        rows = []
        for step in STEPS:
            row: dict[str, Any] = {"step": step, "val/loss": None}
            row.update({m: v for m, points in curves.items() for s, v in points if s == step})
            rows.append(json.dumps(row))
        (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (logs / f"{STRAY}.jsonl").write_text('{"step": 1, "val/loss": 1.0}\n', encoding="utf-8")
    out = tmp_path / "out"
    import_runs(
        f"jsonl:{logs}", r"^(ln|rms)_s\d+/", r"_s(\d+)/metrics$", "val/loss", out, margin=0.05
    )
    analysis = _check_imported(out, [STRAY])
    train = analysis["comparisons"]["rms"]["final_train_loss"]
    assert train["mean_diff"] == pytest.approx(0.005)
