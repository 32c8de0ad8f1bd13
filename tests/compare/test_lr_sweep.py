"""The learning-rate sweep's record, words, figure and plan (no training)."""

from __future__ import annotations

import pytest
from test_figures import LONG_ARMS, _legend_covers, _legend_mismatches, _overlapping_texts

from normlab.analysis.lr_sweep import lr_sweep_record, select_learning_rates, sweep_lines
from normlab.report.plots import plot_lr_sweep
from normlab.report.style import arm_colors
from normlab.run_format import LADDER_KEY, check_ladder
from normlab.study.loader import study_configs
from normlab.study.rungs import plan_ladder
from normlab.study.sweep import sweep_plan, tuning_config, with_arm_rates

RISING = {1e-3: [3.0, 3.1], 3e-3: [2.9, 2.95], 1e-2: [2.8, 2.85]}  # best at the highest rate
FALLING = {1e-3: [2.7, 2.75], 3e-3: [2.9, 2.95], 1e-2: [3.0, None]}  # best at the lowest
INSIDE = {1e-3: [3.0, 3.1], 3e-3: [2.7, 2.8], 1e-2: [2.9, 3.0]}


def _curves(arms: list[str], settings: list[str]) -> dict:
    shapes = [RISING, FALLING, INSIDE]
    return {
        s: select_learning_rates({a: shapes[(i + j) % 3] for i, a in enumerate(arms)})
        for j, s in enumerate(settings)
    }


@pytest.mark.parametrize(("n_arms", "n_settings"), [(2, 1), (6, 1), (2, 2), (6, 3)])
def test_the_sweep_figure_reads_cleanly_with_long_names_at_the_edges(
    n_arms: int, n_settings: int
) -> None:
    arms = LONG_ARMS[:n_arms]
    settings = [f"d_model={32 * 2**k}" for k in range(n_settings)]
    record = lr_sweep_record(_curves(arms, settings), [3, 4])
    assert any(c["edge"] for by_arm in record["settings"].values() for c in by_arm.values())
    fig = plot_lr_sweep(record, arm_colors(arms))
    assert _overlapping_texts(fig) == []
    assert _legend_covers(fig) == 0
    assert _legend_mismatches(fig) == []  # the stars and x's keyed in the arms' colours


def test_the_words_flag_edges_divergence_and_alignment() -> None:
    curves = _curves(["layernorm-pre", "dyt-pre"], ["d_model=32", "d_model=128"])
    chosen_at = {
        "d_model=32": "d_model=32",
        "d_model=64": "d_model=32",
        "d_model=128": "d_model=32",
    }
    record = lr_sweep_record(curves, [3], chosen_at)
    check_ladder_part = {"arms": {}, "learning_rates": record}
    check_ladder(check_ladder_part)  # the record has the declared shape
    assert record["chosen"]["d_model=64"] == {"layernorm-pre": 1e-2, "dyt-pre": 1e-3}
    lines = sweep_lines(record, "final_val_bpb")
    text = "\n".join(lines)
    assert lines[0].startswith("learning-rate sweep at d_model=32 (rates 0.001, 0.003, 0.01; ")
    assert "tuning seed 3)" in lines[0] and "layernorm-pre best 0.01 (final_val_bpb 2.8250)" in text
    assert "the best rate of layernorm-pre (0.01) is the sweep's highest" in text
    assert "extend --lr-sweep to higher rates" in text and "to lower rates" in text
    assert "a tuning seed of dyt-pre diverged at 0.01" in text
    assert "d_model=64: each arm at its own best rate (chosen at d_model=32): " in text
    assert "optimum of layernorm-pre: 0.01 at d_model=32, 0.001 at d_model=128, 2 sweep steps " \
        "apart; no rate is within the tuning seeds' spread of the best at every setting: does " \
        "not line up" in text  # fmt: skip
    with pytest.raises(ValueError, match=r"^chosen_at: expected swept settings"):
        lr_sweep_record(curves, [3], {"d_model=64": "d_model=16"})
    assert LADDER_KEY == "ladder"


def test_which_rungs_are_swept_and_the_configs_of_a_sweep() -> None:
    base = {
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8},
        "lr_sweep": [1e-3, 1e-2],
        "seeds": 2,
    }
    sp = plan_ladder(study_configs({**base, "ladder": {"d_model": [8, 16, 32]}}).ladder)
    assert sweep_plan(sp).swept == ("d_model=8", "d_model=16", "d_model=32")
    assert sweep_plan(sp).chosen_at["d_model=16"] == "d_model=16"
    mup = {**base, "model": {**base["model"], "parametrization": "mup"}}
    width = sweep_plan(
        plan_ladder(study_configs({**mup, "ladder": {"d_model": [8, 16, 32]}}).ladder)
    )
    assert width.swept == ("d_model=8", "d_model=32")  # the choice and the transfer check
    assert set(width.chosen_at.values()) == {"d_model=8"}
    depth = sweep_plan(plan_ladder(study_configs({**mup, "ladder": {"n_layers": [1, 2]}}).ladder))
    assert depth.swept == ("n_layers=1", "n_layers=2")  # μP carries rates across width only
    cfg = sp.configs[0]
    tuned = tuning_config(cfg, 0.03, [2, 3])
    assert (tuned.train.lr, tuned.seed_list(), tuned.train.arm_lr) == (0.03, [2, 3], None)
    chosen = with_arm_rates(cfg, {"layernorm-pre": 0.01, "rmsnorm-pre": 0.001})
    assert chosen.arm_lr("rmsnorm-pre") == 0.001 and chosen.seed_list() == cfg.seed_list()
    with pytest.raises(ValueError, match=r"^--lr-sweep: no chosen rate for the arm 'rmsnorm-pre'"):
        with_arm_rates(cfg, {"layernorm-pre": 0.01})


def test_a_tie_at_the_base_width_is_broken_at_the_check_width() -> None:
    """Under μP (every rung runs the base width's choice) the base width's best is kept unless
    its tuning seeds cannot tell rates apart: then the tied rate best at the widest swept
    setting. Each rung choosing its own (sp) keeps each setting's best."""
    base = {0.01: [3.75, 3.83], 0.02: [3.67, 3.93], 0.04: [3.80, 3.88], 0.005: [4.07, 4.08]}
    check = {0.01: [3.17, 3.17], 0.02: [3.04, 3.045], 0.04: [3.04, 3.32], 0.005: [3.38, 3.39]}
    clear = {0.01: [3.70, 3.701], 0.02: [3.80, 3.801], 0.04: [3.90, 3.901], 0.005: [4.0, 4.001]}
    curves = {
        "d_model=16": select_learning_rates({"tie": base, "clear": clear}),
        "d_model=32": select_learning_rates({"tie": check, "clear": check}),
    }
    assert curves["d_model=16"]["tie"].best == 0.01  # the lowest mean, within the noise
    mup = {"d_model=16": "d_model=16", "d_model=32": "d_model=16", "d_model=64": "d_model=16"}
    chosen = lr_sweep_record(curves, [3, 4], mup)["chosen"]
    assert {r: c["tie"] for r, c in chosen.items()} == dict.fromkeys(mup, 0.02)
    assert {r: c["clear"] for r, c in chosen.items()} == dict.fromkeys(mup, 0.01)  # no tie
    own = lr_sweep_record(curves, [3, 4])["chosen"]  # sp: each rung its own best
    assert own == {"d_model=16": {"tie": 0.01, "clear": 0.01},
                   "d_model=32": {"tie": 0.02, "clear": 0.02}}  # fmt: skip
