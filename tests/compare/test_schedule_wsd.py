"""The warm-up–stable–decay schedule against a float64 hand computation, its continuity at the
phase boundaries, the cosine schedule unchanged, and μP's per-group rates under it."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from normlab.experiment.training.schedule import (
    Schedule,
    lr_at,
    make_optimizer,
    schedule_of,
    wsd_lr_at,
)
from normlab.models import GPTConfig, build_gpt
from normlab.models.mup import set_lr
from normlab.run_format.train_options import fraction_steps


def hand_wsd(step: int, peak: float, n: int, w: int, r: float, f: float, decay: str) -> float:
    """The schedule as the paper states it, in float64 with exact phase arithmetic: the
    cooldown is the last round-half-up(f·n) steps, its progress p = (step − (n − D)) / D."""
    d = int(Fraction(f) * n + Fraction(1, 2))  # ⌊f·n + ½⌋ in exact arithmetic
    if step <= w:
        return peak * step / w
    if step <= n - d:
        return peak
    p = (step - (n - d)) / d
    shape = (1 - p) if decay == "linear" else (1 - p**0.5)
    return peak * (r + (1 - r) * shape)


@pytest.mark.parametrize("decay", ["linear", "sqrt"])
@pytest.mark.parametrize(("n", "w", "f"), [(100, 10, 0.2), (37, 0, 0.3), (10, 3, 0.7), (5, 0, 1.0)])
def test_wsd_matches_a_float64_hand_computation(decay: str, n: int, w: int, f: float) -> None:
    peak, r = 3e-3, 0.1
    for step in range(1, n + 1):
        got = wsd_lr_at(step, peak, n, w, r, f, decay)
        assert got == pytest.approx(hand_wsd(step, peak, n, w, r, f, decay), rel=1e-15, abs=0)
    assert wsd_lr_at(n, peak, n, w, r, f, decay) == pytest.approx(r * peak, rel=1e-15)


@pytest.mark.parametrize("decay", ["linear", "sqrt"])
def test_wsd_is_continuous_at_the_phase_boundaries(decay: str) -> None:
    """Warm-up ends at the peak, the stable phase holds it to its last step, and the first
    cooldown step falls from it by a jump that vanishes as the cooldown lengthens:
    (1 − r)/D for linear, (1 − r)/√D for sqrt."""
    peak, r, w = 1.0, 0.0, 20
    jumps = []
    for n in (1_000, 10_000, 100_000):
        d = fraction_steps(n, 0.2)
        stable_end = n - d
        lr = [wsd_lr_at(s, peak, n, w, r, 0.2, decay) for s in (w, w + 1, stable_end)]
        assert lr == [peak, peak, peak]
        first = wsd_lr_at(stable_end + 1, peak, n, w, r, 0.2, decay)
        expected = 1 / d if decay == "linear" else 1 / math.sqrt(d)
        assert peak - first == pytest.approx(expected, rel=1e-9)
        jumps.append(peak - first)
    assert jumps[0] > jumps[1] > jumps[2] and jumps[2] < 0.01
    # within the cooldown the rate never rises and never falls below r · peak
    n = 1_000
    tail = [wsd_lr_at(s, peak, n, w, 0.1, 0.2, decay) for s in range(n - 200, n + 1)]
    assert all(a >= b for a, b in itertools.pairwise(tail)) and min(tail) == 0.1


def test_fraction_steps_rounds_half_up() -> None:
    assert [fraction_steps(10, f) for f in (0.25, 0.24, 0.26, 0.05, 0.04)] == [3, 2, 3, 1, 0]
    assert fraction_steps(600, 0.2) == 120 and fraction_steps(7, 1.0) == 7


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"step": 0}, "step: expected 1 <= step <= 10"),
        ({"step": 11}, "step: expected 1 <= step <= 10"),
        ({"decay": "cosine"}, "decay: expected one of linear, sqrt"),
        ({"cooldown": 0.9}, "cooldown: 0.9 of 10 steps is 9 steps"),
        ({"cooldown": 0.01}, "cooldown: 0.01 of 10 steps is 0 steps"),
    ],
)
def test_wsd_refuses_bad_input_naming_it(kwargs: dict, fragment: str) -> None:
    args = {"step": 5, "cooldown": 0.2, "decay": "linear", **kwargs}
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        wsd_lr_at(args["step"], 1.0, 10, 2, 0.1, args["cooldown"], args["decay"])


def test_the_cosine_schedule_of_a_run_is_lr_at_bit_for_bit() -> None:
    """A run config without ``schedule`` is a cosine run, with the rates it always had."""
    train = {"lr": 5e-3, "steps": 600, "warmup": 30, "min_lr_ratio": 0.1}
    schedule = schedule_of(train)
    assert schedule.kind == "cosine"
    assert [schedule.lr(s) for s in range(1, 601)] == [
        lr_at(s, 5e-3, 600, 30, 0.1) for s in range(1, 601)
    ]
    with pytest.raises(ValueError, match="only a wsd schedule has a cooldown"):
        schedule.cooldown_start()
    with pytest.raises(ValueError, match="kind: expected one of cosine, wsd"):
        Schedule("step", 1.0, 10, 0, 0.1, 0.2, "linear")
    with pytest.raises(ValueError, match="cooldown, decay: a wsd schedule needs both"):
        schedule_of({**train, "schedule": "wsd", "cooldown": 0.2, "decay": None})


def test_a_wsd_run_and_its_budgets_share_the_stable_prefix() -> None:
    """Every step before a shorter budget's cooldown has the same rate in the long run."""
    train = {"lr": 1e-2, "steps": 200, "warmup": 10, "min_lr_ratio": 0.0}
    long = schedule_of({**train, "schedule": "wsd", "cooldown": 0.25, "decay": "sqrt"})
    assert long.cooldown_start() == 150
    for budget in (40, 100, 199):
        short = long.for_budget(budget)
        start = short.cooldown_start()
        assert start == budget - fraction_steps(budget, 0.25) <= long.cooldown_start()
        assert [short.lr(s) for s in range(1, start + 1)] == [
            long.lr(s) for s in range(1, start + 1)
        ]
        assert short.lr(budget) == 0.0 < long.lr(budget)


def test_mup_group_rates_follow_the_wsd_schedule() -> None:
    """set_lr gives each group the scheduled rate times its μP multiplier, in every phase."""
    cfg = GPTConfig(d_model=32, n_layers=1, n_heads=2, context=8, parametrization="mup")
    model = build_gpt(cfg, seed=0)
    opt = make_optimizer(model, 1e-2, 0.1, (0.9, 0.95))
    mults = [g["lr_mult"] for g in opt.param_groups]
    assert any(m != 1.0 for m in mults)
    schedule = schedule_of(
        {"lr": 1e-2, "steps": 20, "warmup": 2, "min_lr_ratio": 0.1, "schedule": "wsd"}
        | {"cooldown": 0.2, "decay": "linear"}
    )
    for step in (1, 10, 20):
        set_lr(opt, schedule.lr(step))
        assert [g["lr"] for g in opt.param_groups] == [schedule.lr(step) * m for m in mults]
    assert isinstance(opt, torch.optim.AdamW)
