"""benchmarks/ladder_studies.py's analysis on made-up numbers: the hold-out, the own-rate
choice on tuning seeds only, and the document's section replaced in place."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from normlab.analysis.ladder import Rung

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


def test_own_rate_chooses_on_tuning_seeds_only() -> None:
    # seeds 0-2 evaluate, 3-4 tune; on the tuning seeds rmsnorm is best at 0.01, on the
    # evaluation seeds (and over all five) at 0.005: the choice must be 0.01.
    base = {0.005: [3.0] * 5, 0.01: [3.1] * 5}
    rms = {0.005: [2.5, 2.5, 2.5, 3.2, 3.2], 0.01: [3.0, 3.0, 3.0, 2.95, 2.95]}
    o = ls.own_rate({"layernorm-pre": base, "rmsnorm-pre": rms})
    assert o["tuning_seeds"] == [3, 4]
    assert o["curves"]["rmsnorm-pre"].best == 0.01
    assert o["curves"]["layernorm-pre"].best == 0.005
    (row,) = o["rows"]
    assert row["own"]["arm_rate"] == 0.01 and row["own"]["base_rate"] == 0.005
    assert row["own"]["c"].seeds == [0, 1, 2]
    assert abs(row["own"]["c"].mean_diff) < 1e-12  # 3.0 − 3.0 on the evaluation seeds
    assert abs(row["shared"]["c"].mean_diff + 0.5) < 1e-12


def test_place_replaces_only_its_own_section() -> None:
    doc = "# t\n\n<!-- kept: x -->\n## coverage\n\ntext\n"
    first = ls.place(doc, f"{ls.BEGIN}\nA\n{ls.END}")
    assert first.startswith(doc.rstrip("\n")) and first.count(ls.BEGIN) == 1
    second = ls.place(first + "\n## later\n", f"{ls.BEGIN}\nB\n{ls.END}")
    assert "\nA\n" not in second and "\nB\n" in second and second.endswith("## later\n")
    assert ls.KEPT_MARKER in ls.place("# t\n", f"{ls.BEGIN}\nA\n{ls.END}")


def test_sweeps_train_from_the_middle_rate_outwards(tmp_path: Path) -> None:
    cmds = ls.plan(tmp_path)
    (tmp_path / "coord_mup").mkdir()
    (tmp_path / "coord_mup" / "coord_check.json").write_text("{}", encoding="utf-8")
    order = ls.run_order(cmds, ["coord", "own_rate", "transfer"])
    coord = [c for c in order if c[3] == "coord-check"]
    assert [c[-1] for c in coord] == [str(tmp_path / "coord_sp")]  # mup's is done
    lrs = [float(c[c.index("--lr") + 1]) for c in order if "--lr" in c]
    middle_out = [0.01, 0.005, 0.02, 0.0025, 0.04]
    assert lrs == middle_out + [r for r in middle_out for _ in ("mup", "sp")]
    assert (tmp_path / "own_rate.yaml").exists() and (tmp_path / "transfer.yaml").exists()
