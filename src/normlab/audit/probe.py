"""Black-box probing of one norm: what does this implementation really compute?

The norm is treated as a function y = f(x) on [N, D] tensors, assumed to have the form
y = g ⊙ x̂ + b with a per-channel gain g and bias b. Every probe compares what it measures with
a tolerance derived from the probe's dtype and D (:mod:`normlab.audit.basics`), and its result
is a :class:`~normlab.audit.findings.Finding` with a severity (``ok``, ``note``, ``defect``).
The probes, in order, each resting on the ones before:

1. **output**: f(0) (the bias b) and f(x) on random rows. Non-finite output is a finding of its
   own and stops every probe that needs finite output; so is a random output (two calls
   differ), and a target that writes into its input is a defect (the probes pass copies). The
   precision the outputs really carry (:func:`~normlab.audit.basics.effective_dtype`) sets the
   tolerances.
2. **axis** (:mod:`.axis`): which outputs move when one input does: per row, element-wise, or a
   statistic over the wrong axis (the rows of the batch, a middle dim of [B, T, D], the tensor).
3. **normalises?** A normaliser divides each row by a statistic of the row: at a large input
   scale (mean square 10¹², where ε is negligible inside the root or outside it) f(c·x) = f(x)
   for c > 0, and at the probe's own scale scaling x
   changes each row of f(x) − b only by a factor. A row-scale drift within
   :data:`~normlab.audit.statistic.ROW_SCALE_BAND` is a normaliser with imprecise statistics; an
   output that falls as 1/|x| divides by the statistic without a root.
4. **gain** (:mod:`.gain`): g = (f(S·v) − b) / v for v = [+1, −1, …] and S = 2²⁰ (where ε is
   negligible wherever it sits; its small effect is divided out once ε is found), and which
   function of the weight it is (w, 1 + w, or a defect: unbiased variance, L2 norm, the gain
   applied before normalising, rounded to 16 bits, 1 + w added in 16 bits). The weight is set
   to a random value for the audit and restored, so that these differ.
5. **ε** (:mod:`.eps`): its size and whether it sits inside the root, outside it, or is missing.
6. **centring**: f(x + a·1) = f(x) on values exact in the probe dtype ⇔ the mean is subtracted.
7. **statistic** (:mod:`.statistic`): x̂ = (f(X) − b) / g against each candidate on rows built
   to tell them apart, with ε as the ε probe found it (both readings when it could not tell);
   when none fits, the closest with its error, and no name (ε, precision and casting are then
   withheld). Permuting each row's values must leave its scale alone: a
   statistic that depends on the order of its sum is accumulated in 16 bits.
8. **precision** (:mod:`.precision`, needs the statistic): float16 rows with |x| ≈ 300 (x²
   overflows float16) and bfloat16 rows whose row scales tell float32 statistics from rounded
   or 16-bit-accumulated ones.
9. **casting** (mean square family, needs ε's placement and the weight): bit for bit against the
   LLaMA and Gemma formulas in bfloat16, with ε inside or outside the root as found, and against
   16-bit gain arithmetic.

Every probe after the ε probe is computed for the ε placement, centring, gain form and statistic
the audit found, or withheld with the reason; none assumes the contract's choice.
"""

from __future__ import annotations

import math
import reprlib
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from normlab.audit import axis
from normlab.audit.basics import (
    CALL_ERRORS,
    GAIN_READ_SCALE,
    NonFinite,
    NormFn,
    accumulation_error,
    alternating,
    call,
    effective_dtype,
    finite_call,
    output_tolerance,
    rel,
    rounding,
    row_scales,
    row_shape_error,
    shrink,
    working_dtype,
)
from normlab.audit.eps import NO_EPS, EpsModel, EpsResult, estimate_eps
from normlab.audit.findings import (
    DEFECT,
    NOTE,
    OK,
    Finding,
    figure,
    ordered,
    withheld,
    worst,
)
from normlab.audit.gain import L2, UNBIASED, GainResult, identify_gain
from normlab.audit.precision import bf16_check, casting_check, fp16_check, row_noise
from normlab.audit.statistic import (
    ROW_SCALE_BAND,
    Candidate,
    StatisticFit,
    explain_row_scales,
    fit_statistic,
    statistic_rows,
)

SCALE_STEP = 3.7  # the factor c of the scale-invariance probes
# input scales at which ε is negligible, largest first: at 1e12 ε = 1 moves x̂ by 5e-13 in the
# root and by 1e-6 outside it (at 1e4, outside the root ε = 0.01 moved x̂ by 1e-4, read as
# drifting row scales). The first whose output is finite and not collapsed to the bias is used
# (a norm that casts to float16 overflows at 1e12): the last one diagnoses the overflow
LARGE_MEAN_SQUARES = (1e12, 1e8, 1e4)
LARGE_MEAN_SQUARE = LARGE_MEAN_SQUARES[-1]
MIN_DIM = 4  # at D = 2 every centred row is a multiple of [1, −1]: the shape probe cannot fail
GAIN_NAMES = ("weight", "gamma", "gain")  # what a norm module's own gain parameter is called
EPS_NAMES = ("eps", "variance_epsilon", "epsilon")  # and its ε
# the statistic probe's scale (1 in float16, whose x² would overflow); the gain row S·v then has
# S = 1024: its statistic, root and rsqrt are exact in every dtype, however rounded
STAT_MEAN_SQUARE = 2.0**20
RANDOM_GAIN = 0.3  # the weight is set to w + 0.3·N(0, 1) for the audit


def check_probe_dim(dim: object) -> int:
    """The probes' vector size: an even integer >= :data:`MIN_DIM` (bool refused)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < MIN_DIM or dim % 2:
        raise ValueError(f"dim: expected an even integer >= {MIN_DIM} for the probes, got {dim!r}")
    return dim


def module_weight(module: object, dim: int) -> torch.Tensor | None:
    """The gain parameter a norm module exposes, or None.

    Its own tensor attribute ``weight`` (else ``gamma``, ``gain``) holding ``dim`` values, as
    ``torch.nn.LayerNorm``, ``torch.nn.RMSNorm`` and normlab's layers have. Both
    :func:`audit_norm` (when given a module and no ``weight``) and the ``normlab audit norm``
    command use it.
    """
    if not isinstance(module, nn.Module):
        return None
    for name in GAIN_NAMES:
        w = getattr(module, name, None)
        if isinstance(w, torch.Tensor) and w.numel() == dim:
            return w
    return None


def _module_eps(module: object) -> float | None:
    for name in EPS_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return float(value)
    return None


def _normalized_size(module: object) -> int | None:
    """D of a module with a one-dimensional ``normalized_shape`` (an int or (D,)), else None."""
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1:
        d = shape[0]
        return d if isinstance(d, int) and not isinstance(d, bool) else None
    return None


@dataclass
class NormAudit:
    """What a norm implementation computes, as found by :func:`audit_norm`.

    ``severity`` is the worst of the ``findings`` (``defect`` > ``note`` > ``ok``); the findings
    are ordered defects first, each with its probe, error and tolerance. A field that rests on a
    probe that was withheld says ``withheld: <reason>`` (strings) or is None."""

    target: str
    dim: int
    normalizes: bool
    centering: bool
    statistic: str
    eps: float | None
    eps_placement: str
    gain_form: str
    has_bias: bool
    stats_precision: dict[str, str] = field(default_factory=dict)
    casting: str | None = None
    max_rel_error: float | None = None
    notes: list[str] = field(default_factory=list)
    severity: str = OK
    findings: list[Finding] = field(default_factory=list)
    probe_dtype: str = "float32"
    working_dtype: str | None = None  # the precision the outputs were found to carry
    tolerance: float | None = None  # the output tolerance of the probe dtype at this D

    def to_dict(self) -> dict:
        """The fields as a dict, ``severity`` and ``findings`` (defects first) leading."""
        data = asdict(self)
        head = {"severity": data.pop("severity"), "findings": data.pop("findings")}
        return {**head, **data}

    @property
    def defects(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == DEFECT]


def _probe_dtype(f: NormFn, d: int) -> torch.dtype:
    """The most precise input dtype the target accepts: float64 (if it also returns float64),
    else float32, else a 16-bit dtype (a module whose parameters are bfloat16 or float16 and
    that does not cast its input)."""
    gen = torch.Generator().manual_seed(4)  # torch's global generator is left alone
    try:
        y = call(f, torch.randn(2, d, generator=gen, dtype=torch.float64))
        if y.dtype == torch.float64:
            return torch.float64
    except CALL_ERRORS:
        pass
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        try:
            call(f, torch.randn(2, d, generator=gen).to(dtype))
            return dtype
        except CALL_ERRORS:
            continue
    return torch.float32  # let the first probe raise the target's own error


@contextmanager
def _weight_set(
    weight: torch.Tensor | None, values: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[bool]:
    """Set the weight to ``values(w)`` while the block runs and restore w after; yields whether
    it was set (False without a weight, or when it cannot be written in place: the block then
    sees the weight as it is)."""
    if weight is None:
        yield False
        return
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.copy_(values(saved))
    except RuntimeError:
        yield False
        return
    try:
        yield True
    finally:
        with torch.no_grad():
            weight.copy_(saved)


def _unit_gain(weight: torch.Tensor | None) -> AbstractContextManager[bool]:
    """The weight set to 1 while the block runs (:func:`_weight_set`)."""
    return _weight_set(weight, torch.ones_like)


def _random_gain(weight: torch.Tensor | None) -> AbstractContextManager[bool]:
    """The weight set to w + 0.3·N(0, 1) (fixed seed) for the audit (:func:`_weight_set`).

    A uniform gain hides the gain's defects (applied before normalising, rounded to 16 bits,
    1 + w added in 16 bits): with w = 1 they all compute the right thing."""

    def noisy(saved: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(6)
        noise = torch.randn(saved.shape, generator=gen, dtype=torch.float64)
        return (saved.double() + RANDOM_GAIN * noise).to(saved)

    return _weight_set(weight, noisy)


def _invariance(
    f: NormFn, big: torch.Tensor, y_big: torch.Tensor, b: torch.Tensor
) -> tuple[float, float, torch.Tensor]:
    """(relative error, row-shape error, row scales) of f(c·big) − b against f(big) − b."""
    a, r = finite_call(f, SCALE_STEP * big, "normalises") - b, y_big - b
    return rel(a, r), row_shape_error(a, r), row_scales(a, r)


def _why_not_normalizing(
    f: NormFn,
    x: torch.Tensor,
    y: torch.Tensor,
    big: torch.Tensor,
    y_big: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
) -> tuple[str, str] | None:
    """``None`` if ``f`` behaves as a row normaliser, else (the reason, what acts like that).

    ``y = f(x)`` at the probe scale and ``y_big = f(big)`` with ``big`` a multiple of ``x`` of
    large mean square; ``b = f(0)``. See step 3 of the module docstring. The tolerance is
    :func:`~normlab.audit.basics.output_tolerance` of the output dtype and D; a row-scale drift
    within :data:`~normlab.audit.statistic.ROW_SCALE_BAND` still counts as normalising.
    """
    tol = output_tolerance(out_dtype or working_dtype(y), x.shape[-1])
    bumped = x.clone()
    bumped[:, 0] += 30.0 * x.double().pow(2).mean(-1).sqrt().to(x.dtype)
    if rel(call(f, bumped)[:, 1:] - b[1:], y[:, 1:] - b[1:]) < 1e-9:
        return (
            "it acts element-wise: changing one input leaves the other outputs unchanged",
            "as DyT, tanh or the identity do",
        )
    moved = (y_big.double() - b.double()).abs().amax(-1)
    if bool((moved == 0).any()) and bool(((y.double() - b.double()).abs().amax(-1) > 0).all()):
        return (
            f"the output collapses to the bias (zero) on rows of mean square {LARGE_MEAN_SQUARE:g}"
            ", though not at the probe's own scale: the statistic overflows",
            "as x² taken in float16 does past |x| ≈ 256",
        )
    _, shape_err, k = _invariance(f, big, y_big, b)
    drift = float(k.log().abs().max()) if bool((k > 0).all()) else math.inf
    if shape_err > tol or drift > math.log1p(ROW_SCALE_BAND):
        slope = float(k.log().median()) / math.log(SCALE_STEP) if bool((k > 0).all()) else 0.0
        if abs(slope + 1) < 0.1:
            return (
                "the output changes with the input's scale, even where ε is negligible: it "
                "falls as 1/|x|",
                "dividing by the statistic without a root, x / (m + ε)",
            )
        if abs(slope - 1) < 0.1:
            return (
                "the output changes with the input's scale, even where ε is negligible: it "
                "grows in proportion",
                "as a linear map does",
            )
        return (
            "the output changes with the input's scale, even where ε is negligible",
            "as no normaliser does",
        )
    if row_shape_error(call(f, SCALE_STEP * x) - b, y - b) >= tol:
        return (
            "scaling the input changes the shape of the output, not only its size",
            "as the normalisation of a non-linear function of x, e.g. of tanh(x), does",
        )
    return None


def _centring_rows(dim: int, dtype: torch.dtype) -> torch.Tensor:
    """16 rows on a grid of 1/8 within ±63/8 (fixed seed): x + 4 is exact in every dtype."""
    xc = torch.randn(16, dim, generator=torch.Generator().manual_seed(7)) * 2 + 0.5
    return (xc * 8).round().clamp(-63, 63).div(8).to(dtype)


@dataclass
class _GainReading:
    """What the gain probe read, for the probes after it."""

    fn: NormFn  # the target, or x ↦ f(x / w) when the gain is applied before normalising
    gain: GainResult  # the gain's form as first read, where ε is negligible
    v: torch.Tensor  # the alternating row [+1, −1, …] [1, D] in the probe dtype
    gain_scale: float  # S of the statistic probe's gain row S·v
    g_meas: torch.Tensor  # g = (fn(S·v) − b) / v, float64
    read_scale: float  # the scale at which the gain's form was read
    g_read: torch.Tensor  # g = (f(read_scale·v) − b) / v, float64
    centred: bool  # f(x + 4) = f(x), on f itself


class _Audit:
    """The state of one audit: what each probe found, for the next ones and the result."""

    def __init__(self, f: NormFn, dim: int, target: str, weight: torch.Tensor | None) -> None:
        self.f, self.dim, self.target, self.weight = f, dim, target, weight
        self.findings: list[Finding] = []
        self.row_drift = 0.0
        self.notes: list[str] = []
        self.dtype = _probe_dtype(f, dim)
        self.out_dtype = self.dtype
        self.result = NormAudit(
            target=target, dim=dim, normalizes=False, centering=False,
            statistic="withheld: not probed", eps=None, eps_placement="withheld: not probed",
            gain_form="withheld: not probed", has_bias=False, probe_dtype=str(self.dtype)[6:],
            tolerance=output_tolerance(self.dtype, dim),
        )  # fmt: skip

    def finish(self) -> NormAudit:
        r = self.result
        r.findings = ordered(self.findings)
        r.severity = worst(self.findings)
        r.notes = self.notes
        return r

    def withhold(self, reason: str, *probes: str) -> None:
        for probe in probes:
            self.findings.append(withheld(probe, reason))

    # ------------------------------------------------------------------------------------------
    def run(self) -> NormAudit:
        f, dim, dtype = self.f, self.dim, self.dtype
        try:
            b = call(f, torch.zeros(1, dim, dtype=dtype))[0]
        except CALL_ERRORS as err:
            raise ValueError(
                f"f: {self.target!r} failed on the first probe, a {dtype} tensor of shape "
                f"[1, {dim}] ({type(err).__name__}: {err}); expected a norm over vectors of size "
                f"dim={dim} mapping [N, dim] to [N, dim] (does its size match dim?)"
            ) from err
        self.zero_finite = bool(torch.isfinite(b).all())
        if not self.zero_finite:
            b = torch.zeros_like(b)
        self.result.has_bias = bool(b.double().abs().max() > 1e-6)
        try:
            self._probe(b)
        except NonFinite as nf:
            zero = "" if self.zero_finite else "; a zero row gives NaN or infinity too"
            message = f"non-finite output: {nf.what}{zero}"
            self.findings.append(Finding(nf.probe, DEFECT, message, "non-finite output"))
            self._withhold_after(f"the {nf.probe} probe got non-finite output")
            return self.finish()
        if not self.zero_finite:  # finite elsewhere: 0 / 0 on the zero row
            self.findings.append(
                Finding(
                    "output", DEFECT,
                    "a zero row gives NaN or infinity while other rows are finite: nothing keeps "
                    "0 / 0 away (ε missing, or too small for the dtype); the bias was taken as 0",
                    diagnosis="non-finite output on a zero row",
                )
            )  # fmt: skip
        return self.finish()

    def _withhold_after(self, reason: str) -> None:
        r = self.result
        done = {f.probe for f in self.findings}
        later = ["normalises", "gain", "ε", "centring", "statistic", "precision", "casting"]
        self.withhold(reason, *[p for p in later if p not in done])
        for name in ("statistic", "eps_placement", "gain_form"):
            if getattr(r, name).startswith("withheld: not probed"):
                setattr(r, name, f"withheld: {reason}")

    def _probe(self, b: torch.Tensor) -> None:
        """Probes 1 to 9 of the module docstring, on ``b = f(0)``; each of the first three
        stops the rest when its finding leaves nothing for them to probe."""
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, self.dim, generator=gen, dtype=self.dtype) * 2 + 0.5
        y = self._probe_output(x)  # 1. output
        if y is None or not self._probe_axis(x, y):  # 2. axis
            return None
        if not self._probe_normalises(x, y, b):  # 3. normalises?
            return None
        return self._after_normalising(b, y)

    def _probe_output(self, x: torch.Tensor) -> torch.Tensor | None:
        """Step 1: f(x), or None (the later probes withheld) when two calls on the same input
        differ; a target that writes into its input is a defect."""
        f = self.f
        y = finite_call(f, x, "output")
        x_seen = x.clone()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f(x_seen)
        if not torch.equal(x_seen, x):
            self.findings.append(
                Finding(
                    "output", DEFECT,
                    "the norm writes into its input (in place): the caller's x is changed; the "
                    "probes gave it copies",
                    diagnosis="input modified in place",
                )
            )  # fmt: skip
        again = finite_call(f, x, "output")
        if not torch.equal(again, y):
            diff = rel(again, y)
            self.findings.append(
                Finding(
                    "output", NOTE,
                    f"two calls on the same input differ (relative {figure(diff)}): the output is "
                    "random (dropout or another training-mode layer?); nothing else was probed",
                )
            )  # fmt: skip
            self._withhold_after("the output is not a function of the input")
            return None
        return y

    def _probe_axis(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Step 2 (:mod:`.axis`): whether the statistic runs over each row's D values; when it
        runs over the batch's rows, the tensor or a middle dim, the later probes are withheld."""
        rows = axis.probe_rows(self.f, x, y)
        if rows.kind in ("rows", "tensor"):
            self._wrong_axis(rows)
            return False
        if rows.per_row:
            seq = axis.probe_sequence(self.f, x, y)
            if seq is not None and seq.kind in ("sequence", "batch"):
                self._wrong_axis(seq)
                return False
            if seq is None:
                rows.finding.message += " (3-D input [B, T, D] not accepted: dims 0 and 1 of it "
                rows.finding.message += "were not probed)"
            self.findings.append(rows.finding if seq is None else seq.finding)
        return True

    def _probe_normalises(self, x: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> bool:
        """Step 3: whether f divides each row by a statistic of the row (the precision the
        outputs carry, and so the tolerances, are read first); the rows' scale drift found
        here widens the gain and ε probes' tolerance."""
        f, dim, r = self.f, self.dim, self.result
        big_ms, big, y_big = self._large_input(x, b)
        self.out_dtype = effective_dtype(f, x, y, b)
        r.tolerance = output_tolerance(self.out_dtype, dim)
        r.working_dtype = str(self.out_dtype)[6:]
        why_not = _why_not_normalizing(f, x, y, big, y_big, b, self.out_dtype)
        if why_not is not None:
            self._not_normalising(*why_not)
            return False
        r.normalizes = True
        if rounding(self.out_dtype) >= rounding(torch.float16) > rounding(y.dtype):
            self.notes.append(
                f"the outputs are {str(y.dtype)[6:]} but carry only {str(self.out_dtype)[6:]} "
                "precision (rounded to 16 bits on the way)"
            )
        tol = output_tolerance(self.out_dtype, dim)
        _, shape_err, k = _invariance(f, big, y_big, b)
        drift = float((k - 1).abs().max())
        # rows' scales that drift beyond the output tolerance (16-bit statistics) widen the
        # tolerance of the probes that read one row's scale: the gain and ε
        self.row_drift = drift if drift > tol else 0.0
        self.findings.append(
            Finding(
                "normalises", OK,
                f"f(c·x) = f(x) in row shape for c = {SCALE_STEP} at mean square {big_ms:g}; "
                f"rows' scales within {figure(drift)} (the statistic probe measures them)",
                error=shape_err, tolerance=tol,
            )
        )  # fmt: skip
        return True

    def _not_normalising(self, reason: str, like: str) -> None:
        """Step 3's finding for a target that does not normalise: a defect where the reason
        names one (ε without a root, x² overflowing float16), else a note."""
        r = self.result
        diag = "ε applied without a root" if "1/|x|" in reason else None
        diag = "float16 overflow of x²" if "overflows" in reason else diag
        severity = DEFECT if diag else NOTE
        message = f"not a normalizer: {reason} ({like})"
        self.findings.append(Finding("normalises", severity, message, diagnosis=diag))
        r.statistic, r.eps_placement, r.gain_form = f"none: {reason}", "n/a", "unknown"
        self.notes.append(f"not a normalizer: {reason} ({like})")

    def _large_input(
        self, x: torch.Tensor, b: torch.Tensor
    ) -> tuple[float, torch.Tensor, torch.Tensor]:
        """(mean square, x scaled to it, f of that): the largest of :data:`LARGE_MEAN_SQUARES`
        whose output (and that of :data:`SCALE_STEP` times it) is finite and not collapsed to
        the bias (1 for float16 probes)."""
        scales = LARGE_MEAN_SQUARES if self.dtype != torch.float16 else (1.0,)
        ms_x = float(x.double().pow(2).mean())
        for big_ms in scales[:-1]:
            big = x * math.sqrt(big_ms / ms_x)
            try:
                y_big, y_far = call(self.f, big), call(self.f, SCALE_STEP * big)
            except CALL_ERRORS:
                continue
            moved = (y_big.double() - b.double()).abs().amax(-1)
            finite = bool(torch.isfinite(y_big).all()) and bool(torch.isfinite(y_far).all())
            if finite and bool((moved > 0).all()):
                return big_ms, big, y_big
        big = x * math.sqrt(scales[-1] / ms_x)
        return scales[-1], big, finite_call(self.f, big, "normalises")

    def _wrong_axis(self, res: axis.AxisResult) -> None:
        self.findings.append(res.finding)
        r = self.result
        r.statistic = "none: " + res.finding.message
        r.eps_placement, r.gain_form = "n/a", "unknown"
        self._withhold_after("the statistic does not run over each row's D values")

    def _after_normalising(self, b: torch.Tensor, y_main: torch.Tensor) -> None:
        """Probes 4 to 9 of the module docstring, on a target found to normalise its rows."""
        reading = self._read_gain_form(b)  # 4. the gain, where ε is negligible
        eps_res = self._probe_eps(reading.fn, b)  # 5. ε
        gain = self._settle_gain_form(reading)  # 4 again, ε's small effect divided out
        centred = self._probe_centring(reading.fn, b)  # 6. centring
        fit, live = self._probe_statistic(reading, eps_res.models, b)  # 7. statistic
        if fit.candidate is None:
            return self._withhold_without_statistic(fit, eps_res)
        self._name_statistic(fit.candidate, gain.finding, centred)
        self._probe_precision(reading.fn, gain, fit, live, eps_res.models)  # 8. precision
        if fit.candidate.name == "mean square":
            self._probe_casting(reading.fn)  # 9. casting
        return None

    def _gain_at(self, fn: NormFn, scale: float, v: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """g = (fn(scale·v) − b) / v in float64, for the alternating row v = [+1, −1, …]."""
        return ((finite_call(fn, scale * v, "gain").double() - b.double()) / v.double())[0]

    def _centring(self, fn: NormFn, b: torch.Tensor) -> tuple[bool, float, float]:
        """(centred, error, tolerance): fn(x + 4) − b = fn(x) − b within twice the output
        tolerance ⇔ the mean is subtracted (x from :func:`_centring_rows`)."""
        xc = _centring_rows(self.dim, self.dtype)
        y0 = finite_call(fn, xc, "centring") - b
        err = rel(finite_call(fn, xc + 4.0, "centring") - b, y0)
        tol = 2 * output_tolerance(self.out_dtype, self.dim)
        return err <= tol, err, tol

    def _read_gain_form(self, b: torch.Tensor) -> _GainReading:
        """Step 4, first reading: g = (f(S·v) − b) / v at the statistic probe's scale S, and
        the gain's form read where ε is negligible wherever it sits (not yet known). A gain
        applied before normalising turns the target into x ↦ f(x / w) for the probes after."""
        f, dim, dtype = self.f, self.dim, self.dtype
        v = alternating(1, dim, dtype)
        gain_scale = 16.0 if dtype == torch.float16 else math.sqrt(STAT_MEAN_SQUARE)
        g_meas = self._gain_at(f, gain_scale, v, b)
        centred, _, _ = self._centring(f, b)
        read_scale = gain_scale if dtype == torch.float16 else GAIN_READ_SCALE
        g_read = self._read_gain(read_scale, b, g_meas)
        gain = identify_gain(
            g_read, self.weight, dim, v.double()[0], centred, self.out_dtype, self.row_drift
        )
        fn = f
        if gain.effective is not None:  # the gain is applied first: audit x ↦ f(x / w)
            w_eff = gain.effective.to(dtype)
            fn = lambda t: f(t / w_eff.to(t.dtype))  # noqa: E731
            g_meas = self._gain_at(fn, gain_scale, v, b)
            self.notes.append(
                "the gain is applied before normalising: the statistic and ε were probed on "
                "x ↦ f(x / w)"
            )
        return _GainReading(fn, gain, v, gain_scale, g_meas, read_scale, g_read, centred)

    def _probe_eps(self, fn: NormFn, b: torch.Tensor) -> EpsResult:
        """Step 5: ε's size and placement (:func:`~normlab.audit.eps.estimate_eps`)."""
        r, dtype = self.result, self.dtype
        eps_res = estimate_eps(
            fn, b, self.dim, dtype, self.zero_finite, self.out_dtype, self.row_drift
        )
        self.findings.append(eps_res.finding)
        r.eps, r.eps_placement = eps_res.eps, eps_res.placement
        if r.eps is not None and math.isclose(r.eps, rounding(dtype), rel_tol=0.05):
            self.notes.append(
                f"ε equals the machine epsilon of the probe dtype ({dtype}): the implementation "
                "derives ε from a dtype (as torch's eps=None does) instead of a fixed value"
            )
        return eps_res

    def _settle_gain_form(self, reading: _GainReading) -> GainResult:
        """Step 4, final: the gain read again as g_read / shrink(S², ε) with ε's small effect at
        the read scale S divided out (a gain applied first keeps its first reading)."""
        r, gain = self.result, reading.gain
        if gain.effective is None:
            g = reading.g_read / float(shrink(reading.read_scale**2, r.eps, r.eps_placement))
            gain = identify_gain(
                g, self.weight, self.dim, reading.v.double()[0], reading.centred,
                self.out_dtype, self.row_drift,
            )  # fmt: skip
        self.findings.append(gain.finding)
        r.gain_form = gain.form
        return gain

    def _probe_centring(self, fn: NormFn, b: torch.Tensor) -> bool:
        """Step 6: f(x + 4) = f(x) ⇔ the mean is subtracted."""
        centred, c_err, c_tol = self._centring(fn, b)
        self.result.centering = centred
        self.findings.append(
            Finding(
                "centring", OK,
                "subtracts the mean: f(x + 4) = f(x)" if centred
                else "does not subtract the mean: f(x + 4) ≠ f(x)",
                error=c_err, tolerance=c_tol,
            )
        )  # fmt: skip
        return centred

    def _probe_statistic(
        self, reading: _GainReading, models: list[EpsModel], b: torch.Tensor
    ) -> tuple[StatisticFit, torch.Tensor]:
        """Step 7: (the best fit, the live channels). x̂ = (f(X) − b) / g on the statistic rows
        X against each candidate, under each reading of ε the ε probe left open; the order
        probe first. Channels with |g| < 1e-8 are left out of the fits."""
        fn, dim, dtype, g_meas = reading.fn, self.dim, self.dtype, reading.g_meas
        live = g_meas.abs() >= 1e-8
        if not bool(live.all()):
            self.notes.append("some channels have zero gain; they were left out of the fits")
        stat_ms = 1.0 if dtype == torch.float16 else STAT_MEAN_SQUARE
        xs = statistic_rows(dim, dtype, stat_ms)
        ys = finite_call(fn, xs, "statistic")
        gl = torch.where(live, g_meas, torch.ones_like(g_meas))  # as the candidates are scaled
        hat = (ys.double() - b.double()) / gl
        self.findings.append(self._order_probe(fn, xs, hat, b, gl, live))
        stat_tol = output_tolerance(self.out_dtype, dim)
        v64, scale = reading.v.double(), reading.gain_scale
        fit = min(
            (
                fit_statistic(hat, xs.double(), v64, scale, e, p, stat_tol, live)
                for e, p in models or [NO_EPS]
            ),
            key=lambda s: s.error,
        )  # under each reading of ε the ε probe left open
        if fit.candidate is not None and not fit.fits_exactly:
            self._explain_fit(fit, xs, ys, hat, gl, live)
            if not models and fit.finding.diagnosis == "inexact statistic":
                fit.finding.severity, fit.finding.diagnosis = NOTE, None
                fit.finding.message += (
                    "; not called a defect: ε acts in a way the probes do not model (see ε) "
                    "and may cause it"
                )
        self.findings.append(fit.finding)
        self.result.max_rel_error = fit.error
        return fit, live

    def _withhold_without_statistic(self, fit: StatisticFit, eps_res: EpsResult) -> None:
        """No candidate statistic fits: name the closest, and withhold precision, casting and
        ε (read as an addend of a root mean square, a reading no fitted statistic supports)."""
        r = self.result
        stat_tol = output_tolerance(self.out_dtype, self.dim)
        r.statistic = (
            f"none fits: closest {fit.closest.name} (error {figure(fit.error)} > tolerance "
            f"{figure(stat_tol)})"
        )
        reason = "no candidate statistic fits"
        self.withhold(reason, "precision (float16)", "precision (bfloat16)", "casting")
        self.findings.remove(eps_res.finding)
        self.findings.append(
            withheld("ε", f"{reason} (ε's effect on x = s·v looked like {r.eps_placement})")
        )
        r.eps, r.eps_placement = None, f"withheld: {reason}"
        r.stats_precision = {k: f"withheld: {reason}" for k in ("float16", "bfloat16")}

    def _name_statistic(self, candidate: Candidate, gain: Finding, centred: bool) -> None:
        """The fitted statistic's name, and a note where the centring probe disagrees."""
        self.result.statistic = self._statistic_name(candidate.name, gain)
        if candidate.centred != centred:
            self.notes.append(
                f"the centring probe says {'centred' if centred else 'not centred'}, the fitted "
                f"statistic ({candidate.name}) the opposite"
            )

    def _probe_precision(
        self,
        fn: NormFn,
        gain: GainResult,
        fit: StatisticFit,
        live: torch.Tensor,
        models: list[EpsModel],
    ) -> None:
        """Step 8: float16 and bfloat16 statistics (:mod:`.precision`).

        A gain applied first is probed with w = 1 where the weight can be set: in 16 bits
        x ↦ f(x / w) rounds x / w and then w ⊙ (x / w), noise of the probe's own that would
        read as imprecise statistics; with w = 1 both orders compute the same."""
        assert fit.candidate is not None
        dim, inexact = self.dim, not fit.fits_exactly
        unit = gain.effective is not None and self.weight is not None
        with _unit_gain(self.weight if unit else None) as done:
            probed = self.f if unit and done else fn
            fp16_text, fp16 = fp16_check(probed, dim, fit.candidate, live, models)
            bf16_text, bf16 = bf16_check(probed, dim, fit.candidate, live, models, inexact)
        self.findings += [fp16, bf16]
        self.result.stats_precision = {"float16": fp16_text, "bfloat16": bf16_text}

    def _probe_casting(self, fn: NormFn) -> None:
        """Step 9 (mean square family): the 16-bit casting order, bit for bit, for the ε
        placement found (:func:`~normlab.audit.precision.casting_check`)."""
        r = self.result
        if self.weight is None:
            self.withhold("no weight exposed", "casting")
        elif r.eps is None or not r.eps_placement.startswith(("inside", "outside")):
            self.withhold("ε's placement was not determined", "casting")
        else:
            eps_attr = _module_eps(self.f)
            r.casting, finding = casting_check(
                fn, self.weight, self.dim, r.eps, eps_attr, r.eps_placement
            )
            self.findings.append(finding)

    def _read_gain(self, scale: float, b: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
        """g = (f(scale·v) − b) / v (float64); ``fallback`` where that output is not finite."""
        v = alternating(1, self.dim, self.dtype)
        try:
            out = call(self.f, scale * v)
        except CALL_ERRORS:
            return fallback
        if not bool(torch.isfinite(out).all()):
            return fallback
        return ((out.double() - b.double()) / v.double())[0]

    def _order_probe(
        self,
        fn: NormFn,
        xs: torch.Tensor,
        hat: torch.Tensor,
        b: torch.Tensor,
        g: torch.Tensor,
        live: torch.Tensor,
    ) -> Finding:
        """Permute each row's values: a statistic computed exactly (a sum in float32 or better)
        hardly depends on their order; one accumulated in 16 bits does. Allowed: the float32
        reorder error 4·eps32·sqrt(D) plus the output's rounding averaged over the row,
        6u/sqrt(D)."""
        d = self.dim
        perm = torch.randperm(d, generator=torch.Generator().manual_seed(8))
        inverse = torch.argsort(perm)
        yp = finite_call(fn, xs[:, perm], "statistic order").double()
        hat_p = ((yp - b.double()) / g)[:, inverse]  # gain and bias belong to output channels
        keep = live & live[inverse]
        k = row_scales(hat_p[:, keep], hat[:, keep])
        err = float((k - 1).pow(2).mean().sqrt())
        tol = accumulation_error(torch.float32, d) + 6 * rounding(self.out_dtype) / math.sqrt(d)
        if err <= tol:
            return Finding(
                "statistic order", OK,
                "permuting a row's values leaves its scale alone: no low-precision accumulation",
                error=err, tolerance=tol,
            )  # fmt: skip
        return Finding(
            "statistic order", DEFECT,
            f"permuting a row's values moves its scale by {err:.2%} (RMS over rows): the "
            "statistic depends on the order of the sum, as a 16-bit accumulator over the row does",
            diagnosis="16-bit accumulation of the statistic", error=err, tolerance=tol,
        )  # fmt: skip

    def _explain_fit(
        self,
        fit: StatisticFit,
        xs: torch.Tensor,
        ys: torch.Tensor,
        hat: torch.Tensor,
        g: torch.Tensor,
        live: torch.Tensor,
    ) -> None:
        """Name the rounding that the statistic fit's row-scale errors follow, if one does."""
        assert fit.candidate is not None
        noise = row_noise(hat[:, live], ys[:, live], g[live], self.out_dtype, self.dim)
        stat = fit.candidate.statistic(xs.double())[:, 0]
        ref = STAT_MEAN_SQUARE if self.dtype != torch.float16 else 256.0
        ex = explain_row_scales(fit.row_scales, stat, noise, ref)
        if ex.hypothesis is not None:
            fit.finding.message += f"; the row scales follow {ex.hypothesis}"
            fit.finding.diagnosis = (
                "bfloat16-rounded statistic" if "bfloat16" in ex.hypothesis
                else "16-bit statistic"
            )  # fmt: skip

    def _statistic_name(self, name: str, gain: Finding) -> str:
        """The fitted statistic, with the constant factor the gain probe read off."""
        if gain.diagnosis == "unbiased variance" and name == "variance":
            return "variance (unbiased, D − 1)"
        if gain.diagnosis and gain.diagnosis.startswith("L2") and name == "mean square":
            return "sum of squares (L2 norm)"
        if name != "variance" or gain.severity != OK:
            return name
        form = self.result.gain_form
        if self.weight is not None and form not in (UNBIASED, L2) and not form.startswith("unk"):
            return "variance (biased, D)"
        if self.weight is None and gain.message.endswith("= 1"):
            return "variance (biased, D)"
        return name


def audit_norm(
    f: NormFn,
    dim: int = 64,
    *,
    target: str = "norm",
    weight: torch.Tensor | None = None,
) -> NormAudit:
    """Probe ``f`` (a module or callable [N, dim] → [N, dim]) and report what it computes.

    ``f`` is the norm: a ``torch.nn.Module`` or any callable taking x [N, dim] and returning a
    tensor of the same shape (or a tuple whose first item is one); wrap a conditional norm with
    its condition, e.g. ``lambda x: norm(x, cond)[0]``. ``dim`` (even, >= 4) is the vector size
    of the probes and must be the norm's own size. ``weight`` is the implementation's gain
    parameter: it lets the audit tell ``w`` from ``1 + w`` and fixes the constant factor of the
    statistic. When ``f`` is a module and ``weight`` is None, the module's own gain parameter is
    used (:func:`module_weight`: ``weight``, ``gamma`` or ``gain`` with ``dim`` values), as
    ``normlab audit norm`` does. The gain is set to w + 0.3·N(0, 1) during the audit and
    restored.

    The model the probes fit is y = g ⊙ x̂ + b with x̂ = (x − μ)·rsqrt(σ² + ε) (LayerNorm) or
    x·rsqrt(mean(x²) + ε) (RMSNorm); every finding states its error and tolerance.
    """
    if not callable(f):
        raise TypeError(
            f"f: expected the norm to probe: a torch.nn.Module or a callable mapping a tensor "
            f"[N, dim] to one of the same shape (wrap a conditional norm, e.g. "
            f"lambda x: norm(x, cond)[0]), got {type(f).__name__} {reprlib.repr(f)}"
        )
    dim = check_probe_dim(dim)
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise TypeError(
            f"weight: expected the norm's gain parameter (a torch.Tensor of {dim} values) or "
            f"None, got {type(weight).__name__}"
        )
    size = _normalized_size(f)
    if size is not None and size != dim:
        raise ValueError(
            f"dim: {dim} does not match the module's normalized_shape "
            f"{getattr(f, 'normalized_shape', None)}; expected dim={size}"
        )
    if weight is None:
        weight = module_weight(f, dim)
    with _random_gain(weight):
        return _Audit(f, dim, target, weight).run()
