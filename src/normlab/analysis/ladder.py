"""A size ladder's trend: the paired difference against model size, and its value at a target.

Each rung j is a full paired comparison at model size N_j (its parameter count): the per-seed
differences d_ij = x_ij − y_ij (arm − baseline) of the quality metric, i = 1 … n_j. Per rung:
d̄_j, s_j (n − 1 denominator) and the paired t-interval (:func:`.stats.t_interval`).

**The fit.** d(N) = a + b · log₁₀ N (b is the change per tenfold increase in N). A difference
between two choices is not a loss, so it has no power-law floor to fit, and its sign may change
with size; with three or four rungs of three seeds a straight line in log N is the most the data
can identify (a curve would spend the one or two spare degrees of freedom on noise). It is a
weighted least-squares line through the rung means with w_j = 1 / var(d̄_j) = n_j / s̃_j², where
s̃_j = max(s_j, f · s_p), s_p² = Σ (n_j − 1) s_j² / Σ (n_j − 1) the pooled paired variance and
f = ``sd_floor`` (1 by default): a noisier rung pulls less, but three seeds can agree by chance,
and a rung with s_j ≈ 0 must not take all the weight (with f = 0.5 the interval's replicates
re-weighted more erratically than the data and it over-covered).

**The prediction at the target N_t** (x_t = log₁₀ N_t), by a bootstrap over seeds within rungs,
calibrated for few seeds. For each of B replicates (``n_boot``, 4000 by default):

1. every rung's seeds are resampled with replacement from its centred differences inflated by
   √(n_j / (n_j − 1)), d*_ij = d̄_j + √(n_j / (n_j − 1)) · (d_kj − d̄_j), so the bootstrap
   variance of the rung mean is s_j² / n_j (the plain bootstrap of n values gives (n − 1) / n of
   it: 2/3 at three seeds); the line is refitted with the replicate's own weights, giving
   μ*_t = a* + b* x_t;
2. the seed noise of what a user would measure at the target is added: ε* is the mean of k
   draws from the pooled inflated residuals (k = 1: a single training; k = ``target_seeds``:
   the mean over that many paired seeds; k = ∞: none, the trend itself);
3. the spread is scaled by √g, g = ν / χ²_ν with ν = Σ (n_j − 1): the uncertainty of the seed
   variance itself, which a bootstrap of three values cannot see. Under normal noise this turns
   the normal-theory spread into Student's t with ν degrees of freedom (the exact small-sample
   prediction interval of a linear fit with one noise level), and keeps the bootstrap's own
   shape otherwise.

The draw is D* = μ̂_t + √g · (μ*_t − μ̂_t + ε*); the interval is the (1 ± c) / 2 quantiles of
the D*, and P(d > 0), P(d < 0) are the fractions of D* on each side of zero. Without steps 1's
inflation, 2 and 3 (the plain bootstrap of the fit, ``calibrated=False``) the interval covers the
single training at the target far less often than it claims (docs/studies.md, "Ladder: coverage
of the prediction interval"), the trap Besiroglu et al. 2024 found in published scaling fits.

The seed noise at the target is the pooled one: when the paired spread shrinks with size (the
common case) the interval errs on the wide side; when it grows, on the narrow side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from normlab.analysis.stats import t_interval
from normlab.analysis.wording import ladder_words
from normlab.run_format import check_ladder

__all__ = [
    "DEFAULT_BOOT",
    "DEFAULT_SD_FLOOR",
    "LadderFit",
    "LadderPrediction",
    "Rung",
    "RungStats",
    "TargetInterval",
    "extrapolation_words",
    "fit_ladder",
    "ladder_record",
    "ladder_summary",
    "paired_rung",
    "predict_ladder",
    "rung_stats",
]

DEFAULT_BOOT = 4000
"""Bootstrap replicates of the prediction: the Monte-Carlo error of a 2.5 % quantile is then
about √(0.025 · 0.975 / 4000) ≈ 0.25 % in probability."""
DEFAULT_SD_FLOOR = 1.0
"""f: a rung's sd in the weights is at least f times the pooled paired sd."""


@dataclass(frozen=True)
class Rung:
    """One rung's input: its ``setting`` (e.g. ``"d_model=64"``), its parameter count
    ``n_params`` and the paired per-seed differences ``diffs`` (arm − baseline), seed
    ``seeds[i]`` for ``diffs[i]``; how long its runs trained, recorded beside its statistics
    and not used by them: ``tokens_per_param``, ``tokens`` and ``steps`` per run (None where
    unknown)."""

    setting: str
    n_params: float
    diffs: tuple[float, ...]
    seeds: tuple[int, ...] = ()
    tokens_per_param: float | None = None
    tokens: int | None = None
    steps: int | None = None


@dataclass(frozen=True)
class RungStats:
    """A rung's paired statistics: n seeds, mean d̄, sd s, t-interval [low, high] at
    ``confidence``, and ``weight_sd`` s̃ = max(s, f · s_p), the sd its fit weight uses."""

    setting: str
    n_params: float
    n: int
    mean: float
    sd: float
    low: float
    high: float
    weight_sd: float
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]


@dataclass(frozen=True)
class LadderFit:
    """d(N) = a + b · log₁₀ N by weighted least squares; ``pooled_sd`` s_p with ``df``
    ν = Σ (n_j − 1); ``a_se``, ``b_se`` from the weights (var(d̄_j) = s̃_j² / n_j).

    ``lack_of_fit_p`` (three or more rungs, None otherwise) tests whether the rung means
    scatter about the line more than their seeds allow: F = Σ w_j r_j² / (J − 2) against
    F(J − 2, ν), r_j the rung mean's residual. A small p says the trend is not straight in
    log N, and the prediction interval, which assumes it is, is then too narrow."""

    a: float
    b: float
    a_se: float
    b_se: float
    pooled_sd: float
    df: int
    sd_floor: float
    lack_of_fit_p: float | None

    def at(self, n_params: float) -> float:
        """The fitted difference a + b · log₁₀ N at N = ``n_params``."""
        return self.a + self.b * math.log10(n_params)


@dataclass(frozen=True)
class TargetInterval:
    """One prediction at the target: the estimate, its interval [low, high], and the fractions
    of bootstrap draws above and below zero. ``seeds`` is k: 1 for a single training, the mean
    over k paired seeds, or None for the trend (the mean over infinitely many seeds)."""

    seeds: int | None
    estimate: float
    low: float
    high: float
    p_above: float
    p_below: float


@dataclass(frozen=True)
class LadderPrediction:
    """The prediction at ``target_params``: ``single`` (one training), ``mean_of_seeds`` (the
    mean over ``target_seeds`` paired trainings), ``trend`` (the fit's expected difference);
    ``extrapolation`` = target / largest rung; ``calibrated`` False for the plain bootstrap."""

    target_params: float
    largest_rung: float
    extrapolation: float
    confidence: float
    n_boot: int
    calibrated: bool
    single: TargetInterval
    mean_of_seeds: TargetInterval
    trend: TargetInterval


def _finite_positive(value: Any, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected a positive number, got {value!r}") from err
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return v


def paired_rung(
    setting: str,
    n_params: float,
    arm: Mapping[int, float],
    baseline: Mapping[int, float],
    budget: Mapping[str, Any] | None = None,
) -> Rung:
    """A :class:`Rung` from per-seed values {seed: value} of the arm and the baseline, paired
    by seed (seeds present in only one of the two are left out): d_i = arm_i − baseline_i;
    ``budget`` ({``tokens_per_param``, ``tokens``, ``steps``}, None where unknown) says how
    long its runs trained."""
    seeds = sorted(set(arm) & set(baseline))
    diffs = tuple(float(arm[s]) - float(baseline[s]) for s in seeds)
    b = budget or {}
    return Rung(
        str(setting),
        float(n_params),
        diffs,
        tuple(int(s) for s in seeds),
        tokens_per_param=None
        if b.get("tokens_per_param") is None
        else float(b["tokens_per_param"]),
        tokens=None if b.get("tokens") is None else int(b["tokens"]),
        steps=None if b.get("steps") is None else int(b["steps"]),
    )


def _rung_entry(stats_: RungStats, rung: Rung) -> dict[str, Any]:
    """A rung of :func:`ladder_record`: its setting and N, how long it trained (``rung``'s
    tokens per parameter, tokens and steps), then its statistics."""
    entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(stats_).items()}
    trained = {k: getattr(rung, k) for k in ("tokens_per_param", "tokens", "steps")}
    head = {k: entry.pop(k) for k in ("setting", "n_params")}
    return {**head, **trained, **entry}


def _check_rungs(rungs: Sequence[Rung]) -> list[np.ndarray]:
    if len(rungs) < 2:
        raise ValueError(
            f"rungs: a ladder needs at least two model sizes to fit a trend, got {len(rungs)}"
        )
    arrays = []
    for j, r in enumerate(rungs):
        _finite_positive(r.n_params, f"rungs[{j}].n_params ({r.setting})")
        d = np.asarray(r.diffs, dtype=np.float64)
        if d.ndim != 1 or d.size < 2:
            raise ValueError(
                f"rungs[{j}].diffs ({r.setting}): expected at least 2 paired seeds, got {d.size}"
            )
        if not np.all(np.isfinite(d)):
            raise ValueError(
                f"rungs[{j}].diffs ({r.setting}): expected finite numbers, got {d.tolist()}"
            )
        arrays.append(d)
    if len({float(r.n_params) for r in rungs}) < 2:
        raise ValueError("rungs: a ladder needs at least two distinct parameter counts")
    return arrays


def _pooled_sd(arrays: Sequence[np.ndarray]) -> tuple[float, int]:
    df = sum(a.size - 1 for a in arrays)
    ss = sum(float(np.sum((a - a.mean()) ** 2)) for a in arrays)
    return math.sqrt(ss / df), df


def rung_stats(
    rungs: Sequence[Rung], confidence: float = 0.95, sd_floor: float = DEFAULT_SD_FLOOR
) -> list[RungStats]:
    """Each rung's n, d̄, s, paired t-interval and weight sd s̃_j = max(s_j, f · s_p)."""
    arrays = _check_rungs(rungs)
    pooled, _ = _pooled_sd(arrays)
    out = []
    for r, d in zip(rungs, arrays, strict=True):
        ti = t_interval(d, confidence)
        sd = float(ti.sd or 0.0)
        out.append(
            RungStats(
                r.setting,
                float(r.n_params),
                int(d.size),
                float(d.mean()),
                sd,
                float(ti.low if ti.low is not None else d.mean()),
                float(ti.high if ti.high is not None else d.mean()),
                max(sd, sd_floor * pooled),
                tuple(r.seeds),
                tuple(float(v) for v in d),
            )
        )
    return out


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares line y = a + b x along the last axis (broadcasting over the
    leading ones): b = Σw(x − x̄_w)(y − ȳ_w) / Σw(x − x̄_w)², a = ȳ_w − b x̄_w."""
    sw = w.sum(axis=-1)
    xm = (w * x).sum(axis=-1) / sw
    ym = (w * y).sum(axis=-1) / sw
    dx = x - xm[..., None]
    b = (w * dx * (y - ym[..., None])).sum(axis=-1) / (w * dx * dx).sum(axis=-1)
    return ym - b * xm, b


def _check_floor(sd_floor: float) -> None:
    if not (math.isfinite(sd_floor) and 0.0 <= sd_floor <= 1.0):
        raise ValueError(f"sd_floor: expected a number in [0, 1], got {sd_floor!r}")


def fit_ladder(rungs: Sequence[Rung], sd_floor: float = DEFAULT_SD_FLOOR) -> LadderFit:
    """The weighted line d(N) = a + b · log₁₀ N through the rung means (module docstring), with
    w_j = n_j / s̃_j² and the standard errors of a and b from those weights. Rungs whose
    differences are all equal (s_p = 0) get equal weight per seed."""
    _check_floor(sd_floor)
    arrays = _check_rungs(rungs)
    pooled, df = _pooled_sd(arrays)
    x = np.log10([float(r.n_params) for r in rungs])
    y = np.array([a.mean() for a in arrays])
    n = np.array([a.size for a in arrays], dtype=np.float64)
    sd = np.array([a.std(ddof=1) for a in arrays])
    wsd = np.maximum(sd, sd_floor * pooled)
    w = n / wsd**2 if pooled > 0 else n
    a, b = _wls(x, y, w)
    if pooled > 0:
        sw, xm = w.sum(), float((w * x).sum() / w.sum())
        sxx = float((w * (x - xm) ** 2).sum())
        b_se = math.sqrt(1.0 / sxx)
        a_se = math.sqrt(1.0 / sw + xm**2 / sxx)
    else:
        a_se = b_se = 0.0
    lof = None
    if len(rungs) >= 3 and pooled > 0:
        f_stat = float((w * (y - a - b * x) ** 2).sum()) / (len(rungs) - 2)
        lof = float(stats.f.sf(f_stat, len(rungs) - 2, df))
    return LadderFit(float(a), float(b), a_se, b_se, pooled, df, float(sd_floor), lof)


def _interval(
    draws: np.ndarray, estimate: float, confidence: float, seeds: int | None
) -> TargetInterval:
    lo, hi = np.quantile(draws, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return TargetInterval(
        seeds,
        float(estimate),
        float(lo),
        float(hi),
        float(np.mean(draws > 0)),
        float(np.mean(draws < 0)),
    )


def _checked_target(
    rungs: Sequence[Rung],
    target_params: float,
    confidence: float,
    target_seeds: int,
    n_boot: int,
    sd_floor: float,
) -> tuple[list[np.ndarray], float, float]:
    """The rungs' differences, the target N_t and the largest rung, after checking every
    argument of :func:`predict_ladder` (a ``ValueError`` naming the one that is wrong)."""
    arrays = _check_rungs(rungs)
    _check_floor(sd_floor)
    target = _finite_positive(target_params, "target_params")
    largest = max(float(r.n_params) for r in rungs)
    if target < largest:
        raise ValueError(
            f"target_params: expected at least the largest rung's {largest:.4g} parameters "
            f"(a ladder extrapolates upwards), got {target:.4g}"
        )
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: expected a number in (0, 1), got {confidence!r}")
    if isinstance(target_seeds, bool) or not isinstance(target_seeds, int) or target_seeds < 1:
        raise ValueError(f"target_seeds: expected an integer >= 1, got {target_seeds!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot: expected an integer >= 100, got {n_boot!r}")
    return arrays, target, largest


def _refit_replicates(
    arrays: Sequence[np.ndarray],
    x: np.ndarray,
    xt: float,
    sd_floor: float,
    calibrated: bool,
    rng: np.random.Generator,
    n_boot: int,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Step 1 of the prediction (module docstring): every rung's seeds resampled from its
    centred differences (inflated by √(n / (n − 1)) when ``calibrated``), the line refitted
    with each replicate's own weights; returns μ*_t per replicate and each rung's residuals."""
    means, sds, residuals = [], [], []
    for d in arrays:
        n = d.size
        scale = math.sqrt(n / (n - 1)) if calibrated else 1.0
        res = (d - d.mean()) * scale
        residuals.append(res)
        sample = d.mean() + res[rng.integers(0, n, size=(n_boot, n))]
        means.append(sample.mean(axis=1))
        sds.append(sample.std(axis=1, ddof=1))
    m = np.stack(means, axis=1)  # (B, J)
    s = np.stack(sds, axis=1)
    nj = np.array([d.size for d in arrays], dtype=np.float64)
    pooled = np.sqrt(((nj - 1) * s**2).sum(axis=1) / (nj - 1).sum())
    wsd = np.maximum(s, sd_floor * pooled[:, None])
    w = np.where(wsd > 0, nj / np.where(wsd > 0, wsd, 1.0) ** 2, nj)
    w = np.where((pooled > 0)[:, None], w, nj)
    a, b = _wls(x, m, w)
    return a + b * xt, residuals


def _target_draws(
    estimate: float,
    trend_dev: np.ndarray,
    residuals: list[np.ndarray],
    df: int,
    target_seeds: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 2 and 3: D* = μ̂_t + √g · (μ*_t − μ̂_t + ε*) for one training, for the mean over
    ``target_seeds`` paired trainings, and for the trend (no ε*), g = ν / χ²_ν."""
    pooled = np.concatenate(residuals)
    n_boot = trend_dev.size
    root = np.sqrt(df / rng.chisquare(df, size=n_boot))

    def noise(k: int) -> np.ndarray:
        return pooled[rng.integers(0, pooled.size, size=(n_boot, k))].mean(axis=1)

    single = estimate + root * (trend_dev + noise(1))
    mean_k = estimate + root * (trend_dev + noise(target_seeds))
    return single, mean_k, estimate + root * trend_dev


def predict_ladder(
    rungs: Sequence[Rung],
    target_params: float,
    *,
    confidence: float = 0.95,
    target_seeds: int = 3,
    n_boot: int = DEFAULT_BOOT,
    sd_floor: float = DEFAULT_SD_FLOOR,
    seed: int = 0,
    calibrated: bool = True,
) -> LadderPrediction:
    """The difference at ``target_params`` with its prediction intervals (module docstring):
    for a single training, for the mean over ``target_seeds`` paired trainings, and for the
    trend. ``calibrated=False`` gives the plain bootstrap (no inflation, no seed noise at the
    target, no χ² scale), kept to show how far it under-covers. Deterministic for a given
    ``seed``."""
    arrays, target, largest = _checked_target(
        rungs, target_params, confidence, target_seeds, n_boot, sd_floor
    )
    fit = fit_ladder(rungs, sd_floor)
    xt = math.log10(target)
    estimate = fit.a + fit.b * xt
    x = np.log10([float(r.n_params) for r in rungs])
    rng = np.random.default_rng(seed)
    refit, residuals = _refit_replicates(arrays, x, xt, sd_floor, calibrated, rng, n_boot)
    trend_dev = refit - estimate
    if calibrated:
        single, mean_k, trend = _target_draws(
            estimate, trend_dev, residuals, fit.df, target_seeds, rng
        )
    else:
        single = mean_k = trend = estimate + trend_dev
    return LadderPrediction(
        target,
        largest,
        target / largest,
        float(confidence),
        n_boot,
        calibrated,
        _interval(single, estimate, confidence, 1),
        _interval(mean_k, estimate, confidence, target_seeds),
        _interval(trend, estimate, confidence, None),
    )


def extrapolation_words(prediction: LadderPrediction) -> str:
    """How far the target lies beyond the largest rung, e.g. ``"120× beyond the largest rung
    (1.05e+06 parameters)"``, or ``"at the largest rung"``."""
    f = prediction.extrapolation
    if f <= 1.0 + 1e-9:
        return f"at the largest rung ({prediction.largest_rung:.3g} parameters)"
    return f"{f:.3g}× beyond the largest rung ({prediction.largest_rung:.3g} parameters)"


def _fmt(v: float) -> str:
    return f"{v:+.4g}".replace("-", "\u2212")


def _prediction_record(
    pred: LadderPrediction,
    seed: int,
    *,
    arm: str,
    baseline: str,
    unit: str,
    lower_is_better: bool,
    margin: float | None,
) -> dict[str, Any]:
    """A ladder record's ``prediction``: the method, the three intervals, the word at the
    target (:func:`~normlab.analysis.wording.ladder_words`, from the single-training draws),
    why, and the sentence that says it."""
    s = pred.single
    words = ladder_words(
        s.p_above,
        s.p_below,
        low=s.low,
        high=s.high,
        lower_is_better=lower_is_better,
        confidence=pred.confidence,
        margin=margin,
    )
    sentence = (
        f"At {pred.target_params:.3g} parameters, {extrapolation_words(pred)}, {arm} − "
        f"{baseline} is predicted {_fmt(s.estimate)} {unit} for one training "
        f"({100 * pred.confidence:.3g} % prediction interval {_fmt(s.low)} to {_fmt(s.high)}): "
        f"{words.word} ({words.reason})."
    )
    return {
        "method": "seed bootstrap within rungs, residuals inflated by sqrt(n/(n-1)), "
        "pooled seed noise at the target, chi-square scale with df = sum(n_j - 1)",
        "n_boot": pred.n_boot,
        "seed": seed,
        "confidence": pred.confidence,
        "single": asdict(pred.single),
        "mean_of_seeds": asdict(pred.mean_of_seeds),
        "trend": asdict(pred.trend),
        "word": words.word,
        "reason": words.reason,
        "sentence": sentence,
    }


def ladder_record(
    rungs: Sequence[Rung],
    target_params: float,
    *,
    arm: str,
    baseline: str,
    metric: str,
    unit: str,
    lower_is_better: bool = True,
    margin: float | None = None,
    confidence: float = 0.95,
    target_seeds: int = 3,
    n_boot: int = DEFAULT_BOOT,
    sd_floor: float = DEFAULT_SD_FLOOR,
    seed: int = 0,
) -> dict[str, Any]:
    """One arm's ladder as a JSON-ready dict (declared in :mod:`normlab.run_format.ladder`):
    ``rungs`` (per rung its setting, N, tokens per parameter, tokens and steps, seeds,
    differences, mean, sd, interval and weight sd),
    ``fit`` (model, a, b, their standard errors, pooled sd, ν, floor), ``target`` (N_t, the
    largest rung, the extrapolation factor and its words) and ``prediction`` (method,
    replicates, the three intervals, the word at the target, why, and a sentence)."""
    stats_ = rung_stats(rungs, confidence, sd_floor)
    fit = fit_ladder(rungs, sd_floor)
    pred = predict_ladder(
        rungs,
        target_params,
        confidence=confidence,
        target_seeds=target_seeds,
        n_boot=n_boot,
        sd_floor=sd_floor,
        seed=seed,
    )
    return {
        "arm": arm,
        "baseline": baseline,
        "metric": metric,
        "unit": unit,
        "lower_is_better": bool(lower_is_better),
        "rungs": [_rung_entry(r, rung) for r, rung in zip(stats_, rungs, strict=True)],
        "fit": {
            "model": "d = a + b·log10(N)",
            "weights": "n_j / max(s_j, sd_floor·pooled_sd)^2",
            **asdict(fit),
        },
        "target": {
            "n_params": pred.target_params,
            "largest_rung": pred.largest_rung,
            "extrapolation": pred.extrapolation,
            "words": extrapolation_words(pred),
        },
        "prediction": _prediction_record(
            pred,
            seed,
            arm=arm,
            baseline=baseline,
            unit=unit,
            lower_is_better=lower_is_better,
            margin=margin,
        ),
    }


def ladder_summary(
    records: Sequence[Mapping[str, Any]], learning_rates: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The value of the top-level summary.json's ``ladder`` key: ``arms`` {arm: its
    :func:`ladder_record`} and ``learning_rates`` (:func:`.lr_sweep.lr_sweep_record`, or None
    without a sweep), checked against :data:`normlab.run_format.LADDER_SHAPE`."""
    value = {
        "arms": {str(r["arm"]): dict(r) for r in records},
        "learning_rates": None if learning_rates is None else dict(learning_rates),
    }
    check_ladder(value)
    return value
