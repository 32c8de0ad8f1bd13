"""A damaged file of a compare folder is refused or named, never read as a missing one and
written over: ``experiment.json`` before a compare writes its own, a run's ``summary.json``
wherever runs done are skipped (a compare, ``--plan``, ``--run``), ``sequential.json`` in the
report, a script's ``fingerprint.json`` in the pairing guard, a summary a run or script just
left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.errors import EXIT_REFUSED
from normlab.experiment.execution.run_loop import finished_runs
from normlab.experiment.execution.script_grid import check_script_pairing
from normlab.experiment.execution.script_run import script_outcome
from normlab.run_format import folder as run_folder
from normlab.run_format.experiment_record import check_experiment

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args])
    return result.exit_code, " ".join(result.output.split())


DAMAGED_EXPERIMENTS = {
    "cut short": '{"arms": ["a"',
    "a list": "[1, 2]\n",
    "no arms": '{"seeds": [0]}\n',
    "runs not ids": '{"arms": ["a"], "runs": 3}\n',
}


@pytest.mark.parametrize("text", DAMAGED_EXPERIMENTS.values(), ids=DAMAGED_EXPERIMENTS.keys())
def test_a_compare_refuses_a_damaged_experiment_json_and_keeps_it(
    text: str, config: Path, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "experiment.json").write_text(text, encoding="utf-8")
    code, output = invoke(
        "compare", "--config", str(config), "--data", str(corpus), "--out", str(out)
    )
    assert code == EXIT_REFUSED, output
    assert f"{out / 'experiment.json'}" in output
    assert (out / "experiment.json").read_text(encoding="utf-8") == text
    assert not (out / "runs").exists() and not (out / "data").exists()


def test_the_shape_of_experiment_json_is_one_check() -> None:
    check_experiment({"arms": ["a", "b"]}, "e")  # an older folder: no runs, testbed, baseline
    with pytest.raises(ValueError, match="e: 'baseline_arm' must be one of"):
        check_experiment({"arms": ["a"], "baseline_arm": "b"}, "e")
    with pytest.raises(ValueError, match="'seeds' must be a list of ints"):
        check_experiment({"arms": ["a"], "seeds": [True]}, "e")
    with pytest.raises(ValueError, match="'testbed' must be one of"):
        check_experiment({"arms": ["a"], "testbed": "vit"}, "e")


def _planned(config: Path, corpus: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    out = tmp_path / "planned"
    result = CliRunner().invoke(
        app,
        ["compare", "--config", str(config), "--data", str(corpus), "--plan", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    return out, sorted(p.name for p in run_folder.run_folders(out))


@pytest.mark.parametrize("text", ["{not json", '{"run_id": "x"}\n'], ids=["cut", "no status"])
def test_a_damaged_summary_is_refused_by_every_path_that_skips_runs_done(
    text: str, config: Path, corpus: Path, tmp_path: Path
) -> None:
    out, runs = _planned(config, corpus, tmp_path)
    summary = run_folder.summary_path(out / "runs" / runs[0])
    summary.write_text(text, encoding="utf-8")
    experiment = (out / "experiment.json").read_text(encoding="utf-8")
    base = ["compare", "--config", str(config), "--data", str(corpus), "--out", str(out)]
    for args in (["--plan"], ["--no-report"]):
        code, output = invoke(*base, *args)
        assert code == EXIT_REFUSED, output
        assert str(summary) in output and "Nothing was written" in output
    code, output = invoke("compare", "--out", str(out), "--run", runs[0])
    assert code == EXIT_REFUSED, output
    assert str(summary) in output
    assert summary.read_text(encoding="utf-8") == text  # the evidence is kept
    assert (out / "experiment.json").read_text(encoding="utf-8") == experiment
    code, output = invoke("report", str(out))  # the report names it the same way
    assert code == EXIT_REFUSED and str(summary) in output


def test_a_run_with_a_damaged_experiment_json_is_not_trained(
    config: Path, corpus: Path, tmp_path: Path
) -> None:
    out, runs = _planned(config, corpus, tmp_path)
    (out / "experiment.json").write_text("[]", encoding="utf-8")
    code, output = invoke("compare", "--out", str(out), "--run", runs[0])
    assert code == EXIT_REFUSED, output
    assert "experiment.json" in output
    assert not run_folder.has_summary(out / "runs" / runs[0])


def test_finished_runs_names_the_damaged_summary(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a-pre__s0"
    run.mkdir(parents=True)
    run_folder.summary_path(run).write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"run a-pre__s0: .*summary\.json.*holds a JSON list"):
        finished_runs([{"run_id": "a-pre__s0"}], tmp_path)


def test_a_damaged_sequential_json_is_named_by_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    (out / "sequential.json").write_text('{"looks": [', encoding="utf-8")
    code, output = invoke("report", str(out))
    assert code == EXIT_REFUSED, output
    assert "sequential.json" in output
    assert not (out / "report.md").exists()


def _script_run(out: Path, arm: str) -> dict:
    spec = {"run_id": f"{arm}__s0", "arm": arm, "seed": 0, "testbed": "script:val_loss:min"}
    folder = run_folder.run_dir(out, spec["run_id"])
    run_folder.write_run_config(folder, spec)
    return spec


def test_a_damaged_fingerprint_is_named_not_taken_for_none(tmp_path: Path) -> None:
    specs = [_script_run(tmp_path, "a"), _script_run(tmp_path, "b")]
    run_folder.write_fingerprint(run_folder.run_dir(tmp_path, "a__s0"), {"batch": "x"})
    damaged = run_folder.run_dir(tmp_path, "b__s0") / "fingerprint.json"
    damaged.write_text("{cut", encoding="utf-8")
    console = Console(record=True, width=400)
    assert check_script_pairing(specs, tmp_path, console) == {}
    said = " ".join(console.export_text().split())
    assert "1 run left a damaged fingerprint" in said and str(damaged) in said
    assert "recorded no fingerprint" not in said


def test_a_script_that_left_a_damaged_summary_crashed_saying_so(tmp_path: Path) -> None:
    spec = {**_script_run(tmp_path, "a"), "script": {"timeout_s": 10}}
    folder = run_folder.run_dir(tmp_path, "a__s0")
    run_folder.summary_path(folder).write_text(json.dumps([1]), encoding="utf-8")
    summary = script_outcome(spec, folder, 0, False)
    assert summary["status"] == "crashed"
    assert summary["error"].startswith("the script left a damaged summary:")
