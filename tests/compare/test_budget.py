"""A training budget of tokens per parameter (``--tokens-per-param``, ``train.param_count``):
the steps it gives (exact integers), counted once per grid from the baseline arm (every arm the
same steps), the non-embedding count of each testbed against a hand count, every path that
plans a grid (a compare, ``--plan``, a ladder's rungs, ``--until-decided`` rounds,
``--lr-sweep``'s tuning folders, ``--model hf:…``), the refusals, a run without a budget
planned exactly as before, and what the terminal, the report and the analysis say of the tokens
per parameter (the early-training flag)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.analysis.answer import answer_lines
from normlab.analysis.runs import load_compare_folder
from normlab.analysis.summary import analyze
from normlab.analysis.training_budget import (
    COMPUTE_OPTIMAL_TOKENS_PER_PARAM,
    EARLY_TRAINING_TOKENS_PER_PARAM,
    budget_record,
    early_note,
)
from normlab.cli import app
from normlab.experiment.config import ConfigError, TrainSettings, validate_config
from normlab.experiment.execution import grid as grid_module
from normlab.experiment.execution.grid import plan_runs
from normlab.models import DiTConfig, GPTConfig, build_dit, build_gpt
from normlab.models.counts import budget_count, embedding_count
from normlab.run_format import ANALYSIS_FILE, LADDER_KEY, RUNS_CSV_FILE, TOKENS_PER_PARAM
from normlab.run_format import folder as run_folder
from normlab.run_format.budget import PARAM_COUNTS, budget_steps, tokens_per_param
from normlab.study.loader import build_config_dict
from report_figures import skip_rendering

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DATA = {"fingerprint": "f0", "python_version": "3.x", "source": "stdlib"}
TINY: dict[str, Any] = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 2, "warmup": 1},
}
"""A GPT of 7,264 parameters with layernorm (7,216 with rmsnorm): 16 tokens a step."""


def _invoke(tmp_path: Path, corpus: Path, *args: str) -> tuple[int, str]:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "data": {"path": str(corpus)}}))
    result = CliRunner().invoke(
        app, ["compare", "--config", str(config), *args], env={"COLUMNS": "1000"}
    )
    return result.exit_code, result.output


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _run_configs(out: Path) -> dict[str, dict[str, Any]]:
    return {p.name: run_folder.read_run_config(p) for p in run_folder.run_folders(out)}


# --- the resolution -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "n", "per_step", "steps"),
    [
        (20, 214_144, 1024, 4183),  # 4,282,880 / 1,024 = 4,182.5: rounded up
        (2.5, 7, 2, 9),  # 17.5 / 2 = 8.75
        (0.1, 30, 3, 1),  # exactly 1 read as the decimal 0.1 (the float's own value: above 1)
        (0.3, 10, 3, 1),
        (1, 1024, 1024, 1),
        (1e-9, 5, 7, 1),  # a budget of a fraction of a step still trains one
    ],
)
def test_the_steps_are_the_budget_rounded_up_to_whole_steps(
    x: float, n: int, per_step: int, steps: int
) -> None:
    assert budget_steps(x, n, per_step) == steps
    assert (steps - 1) * per_step < float(x) * n <= steps * per_step or x == 0.1


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 10, 2), "tokens_per_param"),
        ((-1.0, 10, 2), "tokens_per_param"),
        ((math.inf, 10, 2), "tokens_per_param"),
        ((1.0, 0, 2), "n_params"),
        ((1.0, 10, 0), "tokens_per_step"),
        ((1.0, 10.5, 2), "n_params"),
    ],
)
def test_bad_budgets_are_refused_naming_the_argument(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        budget_steps(*args)


def test_the_tokens_per_parameter_of_a_run() -> None:
    assert tokens_per_param(600, {"budget_params": 200}, 300) == 3.0  # the budget's N
    assert tokens_per_param(600, {"steps": 3}, 300) == 2.0  # its own count
    assert tokens_per_param(None, {}, 300) is None and tokens_per_param(600, {}, None) is None
    assert TOKENS_PER_PARAM.label == "tokens per parameter" and TOKENS_PER_PARAM.unit


def test_param_count_takes_the_declared_values() -> None:
    field = TrainSettings.model_fields["param_count"]
    assert field.annotation.__args__ == PARAM_COUNTS  # type: ignore[union-attr]
    assert field.default == "all" and "non_embedding" in (field.description or "")


# --- which parameters count ---------------------------------------------------------------


def _gpt(**settings: Any) -> torch.nn.Module:
    cfg = GPTConfig(
        d_model=16, n_layers=2, n_heads=2, context=8, norm="layernorm", placement="pre",
        **settings,
    )  # fmt: skip
    return build_gpt(cfg, 0)


def test_the_gpt_leaves_out_its_token_position_and_untied_output_embeddings() -> None:
    d, v, t, layers = 16, 256, 8, 2
    blocks = layers * 12 * d * d  # qkv, projection, a 4·d MLP in and out; no biases
    norms = (2 * layers + 1) * 2 * d  # LayerNorm's weight and bias, two per block and a final
    tied = _gpt()
    assert budget_count(tied, "all") == v * d + blocks + norms
    assert budget_count(tied, "non_embedding") == blocks + norms  # the head is the embedding
    untied = _gpt(tie_embeddings=False, positions="learned")
    assert budget_count(untied, "all") == 2 * v * d + t * d + blocks + norms
    assert embedding_count(untied) == 2 * v * d + t * d
    assert budget_count(untied, "non_embedding") == blocks + norms


def test_the_dit_leaves_out_its_patch_label_position_embeddings_and_output_projection() -> None:
    c, d, t, classes = 4, 16, 16, 4
    model = build_dit(
        DiTConfig(
            d_model=d, n_layers=1, n_heads=2, in_channels=c, seq_len=t, n_classes=classes,
            positions="learned",
        ),
        0,
    )  # fmt: skip
    patch, head = c * d + d, d * c + c  # Linears with biases
    labels, positions = (classes + 1) * d, t * d
    assert embedding_count(model) == patch + head + labels + positions
    total = model.count_parameters()[0]
    assert budget_count(model, "non_embedding") == total - (patch + head + labels + positions)
    assert "time_embed.mlp.0.weight" not in model.embedding_parameter_names()
    with pytest.raises(ValueError, match="param_count: expected one of all, non_embedding"):
        budget_count(model, "embeddings")


# --- the grid ------------------------------------------------------------------------------


def test_every_arm_trains_the_steps_of_the_baseline_arms_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = []
    real = grid_module.build_model
    monkeypatch.setattr(grid_module, "build_model", lambda *a: built.append(a) or real(*a))
    counts = {}
    for baseline in ("layernorm-pre", "rmsnorm-pre"):
        built.clear()
        cfg = validate_config(
            {
                **TINY,
                "seeds": 2,
                "baseline": baseline,
                "train": {**TINY["train"], "tokens_per_param": 0.7},
            }
        )
        runs = plan_runs(cfg, "cpu", 1, DATA)
        assert len(built) == 4  # arms × seeds, as without a budget: no model built to count
        n = next(r["n_params"] for r in runs if r["arm"] == baseline)
        steps = math.ceil(0.7 * n / 16)
        for r in runs:
            assert r["train"]["budget_params"] == n and r["train"]["steps"] == steps
            assert r["train"]["tokens"] == 16 * steps
            assert (r["train"]["tokens_per_param"], r["train"]["param_count"]) == (0.7, "all")
        assert list(runs[0]["train"])[:5] == [
            "steps", "tokens", "tokens_per_param", "param_count", "budget_params",
        ]  # fmt: skip
        counts[baseline] = (n, steps)
    assert counts == {"layernorm-pre": (7264, 318), "rmsnorm-pre": (7216, 316)}


def _load_fixture_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_plan_fixture", FIXTURES / "make_plan_fixture.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_without_a_budget_is_planned_as_before() -> None:
    """planned_runs.json holds what the code wrote before the budget existed."""
    fixture = _load_fixture_module()
    before = _read(FIXTURES / "planned_runs.json")
    assert list(before) == list(fixture.CASES)
    for name, (config, data) in fixture.CASES.items():
        now = json.loads(json.dumps(fixture.planned(config, data)))
        assert now == before[name], name
        for run in now["runs"]:
            assert not {"tokens_per_param", "param_count", "budget_params"} & set(run["train"])
        assert "budget" not in now["experiment"]


@pytest.mark.parametrize(
    ("train", "line"),
    [
        (
            {"tokens_per_param": 0.01, "warmup": 5},
            "--tokens-per-param: 0.01 tokens per parameter of the baseline arm's 7,264 "
            "parameters, all, make 5 steps of 16 tokens, too few: train.warmup: 5 warm-up "
            "steps with train.steps = 5 (from train.tokens_per_param = 0.01); expected "
            "train.warmup < train.steps",
        ),
        (
            {"tokens_per_param": 0.01, "warmup": 4, "schedule": "wsd", "cooldown": 0.5},
            "--tokens-per-param: 0.01 tokens per parameter of the baseline arm's 7,264 "
            "parameters, all, make 5 steps of 16 tokens, too few: train.cooldown: 0.5 of "
            "train.steps = 5 makes a cooldown of 3 step(s)",
        ),
        (
            {"tokens_per_param": 0.01, "warmup": 0, "schedule": "wsd", "branches": [5]},
            "--tokens-per-param: 0.01 tokens per parameter of the baseline arm's 7,264 "
            "parameters, all, make 5 steps of 16 tokens, too few: train.branches: the branch "
            "of 5 steps is not shorter than the run",
        ),
    ],
)
def test_a_budget_too_small_for_its_schedule_is_refused_in_one_line(
    train: dict[str, Any], line: str
) -> None:
    cfg = validate_config({**TINY, "seeds": 1, "train": {**TINY["train"], **train}})
    with pytest.raises(ValueError) as err:
        plan_runs(cfg, "cpu", 1, DATA)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("train", "line"),
    [
        (
            {"steps": 10, "tokens_per_param": 2},
            "give one of steps, tokens or tokens_per_param, not steps and tokens_per_param "
            "together (steps=10, tokens_per_param=2.0)",
        ),
        (
            {"tokens": 100, "tokens_per_param": 2},
            "give one of steps, tokens or tokens_per_param, not tokens and tokens_per_param",
        ),
        ({"param_count": "non_embedding"}, "train.param_count: only with train.tokens_per_param"),
        ({"tokens_per_param": 0}, "train.tokens_per_param: Input should be greater than 0"),
        ({"tokens_per_param": 2, "param_count": "some"}, "train.param_count: Input should be"),
    ],
)
def test_a_budget_that_does_not_fit_the_config_is_refused(train: dict, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"train": train})
    assert line in str(err.value), str(err.value)


def test_a_flag_gives_the_length_in_place_of_the_files(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"train": {"steps": 40, "lr": 0.01}}))
    merged = build_config_dict(path, {"train.tokens_per_param": 3.0})
    assert merged["train"] == {"lr": 0.01, "tokens_per_param": 3.0}
    path.write_text(yaml.safe_dump({"train": {"tokens_per_param": 3, "param_count": "all"}}))
    assert build_config_dict(path, {"train.steps": 7})["train"] == {"steps": 7}
    assert build_config_dict(path, {})["train"] == {"tokens_per_param": 3, "param_count": "all"}


# --- every path ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "code.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(400)))
    return path


def test_a_compare_trains_to_its_budget_and_says_so(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--seeds", "1", "--tokens-per-param", "0.005", "--out", str(out)
    )
    assert code == 0, output
    assert (
        "2 runs (1 seed) × 3 steps on cpu with 1 thread (0.005 tokens per parameter of the "
        "baseline arm's 7,264 parameters, all)" in output
    )
    budget = run_folder.read_experiment(out)["budget"]
    assert budget == {
        "tokens_per_param": 0.005, "param_count": "all", "n_params": 7264,
        "tokens_per_step": 16, "steps": 3, "tokens": 48,
    }  # fmt: skip
    for run_id, spec in _run_configs(out).items():
        assert spec["train"]["steps"] == 3 and spec["train"]["budget_params"] == 7264
        summary = run_folder.read_summary(out / "runs" / run_id)
        assert summary is not None and summary["tokens"] == 48
        assert summary["tokens_per_param"] == pytest.approx(48 / 7264)  # the baseline's N
    with (out / RUNS_CSV_FILE).open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["tokens_per_param"]) for r in rows] == pytest.approx([48 / 7264] * 2)
    analysis = _read(out / ANALYSIS_FILE)
    assert analysis["budget"]["early_training"] and analysis["budget"]["given"]
    note = early_note(0.005)
    assert f"Note: {note}." in output
    report = (out / "report.md").read_text(encoding="utf-8")
    assert (
        "**Training budget:** Each run trained 3 steps, 48 tokens: 0.005 tokens per parameter "
        "of the baseline arm's 7,264 parameters, all (the budget given, the same tokens for "
        "every arm)." in report
    )
    verdict, setup = report.split("## What was compared", 1)
    assert note[:1].upper() + note[1:] in verdict  # beside the verdict
    assert "Training budget" in setup


def test_plan_writes_the_resolved_budget_into_every_run_json(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--seeds", "2", "--tokens-per-param", "0.1", "--param-count",
        "non_embedding", "--plan", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    n = 7264 - 256 * 16  # the tied token embedding left out
    steps = math.ceil(0.1 * n / 16)
    specs = _run_configs(out)
    assert len(specs) == 4 and not any((out / "runs" / r / "summary.json").exists() for r in specs)
    for spec in specs.values():
        assert spec["train"]["param_count"] == "non_embedding"
        assert (spec["train"]["budget_params"], spec["train"]["steps"]) == (n, steps)
    assert run_folder.read_experiment(out)["budget"]["steps"] == steps


def test_each_rung_of_a_ladder_trains_in_proportion_to_its_size(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--ladder", "d_model=8,16", "--seeds", "2", "--tokens-per-param",
        "0.01", "--no-report", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    plan = run_folder.read_ladder_plan(out)
    assert plan["steps"].startswith("0.01 tokens per parameter of each rung's baseline arm")
    rungs = _read(out / ANALYSIS_FILE)[LADDER_KEY]["arms"]["rmsnorm-pre"]["rungs"]
    seen = []
    for setting, rung in zip(("d_model=8", "d_model=16"), rungs, strict=True):
        budget = plan["budgets"][setting]
        n = budget["n_params"]
        assert (
            budget["steps"] == math.ceil(0.01 * n / 16) and budget["tokens"] == 16 * budget["steps"]
        )
        assert (
            n
            == run_folder.read_experiment(out / setting)["parameter_counts"]["layernorm-pre"][
                "n_params"
            ]
        )
        for spec in _run_configs(out / setting).values():
            assert spec["train"]["steps"] == budget["steps"]
        assert (rung["steps"], rung["tokens"], rung["tokens_per_param"]) == (
            budget["steps"], budget["tokens"], 0.01,
        )  # fmt: skip
        seen.append(budget["steps"])
    assert seen[0] < seen[1]  # the larger rung trains longer


def test_rounds_and_tuning_folders_train_the_steps_of_their_grid(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, corpus, "--seeds", "2", "--until-decided", "--max-seeds", "3",
        "--tokens-per-param", "0.003", "--lr-sweep", "0.001,0.03", "--tuning-seeds", "1",
        "--no-report", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    steps = math.ceil(0.003 * 7264 / 16)
    assert "round 1: seeds 0, 1" in output
    folders = [out, *(run_folder.sweep_path(out, r) for r in (0.001, 0.03))]
    for folder in folders:
        specs = _run_configs(folder)
        assert specs and {s["train"]["steps"] for s in specs.values()} == {steps}, folder
        assert run_folder.read_experiment(folder)["budget"]["steps"] == steps


def test_an_lm_model_counts_its_transformers_embeddings(tmp_path: Path, corpus: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    config = tmp_path / "lm.json"
    config.write_text(json.dumps({"lm": {"context": 16}, "train": {"eval_windows": 4}}))
    result = CliRunner().invoke(
        app,
        [
            "compare", "--config", str(config), "--model", "hf:gpt2", "--model-set",
            "n_embd=32,n_layer=1,n_head=2,n_positions=64", "--data", str(corpus),
            "--tokens-per-param", "0.5", "--param-count", "non_embedding", "--batch-size", "2",
            "--warmup", "1", "--seeds", "1", "--threads", "1", "--device", "cpu", "--plan",
            "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    spec = run_folder.read_run_config(out / "runs" / "layernorm-pre__s0")
    embeddings = 256 * 32 + 64 * 32  # wte (tied to the head) and wpe, the learned positions
    assert spec["train"]["budget_params"] == spec["n_params"] - embeddings
    assert spec["train"]["steps"] == math.ceil(0.5 * spec["train"]["budget_params"] / 32)


def test_a_script_refuses_the_budget(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["compare", "--script", "python t.py {norm}", "--metric", "val_loss",
         "--tokens-per-param", "20", "--out", str(tmp_path / "o")],
        env={"COLUMNS": "1000"},
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--tokens-per-param: sets normlab's own training, which --script replaces" in (
        result.output
    )
    assert not (tmp_path / "o").exists()


def test_steps_and_a_budget_together_are_refused(tmp_path: Path, corpus: Path) -> None:
    code, output = _invoke(
        tmp_path, corpus, "--steps", "3", "--tokens-per-param", "2", "--out", str(tmp_path / "o")
    )
    assert code == 2 and "not steps and tokens_per_param together" in output
    assert not (tmp_path / "o").exists()


# --- the analysis's flag -------------------------------------------------------------------


def test_early_training_is_flagged_below_its_threshold() -> None:
    assert EARLY_TRAINING_TOKENS_PER_PARAM < COMPUTE_OPTIMAL_TOKENS_PER_PARAM
    folder = load_compare_folder(FIXTURES / "compare_run")
    assert budget_record(folder)["tokens_per_param"] is None  # a folder that does not say
    for tokens, early in ((4_000, True), (5_000, False), (20_000, False)):
        experiment = {
            **folder.experiment,
            "fixed": {**folder.experiment["fixed"], "train.tokens": tokens},
            "parameter_counts": {"layernorm-pre": {"n_params": 1000, "n_norm_params": 10}},
        }
        record = budget_record(dataclasses.replace(folder, experiment=experiment))
        assert record["tokens_per_param"] == tokens / 1000 and not record["given"]
        assert record["early_training"] is early and (record["note"] is not None) is early
    assert early_note(2.87) == (
        "early training: 2.87 tokens per parameter, far below the ~20 of compute-optimal "
        "training; this verdict is about how fast the models start"
    )


def test_the_answer_says_the_note_right_after_the_verdicts() -> None:
    a = analyze(load_compare_folder(FIXTURES / "compare_run"))
    plain = answer_lines(a)
    assert not any(line.startswith("Note:") for line in plain)
    a["budget"] = {**a["budget"], "note": early_note(1.5)}
    after_verdicts = 2 + len(a["arm_order"]) - 1  # headline, "Verdict per arm", one per arm
    assert answer_lines(a) == [
        *plain[:after_verdicts],
        f"Note: {early_note(1.5)}.",
        *plain[after_verdicts:],
    ]


def test_the_schedule_flag_sets_train_schedule(tmp_path: Path, corpus: Path) -> None:
    """``--schedule wsd`` is ``train.schedule: wsd`` (its settings recorded with it); a value
    that is no schedule is refused naming the key."""
    out = tmp_path / "out"
    code, output = _invoke(tmp_path, corpus, "--seeds", "1", "--schedule", "wsd", "--plan",
                           "--out", str(out))  # fmt: skip
    assert code == 0, output
    for spec in _run_configs(out).values():
        assert spec["train"]["schedule"] == "wsd"
        assert {"cooldown", "decay"} <= set(spec["train"])
    code, output = _invoke(tmp_path, corpus, "--schedule", "steep", "--plan", "--out",
                           str(tmp_path / "bad"))  # fmt: skip
    assert code == 2 and "train.schedule" in output, output
