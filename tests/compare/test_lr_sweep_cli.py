"""``normlab compare --lr-sweep``: each arm at its own best learning rate, alone and in a ladder;
the per-arm rates of the grid; the refusals; resuming; ``--ladder`` with ``--until-decided``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from normlab.cli import app
from normlab.experiment.config import ConfigError, validate_config
from normlab.experiment.execution import executors
from normlab.experiment.execution.grid import plan_runs
from normlab.experiment.execution.run_loop import finished_runs
from normlab.experiment.execution.worker import execute_run
from normlab.experiment.testbeds import build_model
from normlab.report import build_report
from normlab.run_format import (
    ANALYSIS_FILE,
    LADDER_KEY,
    LR_SWEEP_DIR,
    LR_SWEEP_KEY,
    check_ladder,
    check_lr_sweep_record,
    plot_path,
)
from normlab.run_format import folder as run_folder
from normlab.study.loader import study_configs

TINY: dict[str, Any] = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 2, "warmup": 1},
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(4):
        (root / f"m{i}.py").write_text(
            "".join(f"def fn_{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(80))
        )
    return root


def _invoke(tmp_path: Path, corpus: Path, *args: str) -> tuple[int, str]:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "data": {"path": str(corpus)}}))
    result = CliRunner().invoke(app, ["compare", "--config", str(config), *args])
    return result.exit_code, result.output


class InProcess:
    """The local executor's work without its worker processes (each costs seconds): every run
    not done is written and trained in this process; ``trained`` counts them."""

    name = "local"

    def __init__(self) -> None:
        self.trained: list[str] = []

    def run(self, runs, out, parallel, console, show_progress):
        summaries = finished_runs(runs, out)
        for spec in runs:
            if spec["run_id"] not in summaries:
                run_folder.create_run(out, spec)
                summaries[spec["run_id"]] = execute_run(run_folder.run_dir(out, spec["run_id"]))
                self.trained.append(f"{out.parent.name}/{out.name}/{spec['run_id']}")
        return {r["run_id"]: summaries[r["run_id"]] for r in runs}


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> InProcess:
    from normlab.experiment.measure.posttrain import POSTTRAIN_FIELDS
    from normlab.experiment.testbeds.gpt import GPTTestbed

    executor = InProcess()
    monkeypatch.setattr(executors, "make_executor", lambda scale, on_result=None: executor)
    monkeypatch.setattr(GPTTestbed, "posttrain", lambda *a: dict.fromkeys(POSTTRAIN_FIELDS))
    return executor


# ---- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--lr-sweep", "0.01"], "--lr-sweep"),
        (["--lr-sweep", "0.01,-0.003"], "--lr-sweep"),
        (["--lr-sweep", "0.01,0"], "--lr-sweep"),
        (["--lr-sweep", "0.01,1e-2"], "--lr-sweep"),
        (["--lr-sweep", "0.01,fast"], "--lr-sweep"),
        (["--lr-sweep", "0.01,inf"], "--lr-sweep"),
        (["--lr-sweep", "0.001,0.01", "--tuning-seeds", "0"], "--tuning-seeds"),
        (["--tuning-seeds", "2"], "--tuning-seeds"),
        (["--lr-sweep", "0.001,0.01", "--lr", "0.003"], "--lr"),
        (["--lr-sweep", "0.001,0.01", "--plan"], "--plan"),
        (["--ladder", "d_model=8,16", "--seeds", "2", "--lr-sweep", "0.01"], "--lr-sweep"),
        (
            ["--ladder", "d_model=8,16", "--seeds", "2", "--lr-sweep", "1e-3,1e-2", "--plan"],
            "--plan",
        ),
        (["--ladder", "d_model=8,16", "--seeds", "2", "--tuning-seeds", "1"], "--tuning-seeds"),
    ],
)
def test_bad_sweeps_are_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, corpus: Path, args: list[str], option: str
) -> None:
    out = tmp_path / "out"
    code, output = _invoke(tmp_path, corpus, *args, "--out", str(out))
    lines = output.strip().splitlines()
    assert code != 0
    assert len(lines) == 1 and f"{option}:" in lines[0], output
    assert not out.exists()


def test_a_yaml_sweep_is_checked_by_the_same_rules(tmp_path: Path, corpus: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**TINY, "lr_sweep": [0.01], "tuning_seeds": 1}))
    result = CliRunner().invoke(app, ["compare", "--config", str(config), "--out", "o"])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert "--lr-sweep: expected at least two learning rates" in result.output
    with pytest.raises(ValueError, match="--lr: one learning rate for every arm"):
        study_configs({"lr_sweep": [0.001, 0.01], "train": {"lr": 0.003}})
    with pytest.raises(ConfigError, match=r"train\.arm_lr: 'dyt-pre' is not an arm"):
        validate_config({"train": {"arm_lr": {"dyt-pre": 0.01}}})
    sweep = study_configs({"lr_sweep": [1e-3, 1e-2]}).sweep
    assert sweep is not None and sweep.tuning_seeds == 2
    with pytest.raises(ConfigError, match=r"unknown key 'lr_sweep'"):  # not one compare's key
        validate_config({"lr_sweep": [1e-3, 1e-2]})


# ---- per-arm learning rates --------------------------------------------------------------


def test_each_arm_trains_at_its_own_rate_from_the_same_start(tmp_path: Path, corpus: Path) -> None:
    from normlab.data import prepare_tokens

    rates = {"layernorm-pre": 0.002, "rmsnorm-pre": 0.02}
    cfg = validate_config(
        {
            **TINY,
            "seeds": 1,
            "data": {"path": str(corpus)},
            "train": {**TINY["train"], "steps": 3, "arm_lr": rates},
        }
    )
    runs = plan_runs(cfg, "cpu", 1, prepare_tokens(tmp_path / "out" / "data", str(corpus)))
    assert {r["arm"]: r["train"]["lr"] for r in runs} == rates
    assert all("arm_lr" not in r["train"] for r in runs)
    assert len({r["init_digest"] for r in runs}) == 1
    models = {r["arm"]: build_model(r, r["seed"]) for r in runs}
    norms = {a: set(m.norm_parameter_names()) for a, m in models.items()}
    shared = [
        (name, p)
        for name, p in models["layernorm-pre"].named_parameters()
        if name not in norms["layernorm-pre"]
    ]
    other = dict(models["rmsnorm-pre"].named_parameters())
    assert shared and all(torch.equal(p, other[name]) for name, p in shared)
    for r in runs:  # trained: the schedule peaks at step `warmup` at the arm's own rate
        run_folder.create_run(tmp_path / "out", r)
        summary = execute_run(run_folder.run_dir(tmp_path / "out", r["run_id"]))
        assert summary["status"] == "finished", summary
        records = run_folder.read_records(run_folder.run_dir(tmp_path / "out", r["run_id"]))
        peak = [x["lr"] for x in records if x["type"] == "train" and x["step"] == 1]
        assert peak == [pytest.approx(rates[r["arm"]])]


# ---- end to end ----------------------------------------------------------------------------


def test_tiny_ladder_with_a_sweep_end_to_end_and_resumed(
    tmp_path: Path, corpus: Path, in_process: InProcess
) -> None:
    out = tmp_path / "out"
    args = ["--ladder", "d_model=8,16", "--seeds", "2", "--steps", "2", "--out", str(out)]
    sweep = ["--lr-sweep", "0.001,0.03", "--tuning-seeds", "1"]
    code, first = _invoke(tmp_path, corpus, *args, *sweep, "--no-report")
    assert code == 0, first
    assert "the sweep's highest" in first or "the sweep's lowest" in first  # 2 rates: an edge
    assert len(in_process.trained) == 2 * 2 * 2 + 2 * 2 * 2  # tuning + evaluation runs

    in_process.trained.clear()  # the same command again: every run is reused, reports built
    code, output = _invoke(tmp_path, corpus, *args, *sweep)
    assert code == 0, output
    assert in_process.trained == []
    ladder = json.loads((out / ANALYSIS_FILE).read_text())[LADDER_KEY]
    check_ladder(ladder)
    lr = ladder["learning_rates"]
    assert lr["tuning_seeds"] == [2]  # after the evaluation seeds 0, 1
    assert list(lr["settings"]) == ["d_model=8", "d_model=16"]  # sp: every rung is swept
    assert lr["chosen_at"] == {"d_model=8": "d_model=8", "d_model=16": "d_model=16"}
    for setting, by_arm in lr["settings"].items():
        for arm, curve in by_arm.items():
            assert [p["rate"] for p in curve["points"]] == [0.001, 0.03]
            assert all(p["n"] + p["n_diverged"] == 1 for p in curve["points"])
            best = min((p for p in curve["points"] if not p["n_diverged"]), key=lambda p: p["mean"])
            assert curve["best"] == best["rate"] == lr["chosen"][setting][arm]
            assert curve["edge"] is not None
            tuning = run_folder.sweep_path(out, best["rate"], setting) / "runs" / f"{arm}__s2"
            assert (tuning / "summary.json").is_file()
        experiment = run_folder.read_experiment(out / setting)
        assert experiment["learning_rates"] == lr["chosen"][setting]
        assert "train.lr" not in experiment["fixed"]
        for seed in (0, 1):
            for arm in by_arm:
                spec = run_folder.read_run_config(out / setting / "runs" / f"{arm}__s{seed}")
                assert spec["train"]["lr"] == lr["chosen"][setting][arm]
        assert "each arm at its own best rate" in (out / setting / "report.md").read_text()
    assert (out / plot_path("lr_sweep")).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "## Learning rates" in report and "extend --lr-sweep" in report
    page = (out / "report.html").read_text(encoding="utf-8")  # the same section, its figure
    assert '<h2 id="learning-rates">Learning rates</h2>' in page
    assert '<img alt="Loss against learning rate" src="data:image/png;base64,' in page
    last = output.strip().splitlines()[-1]
    assert last == ladder["arms"]["rmsnorm-pre"]["prediction"]["sentence"]


def test_tuning_seeds_stay_clear_of_every_seed_the_rounds_may_add() -> None:
    from normlab.study.spec import RoundsSpec
    from normlab.study.sweep import sweep_seeds

    cfg, _, sweep = study_configs({"seeds": 3, "lr_sweep": [1e-3, 1e-2], "tuning_seeds": 2})
    assert sweep is not None
    assert sweep_seeds(cfg, sweep, None) == [3, 4]
    assert sweep_seeds(cfg, sweep, RoundsSpec(8, 60.0)) == [8, 9]
    listed, _, sweep = study_configs({"seeds": [5, 1], "lr_sweep": [1e-3, 1e-2]})
    assert sweep is not None
    assert sweep_seeds(listed, sweep, RoundsSpec(4, 60.0)) == [6, 7]  # seeds 5, 1, 0, 2 evaluate


def test_a_ladder_until_decided_runs_the_rounds_in_each_rung(
    tmp_path: Path, corpus: Path, in_process: InProcess
) -> None:
    from normlab.analysis.ladder_folder import analyze_ladder
    from normlab.run_format import SEQUENTIAL_FILE

    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--ladder", "d_model=8,16", "--seeds", "2", "--steps", "2",
        "--until-decided", "--max-seeds", "3", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    seeds = {}
    for setting in ("d_model=8", "d_model=16"):
        state = json.loads((out / setting / SEQUENTIAL_FILE).read_text())
        assert state["looks"][0]["n_seeds"] == 2
        seeds[setting] = run_folder.read_experiment(out / setting)["seeds"]
        assert seeds[setting] in ([0, 1], [0, 1, 2])
        assert seeds[setting] == list(range(state["looks"][-1]["n_seeds"]))
    rungs = analyze_ladder(out, n_boot=200)["arms"]["rmsnorm-pre"]["rungs"]
    assert {r["setting"]: r["n"] for r in rungs} == {s: len(v) for s, v in seeds.items()}


def test_a_sweep_without_a_ladder_compares_each_arm_at_its_best_rate(
    tmp_path: Path, corpus: Path, in_process: InProcess
) -> None:
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--seeds", "1", "--steps", "2", "--lr-sweep", "0.001,0.03",
        "--tuning-seeds", "1", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert len(in_process.trained) == 2 * 2 + 2
    chosen = run_folder.read_experiment(out)["learning_rates"]
    for arm, rate in chosen.items():
        assert run_folder.read_run_config(out / "runs" / f"{arm}__s0")["train"]["lr"] == rate
        tuning = {
            r: run_folder.read_summary(run_folder.sweep_path(out, r) / "runs" / f"{arm}__s1")
            for r in (0.001, 0.03)
        }
        finished = {r: s["final_val_bpb"] for r, s in tuning.items() if s["status"] == "finished"}
        assert rate == min(finished, key=finished.__getitem__)
    shown = ", ".join(f"{a} {r:g}" for a, r in chosen.items())
    assert f"this size: each arm at its own best rate: {shown}" in output

    # the report reads the tuning folders again: summary.json's record, the section, the figure
    build_report(out)
    summary = json.loads((out / ANALYSIS_FILE).read_text())
    record = summary[LR_SWEEP_KEY]
    check_lr_sweep_record(record)
    assert record["tuning_seeds"] == [1] and record["chosen"] == {"this size": chosen}
    assert [p["rate"] for p in record["settings"]["this size"]["layernorm-pre"]["points"]] == [
        0.001,
        0.03,
    ]
    assert (out / plot_path("lr_sweep")).stat().st_size > 0
    for report in ("report.md", "report.html"):
        text = (out / report).read_text()
        assert (
            "Learning rates" in text
            and f"this size: each arm at its own best rate: {shown}" in text
        )
    assert "![" in (out / "report.md").read_text().split("Learning rates", 1)[1]

    # the same folder without its tuning folders: no such key, no figure, nothing else changes
    bare = tmp_path / "bare"
    shutil.copytree(out, bare, ignore=shutil.ignore_patterns(LR_SWEEP_DIR))
    build_report(bare)
    plain = json.loads((bare / ANALYSIS_FILE).read_text())
    assert LR_SWEEP_KEY not in plain
    del summary[LR_SWEEP_KEY]
    assert plain == summary
    assert not (bare / plot_path("lr_sweep")).exists()
    assert "Learning rates" not in (bare / "report.md").read_text()

    # tuning folders that choose other rates than the comparison ran stop the report, naming them
    experiment = run_folder.read_experiment(out)
    other = {a: (0.03 if r == 0.001 else 0.001) for a, r in chosen.items()}
    run_folder.write_experiment(out, {**experiment, "learning_rates": other})
    with pytest.raises(ValueError, match=r"lr-sweep/: the tuning folders .* choose other rates"):
        build_report(out)
