"""benchmarks/ladder_studies.py: its commands are public ``normlab`` commands (``--lr-sweep``,
no folder named by a rate of its own), it reads the folders through the run format, and its
analysis and document on made-up numbers: the hold-out, the own-rate comparisons, the transfer's
reading, and the document's section replaced in place."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from normlab.analysis.ladder import Rung
from normlab.analysis.lr_sweep import PLAIN_SWEEP_SETTING, lr_sweep_record, select_learning_rates
from normlab.run_format import LR_SWEEP_KEY
from normlab.run_format import folder as run_folder
from normlab.study.loader import load_study

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    path = ROOT / "benchmarks" / "ladder_studies.py"
    spec = importlib.util.spec_from_file_location("normlab_ladder_studies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ls = load_script()


def _rungs(last: tuple[float, ...]) -> list[Rung]:
    noise = (-0.01, 0.0, 0.01)
    sizes = (1e4, 4e4, 1.6e5)
    out = [
        Rung(f"d={i}", n, tuple(0.05 - 0.01 * i + z for z in noise)) for i, n in enumerate(sizes)
    ]
    return [*out, Rung("d=3", 6.4e5, last)]


def test_holdout_fits_without_the_largest_rung_and_checks_it() -> None:
    on_trend = ls.holdout(_rungs((0.01, 0.02, 0.03)), n_boot=1000)
    assert on_trend["held_out"].setting == "d=3"
    assert on_trend["prediction"].target_params == 6.4e5
    assert on_trend["mean_inside"] and on_trend["singles_inside"] == 3
    far = ls.holdout(_rungs((0.49, 0.5, 0.51)), n_boot=1000)
    assert not far["mean_inside"] and far["singles_inside"] == 0
    assert far["fit"].b == on_trend["fit"].b  # the held-out rung is not in the fit


def test_spread_per_rung_and_its_slope() -> None:
    rungs = [Rung("a", 1e4, (0.0, 0.2)), Rung("b", 1e5, (0.0, 0.02))]
    sp = ls.spread(rungs)
    assert [round(r["stats"].sd, 6) for r in sp["rows"]] == [0.141421, 0.014142]
    assert abs(sp["slope"] + 1.0) < 1e-9  # tenfold less sd per tenfold in N
    assert sp["rows"][0]["need"] > sp["rows"][1]["need"]
    lo, hi = sp["rows"][0]["sd_ci"]
    assert lo < 0.141421 < hi


def test_place_replaces_only_its_own_section() -> None:
    doc = "# t\n\n<!-- kept: x -->\n## coverage\n\ntext\n"
    first = ls.place(doc, f"{ls.BEGIN}\nA\n{ls.END}")
    assert first.startswith(doc.rstrip("\n")) and first.count(ls.BEGIN) == 1
    second = ls.place(first + "\n## later\n", f"{ls.BEGIN}\nB\n{ls.END}")
    assert "\nA\n" not in second and "\nB\n" in second and second.endswith("## later\n")
    assert ls.KEPT_MARKER in ls.place("# t\n", f"{ls.BEGIN}\nA\n{ls.END}")


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_every_training_is_a_public_compare_or_coord_check(tmp_path: Path) -> None:
    cmds = ls.plan(tmp_path, ls.FULL)
    every = [c for study in cmds.values() for c in study]
    assert {tuple(c[:2]) for c in every} == {("normlab", "compare"), ("normlab", "coord-check")}
    assert all(_flag(c, "--out").startswith(str(tmp_path)) for c in every)
    assert not any("lr=" in part for c in every for part in c)  # no rate-named folder of its own
    rates = ",".join(f"{r:g}" for r in ls.RATES)
    for p, cmd in zip(ls.PARAMETRIZATIONS, cmds["transfer"], strict=True):
        assert _flag(cmd, "--parametrization") == p and _flag(cmd, "--lr-sweep") == rates
        assert _flag(cmd, "--ladder") == "d_model=32,64,128" and _flag(cmd, "--tuning-seeds") == "2"
    sweep, shared = cmds["own_rate"]  # the baseline's best is not known before the sweep
    assert _flag(sweep, "--lr-sweep") == rates and "--lr" not in sweep
    assert _flag(shared, "--lr") == "0.005"
    assert cmds["holdout"] == [
        [
            "normlab",
            "compare",
            "--config",
            "examples/ladder.yaml",
            "--out",
            str(tmp_path / "holdout"),
        ]
    ]
    assert (tmp_path / "own_rate.yaml").exists() and (tmp_path / "transfer.yaml").exists()


def test_the_smoke_scale_runs_the_same_commands_small(tmp_path: Path) -> None:
    full, smoke = ls.plan(tmp_path, ls.FULL), ls.plan(tmp_path, ls.SMOKE)
    assert [len(v) for v in full.values()] == [len(v) for v in smoke.values()]
    for a, b in zip(full["transfer"], smoke["transfer"], strict=True):
        assert b[: a.index("--ladder")] == a[: a.index("--ladder")]
        assert _flag(b, "--steps") == "4" and _flag(b, "--lr-sweep") == "0.005,0.01"
    assert _flag(smoke["holdout"][0], "--ladder") == "d_model=16,32,64"
    with pytest.raises(SystemExit):
        ls.main(["--smoke", "--no-run", "--out", str(tmp_path)])  # no --doc: refused


def _curves(best: dict[str, float]) -> dict[str, Any]:
    """A sweep where each arm's loss is lowest at its ``best`` rate."""
    losses = {
        arm: {r: [3.0 + abs(r - b), 3.01 + abs(r - b)] for r in (0.005, 0.01, 0.02)}
        for arm, b in best.items()
    }
    return select_learning_rates(losses)


def _compare_summary(words: dict[str, tuple[float, str]], sweep: dict | None = None) -> dict:
    """A compare folder's summary.json: its baseline, the arms' comparisons and words."""
    arms = ["layernorm-pre", *words]
    out: dict[str, Any] = {
        "baseline_arm": "layernorm-pre",
        "arm_order": arms,
        "quality_metric": "final_val_bpb",
        "comparisons": {
            a: {"final_val_bpb": {"mean_diff": d, "ci_low": d - 0.1, "ci_high": d + 0.1}}
            for a, (d, _) in words.items()
        },
        "verdicts": {a: {"quality": w} for a, (_, w) in words.items()},
    }
    if sweep is not None:
        out[LR_SWEEP_KEY] = sweep
    return out


def _write(folder: Path, summary: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    run_folder.write_analysis(folder, summary)


def test_the_own_rate_study_reads_its_three_folders(tmp_path: Path) -> None:
    curves = _curves({"layernorm-pre": 0.02, "dyt-pre": 0.01})
    record = lr_sweep_record({PLAIN_SWEEP_SETTING: curves}, [3, 4])
    assert ls.own_rate(tmp_path) is None and ls.baseline_best(tmp_path) is None
    _write(tmp_path / "own_rate", _compare_summary({"dyt-pre": (-0.05, "inconclusive")}, record))
    run_folder.write_experiment(tmp_path / "own_rate", {"seeds": [0, 1, 2]})
    assert ls.baseline_best(tmp_path) == 0.02
    cmds = ls.own_rate_commands(tmp_path, ls.FULL)
    assert len(cmds) == 3 and _flag(cmds[2], "--lr") == "0.02"
    assert _flag(cmds[2], "--out") == str(tmp_path / "own_rate_baseline_best")
    _write(tmp_path / "own_rate_shared", _compare_summary({"dyt-pre": (0.7, "worse")}))
    assert ls.own_rate(tmp_path) is None  # the baseline-best comparison has not run
    _write(tmp_path / "own_rate_baseline_best", _compare_summary({"dyt-pre": (0.4, "worse")}))
    o = ls.own_rate(tmp_path)
    assert o is not None and o["evaluation_seeds"] == [0, 1, 2]
    (row,) = o["rows"]
    assert (row["arm"], row["base"]) == ("dyt-pre", "layernorm-pre")
    assert row["shared"]["rates"] == (0.005, 0.005) and row["shared"]["word"] == "worse"
    assert row["base_best"]["rates"] == (0.02, 0.02) and row["base_best"]["mean_diff"] == 0.4
    assert row["own"]["rates"] == (0.01, 0.02) and row["own"]["word"] == "inconclusive"
    text = "\n".join(
        ls.render_own_rate(o, cmds, tmp_path, {"date": "d", "commit": "c", "machine": "m"})
    )
    assert "| dyt-pre vs layernorm-pre, each at its own best | 0.01 / 0.02 | −0.0500" in text
    assert "the verdict changes from worse to inconclusive" in text
    assert "on the tuning seeds 3, 4, chooses" in text and "evaluation seeds 0, 1, 2" in text


def test_a_shared_baseline_best_reuses_the_shared_folder(tmp_path: Path) -> None:
    record = lr_sweep_record({PLAIN_SWEEP_SETTING: _curves({"layernorm-pre": 0.005})}, [3, 4])
    _write(tmp_path / "own_rate", _compare_summary({}, record))
    assert len(ls.own_rate_commands(tmp_path, ls.FULL)) == 2


def test_the_studies_run_one_command_at_a_time_planning_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []

    def fake_run(cmd: list[str]) -> None:  # the sweep chooses 0.01 for the baseline
        ran.append(cmd)
        if _flag(cmd, "--out") == str(tmp_path / "own_rate"):
            curves = _curves({"layernorm-pre": 0.01})
            record = lr_sweep_record({PLAIN_SWEEP_SETTING: curves}, [3, 4])
            _write(tmp_path / "own_rate", _compare_summary({}, record))

    monkeypatch.setattr(ls, "run_one", fake_run)
    (tmp_path / "coord_mup").mkdir()
    (tmp_path / "coord_mup" / ls.COORD_CHECK_FILE).write_text("{}")
    ls.run_studies(tmp_path, ls.FULL, ["coord", "own_rate"])
    outs = [Path(_flag(c, "--out")).name for c in ran]
    assert outs == ["coord_sp", "own_rate", "own_rate_shared", "own_rate_baseline_best"]
    assert _flag(ran[-1], "--lr") == "0.01"


def _record(best: dict[str, dict[str, float]]) -> dict:
    """A ladder's sweep record: {setting: {arm: best rate}}."""
    return lr_sweep_record({s: _curves(by_arm) for s, by_arm in best.items()}, [2, 3])


def test_the_transfer_reading_follows_the_sweep_records() -> None:
    same = {"d=32": {"ln": 0.01}, "d=128": {"ln": 0.01}}
    moved = {"d=32": {"ln": 0.005}, "d=128": {"ln": 0.02}}
    holds = ls._transfer_reading({"mup": _record(same), "sp": _record(moved)})
    assert "μP's prediction holds" in holds
    assert "mup would be aligned and sp not aligned" in holds
    fails = ls._transfer_reading({"mup": _record(moved), "sp": _record(moved)})
    assert "**This did not hold**" in fails
    assert "Only part" in ls._transfer_reading({"mup": _record(same), "sp": {}})
    assert ls._transfer_reading({"mup": {}, "sp": {}}) == "Reading: the sweep has not finished."
    table = ls._curve_table(_record(same)["settings"], "width")
    assert table[0] == "| width | arm | 0.005 | 0.01 | 0.02 | best |"
    assert table[2] == "| d=32 | ln | 3.010 ± 0.007 | **3.005 ± 0.007** | 3.015 ± 0.007 | 0.01 |"


def test_a_study_not_run_says_so(tmp_path: Path) -> None:
    lines = ls.document(tmp_path, ls.FULL)
    assert lines[0] == ls.BEGIN and lines[-1] == ls.END
    text = "\n".join(lines)
    assert text.count("Not run yet.") == 2 and "Learning-rate sweep, mup: not finished." in text
    assert "Smoke run" not in text and "Smoke run" in "\n".join(ls.document(tmp_path, ls.SMOKE))


# ---- the trained hold-out ----------------------------------------------------------------------

SWEPT = ("d_model=16", "d_model=32")
TRAINED_RUNGS = ("d_model=16", "d_model=32", "d_model=64", "d_model=128")


def _trained_sweep(
    tmp_path: Path, best: dict[str, float], wider: dict[str, float] | None = None
) -> None:
    """The sweep ladder's summary.json: each arm best at its ``best`` rate at the smallest
    width (and at its ``wider`` one at the next, by default the same), chosen at the smallest
    for every rung of the hold-out ladder."""
    curves = {SWEPT[0]: _curves(best), SWEPT[1]: _curves(wider or best)}
    chosen_at = dict.fromkeys(TRAINED_RUNGS, SWEPT[0])
    record = lr_sweep_record(curves, [3, 4], chosen_at)
    _write(tmp_path / "holdout_trained_sweep", {"ladder": {"arms": {}, LR_SWEEP_KEY: record}})


def test_the_trained_holdout_sweeps_then_trains_the_ladder_at_the_chosen_rates(
    tmp_path: Path,
) -> None:
    (sweep,) = ls.holdout_trained_commands(tmp_path, ls.FULL)  # nothing chosen yet
    assert sweep[:4] == ["normlab", "compare", "--config", "examples/ladder.yaml"]
    assert _flag(sweep, "--ladder") == "d_model=16,32" and _flag(sweep, "--tuning-seeds") == "2"
    assert _flag(sweep, "--lr-sweep") == "0.005,0.01,0.02,0.04"
    assert _flag(sweep, "--tokens-per-param") == "10" and "--steps" not in sweep
    assert ls.plan(tmp_path, ls.FULL)["holdout_trained"] == [sweep]
    _trained_sweep(tmp_path, {"layernorm-pre": 0.02, "rmsnorm-pre": 0.01})
    assert ls.trained_rates(tmp_path) == {"layernorm-pre": 0.02, "rmsnorm-pre": 0.01}
    again, ladder = ls.holdout_trained_commands(tmp_path, ls.FULL)
    assert again == sweep and _flag(ladder, "--out") == str(tmp_path / "holdout_trained")
    assert _flag(ladder, "--parametrization") == "mup" and "--ladder" not in ladder
    # the config is the example's with each arm's rate, valid as compare reads it
    config = Path(_flag(ladder, "--config"))
    loaded = load_study(config, {"train.tokens_per_param": 10.0}, "mup")
    assert loaded.config.train.arm_lr == {"layernorm-pre": 0.02, "rmsnorm-pre": 0.01}
    assert loaded.ladder is not None and loaded.ladder.values == (16, 32, 64, 128)
    assert loaded.config.model.parametrization == "mup"
    small = ls.holdout_trained_commands(tmp_path, ls.SMOKE)
    assert [_flag(c, "--tokens-per-param") for c in small] == ["0.05", "0.05"]
    assert _flag(small[1], "--ladder") == "d_model=16,32,64" and "--steps" not in small[1]


def _trained_ladder(
    tmp_path: Path, ln_bpb: tuple[float, ...], held_out: tuple, lack_of_fit_p: float = 0.5
) -> None:
    """The hold-out ladder's summary.json (rmsnorm-pre − layernorm-pre on four rungs, the
    largest's differences ``held_out``) and each rung's, with layernorm-pre's mean ``ln_bpb``."""
    folder = tmp_path / "holdout_trained"
    rungs = []
    for i, (setting, rung) in enumerate(zip(TRAINED_RUNGS, _rungs(held_out), strict=True)):
        diffs = list(rung.diffs)
        mean = sum(diffs) / 3
        sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
        rungs.append(
            {
                "setting": setting,
                "n_params": rung.n_params,
                "tokens_per_param": 10.0,
                "tokens": 200 * 4**i * 512,
                "steps": 200 * 4**i,
                "diffs": diffs,
                "seeds": [0, 1, 2],
                "mean": mean,
                "low": mean - 0.05,
                "high": mean + 0.05,
                "sd": sd,
            }
        )
        arms = {
            "layernorm-pre": {"final_val_bpb": {"mean": ln_bpb[i], "std": 0.01}},
            "rmsnorm-pre": {"final_val_bpb": {"mean": ln_bpb[i] + mean, "std": 0.02}},
        }
        _write(run_folder.rung_path(folder, setting), {"arms": arms})
    rec = {
        "arm": "rmsnorm-pre",
        "baseline": "layernorm-pre",
        "metric": "final_val_bpb",
        "rungs": rungs,
        "fit": {
            "b": -0.01,
            "b_se": 0.004,
            "pooled_sd": 0.01,
            "df": 8,
            "lack_of_fit_p": lack_of_fit_p,
        },
        "target": {"n_params": 6.4e7},
        "prediction": {"single": {"estimate": -0.02, "low": -0.08, "high": 0.05}},
    }
    _write(folder, {"ladder": {"arms": {"rmsnorm-pre": rec}}})


CTX = {"date": "d", "commit": "c", "machine": "m"}


def test_the_trained_holdout_section_says_monotone_covered_and_the_width(tmp_path: Path) -> None:
    assert ls.holdout_trained(tmp_path) is None
    _trained_sweep(tmp_path, {"layernorm-pre": 0.02, "rmsnorm-pre": 0.01})
    _trained_ladder(tmp_path, (3.8, 3.2, 2.7, 2.3), (0.01, 0.02, 0.03))
    h = ls.holdout_trained(tmp_path)
    assert h is not None and h["monotone"] == {"layernorm-pre": True, "rmsnorm-pre": True}
    cmds = ls.holdout_trained_commands(tmp_path, ls.FULL)
    text = "\n".join(ls.render_holdout_trained(h, cmds, tmp_path, CTX))
    assert "`python benchmarks/ladder_studies.py --only holdout_trained`" in text
    assert "| d_model=128 | 640,000 | 10.24 | 12,800 | 2.300 ± 0.010 |" in text
    assert "training 10 tokens per parameter" in text
    assert "Monotone in size: **yes**" in text and "layernorm-pre 3.800 → 3.200" in text
    assert "lies inside" in text and ": covered." in text and "too narrow" not in text
    assert "run +0.050 → +0.040 → +0.030 → +0.020: the held-out rung's lies 0.000 bpb" in text
    assert "0.130 bpb wide, against 0.54 bpb" in text and "0.24× its width (narrower)" in text
    assert "layernorm-pre 0.02, rmsnorm-pre 0.01" in text and "| d_model=32 | rmsnorm-pre |" in text
    assert "the difference mixes the norm with the rate" not in text
    _trained_sweep(tmp_path, {"layernorm-pre": 0.02, "rmsnorm-pre": 0.01}, {"rmsnorm-pre": 0.02})
    _trained_ladder(tmp_path, (3.8, 3.2, 2.7, 2.9), (0.49, 0.5, 0.51), lack_of_fit_p=0.01)
    h = ls.holdout_trained(tmp_path)
    text = "\n".join(ls.render_holdout_trained(h, cmds, tmp_path, CTX))
    assert "the difference mixes the norm with the rate" in text
    assert "at d_model=32 0.02 beat 0.01 by 0.010 bpb on the tuning seeds" in text
    assert "rmsnorm-pre − layernorm-pre there is +0.0400" in text
    assert "Monotone in size: **no**" in text and "**this did not hold** for layernorm-pre" in text
    assert "**lies outside**" in text and "**not covered**" in text
    assert "bpb above the smaller rungs' line" in text and "found every interval too" in text


def test_the_trained_section_is_written_apart_from_the_others(tmp_path: Path) -> None:
    doc = tmp_path / "studies.md"
    doc.write_text(f"# t\n\n<!-- kept: x -->\n\n{ls.BEGIN}\nOTHERS\n{ls.END}\n", encoding="utf-8")
    out = tmp_path / "out"
    ls.main(
        ["--smoke", "--no-run", "--only", "holdout_trained", "--out", str(out), "--doc", str(doc)]
    )
    text = doc.read_text(encoding="utf-8")
    assert f"{ls.BEGIN}\nOTHERS\n{ls.END}" in text  # the other studies' sections untouched
    assert text.index(ls.END) < text.index(ls.TRAINED_BEGIN) < text.index(ls.TRAINED_END)
    assert "## Ladder: hold-out on trained rungs\n\nNot run yet." in text
    ls.main(
        ["--smoke", "--no-run", "--only", "holdout_trained", "--out", str(out), "--doc", str(doc)]
    )
    assert doc.read_text(encoding="utf-8") == text  # replaced in place, not appended again
