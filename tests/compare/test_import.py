"""``normlab report --import``: runs written by a real TensorBoard ``SummaryWriter`` get the same
verdict and the same paired differences as the same runs read from normlab's own format; the
report says which pairing checks could be made; the output folder is replaced only by an import
of the same source; every refusal is one line naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normlab.analysis.runs import load_compare_folder
from normlab.analysis.summary import analyze
from normlab.cli import app
from normlab.report.imported import import_paragraphs, pairing_lines
from normlab.run_format.folder import read_experiment, read_records, read_summary, run_folders
from normlab.trackers.importing import import_runs
from normlab.trackers.tracked import TrackerImportError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "compare_run"
"""A compare folder of normlab's own runs (GPT testbed, judged on final_val_bpb)."""
RULES = (r"^(.+)_s\d+$", r"_s(\d+)$")


def test_tensorboard_import_gives_the_same_verdict_as_normlabs_own_format(
    tmp_path: Path,
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    logs = tmp_path / "tb"
    for run in run_folders(FIXTURE):
        with SummaryWriter(log_dir=str(logs / run.name)) as writer:
            for record in read_records(run, "train"):
                writer.add_scalar("loss", record["loss"], record["step"])
            for record in read_records(run, "eval"):
                writer.add_scalar("val_bpb", record["val_bpb"], record["step"])
    out = tmp_path / "imported"
    result = CliRunner().invoke(
        app,
        [
            "report", "--import", f"tensorboard:{logs}",
            "--arm-from", r"^(.+)__s\d+$", "--seed-from", r"__s(\d+)$",
            "--metric", "val_bpb", "--margin", "0.02", "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pairing: Initial parameters and first batch: not recorded" in result.stdout
    own = analyze(load_compare_folder(FIXTURE))
    imported = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert imported["baseline_arm"] == own["baseline_arm"] == "layernorm-pre"
    arm = "rmsnorm-pre"
    assert imported["verdicts"][arm]["quality"] == own["verdicts"][arm]["quality"]
    for metric in ("final_val_bpb", "best_val_bpb"):
        mine, theirs = imported["comparisons"][arm][metric], own["comparisons"][arm][metric]
        assert mine["n_pairs"] == theirs["n_pairs"] == 3
        for key in ("mean_diff", "sd_diff", "ci_low", "ci_high", "tost_low", "tost_high"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), (metric, key)
        assert mine["verdict"] == theirs["verdict"]
    for seed in (0, 1, 2):  # the paired differences themselves, seed by seed
        diffs = []
        for folder in (FIXTURE, out):
            a, b = (read_summary(folder / "runs" / f"{x}__s{seed}") for x in ("layernorm-pre", arm))
            diffs.append(b["final_val_bpb"] - a["final_val_bpb"])  # type: ignore[index]
        assert diffs[0] == pytest.approx(diffs[1], abs=1e-6)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "imported from TensorBoard" in report
    assert "Initial parameters and first batch: not recorded by the tracker, not checked" in report
    assert "pairing was checked from each run's fingerprint" not in report.lower()
    assert "starts from the same initial values" not in report  # assumed, not claimed
    assert "started alike is assumed" in report


def _write_csv(path: Path, rows: list[tuple[str, int, str, str]]) -> Path:
    lines = ["run,step,metric,value", *(",".join(map(str, row)) for row in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _curve(run: str, steps: int, base: float) -> list[tuple[str, int, str, str]]:
    return [(run, s, "val_loss", repr(base + 1.0 / s)) for s in range(1, steps + 1)]


_BROKEN_ROWS = [
    *_curve("ln_s0", 4, 0.0), *_curve("rms_s0", 4, 0.01),
    *_curve("ln_s1", 4, 0.1), *_curve("rms_s1", 3, 0.11),  # rms stopped at step 3
    *_curve("ln_s2", 4, 0.2),  # no rms run at seed 2
    *_curve("ln_s3", 4, 0.3), ("rms_s3", 1, "val_loss", "nan"), ("rms_s3", 2, "val_loss", "1"),
    ("ln_s4", 1, "loss", "2.0"), *_curve("rms_s4", 2, 0.4),  # ln never logged val_loss
]  # fmt: skip


def test_report_names_unpaired_seeds_step_differences_and_broken_runs(tmp_path: Path) -> None:
    """By default a run that ended whole at an earlier step than its seed's other arm (rms_s1)
    is left out and its seed named unpaired; a diverged run (rms_s3) and one that never logged
    the metric (ln_s4) keep their statuses, and their seeds' step differences are named."""
    out = tmp_path / "out"
    csv = _write_csv(tmp_path / "r.csv", _BROKEN_ROWS)
    plan = import_runs(f"csv:{csv}", *RULES, "val_loss", out, margin=0.1)
    assert [(s["run"], s.get("arm"), s.get("seed")) for s in plan.skipped] == [("rms_s1", "rms", 1)]
    assert "it ends at step 3, before step 4 where ln of seed 1 end" in plan.skipped[0]["reason"]
    experiment = read_experiment(out)
    lines = pairing_lines(experiment)
    assert "not recorded by the tracker, not checked" in lines[0]
    assert "unpaired: seed 1 (rms_s1 left out), seed 2 (no run of rms)" in lines[1]
    assert "seed 1:" not in lines[2]
    assert "seed 3: ln to step 4, rms to step 2 (rms ends earlier)" in lines[2]
    assert "seed 4: ln to step 1, rms to step 2 (ln ends earlier)" in lines[2]
    assert "those that remain failed, diverged or did not end" in lines[2]
    assert "not recorded by CSV" in lines[3]
    diverged = read_summary(out / "runs" / "rms__s3")
    assert diverged is not None and (diverged["status"], diverged["diverged_at"]) == ("diverged", 1)
    crashed = read_summary(out / "runs" / "ln__s4")
    assert crashed is not None and crashed["status"] == "crashed"
    assert "logged no value of 'val_loss'" in crashed["error"]
    assert not (out / "runs" / "rms__s1").exists()
    analysis = analyze(load_compare_folder(out))
    assert analysis["comparisons"]["rms"]["final_val_loss"]["n_pairs"] == 1  # seed 0 only
    paragraphs = import_paragraphs(experiment)
    assert "runs were trained elsewhere" in paragraphs[0]
    assert "so is a run that ended whole at an earlier step" in paragraphs[0]
    assert "Tracker runs left out (1): rms_s1 (it ends at step 3" in paragraphs[2]


def test_compare_unequal_steps_judges_a_short_run_on_its_last_value(tmp_path: Path) -> None:
    """``--compare-unequal-steps``: the run that ended at step 3 is compared, and the words say
    that its last value is from an earlier step."""
    out = tmp_path / "out"
    csv = _write_csv(tmp_path / "r.csv", _BROKEN_ROWS)
    result = CliRunner().invoke(
        app,
        [
            "report", "--import", f"csv:{csv}", "--arm-from", RULES[0], "--seed-from", RULES[1],
            "--metric", "val_loss", "--margin", "0.1", "--out", str(out),
            "--compare-unequal-steps",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "left out rms_s1" not in result.stdout
    assert "seed 1: ln to step 4, rms to step 3 (rms ends earlier)" in result.stdout
    assert "compared on its last value, from an earlier step" in result.stdout
    analysis = analyze(load_compare_folder(out))
    assert analysis["comparisons"]["rms"]["final_val_loss"]["n_pairs"] == 2  # seeds 0 and 1
    short = read_summary(out / "runs" / "rms__s1")
    assert short is not None and short["final_val_loss"] == pytest.approx(0.11 + 1 / 3)


def test_an_undecided_import_asks_for_more_logged_seeds_not_until_decided(
    tmp_path: Path,
) -> None:
    rows = []
    for seed, diff in enumerate((0.05, -0.03, 0.08)):  # spread too wide for the margin
        rows += _curve(f"ln_s{seed}", 2, 0.1 * seed) + _curve(f"rms_s{seed}", 2, 0.1 * seed + diff)
    out = tmp_path / "out"
    import_runs(f"csv:{_write_csv(tmp_path / 'r.csv', rows)}", *RULES, "val_loss", out, margin=0.01)
    recommendation = analyze(load_compare_folder(out))["recommendation"]
    assert recommendation["status"] == "undecided", recommendation
    assert "import them again into the same --out" in recommendation["headline"]
    assert "--until-decided" not in recommendation["headline"]  # normlab cannot train these


def test_out_is_replaced_only_by_an_import_of_the_same_source(tmp_path: Path) -> None:
    rows = [*_curve("a_s0", 2, 0.0), *_curve("b_s0", 2, 0.1)]
    first = _write_csv(tmp_path / "first.csv", rows)
    out = tmp_path / "out"
    import_runs(f"csv:{first}", *RULES, "val_loss", out, margin=0.1)
    (out / "report.md").write_text("an older report", encoding="utf-8")
    _write_csv(first, [*rows, *_curve("a_s1", 2, 0.0), *_curve("b_s1", 2, 0.1)])
    import_runs(f"csv:{first}", *RULES, "val_loss", out, margin=0.1)  # the same source again
    assert sorted(p.name for p in run_folders(out)) == ["a__s0", "a__s1", "b__s0", "b__s1"]
    assert not (out / "report.md").exists()  # the folder was replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.csv", "out"]  # no leftovers
    other = _write_csv(tmp_path / "other.csv", rows)
    with pytest.raises(TrackerImportError, match=r"^--out: .* holds no earlier import of csv:"):
        import_runs(f"csv:{other}", *RULES, "val_loss", out, margin=0.1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep", encoding="utf-8")
    with pytest.raises(TrackerImportError, match=r"^--out: .* is not empty"):
        import_runs(f"csv:{first}", *RULES, "val_loss", mine, margin=0.1)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    (out / "experiment.json").write_text('{"cut in half": ', encoding="utf-8")
    with pytest.raises(
        TrackerImportError, match=r"^--out: .* experiment\.json that cannot be read"
    ):
        import_runs(f"csv:{first}", *RULES, "val_loss", out, margin=0.1)
    assert (out / "experiment.json").read_text(encoding="utf-8") == '{"cut in half": '


_ROWS = [*_curve("ln_s0", 2, 0.0), *_curve("rms_s0", 2, 0.1), *_curve("ln_s1", 2, 0.0)]


@pytest.mark.parametrize(
    ("rows", "args", "words", "code"),
    [
        (_ROWS, {"--import": "parquet:{csv}"}, "--import: 'parquet:", 2),
        (_ROWS, {"--import": "csv:{tmp}/nowhere.csv"}, "--import: '", 1),
        ([], {}, "--import: no csv runs found", 1),
        (_ROWS, {"--arm-from": "^(ln"}, "--arm-from: '^(ln' is not a regular expression", 2),
        (_ROWS, {"--arm-from": "^(x.*)_s"}, "--arm-from: '^(x.*)_s' matched none of the 3 runs", 1),
        (_ROWS, {"--seed-from": "_(s\\d+)$"}, "--seed-from: run 'ln_s0' gives the seed 's0'", 1),
        (_ROWS, {"--arm-from": "^(ln)_s"}, "--arm-from: every run gives the one arm 'ln'", 1),
        (
            _ROWS,
            {"--metric": "acc"},
            "--metric: no run logged 'acc'; the runs logged 'val_loss'",
            1,
        ),
        (_ROWS, {"--arm-from": "param:norm"}, "--arm-from: 'param:norm' reads a param: field", 2),
        (
            [*_ROWS, *_curve("lnb_s0", 2, 0.0)],
            {"--arm-from": "^(ln|rms)"},
            "--arm-from/--seed-from: runs 'ln_s0' and 'lnb_s0' both give arm 'ln', seed 0",
            1,
        ),
        (
            [*_ROWS, *_curve("LN_s0", 2, 0.0)],
            {"--arm-from": "^(.+)_s"},
            "--arm-from: the arms 'LN' and 'ln' differ only in case",
            1,
        ),
        (_ROWS, {"--margin": "0"}, "--margin: expected the difference in val_loss", 2),
        (_ROWS, {"--margin": "nan"}, "--margin: expected the difference in val_loss", 2),
        (_ROWS, {"--baseline": "gn"}, "--baseline: 'gn' is not an arm", 1),
        (_ROWS, {"--out": None}, "--out: expected the folder", 2),
        (_ROWS, {"--import": None}, "--arm-from: an option of --import", 2),
    ],
)
def test_refusals_are_one_line_naming_the_option(
    tmp_path: Path,
    rows: list[tuple[str, int, str, str]],
    args: dict[str, str | None],
    words: str,
    code: int,
) -> None:
    """Each refusal exits as the table of exit statuses says: 2 (usage) for an option as
    written, 1 (refused) for a source or runs that cannot be used with well-formed options."""
    csv = _write_csv(tmp_path / "runs.csv", rows)
    out = tmp_path / "out"
    given: dict[str, str | None] = {
        "--import": f"csv:{csv}",
        "--arm-from": RULES[0],
        "--seed-from": RULES[1],
        "--metric": "val_loss",
        "--margin": "0.1",
        "--out": str(out),
        **{k: v.format(csv=csv, tmp=tmp_path) if v else v for k, v in args.items()},
    }
    argv = [part for key, value in given.items() if value is not None for part in (key, value)]
    result = CliRunner().invoke(app, ["report", *argv])
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("normlab report: error: "), result.stderr
    assert words in lines[0], lines[0]
    assert not out.exists()


def test_a_metric_of_any_name_is_plotted_and_its_direction_kept(tmp_path: Path) -> None:
    """A higher-is-better metric with a name of its own (not val_bpb or val_loss): the
    validation plot reads it from the eval records, and the verdict line says higher is better."""
    from normlab.analysis.answer import answer_lines
    from normlab.report.curves import load_run_curves
    from normlab.report.plots import plot_validation
    from normlab.run_format import testbed_format

    rows = [(r, s, "acc", str(0.5 + 0.1 * s + b)) for r, b in (("a_s0", 0), ("b_s0", 0.01))
            for s in (1, 2)]  # fmt: skip
    out = tmp_path / "out"
    plan = import_runs(
        f"csv:{_write_csv(tmp_path / 'r.csv', rows)}", *RULES, "acc", out, False, margin=0.1
    )
    folder = load_compare_folder(out)
    curves = {arm: [load_run_curves(r) for r in folder.runs_of(arm)] for arm in folder.arms}
    assert list(curves["b"][0].eval_values("acc")) == pytest.approx([0.61, 0.71])
    figure = plot_validation(curves, {"a": "C0", "b": "C1"}, testbed_format(plan.testbed))
    drawn = [list(line.get_ydata()) for line in figure.axes[0].get_lines()]
    assert any(d == pytest.approx([0.6, 0.7]) for d in drawn), drawn
    lines = answer_lines(analyze(folder))
    assert "(arm − a, higher is better)" in lines[1]


def test_without_a_margin_tight_pairs_are_never_called_equivalent(tmp_path: Path) -> None:
    """``--margin`` left out: experiment.json records none, and paired differences that a margin
    of 0.1 would call equivalent get no equivalence verdict (the report builds all the same)."""
    rows = []
    for seed, diff in enumerate((0.001, -0.001, 0.002, 0.0)):
        rows += _curve(f"ln_s{seed}", 2, 0.1 * seed) + _curve(f"rms_s{seed}", 2, 0.1 * seed + diff)
    csv = _write_csv(tmp_path / "r.csv", rows)
    with_margin, without = tmp_path / "with", tmp_path / "without"
    import_runs(f"csv:{csv}", *RULES, "val_loss", with_margin, margin=0.1)
    import_runs(f"csv:{csv}", *RULES, "val_loss", without)
    assert read_experiment(without)["margin"] is None
    judged = analyze(load_compare_folder(with_margin))["comparisons"]["rms"]["final_val_loss"]
    assert judged["verdict"] == "equivalent", judged
    unjudged = analyze(load_compare_folder(without))["comparisons"]["rms"]["final_val_loss"]
    assert unjudged["verdict"] != "equivalent", unjudged
    result = CliRunner().invoke(app, ["report", str(without)])
    assert result.exit_code == 0, result.output
