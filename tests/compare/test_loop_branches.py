"""Cooldowns branched from one stable wsd run: each branch's quality is, bit for bit, that of a
separate run of its budget (CPU training is deterministic), and the stable run goes on exactly
as it would without branches (its state is put back after each)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loop_runs import dit_config, gpt_config, lm_config, train_one, untimed, write_corpus
from normlab import run_format as RF
from normlab.experiment.config import validate_config
from normlab.experiment.training.branches import branch_plan
from normlab.experiment.training.schedule import schedule_of

COMPARED = ("final_train_loss", "tokens", "status", "diverged_at")
"""Fields of a branch's entry compared with the separate run's summary, besides quality."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def check_branches(
    testbed: str,
    make: Callable[[dict[str, Any]], dict[str, Any]],
    train: dict[str, Any],
    budgets: list[int],
    tmp_path: Path,
) -> dict[str, Any]:
    """Train the wsd run ``train`` with ``budgets`` branched off, the same run without them,
    and a run of each budget; assert the equalities; return the branched run's summary."""
    wsd = {**train, "schedule": "wsd"}
    main, records = train_one(make({**wsd, "branches": budgets}), tmp_path / "main")
    plain, plain_records = train_one(make(wsd), tmp_path / "plain")
    # the stable run is the run without branches, bit for bit, but for the branch records
    assert untimed(records, (RF.BRANCH_RECORD,)) == untimed(plain_records)
    for key in ("final_val_loss", "final_train_loss", "n_skipped_steps", "steps", "tokens"):
        assert main[key] == plain[key], key
    assert list(main["branches"]) == [str(b) for b in sorted(budgets)]
    plan = branch_plan(schedule_of(validate_config(make(wsd)).dump()["train"]), budgets)
    starts = {b: s for s, bs in plan.items() for b in bs}
    branch_records = {r["steps"]: r for r in records if r["type"] == RF.BRANCH_RECORD}
    quality = [f for f in RF.testbed_format(testbed).validation_fields if "_val_" in f]
    for budget in budgets:
        alone, alone_records = train_one(make({**wsd, "steps": budget}), tmp_path / f"{budget}")
        entry = main["branches"][str(budget)]
        full = [k for k in entry if k.startswith(RF.FULL_VAL_PREFIX)]  # with train.full_val
        for key in (*(q for q in quality if q.startswith("final_")), *COMPARED, *full):
            assert entry[key] == alone[key], (budget, key)
        last_eval = [r for r in alone_records if r["type"] == RF.EVAL_RECORD][-1]
        record = branch_records[budget]
        assert record["from_step"] == starts[budget]
        assert {k: v for k, v in last_eval.items() if k.startswith("val_")} == {
            k: v for k, v in record.items() if k.startswith("val_")
        }
        assert entry["train_s"] > 0 and record["tokens_seen"] == alone["tokens"]
    return main


def test_gpt_branches_equal_separate_runs_bit_for_bit(corpus: Path, tmp_path: Path) -> None:
    """16 steps, cooldown 0.2 (3 steps); budgets 8, 12 and 13 start their cooldowns after
    steps 6, 10 and 10 (two branches off one state)."""
    main = check_branches(
        "gpt", lambda t: gpt_config(corpus, t), {"steps": 16}, [12, 8, 13], tmp_path
    )
    assert set(main["branches"]["8"]) == {
        "status", "diverged_at", "final_val_loss", "final_val_bpb", "final_train_loss",
        "tokens", "train_s",
    }  # fmt: skip


def test_fp16_branches_carry_the_gradient_scaler(corpus: Path, tmp_path: Path) -> None:
    """A scale of 2²⁴ overflows the first fp16 steps: the scaler's halved scale and the
    skipped count at the branch point are the run's, and are put back after the branch."""

    def make(train: dict[str, Any]) -> dict[str, Any]:
        return gpt_config(corpus, train, precisions=["fp16"], fp16_init_scale=2.0**24)

    main = check_branches("gpt", make, {"steps": 12, "decay": "sqrt"}, [9], tmp_path)
    assert main["n_skipped_steps"] > 0


def test_dit_branches_equal_separate_runs_bit_for_bit(tmp_path: Path) -> None:
    """The DiT's stream (image order, noises, times, label dropout) is carried and put back."""
    main = check_branches("dit", dit_config, {"steps": 12, "cooldown": 0.25}, [8], tmp_path)
    assert "final_val_loss" in main["branches"]["8"]
    assert "final_val_bpb" not in main["branches"]["8"]


def test_lm_branches_with_whole_split_validation(corpus: Path, tmp_path: Path) -> None:
    main = check_branches(
        "lm", lambda t: lm_config(corpus, t), {"steps": 12, "full_val": True}, [8], tmp_path
    )
    entry = main["branches"]["8"]
    assert entry["full_val_bpb"] is not None and entry["full_val_bpb"] != entry["final_val_bpb"]
