"""Where ε sits, and how large it is, from how x̂(s·v) shrinks at small s.

On x = s·v (v = [+1, −1, …], so mean(x²) = var(x) = s²), r(s) = |x̂(s·v)| / |x̂(S·v)|. Inside
the root r = s / sqrt(s² + ε), so ε = s²(1/r² − 1) is the same at every s; outside the root
(added to the standard deviation) r = s / (s + ε), so ε = s(1/r − 1) is. Points with
0.05 < r < 0.95 are used. Each estimate's relative uncertainty follows from r's (two units of
rounding of the output dtype): 2·δr / (1 − r²) inside, δr / (1 − r) outside; a hypothesis
*fits* when every estimate lies within 3 such uncertainties (and at least 0.1 %) of their
median (a finding's error is the largest |log| ratio of an estimate to the median, its
tolerance what that point was allowed). One fitting hypothesis is the finding; both fitting
means the probes cannot tell them apart; neither means ε acts in some other way (a clamp,
ε²…), and ε is not reported.

:attr:`EpsResult.models` lists every (ε, placement) the probes left open: one when the placement
was found (or ε is missing or too small to see), both readings when they could not be told
apart, none when ε acts in neither way. A later probe whose reading depends on ε is computed for
each model left open, and withheld when there is none (:data:`NO_EPS` is the model "no ε").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from normlab.audit.basics import NormFn, alternating, finite_call, rounding
from normlab.audit.findings import DEFECT, NOTE, OK, Finding

EPS_REF_SCALE = 100.0  # |x| of the reference x̂(S·v)
R_RANGE = (0.05, 0.95)
MIN_SPREAD = 1e-3

INSIDE = "inside the root: x·rsqrt(m + ε)"
OUTSIDE = "outside the root: x / (sqrt(m) + ε) (a defect)"
EpsModel = tuple[float | None, str]  # (ε, placement) as :class:`~.statistic.Candidate` takes it
NO_EPS: EpsModel = (None, "none")
_PROBE = "ε"


@dataclass
class EpsResult:
    eps: float | None
    placement: str
    finding: Finding
    models: list[EpsModel] = field(default_factory=lambda: [NO_EPS])

    @property
    def established(self) -> bool:
        """Whether ε's action is known: one model left open."""
        return len(self.models) == 1


def _smallest_scale(dtype: torch.dtype) -> float:
    """The smallest |x| probed: 1e-10 in float64, 1e-8 in float32/bfloat16 (x² stays normal in
    float32), 1e-4 in float16 (its smallest normal is 6e-5)."""
    return {torch.float64: 1e-10, torch.float16: 1e-4}.get(dtype, 1e-8)


def _fits(points: list[tuple[float, float]], inside: bool, ref_scale: float) -> list[float]:
    """ε from each (s, r(s)); a few rounds correct r for ε's own effect on the reference."""
    shrink_ref = 1.0
    fits: list[float] = []
    for _ in range(3):
        fits = []
        for s, r_measured in points:
            r = r_measured * shrink_ref
            fits.append(s * s * (1.0 / (r * r) - 1.0) if inside else s * (1.0 / r - 1.0))
        eps = max(float(torch.tensor(fits).median()), 0.0)
        big = ref_scale
        shrink_ref = big / math.sqrt(big * big + eps) if inside else big / (big + eps)
    return fits


def _agree(estimates: list[float], uncertainties: list[float]) -> tuple[bool, float, float, float]:
    """Whether all estimates lie within 3 uncertainties (at least :data:`MIN_SPREAD`) of the
    median: (agree, worst excess ratio, worst |log(estimate / median)|, what it was allowed)."""
    med = float(torch.tensor(estimates).median())
    if med <= 0:
        return False, math.inf, math.inf, MIN_SPREAD
    worst, spread, allowed_at = 0.0, 0.0, MIN_SPREAD
    for e, u in zip(estimates, uncertainties, strict=True):
        allowed = math.log1p(max(3 * u, MIN_SPREAD))
        off = abs(math.log(max(e, 1e-300) / med))
        if off / allowed >= worst:
            worst, spread, allowed_at = off / allowed, off, allowed
    return worst <= 1.0, worst, spread, allowed_at


def _shrink_points(
    f: NormFn, b: torch.Tensor, v: torch.Tensor, ref_scale: float, lowest: float
) -> list[tuple[float, float]]:
    """(s, r(s)) for s = 10^(−k/4) down to ``lowest``, keeping 0.05 < r < 0.95.

    r(s) = ⟨f(s·v) − b, ref⟩ / ⟨ref, ref⟩ with ref = f(S·v) − b at S = ``ref_scale``; s is the
    scale actually probed, after rounding to v's dtype."""
    dtype = v.dtype
    ref = (finite_call(f, ref_scale * v, "ε") - b).double()
    points: list[tuple[float, float]] = []
    k = 0
    while 10.0 ** (-k / 4) >= lowest * 0.99:
        x = (10.0 ** (-k / 4) * v).to(dtype)
        s = float(x[0, 0].double())  # the scale actually probed, after rounding to dtype
        y = finite_call(f, x, "ε")
        out = (y - b).double()
        r = float((out * ref).sum() / (ref * ref).sum())
        if R_RANGE[0] < r < R_RANGE[1]:
            points.append((s, r))
        k += 1
    return points


def _no_effect_seen(lowest: float, zero_is_finite: bool) -> EpsResult:
    """No point shrank down to |x| = ``lowest``: ε is missing (a zero row gives NaN) or below
    lowest²."""
    if not zero_is_finite:
        return EpsResult(
            None,
            "missing: x·rsqrt(m) with no ε (a zero row gives NaN)",
            Finding(
                _PROBE, DEFECT,
                f"no ε effect down to |x| = {lowest:g} and a zero row gives NaN: ε is "
                "missing, x / sqrt(m) divides 0 by 0",
                diagnosis="ε missing",
            ),
        )  # fmt: skip
    return EpsResult(
        None,
        f"no ε effect seen down to |x| = {lowest:g}",
        Finding(_PROBE, NOTE, f"no ε effect down to |x| = {lowest:g} (ε < {lowest**2:.0e})"),
    )


def _judge_placement(points: list[tuple[float, float]], ref_scale: float, du: float) -> EpsResult:
    """Fit ε in the root and outside it to every point; the placement whose estimates agree.

    ``du`` is r's uncertainty; an estimate's relative uncertainty is 2·du / (1 − r²) in the
    root and du / (1 − r) outside it (:func:`_agree`)."""
    inside = _fits(points, True, ref_scale)
    outside = _fits(points, False, ref_scale)
    in_ok, in_worst, in_spread, in_tol = _agree(inside, [2 * du / (1 - r * r) for _, r in points])
    out_ok, out_worst, out_spread, out_tol = _agree(outside, [du / (1 - r) for _, r in points])
    eps_in = float(torch.tensor(inside).median())
    eps_out = float(torch.tensor(outside).median())
    tol = max(3 * du, MIN_SPREAD)
    n = len(points)
    if n == 1 or (in_ok and out_ok):
        return _undetermined(eps_in, eps_out, n, tol)
    if in_ok:
        return _in_the_root(eps_in, n, in_spread, in_tol)
    if out_ok:
        return _outside_the_root(eps_out, n, out_spread, out_tol)
    return _neither(in_worst, out_worst, tol)


def _undetermined(eps_in: float, eps_out: float, n: int, tol: float) -> EpsResult:
    """Both placements fit (or one point only): both readings are left open."""
    why = "one usable probe point" if n == 1 else "both fit at this precision"
    return EpsResult(
        eps_in,
        "undetermined: x·rsqrt(m + ε) and x / (sqrt(m) + ε) not told apart",
        Finding(
            _PROBE, NOTE,
            f"ε ≈ {eps_in:.3g} (in the root) or {eps_out:.3g} (added to the standard "
            f"deviation): the probes cannot tell which ({why})",
            tolerance=tol,
        ),
        [(eps_in, INSIDE), (eps_out, OUTSIDE)],
    )  # fmt: skip


def _in_the_root(eps: float, n: int, spread: float, tol: float) -> EpsResult:
    """ε = s²(1/r² − 1) agrees at every point: x·rsqrt(m + ε)."""
    return EpsResult(
        eps,
        INSIDE,
        Finding(
            _PROBE, OK,
            f"ε = {eps:.3g}, in the root: x·rsqrt(m + ε) ({n} probe points agree)",
            error=spread, tolerance=tol,
        ),
        [(eps, INSIDE)],
    )  # fmt: skip


def _outside_the_root(eps: float, n: int, spread: float, tol: float) -> EpsResult:
    """ε = s(1/r − 1) agrees at every point: x / (sqrt(m) + ε), a defect."""
    return EpsResult(
        eps,
        OUTSIDE,
        Finding(
            _PROBE, DEFECT,
            f"ε = {eps:.3g} is added to the standard deviation: x / (sqrt(m) + ε) "
            f"({n} probe points agree; in the root they would not)",
            diagnosis="ε outside the root",
            error=spread, tolerance=tol,
        ),
        [(eps, OUTSIDE)],
    )  # fmt: skip


def _neither(in_worst: float, out_worst: float, tol: float) -> EpsResult:
    """Neither placement fits: ε acts in some other way and is not reported (no model)."""
    return EpsResult(
        None,
        "fits neither x·rsqrt(m + ε) nor x / (sqrt(m) + ε)",
        Finding(
            _PROBE, NOTE,
            "ε's effect fits neither x·rsqrt(m + ε) nor x / (sqrt(m) + ε) (estimates spread "
            f"{in_worst:.1f}× and {out_worst:.1f}× the allowed): a clamp, ε² or ε elsewhere; "
            "ε not reported",
            tolerance=tol,
        ),
        [],
    )  # fmt: skip


def estimate_eps(
    f: NormFn,
    b: torch.Tensor,
    d: int,
    dtype: torch.dtype,
    zero_is_finite: bool,
    out_dtype: torch.dtype,
    row_drift: float = 0.0,
) -> EpsResult:
    """ε and its placement (see the module docstring); ``b`` = f(0) (0 when that was NaN).
    ``out_dtype`` is the precision of the outputs; ``row_drift`` how far rows' scales were seen
    to drift (imprecise statistics), added to r's uncertainty."""
    v = alternating(4, d, dtype)
    ref_scale = 16.0 if dtype == torch.float16 else EPS_REF_SCALE
    lowest = _smallest_scale(dtype)
    points = _shrink_points(f, b, v, ref_scale, lowest)
    if not points:
        return _no_effect_seen(lowest, zero_is_finite)
    du = 2 * rounding(out_dtype) + 2 * rounding(dtype) + row_drift  # r, a rounded s, drift
    return _judge_placement(points, ref_scale, du)
