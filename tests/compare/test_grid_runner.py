"""One grid runner for every kind of grid: the config's shared base, the kind it chooses, the one
experiment.json builder, the one executor loop (with a stand-in starter, no processes) and the
per-run line worded by the run's testbed format."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from normlab.experiment.config import ExperimentConfig, ScriptConfig
from normlab.experiment.execution.kinds import GRID_KINDS, grid_kind, recorded_kind
from normlab.experiment.execution.own_grid import OwnGrid
from normlab.experiment.execution.run_loop import (
    Crash,
    GridStopped,
    Started,
    outcome_line,
    train_runs,
)
from normlab.experiment.execution.script_grid import ScriptGrid
from normlab.run_format import run_id
from normlab.run_format.experiment_record import experiment_record, factor_split
from normlab.run_format.folder import read_summary, run_dir

COMMAND = "python train.py --norm {norm} --seed {seed} --out {run_dir}"


def _script(**kw: Any) -> ScriptConfig:
    return ScriptConfig(command=COMMAND, metric="acc", lower_is_better=False, **kw)


# ---- the shared config base and the kind it chooses ------------------------------------------


def test_both_configs_name_arms_seeds_and_baseline_by_one_rule() -> None:
    factors = {"norms": ["layernorm", "rmsnorm"], "precisions": ["fp32", "bf16"], "seeds": [4, 2]}
    own, script = ExperimentConfig(**factors), _script(**factors)
    assert own.arm_factors() == script.arm_factors()
    assert own.arm_names() == [
        "layernorm-pre-fp32",
        "rmsnorm-pre-fp32",
        "layernorm-pre-bf16",
        "rmsnorm-pre-bf16",
    ]
    assert own.seed_list() == script.seed_list() == [4, 2]
    assert own.baseline_arm() == script.baseline_arm() == "layernorm-pre-fp32"
    assert ExperimentConfig(seeds=3).seed_list() == [0, 1, 2]
    named = {"norms": ["layernorm", "rmsnorm"], "baseline": "rmsnorm-pre"}
    assert ExperimentConfig(**named).baseline_arm() == _script(**named).baseline_arm()


def test_a_baseline_that_is_no_arm_is_refused_in_the_same_words() -> None:
    bad = {"norms": ["layernorm", "rmsnorm"], "baseline": "dyt-pre"}
    messages = []
    for build in (ExperimentConfig, _script):
        with pytest.raises(ValueError, match="baseline") as err:
            build(**bad)
        messages.append(str(err.value).split("baseline: ", 1)[1].splitlines()[0])
    assert messages[0] == messages[1], messages
    assert "'dyt-pre' is not an arm; expected one of layernorm-pre, rmsnorm-pre" in messages[0]


def test_the_config_chooses_its_kind() -> None:
    own = grid_kind(ExperimentConfig())
    script = grid_kind(_script(norms=["a", "b"]))
    assert type(own) is OwnGrid and type(script) is ScriptGrid
    assert set(GRID_KINDS) == {ExperimentConfig.grid_kind, ScriptConfig.grid_kind}
    assert recorded_kind({"testbed": "script:val_loss:min"}) is ScriptGrid  # from the folder
    assert recorded_kind({"testbed": "dit"}) is recorded_kind({}) is OwnGrid
    assert OwnGrid.after_planned_run(Path("o"), "a-pre__s0", Console()) == ["a-pre__s0"]
    assert own.exports_each_run and not script.exports_each_run
    summaries = {
        "a-pre__s0": {"seed": 0, "status": "finished"},
        "b-pre__s0": {"seed": 0, "status": "finished"},
        "a-pre__s1": {"seed": 1, "status": "finished"},
        "b-pre__s1": {"seed": 1, "status": "crashed"},
    }
    assert own.settled(summaries) == list(summaries)
    assert script.settled(summaries) == ["a-pre__s0", "b-pre__s0"]  # seed 1 is not complete


# ---- experiment.json, built once -------------------------------------------------------------


def test_factor_split_varies_what_has_several_values_else_the_norm() -> None:
    assert factor_split({"norm": ["a", "b"], "placement": ["pre"], "precision": ["fp32"]}) == (
        {"norm": ["a", "b"]},
        {"placement": "pre", "precision": "fp32"},
    )
    assert factor_split({"norm": ["a"], "placement": ["pre", "post"]}) == (
        {"placement": ["pre", "post"]},
        {"norm": "a"},
    )
    assert factor_split({"norm": ["a"], "placement": ["pre"]}) == (
        {"norm": ["a"]},
        {"placement": "pre"},
    )


def test_the_record_puts_the_margin_under_the_testbeds_key_and_its_kind_last() -> None:
    common: dict[str, Any] = {
        "arms": ["a", "b"],
        "baseline_arm": "a",
        "seeds": [0],
        "margin": 0.5,
        "factors": {"norm": ["a", "b"]},
        "settings": {"x.y": 1},
        "config": {},
        "environment": {},
        "runs": ["a__s0", "b__s0"],
    }
    gpt = experiment_record(testbed="gpt", extra={"z": 1}, **common)
    assert list(gpt) == [
        "testbed", "arms", "baseline_arm", "seeds", "margin_bpb", "target_val_loss", "varied",
        "fixed", "config", "environment", "data", "runs", "z",
    ]  # fmt: skip
    assert gpt["fixed"] == {"x.y": 1} and gpt["data"] == {} and gpt["margin_bpb"] == 0.5
    assert "margin_val_loss" in experiment_record(testbed="dit", **common)
    assert experiment_record(testbed="script:acc:max", **common)["margin"] == 0.5


def test_a_script_grid_records_what_the_analysis_reads() -> None:
    cfg = _script(norms=["a", "b"], seeds=2, equivalence_margin=0.01)
    kind = ScriptGrid(cfg)
    kind.check(Path("."))
    runs = kind.plan(Path("."), Console(quiet=True))
    record = kind.record(runs)
    assert record["testbed"] == "script:acc:max" and record["margin"] == 0.01
    assert record["varied"] == {"norm": ["a", "b"]}
    assert record["fixed"] == {
        "placement": "pre",
        "precision": "fp32",
        "script.command": COMMAND,
        "script.metric": "acc",
    }
    assert record["runs"] == ["a-pre__s0", "b-pre__s0", "a-pre__s1", "b-pre__s1"]
    assert record["environment"]["device"] == "chosen by the script"
    assert record["config"] == json.loads(json.dumps(cfg.dump()))


# ---- the per-run line --------------------------------------------------------------------------


def test_the_run_line_names_each_testbeds_quality_metric() -> None:
    finished = {"status": "finished", "final_val_loss": 0.25, "final_val_bpb": 1.4427}
    assert outcome_line(finished, "gpt") == "[green]finished[/] val bpb 1.443"
    assert outcome_line(finished, None) == "[green]finished[/] val bpb 1.443"  # written before
    assert outcome_line(finished, "lm") == "[green]finished[/] val bpb 1.443"
    assert outcome_line(finished, "dit") == "[green]finished[/] val loss 0.2500"
    script = {"status": "finished", "final_acc": 0.91, "final_val_loss": 2.0}
    assert outcome_line(script, "script:acc:max") == "[green]finished[/] acc 0.9100"
    assert outcome_line({"status": "finished"}, "gpt") == "finished"
    assert outcome_line({"status": "diverged", "diverged_at": 7}, "gpt") == (
        "[yellow]diverged[/] at step 7"
    )
    assert outcome_line({"status": "crashed", "error": "[x] boom"}, "dit") == (
        "[red]crashed[/] \\[x] boom"
    )


# ---- the one executor loop ---------------------------------------------------------------------


class FakeStarter:
    """A starter without processes: a run "trains" by writing its summary at start, except the
    runs in ``silent`` (no summary: a crash) and ``broken`` (its start raises)."""

    def __init__(self, room: int, silent: set[str] = frozenset(), broken: Exception | None = None):
        self.capacity, self.silent, self.broken = room, silent, broken
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.most_active = 0

    def session(self) -> nullcontext[None]:
        return nullcontext()

    def room(self, active: list[Started]) -> int:
        return self.capacity - len(active)

    def start(self, spec: dict[str, Any], folder: Path) -> Started:
        if self.broken is not None and self.started:
            raise self.broken
        self.started.append(spec["run_id"])
        return Started(spec, folder, handle=None)

    def wait(self, active: list[Started]) -> list[Started]:
        self.most_active = max(self.most_active, len(active))
        return active[:1]

    def last_step(self, run: Started) -> int | None:
        return 2

    def collect(self, run: Started) -> dict[str, Any] | Crash:
        if run.spec["run_id"] in self.silent:
            return Crash("it left nothing", "trace")
        return {"run_id": run.spec["run_id"], "status": "finished", "final_val_bpb": 1.0}

    def stop(self, active: list[Started]) -> None:
        self.stopped += [r.spec["run_id"] for r in active]


def _runs(n: int) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id("a-pre", s), "arm": "a-pre", "seed": s, "testbed": "gpt",
         "train": {"steps": 3}}
        for s in range(n)
    ]  # fmt: skip


def test_the_loop_starts_what_the_starter_has_room_for_and_records_a_silent_run(
    tmp_path: Path,
) -> None:
    runs, seen = _runs(3), []
    starter = FakeStarter(room=2, silent={"a-pre__s1"})
    console = Console(record=True, width=200)
    summaries = train_runs(runs, tmp_path, starter, console, False, seen.append)
    assert list(summaries) == [r["run_id"] for r in runs] == seen
    assert starter.most_active == 2
    assert summaries["a-pre__s0"]["status"] == "finished"
    crashed = read_summary(run_dir(tmp_path, "a-pre__s1"))
    assert crashed is not None and crashed == summaries["a-pre__s1"]
    assert crashed["status"] == "crashed" and crashed["error"] == "it left nothing"
    text = console.export_text()
    assert "a-pre__s0: finished val bpb 1.000 (" in text
    assert "a-pre__s1: crashed it left nothing (" in text


def test_a_system_error_stops_the_runs_in_progress_and_the_grid(tmp_path: Path) -> None:
    starter = FakeStarter(room=2, broken=OSError(28, "No space left on device"))
    with pytest.raises(GridStopped, match="No space left on device"):
        train_runs(_runs(3), tmp_path, starter, Console(quiet=True), False)
    assert starter.stopped == ["a-pre__s0"]
