"""What a decision costs, read from a compare folder (normlab.analysis.cost_folder): the spreads
per budget from the runs and their branches, the cost of a seed, summary.json's
``decision_cost`` against normlab.analysis.cost called directly, the report's section in both
renderers, the terminal's line, the settling command at a cheaper budget, and the pilot's
forecast before ``--until-decided`` trains.

The folders are copies of the stored compare folder (tests/compare/fixtures/compare_run: two
arms × three seeds of 40 steps, 81,920 tokens, 870,656 parameters in the baseline) with edited
summaries.
"""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from normlab.analysis import analyze, load_compare_folder
from normlab.analysis.cost import (
    BudgetSpread,
    cheapest,
    fit_seed_cost,
    fit_spread_law,
    price_decisions,
    train_flops,
)
from normlab.analysis.cost_folder import (
    STANDARD_BUDGETS,
    budget_spreads,
    budget_words,
    decision_sentence,
    fmt_flops,
    fmt_sig,
    fmt_wall,
    params_counted,
    seed_cost,
    settle_budget,
)
from normlab.cli.answer import budget_settle_command, print_answer
from normlab.experiment.config import validate_config
from normlab.report import build_report
from normlab.report.decision_cost import decision_cost_section
from normlab.run_format import (
    COMMAND_FILE,
    DECISION_COST,
    DECISION_COST_KEY,
    EXPERIMENT_FILE,
    check_decision_cost,
)
from normlab.study.rounds import pilot_forecast, train_rounds
from normlab.study.spec import RoundsSpec

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"
BASE, ARM = "layernorm-pre", "rmsnorm-pre"
N_PARAMS, TOKENS = 870_656, 81_920
MAIN = float(f"{TOKENS / N_PARAMS:.3g}")  # 0.0941 tokens per parameter
DIFFS = (0.03, -0.02, 0.01)
"""rmsnorm − layernorm per seed at the main budget: sd 0.025 bpb, open at a margin of 0.02."""


def _summary(out: Path, arm: str, seed: int) -> tuple[Path, dict[str, Any]]:
    path = out / "runs" / f"{arm}__s{seed}" / "summary.json"
    return path, json.loads(path.read_text())


def _branch(bpb: float, tokens: int, status: str = "finished") -> dict[str, Any]:
    return {"status": status, "diverged_at": None, "final_val_loss": bpb * 0.69,
            "final_val_bpb": bpb, "final_train_loss": 2.5, "tokens": tokens,
            "train_s": 0.5}  # fmt: skip


def _pilot(
    tmp_path: Path,
    diffs: tuple[float, ...] = DIFFS,
    branch_diffs: tuple[float, ...] | None = None,
    name: str = "pilot",
) -> Path:
    """The fixture with rmsnorm's final_val_bpb at the baseline's + ``diffs[seed]``, and with
    ``branch_diffs`` a branch at 10 steps (20,480 tokens) in every run, the baseline's at 3.9 +
    0.01·seed."""
    out = tmp_path / name
    shutil.copytree(FIXTURE, out)
    for seed, d in enumerate(diffs):
        base_path, base = _summary(out, BASE, seed)
        path, summary = _summary(out, ARM, seed)
        summary["final_val_bpb"] = base["final_val_bpb"] + d
        if branch_diffs is not None:
            ref = 3.9 + 0.01 * seed
            base["branches"] = {"10": _branch(ref, 20_480)}
            summary["branches"] = {"10": _branch(ref + branch_diffs[seed], 20_480)}
            base_path.write_text(json.dumps(base))
        path.write_text(json.dumps(summary))
    return out


def _edit(out: Path, arm: str, seed: int, **fields: Any) -> None:
    path, summary = _summary(out, arm, seed)
    summary.update(fields)
    path.write_text(json.dumps(summary))


# --- the spreads and the cost of a seed ------------------------------------------------------


def test_spreads_at_the_main_budget_and_at_each_branch(tmp_path: Path) -> None:
    branch = (0.2, -0.15, 0.05)
    folder = load_compare_folder(_pilot(tmp_path, branch_diffs=branch))
    params = params_counted(folder)
    assert params == (N_PARAMS, "all 870,656 parameters of the baseline arm")
    spreads = budget_spreads(folder, ARM, params[0])
    short = float(f"{20_480 / N_PARAMS:.3g}")
    assert [s.budget for s in spreads] == [short, MAIN]
    for spread, diffs in zip(spreads, (branch, DIFFS), strict=True):
        assert spread.n_seeds == 3
        assert spread.mean_diff == pytest.approx(statistics.fmean(diffs), abs=1e-9)
        assert spread.sd_diff == pytest.approx(statistics.stdev(diffs), abs=1e-9)
    # the main budget's differences are the analysis's own paired comparison
    a = analyze(folder)
    comparison = a["comparisons"][ARM]["final_val_bpb"]
    assert spreads[1].mean_diff == pytest.approx(comparison["mean_diff"], abs=1e-12)


def test_a_diverged_run_leaves_its_seed_out_of_the_main_budget_but_not_its_branch(
    tmp_path: Path,
) -> None:
    out = _pilot(tmp_path, branch_diffs=(0.2, -0.15, 0.05))
    _edit(out, ARM, 2, status="diverged", diverged_at=30, final_val_bpb=None, steps=30)
    _edit(out, BASE, 1, branches={"10": _branch(3.91, 20_480, status="diverged")})
    folder = load_compare_folder(out)
    spreads = {s.budget: s for s in budget_spreads(folder, ARM, N_PARAMS)}
    assert spreads[MAIN].n_seeds == 2  # seed 2's arm diverged
    assert spreads[MAIN].mean_diff == pytest.approx(statistics.fmean(DIFFS[:2]))
    short = float(f"{20_480 / N_PARAMS:.3g}")
    assert spreads[short].n_seeds == 2  # seed 1's baseline branch diverged; seed 2's arm
    assert spreads[short].mean_diff == pytest.approx(statistics.fmean((0.2, 0.05)))
    # the cost of a seed: only seeds whose every arm finished, Σ wall_s · threads, Σ 6·N·D
    cost, record = seed_cost(folder, params_counted(folder))
    runs = [r for r in folder.runs if r.seed in (0, 1)]
    core = sum(r.summary["wall_s"] * r.summary["threads"] for r in runs) / 2
    flops = sum(train_flops(r.summary["n_params"], r.summary["tokens"]) for r in runs) / 2
    assert record["n_seeds"] == 2 and record["fit"] == "proportional"
    assert cost.core_s(MAIN) == pytest.approx(core, rel=1e-9)
    assert cost.flops(MAIN) == pytest.approx(flops, rel=1e-9)
    assert cost.core_s(20.0) == pytest.approx(core * 20 / MAIN, rel=1e-9)
    assert record["threads"] == 2 and record["parallel"] == 1


def test_the_runs_tokens_per_parameter_set_the_budget(tmp_path: Path) -> None:
    out = _pilot(tmp_path, branch_diffs=(0.2, -0.15, 0.05))
    for arm in (BASE, ARM):
        for seed in range(3):
            _edit(out, arm, seed, tokens_per_param=4.0)
    folder = load_compare_folder(out)
    params, how = params_counted(folder)
    assert params == TOKENS / 4.0 and "tokens_per_param" in how
    assert [s.budget for s in budget_spreads(folder, ARM, params)] == [1.0, 4.0]
    record = analyze(folder)[DECISION_COST_KEY][ARM]
    assert record["current"] == 4.0
    # 1 was measured (a branch), so the standard 1 is not added again; 3 is within 10 % of
    # neither 1 nor 4 and stays
    assert [p["budget"] for p in record["budgets"]] == [1.0, 3.0, 4.0, 10.0, 20.0]
    assert [p["measured"] for p in record["budgets"]] == [True, False, True, False, False]
    assert record["law"]["measured"] is True


# --- the record against analysis.cost ----------------------------------------------------------


def test_the_record_is_analysis_cost_called_directly(tmp_path: Path) -> None:
    out = _pilot(tmp_path)
    a = analyze(load_compare_folder(out))
    assert a["verdicts"][ARM]["quality"] == "inconclusive"
    record = a[DECISION_COST_KEY][ARM]
    check_decision_cost(a[DECISION_COST_KEY])
    # by hand, from the summaries
    spread = BudgetSpread(MAIN, 3, statistics.fmean(DIFFS), statistics.stdev(DIFFS))
    points = []
    for seed in range(3):
        runs = [_summary(out, arm, seed)[1] for arm in (BASE, ARM)]
        core = sum(s["wall_s"] * s["threads"] for s in runs)
        flops = sum(train_flops(s["n_params"], s["tokens"]) for s in runs)
        points.append((MAIN, core, flops))
    cost = fit_seed_cost(points)
    law = fit_spread_law([spread])
    budgets = [MAIN, *STANDARD_BUDGETS]
    prices = price_decisions([spread], cost, budgets, 0.02, alpha=0.05, power=0.8, law=law)
    assert len(record["budgets"]) == len(prices) == 5
    for got, want in zip(record["budgets"], prices, strict=True):
        assert got == pytest.approx(want.to_dict(), rel=1e-9)
    assert record["cheapest"] == cheapest(prices).budget
    assert record["current"] == MAIN and record["n_done"] == 3
    assert record["law"]["measured"] is False and "assumed" in record["law"]["words"]
    assert record["law"]["exponent"] == law.exponent
    assert record["cost_model"]["core_s_per_budget"] == pytest.approx(cost.core_s_per_budget)
    assert record["sentence"] == decision_sentence(ARM, record)
    # the plug-in count at the current budget is the verdict's forecast (3 seeds done)
    assert record["budgets"][0]["seeds"] == a["verdicts"][ARM]["seeds_needed"]


def test_the_shape_is_checked_and_names_the_path(tmp_path: Path) -> None:
    a = analyze(load_compare_folder(_pilot(tmp_path)))
    value = json.loads(json.dumps(a[DECISION_COST_KEY]))
    assert [k.name for k in DECISION_COST.keys] == list(value[ARM])
    value[ARM]["law"]["exponent"] = "half"
    with pytest.raises(ValueError, match=r"decision_cost\['rmsnorm-pre'\]\.law\.exponent"):
        check_decision_cost(value)
    del value[ARM]["budgets"][0]["flops"]
    with pytest.raises(ValueError, match=r"budgets\[0\].*missing \['flops'\]"):
        check_decision_cost(value)


def test_no_record_when_every_arm_is_decided_or_nothing_is_timed(tmp_path: Path) -> None:
    a = analyze(load_compare_folder(FIXTURE))
    assert a["verdicts"][ARM]["quality"] == "equivalent"
    assert DECISION_COST_KEY not in a and decision_cost_section(a) is None
    out = _pilot(tmp_path)
    for seed in range(3):
        _edit(out, BASE, seed, wall_s=None)
    assert DECISION_COST_KEY not in analyze(load_compare_folder(out))


def test_numbers_in_words() -> None:
    assert [fmt_sig(x) for x in (190.4, 1.94, 0.0341, 0.0)] == ["190", "1.9", "0.034", "0"]
    assert fmt_sig(2.76e-7) == "2.8e-07"
    assert [fmt_wall(s) for s in (40, 720, 6840, 302_400)] == [
        "40 s",
        "12 min",
        "1.9 h",
        "3.5 days",
    ]
    assert fmt_flops(3.21e15) == "3.2e15" and fmt_flops(None) == "—"
    assert budget_words(1.0) == "1 token per parameter"
    assert budget_words(0.09409) == "0.0941 tokens per parameter"


# --- which budget the settling command names ----------------------------------------------


def _price(budget: float, seeds: int | None, high: int | None, per_seed: float) -> dict:
    return {"budget": budget, "measured": budget == 1.0, "mean_diff": 0.0, "sd": 0.01,
            "sd_low": 0.005, "sd_high": 0.02, "seeds": seeds, "seeds_high": high,
            "core_s": None if seeds is None else seeds * per_seed * budget,
            "core_s_high": None if high is None else high * per_seed * budget,
            "flops": None if seeds is None else seeds * 1e9 * budget,
            "flops_high": None if high is None else high * 1e9 * budget}  # fmt: skip


def _record(prices: list[dict], n_done: int = 3) -> dict[str, Any]:
    law = {"ref_budget": 1.0, "ref_sd": 0.01, "ref_n": 3, "exponent": 0.5, "exponent_low": 0.25,
           "exponent_high": 0.75, "measured": False, "words": "assumed"}  # fmt: skip
    model = {"fit": "proportional", "fixed_core_s": 0.0, "core_s_per_budget": 100.0,
             "flops_per_budget": 1e9, "budgets": [1.0], "n_seeds": 3, "threads": 2.0,
             "parallel": 1, "basis": "all", "words": "proportional"}  # fmt: skip
    best = cheapest_budget(prices)
    record = {"metric": "final_val_bpb", "unit": "bpb", "current": 1.0, "n_done": n_done,
              "budgets": prices, "cheapest": best, "law": law, "cost_model": model}  # fmt: skip
    record["sentence"] = decision_sentence(ARM, record)
    check_decision_cost({ARM: record})
    return record


def cheapest_budget(prices: list[dict]) -> float | None:
    priced = [p for p in prices if p["core_s"] is not None]
    return min(priced, key=lambda p: (p["core_s"], p["budget"]))["budget"] if priced else None


def test_the_settling_budget_is_cheaper_than_what_the_current_one_still_costs() -> None:
    # at 1 token per parameter 100 seeds (100 core-s each); at 20, 3 seeds (2,000 core-s each)
    far = _record([_price(1.0, 100, 300, 100.0), _price(20.0, 3, 8, 100.0)])
    assert far["cheapest"] == 20.0
    budget, most, seconds = settle_budget({ARM: far})
    assert (budget, most) == (20.0, 8)
    assert seconds == pytest.approx(8 * 100.0 * 20.0 / 2.0)  # core-seconds / threads
    assert "the cheapest measured or forecast: 20 tokens per parameter" in far["sentence"]
    assert far["sentence"].startswith(
        "A decision on rmsnorm-pre costs about 100 seeds (up to 300) at 1 token per parameter: "
        "2.8 core-hours, ~83 min here"
    )
    # 7 seeds at 1, 3 of them done: 400 core-s still to spend, less than 6,000 at 20
    near = _record([_price(1.0, 7, 20, 100.0), _price(20.0, 3, 8, 100.0)])
    assert near["cheapest"] == 1.0 and settle_budget({ARM: near}) is None
    assert "no other budget measured or forecast (20 tokens per parameter)" in near["sentence"]
    # an early-training cheapest also names the cheapest budget beyond early training
    assert near["sentence"].endswith(
        "; beyond early training (at least 5 tokens per parameter) the cheapest is 20 tokens per "
        "parameter (read off the spread law, its exponent assumed), about 3 seeds (up to 8), "
        + near["sentence"].rsplit("up to 8), ", 1)[1]
    )
    assert "beyond early training" not in far["sentence"]  # 20 is past it already
    # cheapest from scratch at 3, but the seeds done at 1 make staying cheaper
    reuse = _record([_price(1.0, 33, 40, 100.0), _price(3.0, 10, 20, 100.0)], n_done=10)
    assert reuse["cheapest"] == 3.0 and settle_budget({ARM: reuse}) is None
    assert "continuing at 1 reuses the 10 seeds done and costs less" in reuse["sentence"]
    # two arms: a budget counts at the larger price of the two (every seed trains both)
    other = _record([_price(1.0, 4, 6, 100.0), _price(20.0, 30, 60, 100.0)])
    assert settle_budget({ARM: far, "dyt-pre": other}) is None
    assert settle_budget({}) is None


def test_the_settling_command_names_the_cheaper_budget(tmp_path: Path) -> None:
    far = _record([_price(1.0, 100, 300, 100.0), _price(20.0, 3, 8, 100.0)])
    a = analyze(load_compare_folder(_pilot(tmp_path)))
    a[DECISION_COST_KEY] = {ARM: far}
    out = tmp_path / "runs" / "pilot"
    command = budget_settle_command(a, ["--steps", "40", "--seeds", "3", "--lr=0.01"], out)
    # 8 seeds × 2,000 core-s / 2 threads = 8,000 s, above the default time budget
    assert command == (
        "normlab compare --lr=0.01 --tokens-per-param 20 --until-decided --max-seeds 8 "
        f"--max-time 8040 --out {tmp_path / 'runs' / 'pilot-tpp20'}"
    )
    a[DECISION_COST_KEY] = {ARM: _record([_price(1.0, 7, 20, 100.0), _price(20.0, 3, 8, 100.0)])}
    assert budget_settle_command(a, ["--steps", "40"], out) is None


# --- the report, the terminal ----------------------------------------------------------------


def _md_table(md: str, heading: str) -> list[list[str]]:
    section = md.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def _html_table(page: str, anchor: str) -> list[list[str]]:
    section = page.split(f'id="{anchor}"', 1)[1].split("<h2", 1)[0]
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall("<tr>(.*?)</tr>", body)]
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in row] for row in cells]


def test_the_report_says_what_a_decision_costs_in_both_formats(tmp_path: Path) -> None:
    out = _pilot(tmp_path, branch_diffs=(0.2, -0.15, 0.05))
    build_report(out)
    record = json.loads((out / "summary.json").read_text())[DECISION_COST_KEY][ARM]
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## What a decision costs" in md and 'id="decision-cost"' in page
    assert record["sentence"] + "." in md and html.escape(record["sentence"]) in page
    assert record["law"]["words"] in md and record["cost_model"]["words"] in md
    rows = _md_table(md, "What a decision costs")
    assert rows == _html_table(page, "decision-cost")
    assert len(rows) == len(record["budgets"])
    model = record["cost_model"]
    for row, price in zip(rows, record["budgets"], strict=True):
        assert float(row[0].split()[0]) == price["budget"]
        assert row[1] == ("measured" if price["measured"] else "spread law")
        assert float(row[2].split()[0]) == pytest.approx(price["sd"], rel=5e-3)
        seeds = re.match(r"(\d+)(?:–(>?\d+))?$", row[3])
        assert seeds and int(seeds[1]) == price["seeds"]
        assert float(row[4].split("–")[0]) == pytest.approx(price["core_s"] / 3600, rel=0.05)
        assert float(row[5].split("–")[0]) == pytest.approx(price["flops"], rel=0.05)
        if price["budget"] == record["current"]:
            assert "current" in row[0]
            wall = price["core_s"] / model["threads"] / model["parallel"]
            assert row[6].split("–")[0] == f"{wall / 60:.0f} min"
        assert ("cheapest" in row[0]) == (price["budget"] == record["cheapest"])


def test_the_terminal_says_the_price_before_the_command(tmp_path: Path) -> None:
    out = _pilot(tmp_path)
    build_report(out)
    (out / COMMAND_FILE).write_text(json.dumps({"args": ["--seeds", "3"]}))
    buffer = io.StringIO()
    assert print_answer(Console(file=buffer, width=400), out)
    lines = buffer.getvalue().strip().splitlines()
    record = json.loads((out / "summary.json").read_text())[DECISION_COST_KEY][ARM]
    price = record["budgets"][0]
    assert lines[-2] == record["sentence"]
    assert lines[-2].startswith(
        f"A decision on {ARM} costs about {price['seeds']} seeds (up to {price['seeds_high']}) "
        f"at {MAIN:g} tokens per parameter: "
    )
    assert lines[-1].startswith("To settle it, run: normlab compare --until-decided")
    assert "--tokens-per-param" not in lines[-1]  # one budget measured: staying is cheaper


# --- the pilot's forecast before --until-decided trains ---------------------------------------


def _noop(*_: Any) -> None:
    return None


def test_until_decided_says_the_pilots_price_before_it_trains(tmp_path: Path) -> None:
    cfg = validate_config({"seeds": 3, "device": "cpu", "threads": 2})
    out = _pilot(tmp_path)
    experiment = json.loads((out / EXPERIMENT_FILE).read_text())
    experiment["config"] = cfg.model_copy(update={"seeds": [0, 1, 2], "parallel": 2}).dump()
    (out / EXPERIMENT_FILE).write_text(json.dumps(experiment))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    buffer = io.StringIO()
    console = Console(file=buffer, width=400)
    seen: list[str] = []

    def train(cfg_k: Any, out_k: Path, **_: Any) -> dict[str, Any]:
        seen.append(buffer.getvalue())
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing written
        raise KeyboardInterrupt  # enough: the first round was about to train

    with pytest.raises(KeyboardInterrupt):
        train_rounds(cfg, out, RoundsSpec(), train=train, console=console, finish=_noop)
    sentence = analyze(load_compare_folder(out))[DECISION_COST_KEY][ARM]["sentence"]
    assert f"pilot: {out} holds 3 seeds of this experiment; before training more:" in seen[0]
    assert " ".join(sentence.split()) in " ".join(seen[0].split())  # as the console wraps it
    # another experiment in the folder (another learning rate): no forecast
    other = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lr": 0.5})})
    assert pilot_forecast(other, out, Console(file=io.StringIO())) == []
    assert pilot_forecast(cfg, tmp_path / "empty", Console(file=io.StringIO())) == []
