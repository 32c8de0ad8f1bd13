"""normlab.track: the logging API of a user's own loop writes normlab's run format, and the
script grid's pieces (argument list, pairing check) that need no process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

import normlab.track as track
from normlab.experiment.config import ScriptConfig
from normlab.experiment.execution.script_grid import check_script_pairing, plan_script_runs
from normlab.run_format import CRASHED, DIVERGED, EVAL_RECORD, FINISHED, TRAIN_RECORD
from normlab.run_format import testbeds as formats
from normlab.run_format.folder import (
    create_run,
    read_fingerprint,
    read_records,
    read_run_config,
    read_summary,
    write_fingerprint,
    write_summary,
)
from normlab.run_format.script import ENV, script_argv


@pytest.fixture(autouse=True)
def _no_compare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV.values(), "RANK"):
        monkeypatch.delenv(name, raising=False)


def toy(norm: nn.Module, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), norm, nn.GELU(), nn.Linear(8, 1))


def test_standalone_run_writes_records_and_summary(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    with track.init(norm="rmsnorm", seed=3, run_dir=folder) as run:
        assert (run.norm, run.placement, run.precision, run.seed) == ("rmsnorm", "pre", "fp32", 3)
        for step in (1, 2, 3):
            run.log(step, loss=torch.tensor(1.0 / step), tokens=10)
        run.log_eval(3, val_loss=0.5)
        run.log_eval(4, val_loss=0.25)
    spec = read_run_config(folder)
    assert spec["run_id"] == "rmsnorm-pre__s3" and spec["seed"] == 3
    train = read_records(folder, TRAIN_RECORD)
    assert [r["tokens_seen"] for r in train] == [10, 20, 30]
    assert train[-1]["loss"] == pytest.approx(1 / 3)
    evals = read_records(folder, EVAL_RECORD)
    assert [r["val_loss"] for r in evals] == [0.5, 0.25]
    summary = read_summary(folder)
    assert summary is not None
    assert summary["status"] == FINISHED and summary["steps"] == 4 and summary["tokens"] == 30
    assert summary["final_val_loss"] == 0.25 and summary["final_train_loss"] == pytest.approx(1 / 3)
    assert summary["peak_memory_bytes"] > 0
    # 20 tokens after the first log over the time between the first and the last log
    assert summary["tokens_per_s"] is None or summary["tokens_per_s"] > 0


def test_compare_environment_wins_and_names_the_quality_metric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ScriptConfig(
        command="python t.py {norm}",
        metric="acc",
        lower_is_better=False,
        equivalence_margin=0.01,
        norms=["a", "b"],
        seeds=1,
    )
    spec = plan_script_runs(cfg, threads=1)[1]
    folder = create_run(tmp_path, spec)
    for name, value in {"norm": "b", "placement": "pre", "precision": "fp32", "seed": "0"}.items():
        monkeypatch.setenv(ENV[name], value)
    monkeypatch.setenv(ENV["run_dir"], str(folder))
    run = track.init(norm="ignored", seed=7)
    assert (run.norm, run.seed, run.run_dir) == ("b", 0, folder)
    run.log_eval(1, acc=0.5)
    run.log_eval(2, acc=0.75)
    run.log_eval(3, acc=0.625)
    summary = run.finish(tokens_per_s=123.0)
    fmt = formats.testbed_format(formats.script_testbed("acc", lower_is_better=False))
    assert list(summary)[: len(fmt.summary_fields)] == list(fmt.summary_fields)
    assert summary["final_acc"] == 0.625 and summary["best_acc"] == 0.75  # higher is better
    assert summary["tokens_per_s"] == 123.0  # given, not measured
    assert summary["run_id"] == "b-pre__s0"


def test_nonfinite_value_marks_the_run_diverged(tmp_path: Path) -> None:
    run = track.init(norm="layernorm", run_dir=tmp_path / "r")
    run.log(1, loss=1.0)
    run.log(2, loss=float("nan"))
    run.log(3, loss=float("inf"))
    summary = run.finish()
    assert summary["status"] == DIVERGED and summary["diverged_at"] == 2
    assert math.isnan(read_records(tmp_path / "r", TRAIN_RECORD)[1]["loss"] or math.nan)


def test_exception_inside_the_block_records_a_crash(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        track.init(norm="layernorm", run_dir=tmp_path / "r") as run,
    ):
        run.log(1, loss=1.0)
        raise RuntimeError("boom")
    summary = read_summary(tmp_path / "r")
    assert summary is not None and summary["status"] == CRASHED
    assert summary["error"] == "RuntimeError: boom" and "raise RuntimeError" in summary["traceback"]


def test_only_rank_zero_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    with track.init(norm="layernorm", run_dir=tmp_path / "r") as run:
        run.log(1, loss=1.0, tokens=4)
        run.fingerprint(toy(nn.LayerNorm(8)), torch.zeros(2))
        run.log_eval(1, val_loss=1.0)
    assert not (tmp_path / "r").exists()


def test_missing_norm_and_bad_values_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^norm: not set"):
        track.init(run_dir=tmp_path)
    run = track.init(norm="x", run_dir=tmp_path / "r")
    with pytest.raises(TypeError, match=r"^loss: expected a number"):
        run.log(1, loss="low")
    with pytest.raises(ValueError, match=r"^loss: expected a number or a one-element tensor"):
        run.log(1, loss=torch.zeros(2))


def test_fingerprint_leaves_out_every_norm_parameter(tmp_path: Path) -> None:
    ln, rms = toy(nn.LayerNorm(8)), toy(nn.RMSNorm(8))
    d_ln, d_rms = track.shared_digests(ln), track.shared_digests(rms)
    assert sorted(d_ln) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert d_ln == d_rms  # same seed: the arms share every non-norm parameter
    assert track.shared_digests(toy(nn.LayerNorm(8), seed=1)) != d_ln
    x = torch.arange(6.0).view(2, 3)
    assert track.batch_digest({"x": x, "y": [x, 1]}) == track.batch_digest({"x": x, "y": [x, 1]})
    assert track.batch_digest({"x": x}) != track.batch_digest({"x": x + 1})
    assert track.batch_digest(x) != track.batch_digest(x.double())
    run = track.init(norm="layernorm", run_dir=tmp_path / "r")
    recorded = run.fingerprint(ln, (x, x))
    assert read_fingerprint(tmp_path / "r") == recorded


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"norm": "a;rm -rf x"}, ["run", "--norm", "a;rm -rf x", "--n=a;rm -rf x!"]),
        ({"norm": "$(touch y)"}, ["run", "--norm", "$(touch y)", "--n=$(touch y)!"]),
        (
            {"norm": "'q' \"r\" {seed}"},
            ["run", "--norm", "'q' \"r\" {seed}", "--n='q' \"r\" {seed}!"],
        ),
    ],
)
def test_factor_values_stay_one_literal_argument(
    values: dict[str, str], expected: list[str]
) -> None:
    assert script_argv("run --norm {norm} '--n={norm}!'", values) == expected


def test_command_problems_are_refused_in_one_line() -> None:
    for command, words in [
        ("python t.py {nrom}", "unknown placeholder {nrom}"),
        ("python t.py {norm:>4}", "unknown placeholder {norm:>4}"),
        ("python 't.py", "cannot split"),
        ("   ", "expected a command"),
    ]:
        with pytest.raises(ValueError, match=r"^script: ") as err:
            script_argv(command, {})
        assert words in str(err.value) and "\n" not in str(err.value)
    assert script_argv("echo {{norm}} {seed}", {"seed": "4"}) == ["echo", "{norm}", "4"]


def test_pairing_check_refuses_a_seed_and_names_what_differs(tmp_path: Path) -> None:
    cfg = ScriptConfig(
        command="t {norm}", metric="val_loss", equivalence_margin=0.1, norms=["a", "b"], seeds=3
    )
    runs = plan_script_runs(cfg, threads=1)
    same = {"parameters": {"w": "1", "v": "2"}, "batch": "B"}
    prints = {
        0: (same, same),
        1: (same, {"parameters": {"w": "1", "v": "9"}, "batch": "B"}),
        2: (same, {**same, "batch": "C"}),
    }
    for spec in runs:
        folder = create_run(tmp_path, spec)
        write_fingerprint(folder, prints[spec["seed"]][spec["norm"] == "b"])
        write_summary(folder, {"run_id": spec["run_id"], "status": FINISHED})
    console = Console(record=True, width=400)
    refused = check_script_pairing(runs, tmp_path, console)
    assert sorted(refused) == ["a-pre__s1", "a-pre__s2", "b-pre__s1", "b-pre__s2"]
    assert "parameter 'v'" in refused["a-pre__s1"]["error"]
    assert "first batch differs" in refused["b-pre__s2"]["error"]
    assert read_summary(tmp_path / "runs" / "a-pre__s0")["status"] == FINISHED  # type: ignore[index]
    assert read_summary(tmp_path / "runs" / "b-pre__s1")["status"] == CRASHED  # type: ignore[index]
    text = console.export_text()
    assert "seed 1 refused" in text and "seed 2 refused" in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--script", "t {norm}", "--margin", "0.1"], "--metric: expected the name"),
        (["--script", "t {norm}", "--metric", "m", "--margin", "0"], "greater than 0"),
        (["--script", "t {norm}", "--metric", "m", "--margin", "0.1", "--lr", "0.1"], "--lr: sets"),
        (["--script", "t {nrm}", "--metric", "m", "--margin", "0.1"], "unknown placeholder {nrm}"),
        (["--script", "t", "--metric", "m", "--margin", "0.1", "--norms", "a/b,c"], "'a/b'"),
        (["--metric", "val_loss"], "--metric: an option of --script"),
        (["--higher-is-better"], "--higher-is-better: an option of --script"),
    ],
)
def test_script_flags_are_checked_before_anything_runs(
    tmp_path: Path, args: list[str], words: str
) -> None:
    from typer.testing import CliRunner

    from normlab.cli import app
    from normlab.cli.errors import EXIT_USAGE

    out = tmp_path / "out"
    norms = [] if "--norms" in args else ["--norms", "a,b"]
    result = CliRunner().invoke(app, ["compare", *args, *norms, "--out", str(out)])
    assert result.exit_code == EXIT_USAGE, result.output
    assert words in result.output and not out.exists()


def test_script_norms_default_as_normlab_own_runs(tmp_path: Path) -> None:
    """Without --norms a --script grid compares the same norms as normlab's own runs, from the
    one definition of that default (not a validation error naming the field)."""
    import json

    from typer.testing import CliRunner

    from normlab.cli import app
    from normlab.experiment.config import DEFAULT_NORMS, validate_config

    assert validate_config({}).norms == list(DEFAULT_NORMS) == ["layernorm", "rmsnorm"]
    assert ScriptConfig(command="t {norm}", metric="m").norms == list(DEFAULT_NORMS)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["compare", "--script", "t {norm} {seed} {run_dir}", "--metric", "m", "--plan",
              "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    arms = json.loads((out / "experiment.json").read_text())["arms"]
    assert arms == [f"{norm}-pre" for norm in DEFAULT_NORMS]


def test_a_refused_option_lists_every_option_that_works_with_script(tmp_path: Path) -> None:
    """The options the refusal lists with --script and the options it refuses are, together,
    every option of the command (--run aside): each listed one is taken with --script, each
    other one is refused naming it."""
    import typing

    from typer.main import get_command
    from typer.testing import CliRunner

    from normlab.cli import app
    from normlab.cli.compare_cmd import compare

    outs = iter(range(100))

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(
            app, ["compare", "--script", "t {norm} {seed} {run_dir}", "--metric", "m", *args,
                  "--plan", "--out", str(tmp_path / f"out{next(outs)}")],
            env={"COLUMNS": "1000"},
        )  # fmt: skip
        return result.output

    message = invoke("--lr", "0.1")
    assert "--lr: sets normlab's own training" in message, message
    listed = message.split("expected only ")[1].split(" with --script")[0].split(", ")
    for flag in ("--metric", "--margin", "--run-timeout", "--until-decided", "--max-seeds",
                 "--max-time", "--plan", "--no-report", "--out", "--lower-is-better",
                 "--higher-is-better", "--norms", "--seeds", "--script"):  # fmt: skip
        assert any(flag in item.split("/") for item in listed), (flag, listed)
    samples = {"--log-to": "tensorboard", "--ladder": "d_model=8,16", "--seeds": "2",
               "--lr-sweep": "0.1,0.2", "--norms": "a,b", "--executor": "local"}  # fmt: skip
    hints = typing.get_type_hints(compare)
    params = [p for p in get_command(app).commands["compare"].params if p.name != "run"]
    assert {"--config", "--testbed", "--lr", "--parametrization"} <= {p.opts[0] for p in params}
    for p in params:
        flag = p.opts[0]
        if flag in ("--script", "--metric", "--plan", "--out", "--help"):
            continue
        number = {int, float} & {hints[p.name], *typing.get_args(hints[p.name])}
        args = [flag] if p.is_flag else [flag, samples.get(flag, "2" if number else "x")]
        output = invoke(*args)
        if any(flag in item.split("/") for item in listed):
            assert "sets normlab's own training" not in output, (flag, output)
        else:
            assert f"{flag}: sets normlab's own training" in output, (flag, output)
