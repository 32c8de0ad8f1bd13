"""Re-running ``normlab compare`` on a folder: refusals leave it untouched, and runs the new
command does not plan (fewer seeds) stay out of the analysis.

The finished runs are written by hand (their planned ``run.json`` and a ``finished`` summary), so
no test here trains anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from normlab._io import write_json_atomic
from normlab.analysis import load_compare_folder
from normlab.cli import app
from normlab.data import prepare_tokens
from normlab.experiment.config import validate_config
from normlab.experiment.execution.environment import environment
from normlab.experiment.execution.grid import check_only_factors_differ, plan_runs
from normlab.experiment.execution.own_grid import grid_record
from normlab.run_format import EXPERIMENT_FILE
from normlab.study.loader import build_config_dict

TINY = {
    "device": "cpu",
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"steps": 2, "batch_size": 2, "eval_interval": 2, "eval_windows": 4, "warmup": 1},
}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    """(config file, corpus file)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(300)))
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return config, corpus


def fake_finished_folder(out: Path, config: Path, corpus: Path, seeds: int) -> list[str]:
    """Write what a finished ``compare`` leaves in ``out`` (without metrics); returns run ids."""
    cfg = validate_config(build_config_dict(config, {"data.path": str(corpus), "seeds": seeds}))
    data_info = prepare_tokens(out / "data", cfg.data.path, cfg.data.max_bytes)
    runs = plan_runs(cfg, "cpu", 1, data_info)
    for spec in runs:
        run_dir = out / "runs" / spec["run_id"]
        write_json_atomic(run_dir / "run.json", spec)
        summary: dict[str, Any] = {
            k: spec[k] for k in ("run_id", "arm", "seed", "norm", "placement")
        }
        write_json_atomic(run_dir / "summary.json", {**summary, "status": "finished"})
    record = grid_record(cfg, runs, data_info, environment("cpu", 1))
    write_json_atomic(out / EXPERIMENT_FILE, record)
    return [r["run_id"] for r in runs]


def file_states(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.output


def test_a_refused_rerun_changes_nothing(setup: tuple[Path, Path], tmp_path: Path) -> None:
    config, corpus = setup
    out = tmp_path / "out"
    fake_finished_folder(out, config, corpus, seeds=1)
    before = file_states(out)
    common = ("--config", str(config), "--data", str(corpus), "--seeds", "1", "--out", str(out))
    code, output = invoke(*common, "--lr", "0.001", "--no-report")
    assert code == 1, output
    flat = " ".join(output.split())
    assert "already holds the finished run 'layernorm-pre__s0'" in flat
    assert "train.lr = 0.005; this command asks for train.lr = 0.001" in flat
    assert file_states(out) == before
    assert json.loads((out / EXPERIMENT_FILE).read_text())["config"]["train"]["lr"] == 0.005
    code, output = invoke(*common, "--no-report")  # the same settings: nothing to retrain
    assert code == 0, output
    assert "2 of 2 runs already done" in output


def test_fewer_seeds_leave_the_other_runs_out(setup: tuple[Path, Path], tmp_path: Path) -> None:
    config, corpus = setup
    out = tmp_path / "out"
    all_runs = fake_finished_folder(out, config, corpus, seeds=2)
    assert len(load_compare_folder(out).runs) == 4
    code, output = invoke(
        "--config", str(config), "--data", str(corpus), "--seeds", "1", "--out", str(out),
        "--no-report",
    )  # fmt: skip
    assert code == 0, output
    flat = " ".join(output.split())
    assert "also holds 2 runs that this command does not plan" in flat
    assert "left out of the analysis and report" in flat
    experiment = json.loads((out / EXPERIMENT_FILE).read_text())
    assert experiment["seeds"] == [0]
    folder = load_compare_folder(out)
    assert sorted(r.run_id for r in folder.runs) == ["layernorm-pre__s0", "rmsnorm-pre__s0"]
    assert folder.ignored_runs == ("layernorm-pre__s1", "rmsnorm-pre__s1")
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(all_runs)  # kept


def test_unpaired_message_lists_what_may_differ() -> None:
    a = {"run_id": "a__s0", "arm": "a", "train": {"lr": 1.0}}
    b = {"run_id": "b__s0", "arm": "b", "train": {"lr": 2.0}}
    with pytest.raises(ValueError) as err:
        check_only_factors_differ([a, b], allowed=("run_id", "arm"))
    assert "differ in 'train.lr' (1.0 vs 2.0); only arm, run_id may differ." in str(err.value)
    with pytest.raises(ValueError) as err:
        check_only_factors_differ([a, {**a, "train": {"lr": 2.0}}], allowed=())
    message = str(err.value)
    assert "nothing may differ" in message and "only  may" not in message
