"""Coverage of the ladder's prediction interval on simulated ladders (docs/studies.md).

Each ladder: rungs at N = 1e6 · 4^j (j = 0 … J − 1), 3 paired seeds per rung, per-seed paired
differences d = μ(N) + σ(N) · z, z ~ N(0, 1), and a target 100× beyond the largest rung. The
interval is computed by :func:`normlab.analysis.ladder.predict_ladder` (2000 replicates per
ladder) and checked against a fresh draw at the target: one training (k = 1), the mean of 3
(k = 3), and the trend μ(N_t). The plain bootstrap (``calibrated=False``) is checked against
one training as well. Monte-Carlo error of a coverage p over n ladders: ±1.96·√(p(1 − p)/n).

    python benchmarks/ladder_coverage.py            # 1000 ladders per scenario, ~3 min on 2 cores
    python benchmarks/ladder_coverage.py --ladders 100
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from normlab.analysis.ladder import Rung, predict_ladder

SCENARIOS: dict[str, tuple[str, Callable[[float], float], Callable[[float], float]]] = {
    "no trend": ("μ = 0, σ = 0.04", lambda x: 0.0, lambda x: 0.04),
    "trend": ("μ = 0.05 − 0.02·x, σ = 0.04", lambda x: 0.05 - 0.02 * x, lambda x: 0.04),
    "sd shrinks": (
        "μ = 0.05 − 0.02·x, σ = 0.05·10^(−0.2·x)",
        lambda x: 0.05 - 0.02 * x,
        lambda x: 0.05 * 10 ** (-0.2 * x),
    ),
    "sd grows": ("μ = 0, σ = 0.03·10^(0.1·x)", lambda x: 0.0, lambda x: 0.03 * 10 ** (0.1 * x)),
    "curved": (
        "μ = 0.05 − 0.02·x + 0.01·x², σ = 0.04",
        lambda x: 0.05 - 0.02 * x + 0.01 * x * x,
        lambda x: 0.04,
    ),
}
"""name: (description, μ(x), σ(x)) with x = log10(N / 1e6)."""


def coverage(name: str, rungs: int, ladders: int, seed: int = 0) -> dict[str, float]:
    """Shares of ``ladders`` simulated ladders whose 95 % intervals hold the truth."""
    _, mu, sd = SCENARIOS[name]
    rng = np.random.default_rng(seed)
    sizes = 1e6 * 4.0 ** np.arange(rungs)
    target = float(sizes[-1]) * 100
    xt = math.log10(target / 1e6)
    hits = {"single": 0, "mean of 3": 0, "trend": 0, "plain": 0}
    for k in range(ladders):
        ladder = [
            Rung(f"r{j}", float(n), tuple(mu(x) + sd(x) * rng.standard_normal(3)))
            for j, n in enumerate(sizes)
            for x in [math.log10(n / 1e6)]
        ]
        p = predict_ladder(ladder, target, n_boot=2000, seed=k)
        q = predict_ladder(ladder, target, n_boot=2000, seed=k, calibrated=False)
        one = mu(xt) + sd(xt) * rng.standard_normal()
        three = mu(xt) + sd(xt) * rng.standard_normal(3).mean()
        hits["single"] += p.single.low <= one <= p.single.high
        hits["mean of 3"] += p.mean_of_seeds.low <= three <= p.mean_of_seeds.high
        hits["trend"] += p.trend.low <= mu(xt) <= p.trend.high
        hits["plain"] += q.single.low <= one <= q.single.high
    return {key: v / ladders for key, v in hits.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the coverage table in Markdown."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ladders", type=int, default=1000)
    args = ap.parse_args(argv)
    n = args.ladders
    mc = 1.96 * math.sqrt(0.95 * 0.05 / n)
    start = time.perf_counter()
    print(f"{n} ladders per row; nominal 95 %, Monte-Carlo error ±{100 * mc:.1f} points\n")
    print("| scenario | rungs | one training | mean of 3 | trend | plain bootstrap, one training |")
    print("|---|---|---|---|---|---|")
    for name, (desc, _, _) in SCENARIOS.items():
        for rungs in (3, 4):
            c = coverage(name, rungs, n)
            cells = " | ".join(
                f"{100 * c[k]:.1f} %" for k in ("single", "mean of 3", "trend", "plain")
            )
            print(f"| {name} ({desc}) | {rungs} | {cells} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
