"""Each arm at its own best learning rate: the choice from a sweep on tuning seeds.

A comparison at one shared learning rate is partly a comparison of learning rates, so every arm
is first trained at each rate r of a sweep on tuning seeds (disjoint from the evaluation seeds,
so the choice does not bias the comparison that follows), and the comparison runs each arm at
its best rate. For one arm, with L_ir the loss of tuning seed i at rate r:

- the curve: per rate, n seeds, the mean L̄_r, the sd (n − 1 denominator) and the t-interval of
  the mean (:func:`.stats.t_interval`); a run that diverged (a missing or non-finite loss)
  counts in ``n_diverged`` and leaves its rate without a mean;
- the best rate r* = argmin_r L̄_r over the rates where no tuning seed diverged;
- the edge flag: r* is the sweep's lowest or highest rate, so the optimum may lie outside it and
  the sweep should be extended that way.

Under μP the optimum found at one width should hold at every width; :func:`optimum_alignment`
reports each arm's r* per width, how many sweep steps apart they lie, and the rates the tuning
seeds cannot tell from the best at each width (:func:`tied_rates`: no seed diverged and
|L̄_r − L̄_r*| ≤ max(sd_r, sd_r*), one seed's spread). With a few seeds and short runs
neighbouring rates are often within that noise, so the argmin jumps between them: the optimum
lines up when some rate is tied with the best at every width; without a spread (one tuning
seed) when the best rates lie at most one sweep step apart.
:func:`sweep_lines` says all of it in words (the terminal and the ladder report print them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from normlab.analysis.stats import t_interval

__all__ = [
    "PLAIN_SWEEP_SETTING",
    "LrCurve",
    "LrPoint",
    "OptimumAlignment",
    "chosen_rate",
    "lr_sweep_record",
    "optimum_alignment",
    "select_learning_rates",
    "sweep_lines",
    "tied_rates",
    "tuning_seed_words",
    "tuning_seeds",
]

PLAIN_SWEEP_SETTING = "this size"
"""How the record and the words of a sweep without a ladder name its one setting."""


@dataclass(frozen=True)
class LrPoint:
    """One rate of an arm's sweep: n finished tuning seeds, ``n_diverged`` diverged ones, the
    mean loss, its sd and t-interval [low, high] (None where no seed finished, or fewer than
    two for sd and interval)."""

    rate: float
    n: int
    n_diverged: int
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class LrCurve:
    """An arm's loss against learning rate (``points`` in increasing rate), its ``best`` rate,
    the best mean loss, and ``edge``: ``"lowest"`` / ``"highest"`` when the best is at that end
    of the sweep, else None."""

    arm: str
    points: tuple[LrPoint, ...]
    best: float
    best_mean: float
    edge: str | None


@dataclass(frozen=True)
class OptimumAlignment:
    """An arm's best rate per width (``best``: {setting: rate}), ``steps``, the largest
    distance between them in sweep positions (0: the same rate at every width), ``tied``:
    {setting: the rates tied with its best (:func:`tied_rates`)}, ``common``: the rates tied
    with the best at every width, and ``aligned``: ``common`` is not empty, or, where a
    setting's best rate has no spread (one tuning seed), ``steps`` ≤ 1."""

    arm: str
    best: dict[str, float]
    steps: int
    aligned: bool
    tied: dict[str, list[float]]
    common: list[float]


def _rate(value: Any, where: str) -> float:
    try:
        r = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: expected a positive learning rate, got {value!r}") from err
    if not (math.isfinite(r) and r > 0):
        raise ValueError(f"{where}: expected a positive learning rate, got {value!r}")
    return r


def _loss(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _point(rate: float, values: Sequence[float | None], confidence: float) -> LrPoint:
    finite = [v for v in (_loss(x) for x in values) if v is not None]
    diverged = len(values) - len(finite)
    if not finite:
        return LrPoint(rate, 0, diverged, None, None, None, None)
    ti = t_interval(np.asarray(finite), confidence)
    return LrPoint(rate, len(finite), diverged, ti.mean, ti.sd, ti.low, ti.high)


def select_learning_rates(
    losses: Mapping[str, Mapping[float, Sequence[float | None]]], confidence: float = 0.95
) -> dict[str, LrCurve]:
    """Each arm's curve and best rate from ``losses``: {arm: {rate: [loss per tuning seed]}}
    (None or a non-finite loss: the run diverged). The best rate minimises the mean over tuning
    seeds among the rates where none diverged; lower loss is better.

    Refused with one line naming the argument: a sweep with fewer than two rates, a rate that
    is not positive, a rate without tuning seeds, an arm where every rate has a diverged seed.
    """
    if not losses:
        raise ValueError("losses: expected {arm: {rate: [loss per tuning seed]}}, got none")
    out: dict[str, LrCurve] = {}
    for arm, by_rate in losses.items():
        rates = {_rate(r, f"losses[{arm!r}]"): v for r, v in by_rate.items()}
        if len(rates) < 2:
            raise ValueError(
                f"losses[{arm!r}]: a learning-rate sweep needs at least two rates, got "
                f"{sorted(rates)}"
            )
        points = []
        for r in sorted(rates):
            values = list(rates[r])
            if not values:
                raise ValueError(f"losses[{arm!r}][{r:g}]: expected one loss per tuning seed")
            points.append(_point(r, values, confidence))
        usable = [p for p in points if p.n_diverged == 0 and p.mean is not None]
        if not usable:
            raise ValueError(
                f"losses[{arm!r}]: a tuning seed diverged at every rate; extend the sweep "
                "towards lower rates"
            )
        best = min(usable, key=lambda p: (p.mean, p.rate))
        edge = None
        if best.rate == points[0].rate:
            edge = "lowest"
        elif best.rate == points[-1].rate:
            edge = "highest"
        assert best.mean is not None
        out[arm] = LrCurve(str(arm), tuple(points), best.rate, best.mean, edge)
    return out


def optimum_alignment(curves: Mapping[str, Mapping[str, LrCurve]]) -> list[OptimumAlignment]:
    """For ``curves`` = {setting (a width): {arm: curve}}, each arm's best rate per setting and
    the largest distance between them in positions of the sorted union of swept rates."""
    if len(curves) < 1:
        raise ValueError("curves: expected {setting: {arm: LrCurve}}, got none")
    arms: list[str] = []
    for by_arm in curves.values():
        arms += [a for a in by_arm if a not in arms]
    out = []
    for arm in arms:
        mine = {s: c[arm] for s, c in curves.items() if arm in c}
        best = {s: c.best for s, c in mine.items()}
        grid = sorted({p.rate for c in mine.values() for p in c.points})
        pos = [grid.index(r) for r in best.values()]
        steps = max(pos) - min(pos)
        tied = {s: tied_rates(c) for s, c in mine.items()}
        common = sorted(set.intersection(*(set(t) for t in tied.values())))
        spread = all(_best_point(c).sd is not None for c in mine.values())
        aligned = bool(common) if spread else steps <= 1
        out.append(OptimumAlignment(arm, best, steps, aligned, tied, common))
    return out


def _best_point(curve: LrCurve) -> LrPoint:
    return next(p for p in curve.points if p.rate == curve.best)


def tied_rates(curve: LrCurve) -> list[float]:
    """The rates of ``curve`` its tuning seeds cannot tell from the best (the best included):
    no seed diverged there and |L̄_r − L̄_r*| ≤ max(sd_r, sd_r*), the larger of the two rates'
    seed spreads; a rate without a spread (one seed) is tied only if its mean equals the
    best's."""
    best = _best_point(curve)
    out = []
    for p in curve.points:
        if p.mean is None or p.n_diverged:
            continue
        noise = max(p.sd or 0.0, best.sd or 0.0)
        if abs(p.mean - curve.best_mean) <= noise:
            out.append(p.rate)
    return out


def tuning_seeds(count: int, evaluation_seeds: Iterable[int]) -> list[int]:
    """``count`` tuning seeds disjoint from ``evaluation_seeds``: the next integers after the
    largest evaluation seed (0, 1, 2 evaluate → 3, 4, … tune)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an integer >= 1 tuning seeds, got {count!r}")
    seeds = [int(s) for s in evaluation_seeds]
    start = max(seeds) + 1 if seeds else 0
    return list(range(start, start + count))


def chosen_rate(curves: Mapping[str, Mapping[str, LrCurve]], setting: str, arm: str) -> float:
    """The rate ``arm`` runs at when ``setting``'s sweep chooses for other widths too (μP): its
    best there, unless other settings were swept (a μP ladder checks the base width's choice at
    its largest swept rung) and the base width's tuning seeds cannot tell several rates apart
    (:func:`tied_rates`): then, of those tied rates, the one with the lowest mean at the widest
    other setting that measured them (the nearest to the sizes the ladder predicts), so a tie at
    the small width is not broken by its noise."""
    curve = curves[setting][arm]
    tied = tied_rates(curve)
    others = [s for s in curves if s != setting and arm in curves[s]]
    if len(tied) < 2 or not others:
        return curve.best
    check = curves[others[-1]][arm]
    means = {p.rate: p.mean for p in check.points if p.mean is not None and not p.n_diverged}
    ranked = [r for r in tied if r in means]
    return min(ranked, key=lambda r: (means[r], r)) if ranked else curve.best


def _chosen(
    curves: Mapping[str, Mapping[str, LrCurve]], setting: str, where: Mapping[str, str]
) -> dict[str, float]:
    """{arm: rate} of the rungs that run ``setting``'s choice: :func:`chosen_rate` where other
    rungs run it too (the rate is carried across widths, as under μP), else each arm's best."""
    carried = any(r != setting for r, s in where.items() if s == setting)
    curve = curves[setting]
    return {a: chosen_rate(curves, setting, a) if carried else c.best for a, c in curve.items()}


def lr_sweep_record(
    curves: Mapping[str, Mapping[str, LrCurve]],
    seeds: Sequence[int] = (),
    chosen_at: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The sweep as a JSON-ready dict: ``tuning_seeds``, ``settings``: {setting: {arm: {best,
    best_mean, edge, points: [{rate, n, n_diverged, mean, sd, low, high}]}}}, ``alignment``:
    [{arm, best: {setting: rate}, steps, aligned, tied: {setting: [rate]}, common: [rate]}],
    ``chosen_at``: {rung: the setting whose
    best rates it runs} (``chosen_at`` given, else every swept setting its own) and ``chosen``:
    {rung: {arm: the rate its comparison runs the arm at}}."""
    where = dict(chosen_at) if chosen_at is not None else {s: s for s in curves}
    missing = [f"{r} ← {s}" for r, s in where.items() if s not in curves]
    if missing:
        raise ValueError(f"chosen_at: expected swept settings, got {', '.join(missing)}")
    return {
        "tuning_seeds": [int(s) for s in seeds],
        "chosen_at": where,
        "chosen": {r: _chosen(curves, s, where) for r, s in where.items()},
        "settings": {
            s: {
                arm: {
                    "best": c.best,
                    "best_mean": c.best_mean,
                    "edge": c.edge,
                    "points": [asdict(p) for p in c.points],
                }
                for arm, c in by_arm.items()
            }
            for s, by_arm in curves.items()
        },
        "alignment": [asdict(a) for a in optimum_alignment(curves)],
    }


def _rates(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)


def tuning_seed_words(seeds: Sequence[int]) -> str:
    """``tuning seed 3`` or ``tuning seeds 3, 4``."""
    return f"tuning seed{'' if len(seeds) == 1 else 's'} {', '.join(map(str, seeds))}"


def sweep_lines(record: Mapping[str, Any], metric: str = "loss") -> list[str]:
    """The sweep record (:func:`lr_sweep_record`, as summary.json holds it) in words, one
    sentence a line: per swept setting each arm's best rate and its mean ``metric`` on the
    tuning seeds; a best rate at the sweep's edge, with the way to extend it; a rate where a
    tuning seed diverged; the rates each rung runs at; and, when the same arm was swept at
    several settings, whether its optimum lines up (:func:`optimum_alignment`)."""
    seeds = record.get("tuning_seeds", [])
    lines = []
    for setting, by_arm in record["settings"].items():
        best = "; ".join(
            f"{arm} best {c['best']:g} ({metric} {c['best_mean']:.4f})" for arm, c in by_arm.items()
        )
        rates = sorted({p["rate"] for c in by_arm.values() for p in c["points"]})
        lines.append(
            f"learning-rate sweep at {setting} (rates {_rates(rates)}; "
            f"{tuning_seed_words(seeds)}): {best}"
        )
        for arm, c in by_arm.items():
            if c["edge"] is not None:
                way = "lower" if c["edge"] == "lowest" else "higher"
                lines.append(
                    f"warning: at {setting} the best rate of {arm} ({c['best']:g}) is the "
                    f"sweep's {c['edge']}; its optimum may lie beyond it: extend --lr-sweep to "
                    f"{way} rates"
                )
            diverged = [p["rate"] for p in c["points"] if p["n_diverged"]]
            if diverged:
                lines.append(
                    f"note: at {setting} a tuning seed of {arm} diverged at {_rates(diverged)}"
                )
    for rung, setting in record.get("chosen_at", {}).items():
        rates = record["chosen"][rung]
        source = "" if rung == setting else f" (chosen at {setting})"
        shown = ", ".join(f"{a} {r:g}" for a, r in rates.items())
        lines.append(f"{rung}: each arm at its own best rate{source}: {shown}")
    if len(record["settings"]) > 1:
        for a in record.get("alignment", []):
            lines.append(_alignment_words(a))
    return lines


def _alignment_words(a: Mapping[str, Any]) -> str:
    """One alignment record in words: the best rate per setting, their distance, the rates tied
    with the best at every setting, and whether the optimum lines up."""
    at = ", ".join(f"{r:g} at {s}" for s, r in a["best"].items())
    apart = f"{a['steps']} sweep step{'' if a['steps'] == 1 else 's'} apart"
    common = a.get("common") or []
    if common:
        within = f"within the tuning seeds' spread of the best at every setting: {_rates(common)}"
    else:
        within = "no rate is within the tuning seeds' spread of the best at every setting"
    verdict = "lines up" if a["aligned"] else "does not line up"
    return f"optimum of {a['arm']}: {at}, {apart}; {within}: {verdict}"
