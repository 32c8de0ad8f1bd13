"""The analysis and report use only the runs that ``experiment.json`` lists: run folders left by
an earlier command with more seeds are named as left out, never counted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from normlab.analysis import load_compare_folder
from normlab.report import build_report

FIXTURE = Path(__file__).parent / "fixtures" / "compare_run"


def _listing_two_seeds(tmp_path: Path) -> Path:
    """The 3-seed fixture, with an experiment.json that lists seeds 0 and 1 only."""
    out = tmp_path / "compare_run"
    shutil.copytree(FIXTURE, out)
    path = out / "experiment.json"
    experiment = json.loads(path.read_text())
    experiment["seeds"] = [0, 1]
    experiment["runs"] = [f"{a}__s{s}" for s in (0, 1) for a in experiment["arms"]]
    path.write_text(json.dumps(experiment))
    return out


def test_unlisted_run_folders_are_left_out(tmp_path: Path) -> None:
    folder = load_compare_folder(_listing_two_seeds(tmp_path))
    assert sorted({r.seed for r in folder.runs}) == [0, 1] and len(folder.runs) == 4
    assert folder.ignored_runs == ("layernorm-pre__s2", "rmsnorm-pre__s2")


def test_a_folder_without_a_run_list_counts_every_run() -> None:
    folder = load_compare_folder(FIXTURE)
    assert len(folder.runs) == 6 and folder.ignored_runs == ()


def test_the_report_counts_only_listed_runs(tmp_path: Path) -> None:
    out = _listing_two_seeds(tmp_path)
    build_report(out)
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run_id"] for r in summary["runs"]} == {
        "layernorm-pre__s0", "layernorm-pre__s1", "rmsnorm-pre__s0", "rmsnorm-pre__s1",
    }  # fmt: skip
    assert summary["ignored_runs"] == ["layernorm-pre__s2", "rmsnorm-pre__s2"]
    quality = summary["comparisons"]["rmsnorm-pre"]["final_val_bpb"]
    assert quality["n_pairs"] == 2 and quality["seeds"] == [0, 1]
    markdown = (out / "report.md").read_text()
    assert "2 arms × 2 seeds, 4 of 4 runs with a result" in markdown
    assert "rmsnorm-pre__s2: in runs/ but not part of this experiment" in markdown
    assert "n = 3 paired seeds" not in markdown
