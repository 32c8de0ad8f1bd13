"""Statistics precision and 16-bit casting, probed once the statistic is known.

**float16**: rows with |x| ≈ 300, where x² (9e4) overflows float16 (max 65504): an
implementation that squares in float16 gives infinities or a wrong output. The output's rows are
compared in shape with the fitted statistic's x̂, to the float16 output tolerance.

**bfloat16**: rows of mean square about 2^20 in bfloat16, enough of them for N·D ≥ 65536 values. The
row scale k = x̂_measured / x̂_exact (least squares per row) is 1 up to the output's rounding,
whose standard deviation per row follows from the output values (two roundings, as the LLaMA
casting does) and the float32 error of a D-long statistic. χ² against that noise tells exact
statistics from rounded ones, and which rounding (the statistic, its rsqrt, the standard
deviation; bfloat16 or float16) the errors follow (:func:`~normlab.audit.statistic
.explain_row_scales`). Errors larger than one rounding explains point at 16-bit accumulation.

**casting** (mean-square family, bfloat16 input): bit for bit against the LLaMA formula (x̂
rounded to the input dtype, then times the gain), the Gemma formula (x̂ and the gain meet in
float32, one rounding) and float32 output; and against the defective variants 1 + w added in
bfloat16 and a gain rounded to bfloat16 first. A formula matches when every output is within one
ulp of it and at most 0.5 % differ at all (reduction order moves a few roundings); a defect is
claimed only when a defective variant matches and fits better than every correct one.
"""

from __future__ import annotations

import math

import torch

from normlab.audit.basics import (
    CALL_ERRORS,
    GAIN_READ_SCALE,
    NormFn,
    accumulation_error,
    alternating,
    call,
    output_tolerance,
    rounding,
    row_scales,
    row_shape_error,
    ulp,
    working_dtype,
)
from normlab.audit.eps import INSIDE, NO_EPS, EpsModel
from normlab.audit.findings import DEFECT, NOTE, OK, Finding, figure
from normlab.audit.statistic import (
    BEYOND_ROUNDING,
    Candidate,
    RowScaleExplanation,
    explain_row_scales,
)

FP16_SCALE = 300.0
BF16_MEAN_SQUARE = 2.0**20  # the bfloat16 rows' mean square
FP16_GAIN_SCALE = 16.0  # x² = 256 stays finite in float16
MISMATCH_ALLOWED = 0.005  # a formula "matches" when at most 0.5 % of outputs differ, by 1 ulp
_BF16_PROBE = "precision (bfloat16)"


def gain_and_bias(
    f: NormFn, d: int, dtype: torch.dtype, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, b) as ``f`` applies them to input of ``dtype`` (a float32 module may cast its weight to
    a 16-bit input's dtype: the 16-bit probes divide by the gain it really uses). Float64."""
    b = call(f, torch.zeros(1, d, dtype=dtype)).double()[0]
    if not bool(torch.isfinite(b).all()):  # 0 / 0 on the zero row: no bias measurable
        b = torch.zeros_like(b)
    v = alternating(1, d, dtype)
    g = ((call(f, scale * v).double() - b) / v.double())[0]
    return g, b


def _predicted(
    cand: Candidate, x: torch.Tensor, model: EpsModel, scale: float, live: torch.Tensor
) -> torch.Tensor:
    """x̂ of ``cand`` on ``x`` (float64) with ε as ``model`` says, as the measured x̂ = (y − b) / g
    shows it: divided by its own value at the gain row scale·v, where g was read."""
    eps, placement = model
    v = alternating(1, x.shape[-1], torch.float64)
    ref = cand.hat(scale * v, eps, placement)[0]
    return (cand.hat(x, eps, placement) * (v[0] / ref))[:, live]


def fp16_check(
    f: NormFn, d: int, cand: Candidate, live: torch.Tensor, models: list[EpsModel]
) -> tuple[str, Finding]:
    """(the ``stats_precision["float16"]`` text, its finding). ``models``: the (ε, placement)
    readings the ε probe left open (none: ε not determined); the rows' scales are judged under
    the one that fits them best."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(8, d, generator=gen) * FP16_SCALE).clamp(-60000, 60000).half()
    probe = "precision (float16)"
    try:
        y = call(f, x)
        g, b = gain_and_bias(f, d, torch.float16, FP16_GAIN_SCALE)
    except CALL_ERRORS as err:
        text = f"float16 input not accepted ({type(err).__name__})"
        return text, Finding(probe, NOTE, text)
    if not bool(torch.isfinite(y).all()):
        text = "float16: non-finite output at |x| ≈ 300 — statistics squared in float16"
        return text, Finding(
            probe, DEFECT,
            "non-finite output at |x| ≈ 300: x² overflows float16 (max 65504), so the "
            "statistic is computed in float16, not float32",
            diagnosis="float16 overflow of x²",
        )  # fmt: skip
    live = live & (g.abs() > 1e-8)
    if not bool(live.any()):
        text = f"{probe[11:-1]}: withheld: no channel has a nonzero gain at this input dtype"
        return text, Finding(probe, NOTE, text, withheld=True)
    hat = ((y.double() - b) / torch.where(live, g, torch.ones_like(g)))[:, live]
    refs = [_predicted(cand, x.double(), m, FP16_GAIN_SCALE, live) for m in models or [NO_EPS]]
    ref = min(refs, key=lambda p: float((row_scales(hat, p) - 1).abs().max()))
    err = row_shape_error(hat, ref) if bool((hat.abs().sum(-1) > 0).all()) else 1.0
    # x̂ may be rounded to the input's dtype, or to a 16-bit weight's
    coarse = max((torch.float16, y.dtype), key=rounding)
    tol = output_tolerance(coarse, d)
    scale_err = float((row_scales(hat, ref) - 1).abs().max())
    if err > tol or scale_err > 0.25:
        text = "float16: wrong output at |x| ≈ 300 — statistics overflow in float16"
        return text, Finding(
            probe, DEFECT,
            f"wrong output at |x| ≈ 300 (rows' shapes off by {figure(err)}, scales by "
            f"{scale_err:.1%}): the statistic overflows float16",
            diagnosis="float16 overflow of x²", error=err, tolerance=tol,
        )  # fmt: skip
    text = "float16: correct at |x| ≈ 300 — statistics not kept in float16"
    return text, Finding(probe, OK, text[len("float16: ") :], error=err, tolerance=tol)


def bf16_rows(d: int) -> torch.Tensor:
    """N rows of mean square about 2^20 in bfloat16, N·D >= 65536 (N >= 16)."""
    n = max(16, math.ceil(65536 / d))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) + 0.3
    scales = torch.exp(torch.empty(n, 1, dtype=torch.float64).uniform_(-1, 1, generator=gen))
    return (x * scales * math.sqrt(BF16_MEAN_SQUARE)).bfloat16()


def row_noise(
    hat: torch.Tensor,
    y: torch.Tensor,
    g: torch.Tensor,
    dtype: torch.dtype,
    d: int,
    b: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard deviation of the per-row scale k of ``hat`` = (y − b) / g from rounding x̂ to the
    input ``dtype`` (when the values of ``hat`` lie on its grid, as after the LLaMA casting) and
    y to the grid its values lie on (:func:`~normlab.audit.basics.working_dtype`), from
    the rounding of the measured g (read off the output g·v + b), and from a float32 statistic:
    Σ hat²·(ulp(x̂)² + ulp(y)²/g² + hat²·ulp(|g| + |b|)²/g²)/12 / (Σ hat²)², plus
    (4·eps32·sqrt(D))² and (u/128)²: the order of a 16-bit implementation's roundings may bias a
    row's mean scale by a small fraction of an ulp, which averaging over D does not remove."""
    off = (hat - hat.to(dtype).double()).abs() / hat.abs().clamp_min(1e-300)
    on_grid = float(off.max()) if off.numel() else math.inf
    out = working_dtype(y)  # the grid the outputs lie on
    x_hat_dtype = dtype if on_grid < 8 * rounding(torch.float32) else out  # rounded first?
    var = (ulp(hat.to(x_hat_dtype)).pow(2) + (ulp(y.to(out)) / g).pow(2)) / 12
    # g was read off a rounded output g·v + b too
    g_out = g.abs() + (b.abs() if b is not None else 0.0)
    var = var + hat.pow(2) * (ulp(g_out.to(out)) / g).pow(2) / 12
    p2 = hat.pow(2)
    out = (p2 * var).sum(-1) / p2.sum(-1).pow(2)
    floor = accumulation_error(torch.float32, d) ** 2 + (rounding(dtype) / 128) ** 2
    return (out + floor).sqrt()


def bf16_check(
    f: NormFn,
    d: int,
    cand: Candidate,
    live: torch.Tensor,
    models: list[EpsModel],
    inexact: bool = False,
) -> tuple[str, Finding]:
    """(the ``stats_precision["bfloat16"]`` text, its finding). ``models``: the (ε, placement)
    readings the ε probe left open; the row scales are predicted under each and judged under the
    one that fits best. With none (ε acts in no way the probes model), errors that no rounding
    explains are not called a defect: ε may cause them. ``inexact``: the statistic probe
    already found the row scales off at the audit's own input dtype; errors no bfloat16 rounding
    explains are then not laid at bfloat16's door either."""
    x = bf16_rows(d)
    probe = _BF16_PROBE
    try:
        y = call(f, x)
        g, b = gain_and_bias(f, d, torch.bfloat16, GAIN_READ_SCALE)
    except CALL_ERRORS as err:
        text = f"bfloat16 input not accepted ({type(err).__name__})"
        return text, Finding(probe, NOTE, text)
    if not bool(torch.isfinite(y).all()):
        text = "bfloat16: non-finite output at |x| ≈ 1e3 — statistics overflow in bfloat16"
        return text, Finding(probe, DEFECT, text[len("bfloat16: ") :],
                             diagnosis="low-precision statistics")  # fmt: skip
    live = live & (g.abs() > 1e-8)
    if not bool(live.any()):
        text = f"{probe[11:-1]}: withheld: no channel has a nonzero gain at this input dtype"
        return text, Finding(probe, NOTE, text, withheld=True)
    hat = ((y.double() - b) / torch.where(live, g, torch.ones_like(g)))[:, live]
    noise = row_noise(hat, y[:, live], g[live], x.dtype, d, b[live])
    ex = _bf16_explanation(cand, x, hat, noise, live, models)
    verdict = _bf16_explained(ex, d)
    if verdict is not None:
        return verdict
    if inexact:
        return _bf16_inexact_too(ex)
    if ex.beyond_rounding and _order_dependent(f, x, hat, b, g, live, noise):
        return _bf16_accumulated(ex, d)
    return _bf16_imprecise(ex, models)


def _bf16_explanation(
    cand: Candidate,
    x: torch.Tensor,
    hat: torch.Tensor,
    noise: torch.Tensor,
    live: torch.Tensor,
    models: list[EpsModel],
) -> RowScaleExplanation:
    """The row scales k = x̂_measured / x̂_predicted explained under each ε model left open; the
    best: exact first, then undetermined, then the smallest χ² against the rounding noise."""
    xd = x.double()
    stat = cand.statistic(xd)[:, 0]
    explained = []
    for model in models or [NO_EPS]:
        pred = _predicted(cand, xd, model, GAIN_READ_SCALE, live)
        ex = explain_row_scales(
            row_scales(hat, pred), stat, noise, GAIN_READ_SCALE**2, pred, x.dtype
        )
        explained.append(ex)
    return min(explained, key=lambda e: (not e.exact, not e.undetermined, e.chi2))


def _bf16_explained(ex: RowScaleExplanation, d: int) -> tuple[str, Finding] | None:
    """The verdict when the row scales are accounted for: undetermined, float32 statistics, or
    one named 16-bit rounding of them (a defect); None when nothing accounts for them."""
    probe, tol = _BF16_PROBE, ex.threshold
    if ex.undetermined:
        text = (
            f"bfloat16: undetermined at D = {d}: float32 statistics and a 16-bit rounding of "
            f"them both fit the row scales (χ² {ex.chi2:.2f} ≤ {tol:.2f})"
        )
        return text, Finding(probe, NOTE, text[len("bfloat16: ") :], error=ex.chi2, tolerance=tol)
    if ex.exact:
        text = (
            f"bfloat16: statistics in float32 or better (row scale within {ex.median_error:.3%}, "
            "median; rounding them to bfloat16 is ruled out)"
        )
        return text, Finding(
            probe, OK, text[len("bfloat16: ") :] + f"; χ² {ex.chi2:.2f} against output rounding",
            error=ex.chi2, tolerance=tol,
        )  # fmt: skip
    if ex.hypothesis is not None:
        text = (
            f"bfloat16: statistics rounded to bfloat16 (row scale off by {ex.median_error:.3%}, "
            f"median; the errors follow {ex.hypothesis})"
        )
        diag = "bfloat16-rounded statistic"
        if "bfloat16" not in ex.hypothesis:
            diag = "16-bit statistic"
            text = text.replace("rounded to bfloat16", "rounded to float16", 1)
        return text, Finding(
            probe, DEFECT, text[len("bfloat16: ") :], diagnosis=diag, error=ex.chi2, tolerance=tol
        )
    return None


def _bf16_inexact_too(ex: RowScaleExplanation) -> tuple[str, Finding]:
    """No rounding fits, and the statistic was inexact at the audit's own dtype: a note."""
    text = (
        f"bfloat16: row scale off by {ex.median_error:.3%} (median), no bfloat16 rounding "
        "fits, and the statistic is inexact at the audit's own input dtype too (see statistic)"
    )
    return text, Finding(
        _BF16_PROBE, NOTE, text[len("bfloat16: ") :], error=ex.chi2, tolerance=ex.threshold
    )


def _bf16_accumulated(ex: RowScaleExplanation, d: int) -> tuple[str, Finding]:
    """Row-scale errors beyond any rounding of the statistic that move with the order of the
    sum: a 16-bit accumulator (a defect)."""
    text = (
        f"bfloat16: statistics accumulated in 16 bits: row scale off by {ex.rms_error:.3%} "
        f"(RMS), more than rounding the statistic to bfloat16 explains (≤ "
        f"{BEYOND_ROUNDING:.3%}), over rows of D = {d}"
    )
    return text, Finding(
        _BF16_PROBE, DEFECT, text[len("bfloat16: ") :],
        diagnosis="16-bit accumulation of the statistic", error=ex.chi2, tolerance=ex.threshold,
    )  # fmt: skip


def _bf16_imprecise(ex: RowScaleExplanation, models: list[EpsModel]) -> tuple[str, Finding]:
    """Imprecise statistics that no single rounding fits: a defect, withheld when ε acts in a
    way the probes do not model (no ``models``) and may be the cause."""
    probe, tol = _BF16_PROBE, ex.threshold
    if not models:
        text = (
            f"bfloat16: withheld: row scale off by {ex.median_error:.3%} (median) and no bfloat16 "
            "rounding fits, but ε acts in a way the probes do not model (see ε), and may be the "
            "cause"
        )
        return text, Finding(probe, NOTE, text[len("bfloat16: ") :], error=ex.chi2,
                             tolerance=tol, withheld=True)  # fmt: skip
    text = (
        f"bfloat16: statistics rounded to bfloat16 or otherwise imprecise (row scale off by "
        f"{ex.median_error:.3%}, median; χ² {ex.chi2:.1f} > {tol:.2f}, no single rounding fits)"
    )
    return text, Finding(
        probe, DEFECT, text[len("bfloat16: ") :], diagnosis="low-precision statistics",
        error=ex.chi2, tolerance=tol,
    )  # fmt: skip


def _order_dependent(
    f: NormFn,
    x: torch.Tensor,
    hat: torch.Tensor,
    b: torch.Tensor,
    g: torch.Tensor,
    live: torch.Tensor,
    noise: torch.Tensor,
) -> bool:
    """Whether permuting each row's values moves the rows' scales by more than 6 times the
    output noise (RMS): a statistic summed in 16 bits depends on the order of the sum."""
    d = x.shape[-1]
    perm = torch.randperm(d, generator=torch.Generator().manual_seed(9))
    inverse = torch.argsort(perm)
    try:
        yp = call(f, x[:, perm]).double()
    except CALL_ERRORS:
        return False
    hat_p = ((yp - b) / torch.where(g.abs() > 1e-8, g, torch.ones_like(g)))[:, inverse][:, live]
    moved = row_scales(hat_p, hat) - 1
    return float(moved.pow(2).mean().sqrt()) > 6 * float(noise.pow(2).mean().sqrt())


# ----------------------------------------------------------------------------------------------
# casting
# ----------------------------------------------------------------------------------------------
def _eps_choices(eps: float, attribute: float | None) -> list[float]:
    """The module's own ε when it has one, else the estimate and its 1- and 2-digit roundings."""
    if attribute is not None:
        return [attribute]
    out = [eps]
    if eps > 0:
        exponent = math.floor(math.log10(eps))
        for digits in (0, 1):
            out.append(round(eps / 10.0**exponent, digits) * 10.0**exponent)
    return out


def _variants(
    x: torch.Tensor, xf: torch.Tensor, w: torch.Tensor, e: float, placement: str
) -> list[tuple[str, str, torch.Tensor]]:
    """(severity, label, output) of each rounding recipe for input x with ε = e, added where
    ``placement`` says: x·rsqrt(m + ε) inside the root, x / (sqrt(m) + ε) outside."""
    ms = xf.pow(2).mean(-1, keepdim=True)
    hat = xf / (ms.sqrt() + e) if placement.startswith("outside") else xf * torch.rsqrt(ms + e)
    out = []
    for offset in (0.0, 1.0):
        gain32 = w.float() + offset
        out += [
            (OK, "llama: x̂ rounded to the input dtype, then times the gain",
             (gain32 * hat.to(x.dtype).float()).to(x.dtype)),
            (OK, "gemma: x̂ and the gain meet in float32, one rounding at the end",
             (hat * gain32).to(x.dtype)),
        ]  # fmt: skip
    gain16 = (w.bfloat16() + 1.0).float()  # 1 + w added in bfloat16
    label16 = "1 + w added in bfloat16 (the offset belongs in float32)"
    out += [
        (DEFECT, label16, (hat * gain16).to(x.dtype)),
        (DEFECT, label16, (gain16 * hat.to(x.dtype).float()).to(x.dtype)),
    ]
    if w.dtype in (torch.float32, torch.float64):
        w16 = w.bfloat16().float()
        label = "the gain cast to the input dtype (bfloat16) before use, as w.to(x.dtype) does"
        out += [(NOTE, label, (hat * w16).to(x.dtype)),
                (NOTE, label, (hat * (w16 + 1.0)).to(x.dtype)),
                (NOTE, label, (w16 * hat.to(x.dtype).float()).to(x.dtype)),
                (NOTE, label, ((w16 + 1.0) * hat.to(x.dtype).float()).to(x.dtype))]  # fmt: skip
    return out


def casting_check(
    f: NormFn,
    weight: torch.Tensor,
    dim: int,
    eps: float,
    eps_attribute: float | None,
    placement: str = INSIDE,
) -> tuple[str, Finding]:
    """Which 16-bit rounding a mean-square norm follows, bit for bit, in bfloat16, with ε where
    the ε probe found it (``placement``: inside or outside the root)."""
    gen = torch.Generator().manual_seed(3)
    n = max(16, math.ceil(4096 / dim))
    x = torch.randn(n, dim, generator=gen).bfloat16()
    probe = "casting"
    try:
        y = call(f, x)
    except CALL_ERRORS as err:
        text = f"bfloat16 input not accepted ({type(err).__name__})"
        return text, Finding(probe, NOTE, text)
    w = weight.detach().to("cpu")
    if y.dtype == torch.float32:
        text = "fp32: bfloat16 input gives a float32 output (x̂ and the gain meet in float32)"
        return text, Finding(probe, OK, text)
    xf = x.float()
    y16 = y.to(x.dtype)
    scored = []  # (fraction of outputs that differ, severity, label)
    for e in _eps_choices(eps, eps_attribute):
        for sev, label, ref in _variants(x, xf, w, e, placement):
            diff = (y16.float() - ref.float()).abs()
            one_ulp = bool((diff <= ulp(ref).float() * 1.0001).all())
            scored.append((float((diff > 0).float().mean()) if one_ulp else 1.0, sev, label))
    rank = {OK: 0, NOTE: 1, DEFECT: 2}
    scored.sort(key=lambda s: (s[0] > MISMATCH_ALLOWED, rank[s[1]], s[0]))
    frac, sev, label = scored[0]
    if frac <= MISMATCH_ALLOWED:
        how = "bit for bit" if frac == 0 else f"to 1 ulp; {frac:.2%} of outputs differ by 1 ulp"
        if sev != DEFECT:
            return label, Finding(probe, sev, f"{label} ({how})", error=frac,
                                  tolerance=MISMATCH_ALLOWED)  # fmt: skip
        return label, Finding(
            probe, DEFECT, f"{label} ({how}; the LLaMA and Gemma formulas are not)",
            diagnosis=label.split(" (")[0], error=frac, tolerance=MISMATCH_ALLOWED,
        )  # fmt: skip
    best = min((s[0], s[2]) for s in scored)
    text = "neither LLaMA nor Gemma rounding, bit for bit"
    return text, Finding(
        probe, NOTE,
        f"{text} (closest: {best[1] or 'none'}, {best[0]:.1%} of outputs differ)",
        error=best[0], tolerance=MISMATCH_ALLOWED,
    )  # fmt: skip
