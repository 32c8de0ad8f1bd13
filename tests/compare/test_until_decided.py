"""``compare --until-decided``: the rounds loop, its state file, the closing terminal lines and
the settling command, and the descriptions the terminal prints.

The rounds loop is driven by a stand-in for ``train_grid`` that makes up each run's summary
from a rule (no training), except two tests that train a tiny model (the second command of one
reuses the finished runs), their runs' workers threads of this process (:mod:`in_process`) and
their reports' figures drawn but not rendered (:mod:`report_figures`).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.analysis.rounds import SequentialTracker, paired_differences, read_state
from normlab.analysis.sequential import DEFAULT_MAX_SEEDS, SequentialPlan, look_schedule
from normlab.cli import app
from normlab.cli.answer import compare_args, settle_command
from normlab.cli.errors import EXIT_USAGE
from normlab.experiment.config import validate_config
from normlab.experiment.execution.own_grid import paired_description
from normlab.run_format import COMMAND_FILE, SEQUENTIAL_FILE
from normlab.study.rounds import round_seconds, run_until_decided
from report_figures import skip_rendering

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
BASE, ARM = "layernorm-pre", "rmsnorm-pre"


def _cfg(seeds: int = 3) -> Any:
    return validate_config({"seeds": seeds, "device": "cpu", "threads": 1})


class FakeTrain:
    """A stand-in for ``train_grid``: each run's final_val_bpb is ``value(arm, seed)``;
    records the seeds of every call, and which runs it 'trained' (not already on its disk)."""

    def __init__(self, value: Any, wall_s: float = 10.0) -> None:
        self.value = value
        self.wall_s = wall_s
        self.calls: list[list[int]] = []
        self.disk: dict[str, dict[str, Any]] = {}
        self.trained: list[str] = []

    def __call__(self, cfg: Any, out: Path, *, console: Any, show_progress: bool,
                 after_training: Any) -> dict[str, dict[str, Any]]:  # fmt: skip
        self.calls.append(cfg.seed_list())
        summaries = {}
        for arm in cfg.arm_names():
            for seed in cfg.seed_list():
                rid = f"{arm}__s{seed}"
                if rid not in self.disk:
                    self.trained.append(rid)
                    self.disk[rid] = {
                        "run_id": rid, "arm": arm, "seed": seed, "status": "finished",
                        "final_val_bpb": self.value(arm, seed), "wall_s": self.wall_s,
                    }  # fmt: skip
                summaries[rid] = self.disk[rid]
        after_training(Path(out), summaries)
        return summaries


def _tracker(looks: tuple[int, ...], margin: float = 0.02) -> SequentialTracker:
    plan = SequentialPlan(looks=looks, margin=margin, lower_is_better=True)
    return SequentialTracker(plan, [ARM], BASE, "final_val_bpb", "bpb", 360.0)


def test_exact_differences_stop_at_the_first_look(tmp_path: Path) -> None:
    train = FakeTrain(lambda arm, s: 2.5 + (0.1 if arm == ARM else 0.0) + 0.01 * s)
    finished: list[Path] = []
    looks = look_schedule(3, 10)
    _, state = run_until_decided(
        _cfg(), tmp_path, _tracker(looks), looks, train=train,
        finish=lambda out, summaries: finished.append(out),
    )  # fmt: skip
    assert train.calls == [[0, 1, 2]]
    assert state["verdicts"] == {ARM: "worse"}
    assert state["stopped"]["reason"] == "decided" and len(state["looks"]) == 1
    assert finished == [tmp_path]
    assert read_state(tmp_path) == json.loads((tmp_path / SEQUENTIAL_FILE).read_text())


SPREAD = (0.05, -0.05, 0.04, -0.04, 0.06, -0.06, 0.05, -0.05, 0.04, -0.04)
"""Paired differences with mean about 0 and sd about 0.05: too noisy for a margin of 0.02."""


def _spread(arm: str, seed: int) -> float:
    return 2.5 + (SPREAD[seed] if arm == ARM else 0.0)


def test_a_noisy_difference_runs_to_max_seeds(tmp_path: Path) -> None:
    train = FakeTrain(_spread)
    looks = look_schedule(3, 6)
    assert looks == (3, 5, 6)
    _, state = run_until_decided(_cfg(), tmp_path, _tracker(looks), looks, train=train)
    assert train.calls == [[0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]
    assert state["stopped"]["reason"] == "max-seeds"
    assert state["verdicts"][ARM] == "inconclusive"
    assert [look["n_seeds"] for look in state["looks"]] == [3, 5, 6]
    # each look's boundary was computed with the looks made so far, and grows no looser
    crits = [look["arms"][ARM]["critical"] for look in state["looks"]]
    assert all(np.isfinite(crits)) and crits[0] > crits[-1]
    # rounds reuse what is on disk: each run trained once
    assert len(train.trained) == len(set(train.trained)) == 12


def test_the_time_budget_stops_before_a_round_that_would_overrun(tmp_path: Path) -> None:
    train = FakeTrain(_spread, wall_s=30.0)
    looks = look_schedule(3, 10)
    # next round: 2 seeds × 2 arms × (30 × 1.25 + 2) s = 158 s > 100 s
    _, state = run_until_decided(
        _cfg(), tmp_path, _tracker(looks), looks, train=train, max_time_s=100.0
    )
    assert train.calls == [[0, 1, 2]]
    assert state["stopped"]["reason"] == "max-time"
    assert state["verdicts"][ARM] == "open"
    assert round_seconds({"a": {"wall_s": 30.0}}, 4) == pytest.approx(4 * 39.5)


def test_a_decided_arm_keeps_its_decision(tmp_path: Path) -> None:
    tracker = _tracker((3, 5))
    exact = {f"{a}__s{s}": {"arm": a, "seed": s, "status": "finished",
                            "final_val_bpb": 1.0 + (0.5 if a == ARM else 0.0)}
             for a in (BASE, ARM) for s in range(5)}  # fmt: skip
    first = {k: v for k, v in exact.items() if v["seed"] < 3}
    assert tracker.look(3, first)
    exact[f"{ARM}__s4"]["final_val_bpb"] = 0.0  # a later seed cannot undo it
    tracker.look(5, exact)
    assert tracker.verdicts() == {ARM: "worse"} and tracker.final[ARM].n == 3


def test_only_usable_pairs_are_differenced() -> None:
    summaries = {
        "a0": {"arm": ARM, "seed": 0, "status": "finished", "final_val_bpb": 2.0},
        "b0": {"arm": BASE, "seed": 0, "status": "finished", "final_val_bpb": 1.5},
        "a1": {"arm": ARM, "seed": 1, "status": "diverged", "final_val_bpb": 9.0},
        "b1": {"arm": BASE, "seed": 1, "status": "finished", "final_val_bpb": 1.0},
    }
    assert paired_differences(summaries, ARM, BASE, "final_val_bpb") == ([0], [0.5])


def test_the_schedule_needs_max_seeds_at_least_the_first_look() -> None:
    with pytest.raises(ValueError, match="max_seeds"):
        look_schedule(5, 3)
    with pytest.raises(ValueError, match="seeds"):
        look_schedule(1, 3)
    assert look_schedule(3, 10) == (3, 5, 7, 9, 10)


# --- the settling command and the closing lines ---------------------------------------------


def test_settle_command_is_the_same_command_with_until_decided() -> None:
    args = compare_args({"config": None, "norms": "layernorm,rmsnorm", "seeds": "3", "lr": 0.01})
    assert args == ["--norms", "layernorm,rmsnorm", "--seeds", "3", "--lr", "0.01"]
    assert settle_command(args, "o u t") == (
        "normlab compare --norms layernorm,rmsnorm --lr 0.01 --until-decided --out 'o u t'"
    )
    timed = {"stopped": {"reason": "max-time"}, "plan": {"max_seeds": 10}}
    seq = [*args, "--until-decided", "--max-seeds", "10"]
    assert settle_command(seq, "o", timed) == "normlab compare " + " ".join(seq) + " --out o"
    assert settle_command(args, "o", None, DEFAULT_MAX_SEEDS, 100.0).endswith(
        "--until-decided --out o"
    )
    assert settle_command(args, "o", None, 5, 100.0).endswith(
        "--until-decided --max-seeds 5 --out o"
    )
    assert settle_command(args, "o", None, 12, 900.0).endswith(
        "--until-decided --max-seeds 12 --max-time 900 --out o"
    )
    full = {"stopped": {"reason": "max-seeds"}, "plan": {"max_seeds": 10}}
    assert settle_command(seq, "o", full).endswith("--until-decided --max-seeds 20 --out o")
    assert settle_command(seq, "o", full, None, 600.0).endswith(
        "--until-decided --max-seeds 20 --max-time 600 --out o"
    )


def _undecided_copy(tmp_path: Path) -> Path:
    """The fixture with rmsnorm's seed 2 made much worse, so the quality verdict is open."""
    out = tmp_path / "undecided"
    shutil.copytree(FIXTURE, out)
    path = out / "runs" / f"{ARM}__s2" / "summary.json"
    summary = json.loads(path.read_text())
    summary["final_val_bpb"] += 0.3
    path.write_text(json.dumps(summary))
    return out


def test_report_ends_with_the_answer_and_the_settling_command(tmp_path: Path) -> None:
    out = _undecided_copy(tmp_path)
    (out / COMMAND_FILE).write_text(json.dumps({"args": ["--seeds", "3"]}))
    result = CliRunner().invoke(app, ["report", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-5].startswith("The evidence cannot tell rmsnorm-pre from layernorm-pre")
    assert lines[-4].startswith("Verdict per arm on validation bpb")
    assert lines[-3].startswith("  rmsnorm-pre vs layernorm-pre: inconclusive — difference +0.10")
    assert "95% CI [" in lines[-3] and lines[-3].endswith("3 paired seeds [undecided]")
    # the forecast says its range, and the command plans for its upper end
    assert "seeds per arm would likely settle it at the spread of these 3 seeds" in lines[-5]
    a = json.loads((out / "summary.json").read_text())
    point, needed = (a["verdicts"][ARM][k] for k in ("seeds_needed", "seeds_needed_high"))
    assert f"about {point} seeds" in lines[-5] and f"and up to {needed} if that" in lines[-5]
    # what a decision costs, before the command (tests/compare/test_decision_cost.py)
    assert lines[-2] == a["decision_cost"][ARM]["sentence"]
    walls = sorted(
        json.loads(p.read_text())["wall_s"] for p in (out / "runs").glob("*/summary.json")
    )
    per_run = (walls[2] + walls[3]) / 2 * 1.25 + 2  # the median × 1.25 + start-up
    seconds = math.ceil((needed - 3) * 2 * per_run / 60) * 60
    assert needed > 3 * point > 3 and seconds > 360
    assert lines[-1] == (
        f"To settle it, run: normlab compare --until-decided --max-seeds {needed} "
        f"--max-time {seconds} --out {out}"
    )


def test_report_of_a_decided_folder_prints_no_command(tmp_path: Path) -> None:
    out = tmp_path / "decided"
    shutil.copytree(FIXTURE, out)
    (out / COMMAND_FILE).write_text(json.dumps({"args": []}))
    result = CliRunner().invoke(app, ["report", str(out)], env={"COLUMNS": "300"})
    lines = result.output.strip().splitlines()
    assert lines[-3].startswith("Use rmsnorm-pre rather than layernorm-pre")
    assert lines[-1].startswith("  rmsnorm-pre vs layernorm-pre: equivalent — difference")
    assert "[recommended]" in lines[-1] and "To settle" not in result.output


def test_the_report_follows_the_sequential_decision(tmp_path: Path) -> None:
    out = tmp_path / "seq"
    shutil.copytree(FIXTURE, out)
    summaries = {
        p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/summary.json")
    }
    tracker = _tracker((3, 10))
    tracker.look(3, summaries)
    tracker.stop("max-time", 3)
    (out / SEQUENTIAL_FILE).write_text(json.dumps(tracker.to_dict()))
    (out / COMMAND_FILE).write_text(json.dumps({"args": ["--until-decided"]}))
    # fixed-sample: equivalent; at the first of two looks O'Brien–Fleming spends almost nothing
    assert tracker.verdicts() == {ARM: "open"}
    result = CliRunner().invoke(app, ["report", str(out)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    a = json.loads((out / "summary.json").read_text())
    assert a["comparisons"][ARM]["final_val_bpb"]["verdict"] == "inconclusive"
    assert a["recommendation"]["status"] == "undecided"
    assert "repeated 95% interval" in result.output
    assert "stopped because the next round would not fit in the time budget" in result.output
    # the same command, with a budget for the 7 seeds × 2 arms still planned
    seconds = math.ceil(round_seconds(summaries, 14) / 60) * 60
    assert result.output.strip().splitlines()[-1] == (
        f"To settle it, run: normlab compare --until-decided --max-time {seconds} --out {out}"
    )
    md = (out / "report.md").read_text()
    assert "Lan & DeMets (1983)" in md and "after 3 seeds: rmsnorm-pre open" in md


# --- the compare command's closing lines, and a real resume --------------------------------


def test_compare_ends_with_the_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import normlab.experiment.execution.runner as runner

    def fake(cfg: Any, out: Path, console: Any = None, show_progress: bool = True,
             after_training: Any = None,
             executor: Any = None) -> dict[str, dict[str, Any]]:  # fmt: skip
        shutil.copytree(_undecided_copy(tmp_path), out)
        summaries = {p.parent.name: json.loads(p.read_text())
                     for p in (Path(out) / "runs").glob("*/summary.json")}  # fmt: skip
        after_training(Path(out), summaries)
        return summaries

    monkeypatch.setattr(runner, "train_grid", fake)
    out = tmp_path / "cmp"
    result = CliRunner().invoke(
        app, ["compare", "--seeds", "3", "--lr", "0.01", "--out", str(out)],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads((out / COMMAND_FILE).read_text())["args"] == [
        "--seeds", "3", "--lr", "0.01"
    ]  # fmt: skip
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith("To settle it, run: normlab compare --lr 0.01 --until-decided --max-seeds ")
    )
    assert result.output.strip().endswith(f"--out {out}")


TINY = {
    "device": "cpu",
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 16},
    "train": {"steps": 2, "batch_size": 2, "eval_interval": 2, "eval_windows": 4, "warmup": 1},
}


def test_until_decided_trains_in_rounds_and_resumes(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    args = ["compare", "--config", str(config), "--data", str(corpus), "--seeds", "2",
            "--until-decided", "--max-seeds", "3", "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert first.exit_code == 0, first.output
    state = read_state(out)
    assert state is not None and state["plan"]["looks"] == [2, 3]
    assert state["stopped"]["reason"] in ("decided", "max-seeds")
    n = state["stopped"]["n_seeds"]
    again = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert again.exit_code == 0, again.output
    assert f"{2 * n} of {2 * n} runs already done" in again.output
    assert read_state(out)["verdicts"] == state["verdicts"]
    assert "Sequential: group-sequential paired t-test" in again.output


def test_until_decided_trains_every_round_with_the_chosen_executor(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--executor ray --until-decided``: each round goes to the grid executor the command
    made (here a recording stand-in for Ray that trains locally), not to a local one."""
    import normlab.experiment.execution.executors as executors

    rounds: list[list[str]] = []

    class Recording(executors.LocalExecutor):
        name = "ray"

        def run(self, runs: list[dict[str, Any]], *args: Any) -> dict[str, dict[str, Any]]:
            rounds.append([r["run_id"] for r in runs])
            return super().run(runs, *args)

    monkeypatch.setattr(executors, "make_executor", lambda scale, on_result=None: Recording())
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    args = ["compare", "--config", str(config), "--data", str(corpus), "--seeds", "2",
            "--until-decided", "--max-seeds", "3", "--executor", "ray",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    state = read_state(out)
    assert state is not None and state["plan"]["looks"] == [2, 3]
    assert len(rounds) == len(state["looks"]) >= 1  # every round, through the executor
    assert len(rounds[0]) == 4 and all(r.endswith(("__s0", "__s1")) for r in rounds[0])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seeds", "3", "--max-seeds", "2"], "--max-seeds to be an int >= the seeds"),
        (["--seeds", "1"], "needs at least 2 seeds at the first look (--seeds)"),
        (["--max-time", "0"], "--max-time in seconds > 0"),
    ],
)
def test_until_decided_refuses_a_plan_it_cannot_run(
    tmp_path: Path, corpus: Path, flags: list[str], message: str
) -> None:
    out = tmp_path / "never"
    result = CliRunner().invoke(
        app, ["compare", "--data", str(corpus), "--until-decided", *flags, "--out", str(out)],
        env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == EXIT_USAGE, result.output  # the options' values: usage
    assert message in result.output and not out.exists()


# --- descriptions ---------------------------------------------------------------------------


def test_the_paired_line_names_what_varies_and_counts_in_words() -> None:
    cfg = validate_config({"norms": ["layernorm", "rmsnorm"], "placements": ["pre"]})
    runs = [{"seed": s, "train": {"steps": 1}} for s in (0, 0)]
    line = paired_description(cfg, runs, "cpu", 1)
    assert "only the norm differs (placement pre for all)" in line
    assert "2 runs (1 seed) × 1 step on cpu with 1 thread" in line
    both = validate_config({"norms": ["layernorm", "rmsnorm"], "placements": ["pre", "post"]})
    runs = [{"seed": s, "train": {"steps": 600}} for s in (0, 1)]
    line = paired_description(both, runs, "cpu", 2)
    assert "only the norm and placement differ." in line and "600 steps" in line
    assert "with 2 threads" in line


# --- one rule in one place: δ and "describes the trained model" live in the field declarations


def test_every_compared_field_declares_its_smallest_difference() -> None:
    from normlab.analysis import smallest
    from normlab.run_format import TESTBED_FORMATS

    for fmt in TESTBED_FORMATS.values():
        for f in fmt.fields:
            if f.compare is None:
                continue
            assert f.compare.smallest is not None, (fmt.name, f.name)
            spec = smallest.smallest_for(f.name, fmt.name)
            if f.compare.smallest.in_train_unit and fmt.train_per_quality is None:
                # no fixed conversion to the training unit (lm: nats per token): a relative 5 %
                assert (spec.kind, spec.value) == ("relative", 0.05), (fmt.name, f.name)
                continue
            assert spec.kind == f.compare.smallest.kind
            assert spec.resolve(0.02) == pytest.approx(
                f.compare.smallest.resolve(0.02)
                * (fmt.train_per_quality if f.compare.smallest.in_train_unit else 1.0)
            )
            assert (f.name in smallest.LEARNED_MODEL_METRICS) == f.compare.trained_model


def test_smallest_reads_a_changed_declaration(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from normlab.analysis import smallest
    from normlab.run_format import GPT, Smallest

    fields = tuple(
        dataclasses.replace(
            f, compare=dataclasses.replace(f.compare, smallest=Smallest("relative", 0.5))
        )
        if f.name == "tokens_per_s" and f.compare is not None
        else f
        for f in GPT.fields
    )
    patched = dataclasses.replace(GPT)
    object.__setattr__(patched, "__dict__", {**GPT.__dict__, "fields": fields})
    monkeypatch.setattr(smallest, "testbed_format", lambda name: patched)
    assert smallest.smallest_for("tokens_per_s").value == 0.5
