"""Which statistic a normaliser divides by, fitted on rows built to tell the candidates apart.

x̂ = (f(X) − b) / g is compared with each candidate on rows of four shapes (Gaussian, uniform,
one spike, two levels) with per-row offsets from −2 to 2 standard deviations and per-row scales
from 0.5 to 2: the mean square and the variance then differ by factors up to 5 from row to row,
and the mean absolute value differs in its own way per shape. Each candidate is normalised as
the gain probe was (at S·v), with ε where it was found, so a fit needs no free constant.

A candidate **fits** when the relative error is within :func:`~normlab.audit.basics
.output_tolerance` of the output dtype and D. When none fits but the best candidate has the right
row *shapes* and only the row *scales* are off by at most :data:`ROW_SCALE_BAND` (what 16-bit
statistics cause), it is named with that error stated, and :func:`explain_row_scales` says which
rounding of the statistic the errors follow. Otherwise no candidate is named: the closest is
given with its error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from normlab.audit.basics import rel, row_scales, row_shape_error
from normlab.audit.findings import DEFECT, NOTE, OK, Finding, figure

# RMS row-scale error that no chain of a few bfloat16 roundings of the statistic reaches (one
# rounding gives RMS ≈ 0.1 %, four ≈ 0.2 %): beyond it, errors accumulate over the row
BEYOND_ROUNDING = 2.0**-8
ROW_SCALE_BAND = 2.0**-5  # 3.1 %: four bfloat16 ulps of the statistic's effect on a row
Stat = Callable[[torch.Tensor], torch.Tensor]


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


def _ms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(-1, keepdim=True)


@dataclass(frozen=True)
class Candidate:
    """x̂ = numerator(x) / root(statistic(x)); ``squared``: ε applies to the statistic."""

    name: str
    severity: str
    diagnosis: str | None
    numerator: Stat
    statistic: Stat
    squared: bool = True
    centred: bool = False

    def hat(self, x: torch.Tensor, eps: float | None, placement: str) -> torch.Tensor:
        s = self.statistic(x)
        e = eps or 0.0
        if not self.squared:
            return self.numerator(x) / s
        if placement.startswith("outside"):
            return self.numerator(x) / (s.sqrt() + e)
        return self.numerator(x) / torch.sqrt(s + (e if placement.startswith("inside") else 0))


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("variance", OK, None, _centred, lambda x: _ms(_centred(x)), centred=True),
    Candidate("mean square", OK, None, lambda x: x, _ms),
    Candidate(
        "variance, mean not subtracted: x / sqrt(var(x))", DEFECT, "std without centring",
        lambda x: x, lambda x: _ms(_centred(x)),
    ),
    Candidate(
        "mean square of x, mean subtracted: (x − μ) / sqrt(mean(x²))", DEFECT,
        "centred numerator, uncentred statistic", _centred, _ms, centred=True,
    ),
    Candidate(
        "mean absolute deviation", NOTE, None, _centred,
        lambda x: _centred(x).abs().mean(-1, keepdim=True), squared=False, centred=True,
    ),
    Candidate(
        "mean absolute value", NOTE, None, lambda x: x,
        lambda x: x.abs().mean(-1, keepdim=True), squared=False,
    ),
)  # fmt: skip
BY_NAME = {c.name: c for c in CANDIDATES}


def statistic_rows(d: int, dtype: torch.dtype, mean_square: float) -> torch.Tensor:
    """24 rows of D values in ``dtype`` whose mean of mean squares is ``mean_square``."""
    gen = torch.Generator().manual_seed(5)
    n = 24
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    rows = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            r = z[i]
        elif kind == 1:
            r = (torch.rand(d, generator=gen, dtype=torch.float64) - 0.5) * math.sqrt(12)
        elif kind == 2:
            r = 0.2 * z[i]
            r[(7 * i) % d] += math.sqrt(d)
        else:
            r = 0.3 * z[i]
            r[: d // 2] += 1.0
            r[d // 2 :] -= 0.6
        rows.append(r / r.std().clamp_min(1e-12))
    offsets = torch.linspace(-2.0, 2.0, n, dtype=torch.float64)[torch.randperm(n, generator=gen)]
    scales = torch.exp(torch.empty(n, dtype=torch.float64).uniform_(-0.7, 0.7, generator=gen))
    x = (torch.stack(rows) + offsets[:, None]) * scales[:, None]
    x = x * math.sqrt(mean_square / float(x.pow(2).mean()))
    return x.to(dtype)


@dataclass
class StatisticFit:
    candidate: Candidate | None  # None: none fits
    closest: Candidate
    error: float
    shape_error: float
    row_scale_error: float
    tolerance: float
    row_scales: torch.Tensor  # measured / predicted, per row, of the closest candidate
    finding: Finding

    @property
    def fits_exactly(self) -> bool:
        return self.candidate is not None and self.error <= self.tolerance


def fit_statistic(
    hat: torch.Tensor,
    x: torch.Tensor,
    v: torch.Tensor,
    gain_scale: float,
    eps: float | None,
    placement: str,
    tolerance: float,
    live: torch.Tensor,
) -> StatisticFit:
    """Fit x̂ measured on rows ``x`` (float64) against each candidate (see the module docstring).

    ``v`` is the gain probe's row and ``gain_scale`` its scale: candidate c is compared as
    c(x) · v / c(S·v), as the measured gain divided it out."""
    scored = []
    for cand in CANDIDATES:
        ref = cand.hat(gain_scale * v, eps, placement)[0]
        pred = cand.hat(x, eps, placement) * (v[0] / ref)
        a, p = hat[:, live], pred[:, live]
        k = row_scales(a, p)
        scored.append(
            (rel(a, p), row_shape_error(a, p), float((k - 1).pow(2).mean().sqrt()), cand, k)
        )
    scored.sort(key=lambda t: t[0])
    err, shape_err, scale_err, best, k = scored[0]
    probe = "statistic"
    if err <= tolerance:
        found, msg = best, f"x̂ fits {best.name} on {x.shape[0]} rows of mixed shape and mean"
        sev = best.severity
    elif shape_err <= tolerance and scale_err <= ROW_SCALE_BAND:
        found, sev = best, DEFECT if best.severity == OK else best.severity
        msg = (
            f"x̂ has the row shapes of {best.name}, but the row scales are off by "
            f"{scale_err:.2%} (RMS over rows), beyond the tolerance: the statistic is not "
            "computed exactly (in low precision, or with an extra term)"
        )
    else:
        found, sev = None, NOTE
        second = scored[1]
        msg = (
            f"no candidate statistic fits: closest {best.name} (error {figure(err)}, "
            f"rows' shapes {figure(shape_err)}, rows' scales {figure(scale_err)}); next "
            f"{second[3].name} (error {figure(second[0])})"
        )
    diagnosis = found.diagnosis if found is not None else None
    if found is not None and sev == DEFECT and diagnosis is None:
        diagnosis = "inexact statistic"
    return StatisticFit(
        candidate=found, closest=best, error=err, shape_error=shape_err,
        row_scale_error=scale_err, tolerance=tolerance, row_scales=k,
        finding=Finding(probe, sev, msg, diagnosis=diagnosis, error=err, tolerance=tolerance),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# which rounding of the statistic the row scales follow
# ----------------------------------------------------------------------------------------------
def _r(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).double()


def rounding_hypotheses(stat: torch.Tensor, ref: float) -> dict[str, torch.Tensor]:
    """Predicted row scale k − 1 of x̂ for each way of rounding the statistic S (float64, [N]).

    x̂ = x·rsqrt(S) exactly; each hypothesis rounds one quantity to a 16-bit dtype. The gain was
    measured on a row of statistic ``ref``, so each prediction is relative to that row's."""
    out = {}
    root = stat.sqrt()
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        top, tiny = float(torch.finfo(dtype).max), float(torch.finfo(dtype).tiny)

        def rounded(t: torch.Tensor, dtype: torch.dtype = dtype) -> torch.Tensor:
            return _r(t, dtype)

        quantities = {
            f"the statistic rounded to {name}": (stat, lambda s: torch.sqrt(s / rounded(s))),
            f"rsqrt(statistic) rounded to {name}": (
                stat.rsqrt(), lambda s: rounded(s.rsqrt()) * s.sqrt()),
            f"the standard deviation rounded to {name}": (
                root, lambda s: s.sqrt() / rounded(s.sqrt())),
            f"the statistic and its rsqrt both rounded to {name}": (
                stat, lambda s: rounded(rounded(s).rsqrt()) * s.sqrt()),
        }  # fmt: skip
        r = torch.tensor([ref], dtype=torch.float64)
        for label, (q, k) in quantities.items():
            if float(q.max()) < top and float(q.min()) > tiny:
                out[label] = k(stat) / k(r) - 1
    return out


@dataclass
class RowScaleExplanation:
    exact: bool  # consistent with statistics at least as precise as float32
    hypothesis: str | None  # the rounding the errors follow, when one does
    chi2: float  # mean squared error / noise under "exact"
    threshold: float
    median_error: float  # median |k − 1|
    rms_error: float  # sqrt(mean((k − 1)²))
    undetermined: bool = False  # exact and some rounding both fit: the probe cannot tell

    @property
    def beyond_rounding(self) -> bool:
        """Errors larger than a few roundings of the statistic to bfloat16 can cause: RMS above
        2⁻⁸ (one rounding moves a row's scale by at most 2⁻⁹, RMS ≈ 0.1 %)."""
        return self.rms_error > BEYOND_ROUNDING


def _rounded_first(hat: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Row scale that rounding x̂ = hat·scale to ``dtype`` before the gain adds (as the LLaMA
    casting does: for input on a 16-bit grid, x̂ = x·r rounds alike across a row, so the row's
    scale moves by up to half an ulp, a deterministic function of r)."""
    h = hat * scale[:, None]
    return row_scales(h.to(dtype).double(), h)


def explain_row_scales(
    k: torch.Tensor,
    stat: torch.Tensor,
    noise: torch.Tensor,
    ref: float,
    hat: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> RowScaleExplanation:
    """Are the measured row scales ``k`` (want 1) exact up to ``noise`` (per-row standard
    deviation), or do they follow the rounding of the statistic ``stat`` to 16 bits?

    The test is χ² = mean(((k − predicted) / noise)²) ≤ 1 + 6·sqrt(2 / N): six standard
    deviations of the mean of N unit χ² variables. ``ref`` is the statistic of the row the gain
    was measured on. Given the exact x̂ rows ``hat`` and the input ``dtype``, every hypothesis is
    also tried with x̂ rounded to ``dtype`` before the gain (the LLaMA casting)."""
    n = k.numel()
    threshold = 1.0 + 6.0 * math.sqrt(2.0 / n)
    e = k - 1
    med = float(e.abs().median())
    rms = float(e.pow(2).mean().sqrt())

    def chi2(scale: torch.Tensor) -> float:
        best = float((((k - scale) / noise) ** 2).mean())
        if hat is not None and dtype is not None:
            pred = scale * _rounded_first(hat, scale, dtype)
            best = min(best, float((((k - pred) / noise) ** 2).mean()))
        return best

    chi0 = chi2(torch.ones_like(k))
    best, best_chi, bf16_chi = None, math.inf, math.inf
    for name, pred in rounding_hypotheses(stat, ref).items():
        chi = chi2(1 + pred)
        if "bfloat16" in name:
            bf16_chi = min(bf16_chi, chi)
        if chi < best_chi:
            best, best_chi = name, chi
    if chi0 <= threshold:
        # exact only when rounding to bfloat16 is ruled out (a float16 rounding moves rows by
        # less than a bfloat16 output's noise): else the probe cannot tell
        ruled_out = bf16_chi > threshold
        return RowScaleExplanation(
            ruled_out, None, chi0, threshold, med, rms, undetermined=not ruled_out
        )
    found = best if best_chi <= threshold else None
    return RowScaleExplanation(False, found, chi0, threshold, med, rms)
