"""benchmarks/budget_study.py reads its runs through the run format and writes its section from
them: checked on synthetic folders whose paired differences are known."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "budget_study", ROOT / "benchmarks" / "budget_study.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["budget_study"] = module
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, arm: str, seed: int, summary: dict) -> None:
    run = folder / "runs" / f"{arm}__s{seed}"
    run.mkdir(parents=True)
    full = {"status": "finished", "arm": arm, "seed": seed, "run_id": run.name,
            "tokens_per_s": 10_000.0, "n_loss_spikes": 0, **summary}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(full), encoding="utf-8")
    records = [{"type": "train", "step": s, "loss": 3.0 - 0.001 * s} for s in range(1, 121)]
    records += [{"type": "eval", "step": s, "val_bpb": summary.get("final_val_bpb", 2.5)}
                for s in (100, 110, 120)]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _folders(root: Path, study: ModuleType, outlier: float = 0.0) -> dict[str, np.ndarray]:
    """Write every study's folder; return the RMSNorm − LayerNorm differences written."""
    rng = np.random.default_rng(7)
    diffs = {}
    ln, rms, gemma = study.LN, study.RMS, study.GEMMA
    d3 = 0.004 + 0.01 * rng.standard_normal(12)
    d3[5] += outlier
    diffs["3"] = d3
    base3 = 2.4 + 0.02 * rng.standard_normal(12)
    for k in range(8):
        x = {"final_val_bpb": base3[k], "full_val_bpb": base3[k] + 0.001,
             "avg_val_bpb": base3[k] - 0.002, "avg_full_val_bpb": base3[k] - 0.001}  # fmt: skip
        _run(root / "base", ln, k, x)
        _run(root / "base", rms, k, {f: v + d3[k] for f, v in x.items()})
        _run(root / "base", gemma, k, {f: v + d3[k] + 1e-4 * (k - 4) for f, v in x.items()})
        for name in ("init_only", "data_only"):
            _run(root / name, ln, k, {"final_val_bpb": base3[k]})
            _run(root / name, rms, k, {"final_val_bpb": base3[k] + d3[k] / 2})
        _run(root / "cosine_default", ln, k, {"final_val_bpb": 2.6 + base3[k]})
        _run(root / "cosine_default", rms, k, {"final_val_bpb": 2.6 + base3[k] + d3[k]})
    d1 = 0.01 + 0.03 * rng.standard_normal(12)
    d10 = 0.002 + 0.005 * rng.standard_normal(12)
    diffs["1"], diffs["10"] = d1, d10
    for k in (*range(4), *range(8, 12)):
        folder = root / ("budget10" if k < 4 else "budget10b")
        for arm, s1, s3, s10 in ((ln, 0.0, 0.0, 0.0), (rms, d1[k], d3[k], d10[k])):
            _run(folder, arm, k, {
                "final_val_bpb": 2.2 + s10,
                "branches": {"210": {"final_val_bpb": 2.9 + s1},
                             "628": {"final_val_bpb": base3[k] + s3}},
            })  # fmt: skip
    return diffs


def test_section_from_known_differences(study: ModuleType, tmp_path: Path) -> None:
    diffs = _folders(tmp_path, study)
    text = "\n".join(study.section(tmp_path))
    assert text.startswith(study.BEGIN) and text.endswith(study.END)
    # base's seeds 0-3 are the branches' seeds 0-3, bit for bit: 4 seeds × 2 arms
    assert "Of the 8 runs of the 3-tokens-per-parameter budget" in text
    assert "8 gave the same final validation bpb bit for bit" in text
    rows = {line.split(" |")[0]: line for line in text.splitlines() if line.startswith("| ")}
    for budget, steps, n in (("1", "210", 8), ("3", "628", 12), ("10", "2,092", 8)):
        row = rows[f"| {budget} ({steps}), wsd"]
        d = diffs[budget] if budget == "3" else diffs[budget][[*range(4), *range(8, 12)]]
        assert f"| {n} |" in row
        assert f"{np.std(d, ddof=1):.4f} [" in row, row
    assert "| 2.9 (600), cosine (the default recipe) | 8 |" in text
    assert "forecast at budget" in text


def test_a_broken_branch_is_counted(study: ModuleType, tmp_path: Path) -> None:
    _folders(tmp_path, study)
    run = tmp_path / "budget10" / "runs" / f"{study.RMS}__s2"
    summary = json.loads((run / "summary.json").read_text())
    summary["branches"]["628"]["final_val_bpb"] += 1e-12
    (run / "summary.json").write_text(json.dumps(summary))
    assert "7 gave the same final validation bpb" in study.identity_check(tmp_path)


def test_heavy_tail_names_the_far_seed(study: ModuleType, tmp_path: Path) -> None:
    _folders(tmp_path, study, outlier=0.2)
    text = "\n".join(study.section(tmp_path))
    assert "1 of 8 seeds lie more than 3 robust sd" in text
    assert "- seed 5: difference" in text


def test_replace_section_keeps_the_rest(study: ModuleType) -> None:
    old = f"intro\n\n{study.BEGIN}\nold\n{study.END}\n\noutro\n"
    new = study.replace_section(old, [study.BEGIN, "new", study.END])
    assert new == f"intro\n\n{study.BEGIN}\nnew\n{study.END}\n\noutro\n"
    assert study.replace_section("intro\n", ["x"]) == "intro\n\nx\n"
