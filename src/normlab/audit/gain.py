"""The gain: g = (f(S·v) − b) / v, and which function of the weight w it is.

v = [+1, −1, …] has mean 0 and mean(v²) = var(v) = 1, so x̂(S·v) = v for both LayerNorm and
RMSNorm and g is the gain itself. Given the module's weight, g is compared with each form below;
a form *fits* when max |g − form| ≤ tolerance · max |g|, the tolerance being two units of
rounding of the output dtype plus the float32 error of the statistic (:func:`gain_tolerance`).
Correct forms win ties: a defect is claimed only when no correct form fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from normlab.audit.basics import rounding
from normlab.audit.findings import DEFECT, NOTE, OK, Finding

W, ONE_PLUS_W = "w", "1 + w"
UNBIASED = "w · sqrt((D − 1) / D) (unbiased variance)"
L2 = "w / sqrt(D) (L2 norm, not mean square)"
PRE_GAIN = "applied before normalising: x̂(w ⊙ x)"


@dataclass
class GainResult:
    form: str  # one of the forms, "unknown: …" or "no gain parameter exposed"
    effective: torch.Tensor | None  # the gain multiplying x before normalisation, if pre-gain
    finding: Finding


def gain_tolerance(out_dtype: torch.dtype) -> float:
    """Relative error allowed on the measured gain: 2u(output) + 8·eps32."""
    return 2 * rounding(out_dtype) + 8 * rounding(torch.float32)


def _pre_gain(w: torch.Tensor, v: torch.Tensor, centred: bool) -> torch.Tensor:
    """g that normalising w ⊙ v (instead of v) shows at v: x̂(w ⊙ v) / v."""
    x = w * v
    if centred:
        x = x - x.mean()
    return x * torch.rsqrt(x.pow(2).mean()) / v


def _forms(
    w: torch.Tensor, w_dtype: torch.dtype, d: int, v: torch.Tensor, centred: bool
) -> list[tuple[str, str, str | None, torch.Tensor]]:
    """(label, severity, diagnosis, values) of every form g may take."""
    forms: list[tuple[str, str, str | None, torch.Tensor]] = [
        (W, OK, None, w),
        (ONE_PLUS_W, OK, None, 1 + w),
        (UNBIASED, DEFECT, "unbiased variance", w * math.sqrt((d - 1) / d)),
        ("(1 + w) · sqrt((D − 1) / D) (unbiased variance)", DEFECT, "unbiased variance",
         (1 + w) * math.sqrt((d - 1) / d)),
        (L2, DEFECT, "L2 norm instead of RMS (missing 1/D)", w / math.sqrt(d)),
        ("(1 + w) / sqrt(D) (L2 norm, not mean square)", DEFECT,
         "L2 norm instead of RMS (missing 1/D)", (1 + w) / math.sqrt(d)),
    ]  # fmt: skip
    forms += [
        ("w · w: the gain applied twice", DEFECT, "gain applied twice", w * w),
        ("(1 + w)²: the gain applied twice", DEFECT, "gain applied twice", (1 + w) * (1 + w)),
        ("1: the weight is not applied", DEFECT, "weight not applied", torch.ones_like(w)),
    ]
    for base, values in ((W, w), (ONE_PLUS_W, 1 + w)):
        for centre in (centred, not centred):
            label = f"{base} {PRE_GAIN}" + (" (centred)" if centre else "")
            forms.append((label, DEFECT, "gain applied before normalising",
                          _pre_gain(values, v, centre)))  # fmt: skip
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        if rounding(w_dtype) < rounding(dtype):  # a weight more precise than the 16-bit dtype
            forms.append(
                (f"{name}(w): the gain rounded to {name} before use", DEFECT,
                 f"gain rounded to {name}", w.to(dtype).double())
            )  # fmt: skip
        forms.append(
            (f"{name}(1 + w): 1 + w added in {name}", DEFECT, f"1 + w added in {name}",
             (1 + w.to(dtype)).to(dtype).double())
        )  # fmt: skip
    return forms


def identify_gain(
    g: torch.Tensor,
    weight: torch.Tensor | None,
    d: int,
    v: torch.Tensor,
    centred: bool,
    out_dtype: torch.dtype,
    row_drift: float = 0.0,
) -> GainResult:
    """Which form g (float64) takes; see the module docstring. ``row_drift``: how far rows'
    scales were seen to drift (imprecise statistics), added to the tolerance."""
    tol = gain_tolerance(out_dtype) + row_drift
    scale = float(g.abs().max().clamp_min(1e-300))
    probe = "gain"
    if weight is None:
        return _without_weight(g, d, tol, scale)
    w = weight.detach().to("cpu", torch.float64).reshape(-1)
    vv = v.double()
    scored = []
    for label, sev, diag, values in _forms(w, weight.dtype, d, vv, centred):
        err = float((g - values).abs().max()) / scale
        scored.append((err, label, sev, diag, values))
    fits = [s for s in scored if s[0] <= tol]
    good = sorted((s for s in fits if s[2] == OK), key=lambda s: s[0])
    bad = sorted((s for s in fits if s[2] != OK), key=lambda s: s[0])
    if good:
        err, label = good[0][:2]
        msg = f"g = {label} (the module's weight)"
        if bad:
            msg += f"; at this precision it cannot be told from {bad[0][1]}"
        return GainResult(label, None, Finding(probe, OK, msg, error=err, tolerance=tol))
    if bad:
        err, label, sev, diag, values = bad[0]
        effective = None
        if PRE_GAIN in label:
            effective = (1 + w) if label.startswith("1 + w") else w
        return GainResult(
            label,
            effective,
            Finding(probe, sev, f"g = {label}", diagnosis=diag, error=err, tolerance=tol),
        )
    err, label = min(scored, key=lambda s: s[0])[:2]
    return GainResult(
        f"unknown (closest: {label})",
        None,
        Finding(
            probe, NOTE,
            f"g matches no form of the weight: closest {label}",
            error=err, tolerance=tol,
        ),
    )  # fmt: skip


def _without_weight(g: torch.Tensor, d: int, tol: float, scale: float) -> GainResult:
    probe = "gain"
    form = "no gain parameter exposed"
    spread = float((g - g.mean()).abs().max()) / scale
    if spread > tol:
        return GainResult(
            form, None,
            Finding(probe, NOTE, "no weight exposed; the measured gain differs per channel",
                    error=spread, tolerance=tol),
        )  # fmt: skip
    c = float(g.mean())
    constants = [
        (1.0, OK, None, "1"),
        (math.sqrt((d - 1) / d), DEFECT, "unbiased variance", "sqrt((D − 1) / D)"),
        (1 / math.sqrt(d), DEFECT, "L2 norm instead of RMS (missing 1/D)", "1 / sqrt(D)"),
    ]
    errs = [(abs(c - k) / scale, k, sev, diag, name) for k, sev, diag, name in constants]
    fits = sorted((e for e in errs if e[0] <= tol), key=lambda e: (e[2] != OK, e[0]))
    if not fits:
        return GainResult(
            form, None,
            Finding(probe, NOTE, f"no weight exposed; a constant gain {c:.6g}", tolerance=tol),
        )  # fmt: skip
    err, _, sev, diag, name = fits[0]
    msg = f"no weight exposed; a constant gain {c:.6g} = {name}"
    if diag == "unbiased variance":
        msg += ": the variance divided by D − 1 (or a gain of exactly that value)"
    elif diag is not None:
        msg += ": the root of the sum of squares, ‖x‖, instead of the mean square"
    return GainResult(
        form, None, Finding(probe, sev, msg, diagnosis=diag, error=err, tolerance=tol)
    )
