"""Counts and intervals in sentences: "1 seed", never "1 seeds"; "no interval", never
"95% CI no interval". Each sentence is built from a folder or a comparison with one seed, one
run or no pair at all, and the sources of analysis/ and report/ are checked for a count written
before a plural noun without :func:`normlab._plural.counted`."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from normlab._plural import counted, noun
from normlab.analysis import analyze, load_compare_folder
from normlab.analysis.answer import answer_lines
from normlab.analysis.format import NO_INTERVAL, fmt_interval, fmt_ratio, with_interval
from normlab.analysis.runs import RunResult
from normlab.analysis.sequential import SequentialPlan, decide
from normlab.analysis.stability import stability_verdict
from normlab.report.content import build_content

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
SRC = Path(__file__).resolve().parents[2] / "src" / "normlab"
ONE_PLURAL = re.compile(r"\b1 (paired |usable paired )?(seeds|runs|arms|steps|rungs|pairs)\b")


def test_a_count_takes_the_noun_of_its_number() -> None:
    assert counted(1, "seed") == "1 seed"
    assert counted(0, "seed") == "0 seeds"
    assert counted(3, "paired seed") == "3 paired seeds"
    assert counted(2, "child", "children") == "2 children"
    assert noun(1, "run") == "run" and noun(-1, "run") == "run" and noun(7, "run") == "runs"


def test_an_interval_without_ends_drops_its_label() -> None:
    assert fmt_interval(None, 0.1, label="95% CI") == NO_INTERVAL == "no interval"
    assert fmt_interval(float("nan"), 0.1, label="95% CI") == NO_INTERVAL
    assert fmt_interval(-0.01, 0.02, label="95% CI") == "95% CI [\u22120.0100, +0.0200]"
    assert fmt_interval(1.02, 1.1, fmt_ratio, label="95% CI", to=True) == (
        "95% CI 1.020× to 1.100×"
    )
    assert with_interval("+0.0100", None, None) == "+0.0100"
    assert with_interval("+0.0100", 0.0, 0.02) == "+0.0100 [+0.0000, +0.0200]"


def _folder(tmp_path: Path, seeds: list[int]) -> Path:
    """The fixture's compare folder keeping only ``seeds``."""
    out = tmp_path / "o"
    shutil.copytree(FIXTURE, out)
    for run in list((out / "runs").iterdir()):
        if int(run.name.rsplit("__s", 1)[1]) not in seeds:
            shutil.rmtree(run)
    exp = json.loads((out / "experiment.json").read_text())
    exp["seeds"] = seeds
    (out / "experiment.json").write_text(json.dumps(exp))
    return out


def test_one_seed_says_one_seed_and_no_interval(tmp_path: Path) -> None:
    """One seed per arm: the arm's line has a difference but no interval; the report's subtitle
    and every sentence count one seed in the singular."""
    out = _folder(tmp_path, [0])
    folder = load_compare_folder(out)
    a = analyze(folder)
    lines = answer_lines(a)
    arm_line = next(line for line in lines if "rmsnorm-pre vs layernorm-pre" in line)
    assert "difference +0.0058 bpb, no interval (margin ±0.02), 1 paired seed [undecided]" in (
        arm_line
    )
    assert "CI no interval" not in arm_line
    content = build_content(folder, a, None, [])
    assert content.subtitle.startswith("2 arms × 1 seed, 2 of 2 runs with a result")
    text = json.dumps(a, ensure_ascii=False) + "\n".join(lines) + content.subtitle
    assert not ONE_PLURAL.search(text), ONE_PLURAL.search(text)


def test_no_pair_says_so_once(tmp_path: Path) -> None:
    """Every run of the arm crashed: no difference and no interval, said plainly."""
    out = _folder(tmp_path, [0, 1, 2])
    for seed in range(3):
        path = out / "runs" / f"rmsnorm-pre__s{seed}" / "summary.json"
        summary = json.loads(path.read_text())
        path.write_text(json.dumps({**summary, "status": "crashed", "error": "boom"}))
    a = analyze(load_compare_folder(out))
    arm_line = answer_lines(a)[2]
    assert "inconclusive — no paired difference, no interval (margin ±0.02), 0 paired seeds" in (
        arm_line
    )
    assert "difference no difference" not in arm_line


def test_a_look_at_one_pair_counts_one_pair() -> None:
    decision = decide([0.01], SequentialPlan(looks=(3, 5), margin=0.02))
    assert decision.reason.startswith("1 paired seed: at least 2 are needed for a look")


def _run(tmp_path: Path, arm: str, status: str) -> RunResult:
    summary = {"status": status, "diverged_at": 3 if status == "diverged" else None}
    return RunResult(f"{arm}__s0", arm, 0, status, tmp_path, summary)


def test_one_run_per_arm_counts_one_run(tmp_path: Path) -> None:
    v = stability_verdict([_run(tmp_path, "a", "diverged")], [_run(tmp_path, "b", "finished")])
    assert v.verdict == "worse"
    assert v.reason == "failed to learn (of 1 run, 1 diverged; baseline: the one run learned)"


def _count_before_plural(source: str, name: str) -> list[str]:
    """``{expression} seeds`` and the like in the f-strings of ``source`` (the file ``name``):
    a count written before a plural noun, which reads "1 seeds" when the count is 1. ``looks``
    (a list of seed counts, each at least 2) is plural by nature."""
    pattern = re.compile(r"^ (paired |usable paired )?(seeds|runs|arms|rungs|pairs|steps)\b")
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, text in zip(node.values, node.values[1:], strict=False):
            if not (isinstance(value, ast.FormattedValue) and isinstance(text, ast.Constant)):
                continue
            expr = ast.unparse(value.value)
            if isinstance(text.value, str) and pattern.match(text.value) and expr != "looks":
                found.append(f"{name}:{node.lineno}: {{{expr}}}{text.value}")
    return found


@pytest.mark.parametrize("package", ["analysis", "report"])
def test_counts_in_sentences_go_through_counted(package: str) -> None:
    found = [
        hit
        for path in sorted((SRC / package).rglob("*.py"))
        for hit in _count_before_plural(path.read_text(encoding="utf-8"), path.name)
    ]
    assert not found, "a count before a plural noun (use normlab._plural.counted):\n" + "\n".join(
        found
    )


def test_the_source_check_can_fail() -> None:
    source = "\n".join(
        ["n, runs = 1, [1]", 'a = f"{n} seeds"', 'b = f"{len(runs)} runs"', 'c = f"{c(n, 1)}"']
    )
    found = _count_before_plural(source, "x.py")
    assert found == ["x.py:2: {n} seeds", "x.py:3: {len(runs)} runs"]
