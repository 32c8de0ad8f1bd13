"""normlab.analysis.cost: the price of a decision at each budget (seeds needed × a seed's
compute), the spread law across budgets and the cost model of a seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.analysis.cost import (
    PRIOR_EXPONENT,
    BudgetSpread,
    SeedCost,
    cheapest,
    fit_seed_cost,
    fit_spread_law,
    price_decisions,
    train_flops,
)
from normlab.analysis.power import sd_interval, seeds_needed


def test_train_flops_is_six_n_d() -> None:
    assert train_flops(214_144, 1024 * 600) == 6 * 214_144 * 1024 * 600
    with pytest.raises(ValueError, match="n_params"):
        train_flops(0, 10)


def test_seed_cost_recovers_a_line_and_falls_back_to_proportional() -> None:
    points = [(b, 5.0 + 12.0 * b, 1e9 * b) for b in (1.0, 3.0, 10.0)]
    cost = fit_seed_cost(points)
    assert cost.fixed_core_s == pytest.approx(5.0)
    assert cost.core_s_per_budget == pytest.approx(12.0)
    assert cost.flops(20.0) == pytest.approx(2e10)
    one = fit_seed_cost([(3.0, 36.0, 3e9)])
    assert (one.fixed_core_s, one.core_s_per_budget) == (0.0, pytest.approx(12.0))
    # a line that would need a negative fixed part is not believed
    odd = fit_seed_cost([(1.0, 1.0, 1.0), (2.0, 10.0, 2.0)])
    assert odd.fixed_core_s == 0.0
    with pytest.raises(ValueError, match="points"):
        fit_seed_cost([])


@given(
    k=st.floats(-0.5, 1.5),
    scale=st.floats(0.001, 1.0),
    budgets=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 10.0, 20.0]), min_size=2, unique=True),
)
@settings(max_examples=50, deadline=None)
def test_spread_law_recovers_an_exact_power_law(k: float, scale: float, budgets: list) -> None:
    spreads = [BudgetSpread(b, 8, 0.0, scale * b ** (-k)) for b in budgets]
    law = fit_spread_law(spreads)
    assert law.measured
    assert law.exponent == pytest.approx(k, abs=1e-9)
    for b in (0.3, 7.0, 40.0):
        assert law.sd(b) == pytest.approx(scale * b ** (-k), rel=1e-9)
    assert law.exponent_low < k < law.exponent_high


def test_spread_law_weights_by_degrees_of_freedom() -> None:
    spreads = [BudgetSpread(1.0, 16, 0.0, 0.08), BudgetSpread(3.0, 4, 0.0, 0.03),
               BudgetSpread(10.0, 16, 0.0, 0.03)]  # fmt: skip
    law = fit_spread_law(spreads)
    x, y = np.log([1.0, 3.0, 10.0]), np.log([0.08, 0.03, 0.03])
    slope = np.polyfit(x, y, 1, w=np.sqrt([15.0, 3.0, 15.0]))[0]
    assert law.exponent == pytest.approx(-slope)


def test_one_budget_takes_the_prior_exponent() -> None:
    law = fit_spread_law([BudgetSpread(3.0, 16, 0.0, 0.045)])
    assert not law.measured
    assert (law.exponent, law.exponent_low, law.exponent_high) == PRIOR_EXPONENT
    assert law.sd(12.0) == pytest.approx(0.045 * 4 ** (-PRIOR_EXPONENT[0]))
    low, high = law.sd_range(12.0)
    ref_low, ref_high = sd_interval(0.045, 16)
    assert low == pytest.approx(ref_low * 4 ** (-PRIOR_EXPONENT[2]))
    assert high == pytest.approx(ref_high * 4 ** (-PRIOR_EXPONENT[1]))


def test_a_measured_budget_is_priced_from_its_own_spread() -> None:
    spread = BudgetSpread(3.0, 16, 0.001, 0.045)
    cost = SeedCost(0.0, 10.0, 1e9)
    (price,) = price_decisions([spread], cost, [3.0], 0.02)
    assert price.measured
    n = seeds_needed(0.001, 0.045, 0.02)
    assert price.seeds == n
    assert price.seeds_high == seeds_needed(0.001, sd_interval(0.045, 16)[1], 0.02)
    assert price.core_s == pytest.approx(n * 30.0)
    assert price.flops == pytest.approx(n * 3e9)


@pytest.mark.parametrize(("k", "margin", "expected"), [(1.0, 0.002, 20.0), (0.2, 0.05, 1.0)])
def test_cheapest_budget_follows_how_fast_the_spread_falls(
    k: float, margin: float, expected: float
) -> None:
    """With a seed's cost ∝ b and seeds ∝ σ² ∝ b^(−2k) (well above the floor of 2 seeds):
    k > 0.5 makes longer training cheaper, k < 0.5 shorter."""
    spreads = [BudgetSpread(b, 16, 0.0, 0.08 * b ** (-k)) for b in (1.0, 3.0)]
    prices = price_decisions(spreads, SeedCost(0.0, 10.0, 1e9), [1.0, 3.0, 10.0, 20.0], margin)
    best = cheapest(prices)
    assert best is not None and best.budget == expected
    assert [p.measured for p in prices] == [True, True, False, False]


def test_no_practical_count_has_no_price() -> None:
    spreads = [BudgetSpread(1.0, 4, 0.0, 5.0)]
    prices = price_decisions(spreads, SeedCost(0.0, 1.0, 1.0), [1.0], 0.001)
    assert prices[0].seeds is None and prices[0].core_s is None
    assert cheapest(prices) is None


def test_bad_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="budget"):
        BudgetSpread(0.0, 3, 0.0, 0.1)
    with pytest.raises(ValueError, match="n_seeds"):
        BudgetSpread(1.0, 1, 0.0, 0.1)
    with pytest.raises(ValueError, match="budgets"):
        price_decisions([BudgetSpread(1.0, 3, 0.0, 0.1)], SeedCost(0, 1, 1), [math.nan], 0.02)
