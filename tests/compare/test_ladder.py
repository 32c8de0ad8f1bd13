"""The size ladder's statistics: the weighted fit in log N, the calibrated prediction interval
at a target size (its coverage on simulated ladders, against the plain bootstrap's), the
learning-rate choice, the refusals, the record's declared shape and the two figures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from normlab.analysis.ladder import (
    Rung,
    fit_ladder,
    ladder_record,
    ladder_summary,
    paired_rung,
    predict_ladder,
    rung_stats,
)
from normlab.analysis.lr_sweep import (
    lr_sweep_record,
    optimum_alignment,
    select_learning_rates,
    tuning_seeds,
)
from normlab.analysis.wording import ladder_words
from normlab.run_format import LADDER_KEY, check_ladder

SIZES = (1e6, 4e6, 1.6e7, 6.4e7)


def _noiseless(a: float, b: float, offsets=(-0.01, 0.0, 0.01)) -> list[Rung]:
    """Rungs whose seeds scatter symmetrically about a + b·log10 N (so each mean is on it)."""
    return [
        Rung(f"r{j}", n, tuple(a + b * math.log10(n) + o for o in offsets), (0, 1, 2))
        for j, n in enumerate(SIZES)
    ]


def test_fit_recovers_a_known_line():
    fit = fit_ladder(_noiseless(0.3, -0.05))
    assert fit.a == pytest.approx(0.3, abs=1e-12)
    assert fit.b == pytest.approx(-0.05, abs=1e-12)
    assert fit.at(1e9) == pytest.approx(0.3 - 0.05 * 9, abs=1e-12)
    assert fit.lack_of_fit_p == pytest.approx(1.0)
    # float64 reference: the weighted normal equations solved directly
    rungs = _noiseless(0.3, -0.05)
    x = np.log10(SIZES)
    y = np.array([np.mean(r.diffs) for r in rungs])
    coef = np.linalg.lstsq(np.vstack([np.ones(4), x]).T, y, rcond=None)[0]
    assert (fit.a, fit.b) == pytest.approx(tuple(coef), abs=1e-12)


def test_a_noisy_rung_pulls_less():
    """One rung off the line: with a large sd it moves the fit less than with a small one."""
    base = _noiseless(0.0, 0.0)

    def shifted(spread: float) -> list[Rung]:
        rungs = list(base)
        rungs[1] = Rung("r1", SIZES[1], (0.1 - spread, 0.1, 0.1 + spread), (0, 1, 2))
        return rungs

    quiet, noisy = fit_ladder(shifted(0.01)), fit_ladder(shifted(0.2))
    pred_quiet, pred_noisy = quiet.at(SIZES[1]), noisy.at(SIZES[1])
    assert pred_noisy < pred_quiet
    # the weights are what moves it: an equal-weight line through the means ignores the sd
    x = np.log10(SIZES)
    y = np.array([0.0, 0.1, 0.0, 0.0])
    b, a = np.polyfit(x, y, 1)
    assert pred_quiet == pytest.approx(a + b * x[1], rel=1e-9)
    assert pred_noisy < 0.5 * (a + b * x[1])


def test_rung_stats_are_the_paired_t_interval():
    r = paired_rung("w=64", 4e6, {0: 2.0, 1: 2.1, 2: 2.05, 5: 9.0}, {0: 1.9, 1: 2.15, 2: 2.0})
    assert r.seeds == (0, 1, 2)
    assert r.diffs == pytest.approx((0.1, -0.05, 0.05))
    s = rung_stats([r, Rung("w=32", 1e6, (0.0, 0.02))])[0]
    d = np.array([0.1, -0.05, 0.05])
    half = 4.302652729911275 * d.std(ddof=1) / math.sqrt(3)  # t_{0.975, 2}
    assert (s.mean, s.low, s.high) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))


def _simulate(n_ladders: int, calibrated: bool, seed: int = 7) -> dict[str, float]:
    """Ladders from d(N) = 0.05 − 0.02·log10(N / 1e6) with paired sd 0.04 per seed, 3 seeds
    per rung, 4 rungs at 4× steps, target 100× beyond; the share of ladders whose interval
    holds a fresh single training (and the trend) at the target."""
    rng = np.random.default_rng(seed)
    target = SIZES[-1] * 100

    def mu(n: float) -> float:
        return 0.05 - 0.02 * math.log10(n / 1e6)

    hits = {"single": 0, "trend": 0}
    for k in range(n_ladders):
        rungs = [
            Rung(f"r{j}", n, tuple(mu(n) + 0.04 * rng.standard_normal(3)))
            for j, n in enumerate(SIZES)
        ]
        p = predict_ladder(rungs, target, n_boot=1000, seed=k, calibrated=calibrated)
        one = mu(target) + 0.04 * rng.standard_normal()
        hits["single"] += p.single.low <= one <= p.single.high
        hits["trend"] += p.trend.low <= mu(target) <= p.trend.high
    return {key: v / n_ladders for key, v in hits.items()}


def test_prediction_interval_covers_at_its_nominal_rate():
    """200 simulated ladders: the calibrated 95 % intervals cover within a generous band
    (Monte-Carlo sd at n = 200 is 1.5 points); the plain bootstrap of the fit, read as the
    difference a single training would show, covers far less often than it claims."""
    calibrated = _simulate(200, calibrated=True)
    naive = _simulate(200, calibrated=False)
    assert 0.90 <= calibrated["single"] <= 0.99, calibrated
    assert 0.90 <= calibrated["trend"] <= 0.99, calibrated
    assert naive["single"] < 0.88, naive


def test_intervals_nest_and_are_reproducible():
    rungs = _noiseless(0.0, 0.01, offsets=(-0.05, 0.01, 0.04))
    p = predict_ladder(rungs, 1e10, target_seeds=4, seed=3)
    assert p == predict_ladder(rungs, 1e10, target_seeds=4, seed=3)
    assert p.extrapolation == pytest.approx(1e10 / SIZES[-1])
    assert p.single.low < p.mean_of_seeds.low < p.trend.low < p.trend.estimate
    assert p.trend.estimate < p.trend.high < p.mean_of_seeds.high < p.single.high
    assert p.single.p_above + p.single.p_below == pytest.approx(1.0)
    assert p.mean_of_seeds.seeds == 4 and p.trend.seeds is None


def test_sign_words():
    assert ladder_words(0.01, 0.99, low=-0.2, high=-0.01, lower_is_better=True).word == "better"
    assert ladder_words(0.01, 0.99, low=-0.2, high=-0.01, lower_is_better=False).word == "worse"
    undecided = ladder_words(0.3, 0.7, low=-0.2, high=0.1, lower_is_better=True)
    assert undecided.word == "not determined" and "70 %" in undecided.reason
    eq = ladder_words(0.5, 0.5, low=-0.01, high=0.01, lower_is_better=True, margin=0.02)
    assert eq.word == "equivalent"


@pytest.mark.parametrize(
    ("rungs", "target", "kwargs", "name"),
    [
        ([Rung("a", 1e6, (0.0, 0.1))], 1e8, {}, "rungs:"),
        ([Rung("a", 1e6, (0.0, 0.1)), Rung("b", 1e6, (0.0, 0.2))], 1e8, {}, "rungs:"),
        ([Rung("a", 1e6, (0.0, 0.1)), Rung("b", 4e6, (0.1,))], 1e8, {}, "rungs[1].diffs"),
        ([Rung("a", 0.0, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))], 1e8, {}, "rungs[0].n_params"),
        ([Rung("a", -5, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))], 1e8, {}, "rungs[0].n_params"),
        ([Rung("a", 1e6, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))], 2e6, {}, "target_params"),
        ([Rung("a", 1e6, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))], 0, {}, "target_params"),
        ([Rung("a", 1e6, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))], 1e8, {"n_boot": 5}, "n_boot"),
        (
            [Rung("a", 1e6, (0.0, 0.1)), Rung("b", 4e6, (0.0, 0.1))],
            1e8,
            {"target_seeds": 0},
            "target_seeds",
        ),
    ],
)
def test_bad_ladders_are_refused_with_one_line(rungs, target, kwargs, name):
    with pytest.raises(ValueError) as err:
        predict_ladder(rungs, target, **kwargs)
    assert str(err.value).startswith(name) and "\n" not in str(err.value)


def test_learning_rate_choice():
    losses = {
        "ln": {1e-3: [3.0, 3.1], 3e-3: [2.8, 2.9], 1e-2: [2.95, None]},
        "rms": {3e-3: [3.0, 3.0], 1e-3: [3.2, 3.3], 1e-2: [2.7, 2.75]},
    }
    curves = select_learning_rates(losses)
    assert curves["ln"].best == 3e-3 and curves["ln"].edge is None
    assert curves["ln"].best_mean == pytest.approx(2.85)
    assert [p.rate for p in curves["rms"].points] == [1e-3, 3e-3, 1e-2]
    assert curves["rms"].best == 1e-2 and curves["rms"].edge == "highest"
    diverged = curves["ln"].points[2]
    assert (diverged.n, diverged.n_diverged, diverged.sd) == (1, 1, None)
    low_edge = select_learning_rates({"a": {1e-3: [1.0, 1.1], 1e-2: [2.0, 2.1]}})["a"]
    assert low_edge.edge == "lowest"
    p = curves["ln"].points[1]
    half = 12.706204736174707 * np.std([2.8, 2.9], ddof=1) / math.sqrt(2)
    assert (p.low, p.high) == pytest.approx((2.85 - half, 2.85 + half))


def test_learning_rate_refusals():
    with pytest.raises(ValueError, match=r"^losses\['a'\]: a learning-rate sweep needs at least"):
        select_learning_rates({"a": {1e-3: [1.0, 1.1]}})
    with pytest.raises(ValueError, match=r"^losses\['a'\]: expected a positive learning rate"):
        select_learning_rates({"a": {-1e-3: [1.0], 1e-2: [1.0]}})
    with pytest.raises(ValueError, match=r"^losses\['a'\]: a tuning seed diverged at every"):
        select_learning_rates({"a": {1e-3: [1.0, None], 1e-2: [float("nan")]}})


def test_optimum_alignment_and_tuning_seeds():
    sweep = {1e-3: [3.0], 3e-3: [2.5], 1e-2: [2.9], 3e-2: [3.5]}
    moved = {1e-3: [3.0], 3e-3: [2.9], 1e-2: [3.2], 3e-2: [2.1]}
    curves = {
        "d_model=32": select_learning_rates({"a": sweep, "b": sweep}),
        "d_model=64": select_learning_rates({"a": sweep, "b": moved}),
    }
    al = {x.arm: x for x in optimum_alignment(curves)}
    assert al["a"].steps == 0 and al["a"].aligned
    assert al["b"].steps == 2 and not al["b"].aligned
    assert al["b"].best == {"d_model=32": 3e-3, "d_model=64": 3e-2}
    assert al["a"].common == [3e-3] and al["b"].common == []  # one seed: only the best is tied
    assert tuning_seeds(2, [0, 1, 2]) == [3, 4]
    with pytest.raises(ValueError, match=r"^count:"):
        tuning_seeds(0, [0])


def _summary() -> dict:
    rng = np.random.default_rng(0)
    rungs = [
        Rung(f"d_model={w}", n, tuple(0.02 + 0.04 * rng.standard_normal(3)), (0, 1, 2))
        for w, n in zip((32, 64, 128), SIZES, strict=False)
    ]
    rec = ladder_record(
        rungs, 1e9, arm="rmsnorm-pre", baseline="layernorm-pre", metric="final_val_bpb",
        unit="bpb", n_boot=500,
    )  # fmt: skip
    sweep = {
        "d_model=32": select_learning_rates(
            {
                "layernorm-pre": {1e-3: [3.0, 3.1], 3e-3: [2.8, 2.9], 1e-2: [2.95, None]},
                "rmsnorm-pre": {1e-3: [3.2, 3.3], 3e-3: [3.0, 3.0], 1e-2: [2.7, 2.75]},
            }
        ),
        "d_model=64": select_learning_rates(
            {
                "layernorm-pre": {1e-3: [2.9, 3.0], 3e-3: [2.7, 2.8], 1e-2: [2.85, 2.9]},
                "rmsnorm-pre": {1e-3: [3.1, 3.2], 3e-3: [2.9, 2.9], 1e-2: [2.6, 2.65]},
            }
        ),
    }
    return ladder_summary([rec], lr_sweep_record(sweep, tuning_seeds(2, [0, 1, 2])))


def test_record_validates_against_the_declaration():
    value = json.loads(json.dumps(_summary()))  # what summary.json holds after a round trip
    check_ladder(value)
    assert LADDER_KEY == "ladder"
    rec = value["arms"]["rmsnorm-pre"]
    assert rec["target"]["extrapolation"] == pytest.approx(1e9 / SIZES[2])
    assert "beyond the largest rung" in rec["prediction"]["sentence"]
    broken = json.loads(json.dumps(value))
    broken["arms"]["rmsnorm-pre"]["fit"]["b"] = "steep"
    with pytest.raises(ValueError, match=r"^ladder\.arms\['rmsnorm-pre'\]\.fit\.b: expected"):
        check_ladder(broken)
    del broken["arms"]["rmsnorm-pre"]["fit"]
    with pytest.raises(ValueError, match=r"missing \['fit'\]"):
        check_ladder(broken)


@pytest.mark.parametrize("n_arms", [1, 3])
def test_figures_read_cleanly(n_arms):
    """The ladder's figures: no overlapping text, no legend over data, and every legend
    swatch in a colour the panels draw (the bands' in their arm's colour and opacity)."""
    from test_figures import _legend_covers, _legend_mismatches, _overlapping_texts

    from normlab.report.plots import figure_png, plot_ladder, plot_ladder_losses, plot_lr_sweep
    from normlab.report.style import arm_colors

    value = _summary()
    record = value["arms"]["rmsnorm-pre"]
    arms = ["rmsnorm-pre", "dyt-pre-alpha0.5-learnable", "rmsnorm-sandwich-peri-ln"][:n_arms]
    value["arms"] = {arm: {**record, "arm": arm} for arm in arms}
    colors = arm_colors(["layernorm-pre", *arms])
    losses = {
        arm: [(r["n_params"], [3.0 - 0.1 * j + 0.01 * i + d for d in r["diffs"]])
              for j, r in enumerate(record["rungs"])]
        for i, arm in enumerate(["layernorm-pre", *arms])
    }  # fmt: skip
    figures = (
        plot_ladder(value, colors),
        plot_lr_sweep(value["learning_rates"], colors),
        plot_ladder_losses(losses, colors, "final validation bpb (bpb)"),
    )
    for fig in figures:
        assert _overlapping_texts(fig) == []
        assert _legend_covers(fig) == 0
        assert _legend_mismatches(fig) == []
        assert figure_png(fig)[:4] == b"\x89PNG"


def test_alignment_weighs_the_best_rates_against_the_tuning_seeds_spread():
    """With two tuning seeds the optimum lines up when some rate is within the seeds' spread of
    the best at every width, however far the argmins lie apart, and not when none is, however
    close they are."""
    noisy = {
        "d_model=32": {1e-3: [3.0, 3.2], 3e-3: [2.5, 2.7], 1e-2: [2.55, 2.75], 3e-2: [3.4, 3.5]},
        "d_model=64": {1e-3: [3.0, 3.2], 3e-3: [2.6, 2.8], 1e-2: [2.62, 2.8], 3e-2: [2.5, 2.7]},
    }
    sharp = {
        "d_model=32": {1e-3: [3.0, 3.01], 3e-3: [2.5, 2.51], 1e-2: [2.9, 2.91], 3e-2: [3.5, 3.5]},
        "d_model=64": {1e-3: [3.0, 3.01], 3e-3: [2.9, 2.91], 1e-2: [2.5, 2.51], 3e-2: [3.5, 3.5]},
    }
    curves = {s: select_learning_rates({"noisy": noisy[s], "sharp": sharp[s]}) for s in noisy}
    al = {x.arm: x for x in optimum_alignment(curves)}
    assert al["noisy"].steps == 2 and al["noisy"].aligned  # argmins 3e-3 and 3e-2
    assert al["noisy"].common == [3e-3, 1e-2]
    assert al["noisy"].tied["d_model=64"] == [3e-3, 1e-2, 3e-2]
    assert al["sharp"].steps == 1 and not al["sharp"].aligned  # neighbours, far beyond noise
    assert al["sharp"].common == [] and al["sharp"].tied["d_model=32"] == [3e-3]
