"""A run's summary.json has one builder and one writer (``normlab.run_format.summary``): the
``final_`` / ``best_`` rule checked once against a hand-made log, the same log giving the same
fields through ``normlab.track`` and through an import, and no other module writing the file or
laying out a summary's fields."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import normlab.track as track
from normlab import run_format
from normlab.run_format import CRASHED
from normlab.run_format.folder import read_summary, write_run_config
from normlab.run_format.script import ENV
from normlab.run_format.summary import (
    build_summary,
    crashed_summary,
    logged_quality,
    record_crash,
)
from normlab.run_format.testbeds import script_format, script_testbed
from normlab.trackers.importing import import_runs

SRC = Path(__file__).resolve().parents[2] / "src" / "normlab"
SUMMARY_MODULE = SRC / "run_format" / "summary.py"

NAN = float("nan")
LOG: dict[str, list[tuple[int, float]]] = {
    "val_loss": [(1, 2.0), (2, NAN), (3, 1.25), (4, 1.5)],
    "acc": [(1, 0.5), (3, 0.75), (4, 0.6)],
}
"""A run's eval values by metric, as (step, value). Worked by hand: val_loss (lower is better)
ends at 1.5 and is best at 1.25 (the NaN of step 2 is no value); acc (higher is better) ends at
0.6 and is best at 0.75."""
EXPECTED = {
    ("val_loss", True): {"final_val_loss": 1.5, "best_val_loss": 1.25},
    ("acc", False): {"final_acc": 0.6, "best_acc": 0.75},
}


@pytest.fixture(autouse=True)
def _no_compare_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV.values(), "RANK"):
        monkeypatch.delenv(name, raising=False)


def _values(metric: str) -> list[float]:
    return [v for _, v in LOG[metric]]


@pytest.mark.parametrize(("metric", "lower"), list(EXPECTED))
def test_the_final_and_best_rule_on_a_hand_made_log(metric: str, lower: bool) -> None:
    evals = {m: _values(m) for m in LOG}
    fields = logged_quality(evals, script_format(metric, lower))
    other = "acc" if metric == "val_loss" else "val_loss"
    assert fields == {**EXPECTED[metric, lower], f"final_{other}": LOG[other][-1][1]}
    assert logged_quality(evals, None) == {"final_val_loss": 1.5, "final_acc": 0.6}


def test_no_finite_value_has_no_best_and_an_unlogged_metric_no_field() -> None:
    fmt = script_format("val_loss")
    fields = logged_quality({"val_loss": [NAN, math.inf], "acc": []}, fmt)
    assert list(fields) == ["final_val_loss", "best_val_loss"]
    assert math.isinf(fields["final_val_loss"]) and fields["best_val_loss"] is None
    assert logged_quality({"acc": [0.5]}, fmt) == {"final_acc": 0.5}


@pytest.mark.parametrize(("metric", "lower"), list(EXPECTED))
def test_a_tracked_run_and_an_import_of_the_same_log_give_the_rules_fields(
    tmp_path: Path, metric: str, lower: bool
) -> None:
    testbed = script_testbed(metric, lower)
    folder = tmp_path / "tracked"
    spec = {"run_id": "a__s0", "arm": "a", "seed": 0, "norm": "a", "testbed": testbed}
    write_run_config(folder, {**spec, "placement": "pre", "precision": "fp32"})
    with track.init(norm="a", run_dir=folder) as run:
        for step in sorted({s for points in LOG.values() for s, _ in points}):
            run.log_eval(
                step, **{m: v for m, points in LOG.items() for s, v in points if s == step}
            )
    tracked = read_summary(folder)
    assert tracked is not None
    assert {k: tracked[k] for k in EXPECTED[metric, lower]} == EXPECTED[metric, lower]

    table = tmp_path / "runs.jsonl"
    rows = [
        {"run": f"{arm}_s0", "step": step, "metric": metric, "value": value}
        for arm in ("a", "b")
        for step, value in LOG[metric]
    ]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "imported"
    import_runs(f"jsonl:{table}", r"^(.+)_s\d+$", r"_s(\d+)$", metric, out, lower_is_better=lower)
    imported = read_summary(out / "runs" / "a__s0")
    assert imported is not None
    assert {k: imported[k] for k in EXPECTED[metric, lower]} == EXPECTED[metric, lower]


def test_a_summary_holds_its_testbeds_fields_in_order_then_what_the_caller_adds() -> None:
    fmt = run_format.testbed_format("dit")
    spec = {"run_id": "x__s1", "arm": "x", "seed": 1, "norm": "adarms", "placement": "pre"}
    summary = build_summary(
        fmt, spec, "finished", {"zeta": 1, "steps": 4}, logged={"val_loss": [0.5, 0.25]},
        extra={"alpha": 2, "final_val_loss": 0.3},
    )  # fmt: skip
    assert list(summary) == [*fmt.summary_fields, "zeta", "alpha"]
    assert summary["run_id"] == "x__s1" and summary["precision"] is None
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert summary["best_val_loss"] == 0.25 and summary["final_val_loss"] == 0.3  # extra wins
    bare = build_summary(None, spec, "finished", {"steps": 4})
    identity = ["run_id", "arm", "seed", "norm", "placement", "precision"]
    assert list(bare) == [*identity, "status", "steps"]


def test_a_crash_is_recorded_with_the_testbeds_fields(tmp_path: Path) -> None:
    spec = {"run_id": "a__s0", "arm": "a", "seed": 0, "testbed": "dit", "n_params": 7}
    summary = record_crash(tmp_path, spec, "RuntimeError: boom", "trace")
    assert read_summary(tmp_path) == summary
    assert list(summary) == [*run_format.testbed_format("dit").summary_fields, "error", "traceback"]
    assert summary["status"] == CRASHED and summary["n_params"] == 7
    unknown = crashed_summary({"testbed": "nope"}, "e", "")
    assert list(unknown)[:-2] == list(run_format.testbed_format("gpt").summary_fields)


# -- one writer, one builder --------------------------------------------------------------------


def summary_writes(source: str) -> list[int]:
    """Lines of ``source`` that import ``write_summary``, call it (by name or as an attribute),
    or lay a summary out from a format's fields (``dict.fromkeys(<…>.summary_fields)``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(a.name == "write_summary" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            lays_out = name == "fromkeys" and any(
                isinstance(a, ast.Attribute) and a.attr == "summary_fields" for a in node.args
            )
            if name == "write_summary" or lays_out:
                lines.append(node.lineno)
    return sorted(lines)


def test_only_run_format_summary_writes_or_lays_out_a_summary() -> None:
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if path != SUMMARY_MODULE
        for line in summary_writes(path.read_text(encoding="utf-8"))
    ]
    assert not found, "summary.json written or laid out outside run_format.summary: " + ", ".join(
        found
    )
    assert summary_writes(SUMMARY_MODULE.read_text(encoding="utf-8"))


def test_the_writer_check_can_fail() -> None:
    assert summary_writes("from normlab.run_format.folder import write_summary\n") == [1]
    assert summary_writes("import normlab.run_format.folder as f\nf.write_summary(d, s)\n") == [2]
    assert summary_writes("s = dict.fromkeys(fmt.summary_fields)\n") == [1]
    assert summary_writes("columns = list(fmt.summary_fields)\nread_summary(d)\n") == []
