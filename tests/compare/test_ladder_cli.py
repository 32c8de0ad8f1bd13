"""``normlab compare --ladder``: μP in training, the ladder as a grid of rungs, its refusals and
its summary, end to end through the command line on tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from in_process import use_in_process_workers
from normlab.cli import app
from normlab.experiment.training.schedule import lr_at, make_optimizer
from normlab.models import GPTConfig, build_gpt
from normlab.models.mup import hidden_names, set_lr
from normlab.run_format import ANALYSIS_FILE, LADDER_KEY, check_ladder, plot_path
from normlab.study.loader import study_configs
from normlab.study.rungs import plan_ladder
from report_figures import PNG_SIGNATURE, skip_rendering


def _gpt(d_model: int, parametrization: str) -> torch.nn.Module:
    cfg = GPTConfig(
        d_model=d_model,
        n_layers=1,
        n_heads=2,
        context=8,
        norm="layernorm",
        placement="pre",
        parametrization=parametrization,
        base_d_model=8,
    )
    return build_gpt(cfg, 0)


def test_mup_optimizer_groups_keep_their_multipliers_after_a_schedule_step() -> None:
    model = _gpt(32, "mup")
    opt = make_optimizer(model, 0.01, 0.1, (0.9, 0.95))
    lr = lr_at(2, 0.01, 10, 4, 0.1)  # inside the warm-up: half the peak
    set_lr(opt, lr)
    hidden = set(hidden_names(model))
    params = dict(model.named_parameters())
    by_id = {id(p): n for n, p in params.items()}
    seen = set()
    for group in opt.param_groups:
        for p in group["params"]:
            name = by_id[id(p)]
            seen.add(name)
            expected = lr * (8 / 32 if name in hidden else 1.0)
            assert group["lr"] == pytest.approx(expected, rel=1e-12), name
    assert seen == set(params)
    assert any(by_id[id(p)] in hidden for g in opt.param_groups for p in g["params"])


def test_sp_optimizer_has_todays_two_groups_in_parameter_order() -> None:
    model = _gpt(16, "sp")
    opt = make_optimizer(model, 0.01, 0.1, (0.9, 0.95))
    norms = set(model.norm_parameter_names())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in norms]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in norms)]
    groups = {g["weight_decay"]: g for g in opt.param_groups}
    assert len(opt.param_groups) == 2
    assert [id(p) for p in groups[0.1]["params"]] == [id(p) for p in decay]
    assert [id(p) for p in groups[0.0]["params"]] == [id(p) for p in rest]
    set_lr(opt, 0.003)
    assert all(g["lr"] == 0.003 for g in opt.param_groups)


TINY = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 2, "warmup": 1},
    "data": {"max_bytes": 300_000},
}


def _invoke(tmp_path: Path, *args: str) -> tuple[int, str]:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    result = CliRunner().invoke(app, ["compare", "--config", str(config), *args])
    return result.exit_code, result.output


def test_tiny_ladder_end_to_end(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)  # the ladder's grids, not the worker processes
    skip_rendering(monkeypatch)  # each rung's report: figures drawn, not rendered
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, "--ladder", "d_model=8,16", "--seeds", "2", "--steps", "2",
        "--data", str(corpus), "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    summary = json.loads((out / ANALYSIS_FILE).read_text())
    check_ladder(summary[LADDER_KEY])
    rec = summary[LADDER_KEY]["arms"]["rmsnorm-pre"]
    assert [r["setting"] for r in rec["rungs"]] == ["d_model=8", "d_model=16"]
    assert all(r["n"] == 2 for r in rec["rungs"])
    assert rec["rungs"][0]["n_params"] < rec["rungs"][1]["n_params"]
    assert rec["target"]["extrapolation"] == pytest.approx(100.0)
    assert (out / plot_path("ladder")).read_bytes()[:8] == PNG_SIGNATURE
    assert (out / plot_path("ladder")).stat().st_size > 1000  # rendered, not a stand-in
    for setting in ("d_model=8", "d_model=16"):
        assert (out / setting / ANALYSIS_FILE).is_file()  # each rung's own report
    last = output.strip().splitlines()[-1]
    assert last == rec["prediction"]["sentence"] and "100× beyond the largest rung" in last


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--ladder", "d_model=16"], "--ladder"),
        (["--ladder", "vocab_size=8,16"], "--ladder"),
        (["--ladder", "d_model=8,1.5"], "--ladder"),
        (["--ladder", "d_model=8,10"], "--ladder"),  # 10 / 2 heads: odd rope head size
        (["--ladder", "d_model=8,16", "--target-params", "100"], "--target-params"),
        (["--ladder", "d_model=8,16", "--seeds", "1"], "--seeds"),
        (["--target-params", "1e9"], "--target-params"),
    ],
)
def test_bad_ladders_are_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, args: list[str], option: str
) -> None:
    out = tmp_path / "out"
    code, output = _invoke(tmp_path, *args, "--out", str(out))
    lines = output.strip().splitlines()
    assert code != 0
    assert len(lines) == 1 and option in lines[0], output
    assert not out.exists()


def test_plan_lists_every_rungs_runs(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path,
        "--ladder",
        "n_layers=1,2",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--plan",
        "--data",
        str(corpus),
        "--out",
        str(out),
    )
    assert code == 0, output
    ids = [line.split("--run ")[1] for line in output.splitlines() if "--run " in line]
    assert sorted(ids) == sorted(
        f"n_layers={n}/{arm}__s{s}"
        for n in (1, 2)
        for arm in ("layernorm-pre", "rmsnorm-pre")
        for s in (0, 1)
    )
    assert (out / "n_layers=2" / "runs" / "rmsnorm-pre__s1").is_dir()


def test_a_testbed_without_ladder_keys_is_refused_naming_the_option() -> None:
    ladder = study_configs({"testbed": "dit", "ladder": {"d_model": [8, 16]}}).ladder
    with pytest.raises(ValueError, match=r"^--ladder: not available for the dit testbed"):
        plan_ladder(ladder)


def test_the_ladder_computes_its_fit_without_the_report(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study computes the ladder's answer, the report only draws it: with --no-report the
    fit and prediction lines are printed and the fit is in the ladder's summary.json, no report
    is written; `normlab report` then draws the same answer."""
    use_in_process_workers(monkeypatch)
    skip_rendering(monkeypatch)
    out = tmp_path / "out"
    code, output = _invoke(
        tmp_path, "--ladder", "d_model=8,16", "--seeds", "2", "--steps", "2",
        "--data", str(corpus), "--no-report", "--out", str(out),
    )  # fmt: skip
    assert code == 0, output
    summary = json.loads((out / ANALYSIS_FILE).read_text())
    check_ladder(summary[LADDER_KEY])
    assert summary["plan"] == json.loads((out / "ladder.json").read_text())
    rec = summary[LADDER_KEY]["arms"]["rmsnorm-pre"]
    lines = output.strip().splitlines()
    assert lines[-1] == rec["prediction"]["sentence"]
    fit = [line for line in lines if line.startswith("fit: rmsnorm-pre − layernorm-pre")]
    assert len(fit) == 1 and f"{rec['fit']['b']:+.4g}" in fit[0]
    assert not (out / "report.md").exists() and not (out / "d_model=8" / "report.md").exists()

    result = CliRunner().invoke(app, ["report", str(out)], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == rec["prediction"]["sentence"]
    assert rec["prediction"]["sentence"] in (out / "report.md").read_text()
    redrawn = json.loads((out / ANALYSIS_FILE).read_text())[LADDER_KEY]["arms"]["rmsnorm-pre"]
    assert redrawn["fit"] == rec["fit"]  # the same runs, the same fit
