"""Anomaly detectors on synthetic series: injected spikes are flagged, clean noise is not."""

from __future__ import annotations

import math

import numpy as np
import pytest

from normlab.experiment.measure.anomaly import (
    SpikeDetector,
    SpikeRule,
    find_spikes,
    first_nonfinite,
    robust_z,
    spike_scores,
)


def noisy_loss(n: int = 2000, seed: int = 0, noise: float = 0.03) -> list[float]:
    """A decaying loss curve with multiplicative log-normal noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    clean = 1.5 + 4.0 * np.exp(-t / 300)
    return list(clean * np.exp(rng.normal(0, noise, n)))


@pytest.mark.parametrize("seed", range(5))
def test_clean_noisy_series_raises_no_alarm(seed: int) -> None:
    assert find_spikes(noisy_loss(seed=seed)) == []
    grad = list(np.exp(np.random.default_rng(seed).normal(0, 0.2, 2000)))  # noisier: grad norms
    assert find_spikes(grad) == []


def test_injected_spikes_are_flagged_exactly() -> None:
    series = noisy_loss()
    for i in (400, 1000, 1700):
        series[i] *= 2.0
    assert find_spikes(series) == [400, 1000, 1700]


def test_grad_norm_spike_among_heavy_noise() -> None:
    rng = np.random.default_rng(1)
    series = list(np.exp(rng.normal(0, 0.2, 600)))
    series[300] = 50.0
    assert find_spikes(series, SpikeRule(window=50, warmup=50, threshold=6.0)) == [300]


def test_drops_are_not_spikes() -> None:
    series = noisy_loss()
    series[800] *= 0.3
    assert find_spikes(series) == []


def test_warmup_is_never_judged() -> None:
    series = noisy_loss(n=200)
    series[30] *= 10
    rule = SpikeRule(window=20, warmup=50)
    scores = spike_scores(series, rule)
    assert all(z is None for z in scores[:50])
    assert find_spikes(series, rule) == []
    assert find_spikes(series, SpikeRule(window=20, warmup=0)) == [30]


def test_the_current_step_is_not_in_its_own_window() -> None:
    """A flat window (MAD at the floor) then one jump: judged only against the past."""
    series = [2.0] * 60 + [2.0 * math.exp(0.1)]
    scores = spike_scores(series, SpikeRule(window=50, warmup=50, min_scale=0.01))
    assert scores[-1] == pytest.approx(0.1 / 0.01)
    # logs [0, 0, 1, 1] then 3: the window's median is 0.5 and its MAD 0.5; had the current
    # value been in the window (0, 1, 1, 3), the median would be 1 and z smaller
    series = [1.0, 1.0, math.e, math.e, math.e**3]
    z = spike_scores(series, SpikeRule(window=4, warmup=0))[-1]
    assert z == pytest.approx((3 - 0.5) / (1.4826 * 0.5))
    # a run of spikes: the first is judged against clean history, the window then adapts
    series = noisy_loss(n=300) + [20.0] * 5
    assert find_spikes(series)[0] == 300


def test_robust_z_formula() -> None:
    history = [1.0, math.e, math.e**2, math.e**3, math.e**4]  # logs 0..4: median 2, MAD 1
    assert robust_z(history, math.e**5) == pytest.approx(3 / 1.4826)
    assert robust_z(history, math.e**2) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="history"):
        robust_z([], 1.0)
    with pytest.raises(ValueError, match="positive"):
        robust_z([1.0, 2.0], -1.0)


def test_online_detector_matches_the_series_function() -> None:
    series = noisy_loss(n=500)
    series[321] *= 3
    series[100] = float("nan")
    detector = SpikeDetector()
    online = [detector.update(v) for v in series]
    assert online == spike_scores(series)
    assert [i for i, z in enumerate(online) if detector.is_spike(z)] == [321]


def test_nonfinite_values() -> None:
    assert first_nonfinite([1.0, 2.0, 3.0]) is None
    assert first_nonfinite([1.0, float("nan"), float("inf")]) == 1
    assert first_nonfinite([1.0, 2.0, float("-inf")]) == 2
    assert first_nonfinite([1.0, None]) == 1
    scores = spike_scores([1.0] * 60 + [float("inf"), float("nan")])
    assert scores[-2:] == [None, None]  # non-finite values are reported as divergence instead


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"window": 2}, "window"), ({"warmup": -1}, "warmup"), ({"threshold": 0}, "threshold")],
)
def test_rule_validation(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SpikeRule(**kw)
