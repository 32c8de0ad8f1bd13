"""``normlab report --import KIND:PATH``: runs a tracker already holds → a compare folder.

The tracker's runs are read with its own library (``read_<kind>.py``), each run's arm and seed
are read from its name (or a field) by the ``--arm-from`` / ``--seed-from`` rules
(:class:`RunRule`), and the runs that match both are written as a compare folder in the run
format, judged on ``--metric`` (the script testbed ``script:<field>:min|max``,
:func:`normlab.run_format.testbeds.script_testbed`):

- ``runs/<arm>__s<seed>/run.json``: the arm (recorded as the run's norm: the factor under study),
  the seed, the testbed and the tracker run it came from;
- ``metrics.jsonl``: an ``eval`` record ``{<field>: value}`` at every step the judged metric was
  logged, and a ``train`` record at every step another scalar was, each under the tracker's name
  (a metric called ``loss`` is the training loss that the report plots);
- ``summary.json``: ``final_<field>`` (its last value), ``best_<field>`` (its lowest, or highest
  when higher is better, among the finite values), ``final_train_loss`` (the last ``loss``),
  ``steps`` (the last step any metric was logged) and the status: ``finished``; ``diverged`` at
  the first step where the judged metric or ``loss`` is not finite; ``crashed`` when the
  tracker recorded a failure or the run never logged the judged metric; no summary (unfinished)
  when the tracker says the run has not ended;
- ``experiment.json``: arms (the baseline first, then in name order), seeds, the margin, and the
  :class:`normlab.run_format.imported.ImportRecord` (source, rules, skipped runs, the arms and
  last steps of every seed).

The folder is written under a temporary name beside ``--out`` and renamed into place; an
existing ``--out`` is replaced only when it holds an earlier import of the same source. Every
refusal is one line naming the option (:class:`TrackerImportError`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab._plural import counted
from normlab._version import __version__
from normlab.run_format import (
    CRASHED,
    DIVERGED,
    EVAL_RECORD,
    FINISHED,
    LOCK_FILE,
    TRAIN_RECORD,
    run_id,
)
from normlab.run_format.experiment_record import experiment_record
from normlab.run_format.folder import (
    create_run,
    has_experiment,
    read_experiment,
    write_experiment,
    write_records,
)
from normlab.run_format.imported import IMPORT_KEY, ImportRecord, SkippedRun, same_source
from normlab.run_format.summary import build_summary, finish_run
from normlab.run_format.testbeds import script_format, script_testbed
from normlab.trackers.read_mlflow import read_mlflow
from normlab.trackers.read_table import read_csv, read_jsonl
from normlab.trackers.read_tensorboard import read_tensorboard
from normlab.trackers.read_wandb import read_wandb
from normlab.trackers.tracked import (
    ENDED,
    FAILED,
    ImportUsageError,
    TrackedRun,
    TrackerImportError,
)

__all__ = [
    "FIELD_RULES",
    "KINDS",
    "STATUS_RECORDED",
    "TRAIN_LOSS",
    "ImportPlan",
    "RunRule",
    "check_out",
    "field_name",
    "import_runs",
    "parse_source",
    "plan_import",
    "write_import",
]

KINDS: dict[str, Callable[[Path], list[TrackedRun]]] = {
    "tensorboard": read_tensorboard,
    "mlflow": read_mlflow,
    "wandb": read_wandb,
    "csv": read_csv,
    "jsonl": read_jsonl,
}
"""Each ``KIND`` of ``--import KIND:PATH`` and its reader."""
_WHAT = {
    "tensorboard": "a log folder with event files (events.out.tfevents.*)",
    "mlflow": "the mlruns folder of an MLflow file store",
    "wandb": "a wandb folder with run folders (offline-run-*/run-*.wandb)",
    "csv": "a CSV file, or a folder of them, with columns run, step and metrics",
    "jsonl": "a JSON Lines file, or a folder of them, one object per row",
}
FIELD_RULES: dict[str, tuple[str, ...]] = {"mlflow": ("param", "tag"), "wandb": ("config",)}
"""The fields (besides the run's name) that ``--arm-from`` / ``--seed-from`` may read, by kind:
``param:KEY`` and ``tag:KEY`` of an MLflow run, ``config:KEY`` of a W&B run."""
_PREFIXES = tuple(sorted({p for ps in FIELD_RULES.values() for p in ps}))
STATUS_RECORDED: tuple[str, ...] = ("mlflow", "wandb")
"""The kinds whose trackers record whether a run ended, failed or is still running."""
TRAIN_LOSS = "loss"
"""The tracker metric that becomes the training loss (``final_train_loss``, the report's
training-loss curve) and, with the judged metric, decides divergence."""
_RESERVED = ("type", "step")
"""Keys of a ``metrics.jsonl`` record that no metric may take."""
_SHOWN = 8
"""Names listed in a refusal before the rest are counted."""
_EXAMPLE = {"--arm-from": r"^(.+)_s\d+$", "--seed-from": r"_s(\d+)$"}
"""A rule of each option, for the refusals' words."""
_SEED = re.compile(r"\s*[+-]?\d+\s*")
"""What ``--seed-from`` must read: an integer."""


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def parse_source(source: str) -> tuple[str, Path]:
    """(kind, absolute path) of ``KIND:PATH``; naming ``--import``, :class:`ImportUsageError`
    for an unknown kind or no path, :class:`TrackerImportError` for a path that does not
    exist."""
    kind, sep, raw = source.partition(":")
    if not sep or kind not in KINDS:
        raise ImportUsageError(
            f"--import: {source!r} names no known kind; expected KIND:PATH with KIND one of "
            f"{', '.join(KINDS)}"
        )
    if not raw:
        raise ImportUsageError(f"--import: {source!r} names no path; expected {kind}:PATH")
    path = Path(raw).expanduser().absolute()
    if not path.exists():
        raise TrackerImportError(f"--import: {raw!r} does not exist; expected {_WHAT[kind]}")
    return kind, path


def field_name(metric: str) -> str:
    """The run format's name of the tracker metric ``metric``: every character other than a
    letter, digit, ``_`` or ``.`` becomes ``_`` (``val/loss`` → ``val_loss``), ``m_`` is put
    before a name that does not start with a letter or ``_``, and ``_`` after ``type`` and
    ``step`` (keys of every record)."""
    name = re.sub(r"[^A-Za-z0-9_.]", "_", metric)
    if not re.match(r"[A-Za-z_]", name):
        name = "m_" + name
    return name + "_" if name in _RESERVED else name


@dataclass(frozen=True)
class RunRule:
    """How ``--arm-from`` or ``--seed-from`` reads a run's arm or seed.

    ``REGEX`` is searched for in the run's name; ``PREFIX:KEY=REGEX`` in the run's field
    ``PREFIX:KEY`` (:data:`FIELD_RULES`), and ``PREFIX:KEY`` alone takes the field's whole
    value. The regex's first group is the value (its whole match when it has no group); a run
    it does not match, or whose field is absent, gives None.
    """

    option: str
    text: str
    pattern: re.Pattern[str]
    field: str | None = None

    @classmethod
    def parse(cls, option: str, text: str, kind: str) -> RunRule:
        """The rule ``text`` of ``option`` for runs of ``kind``; :class:`ImportUsageError`
        naming ``option`` when its regex does not compile or it reads a field ``kind`` runs do
        not have."""
        fields, regex, prefix = None, text, text.partition(":")[0]
        if ":" in text and prefix in _PREFIXES:
            allowed = FIELD_RULES.get(kind, ())
            if prefix not in allowed:
                other = f" or {', '.join(p + ':KEY' for p in allowed)}" if allowed else ""
                raise ImportUsageError(
                    f"{option}: '{text}' reads a {prefix}: field, which {kind} runs do not "
                    f"have; expected a regex on the run's name{other}"
                )
            key, sep, regex = text[len(prefix) + 1 :].partition("=")
            if not key:
                raise ImportUsageError(
                    f"{option}: '{text}' names no key; expected {prefix}:KEY or {prefix}:KEY=REGEX"
                )
            fields = f"{prefix}:{key}"
            if not sep:
                regex = r"(?s).+"  # the whole value
        if not regex:
            raise ImportUsageError(
                f"{option}: expected a regex whose first group is the run's "
                f"{'arm' if 'arm' in option else 'seed'}, e.g. '{_EXAMPLE[option]}'"
            )
        try:
            pattern = re.compile(regex)
        except re.error as err:
            raise ImportUsageError(
                f"{option}: '{regex}' is not a regular expression ({err}); expected e.g. "
                f"'{_EXAMPLE[option]}'"
            ) from None
        return cls(option, text, pattern, fields)

    @property
    def where(self) -> str:
        """What the rule reads, in words ("its name", "its param:norm")."""
        return "its name" if self.field is None else f"its {self.field}"

    def read(self, run: TrackedRun) -> str | None:
        """The rule's value for ``run`` (the first group, or the whole match), or None."""
        value = run.name if self.field is None else run.fields.get(self.field)
        match = self.pattern.search(value) if value is not None else None
        if match is None:
            return None
        found = match.group(1) if self.pattern.groups else match.group(0)
        return found or None


@dataclass
class ImportPlan:
    """What an import writes: the source, the judged metric, the arms (baseline first), the
    seeds, the selected runs by (arm, seed), the tracker runs left out with why, and whether a
    run that ended earlier than another of its seed is compared (``compare_unequal_steps``) or
    was left out."""

    kind: str
    path: Path
    metric: str
    lower_is_better: bool
    margin: float | None
    arm_rule: RunRule
    seed_rule: RunRule
    arms: list[str]
    seeds: list[int]
    runs: dict[tuple[str, int], TrackedRun]
    skipped: list[SkippedRun] = field(default_factory=list)
    compare_unequal_steps: bool = False

    @property
    def metric_field(self) -> str:
        """The judged metric's name in the run format (:func:`field_name`)."""
        return field_name(self.metric)

    @property
    def testbed(self) -> str:
        """``script:<field>:min|max``."""
        return script_testbed(self.metric_field, self.lower_is_better)

    @property
    def source(self) -> str:
        """``KIND:PATH``, the path absolute."""
        return f"{self.kind}:{self.path}"

    def run_ids(self) -> list[str]:
        """The run ids, seed-major (every arm of the first seed, then the next …)."""
        return [
            run_id(arm, seed)
            for seed in self.seeds
            for arm in self.arms
            if (arm, seed) in self.runs
        ]


def _read(kind: str, path: Path) -> list[TrackedRun]:
    """The runs of ``path`` as the ``kind`` reader returns them; an error of the tracker's
    library on a store it cannot read (damaged or of another version) becomes one line naming
    ``--import``."""
    try:
        return KINDS[kind](path)
    except TrackerImportError:
        raise
    except Exception as err:  # the tracker library's own errors (MlflowException, DecodeError…)
        raise TrackerImportError(
            f"--import: {kind} could not read {str(path)!r} ({type(err).__name__}: {err}); "
            f"expected {_WHAT[kind]}"
        ) from err


def _check_options(metric: str, margin: float | None) -> None:
    if not metric or not metric.strip():
        raise ImportUsageError(
            "--metric: expected the name of the metric that decides quality, as the tracker "
            "logged it (e.g. --metric val_loss)"
        )
    if margin is not None and (not math.isfinite(margin) or margin <= 0):
        raise ImportUsageError(
            f"--margin: expected the difference in {metric} that does not matter to you (the "
            f"equivalence margin, in its unit, e.g. --margin 0.01; a number > 0), got {margin!r}"
        )


def _seed(text: str, run: TrackedRun, rule: RunRule) -> int:
    if not _SEED.fullmatch(text):
        raise TrackerImportError(
            f"{rule.option}: run {run.name!r} gives the seed {text!r}; expected an integer "
            f"(the regex's first group, e.g. '{_EXAMPLE['--seed-from']}')"
        )
    return int(text)


def _check_arm_names(arms: dict[str, str], rule: RunRule) -> None:
    """Refuse an arm that cannot name a run folder, and arms whose folders would clash on a
    file system that ignores case. ``arms``: {arm: a run that gives it}."""
    folded: dict[str, str] = {}
    for arm, run in arms.items():
        if "/" in arm or "\\" in arm or "\x00" in arm or arm.strip(".") == "":
            raise TrackerImportError(
                f"{rule.option}: run {run!r} gives the arm {arm!r}, which cannot name a run "
                "folder; expected a name without '/' or '\\' that is not only dots"
            )
        other = folded.setdefault(arm.casefold(), arm)
        if other != arm:
            raise TrackerImportError(
                f"{rule.option}: the arms {other!r} and {arm!r} differ only in case, so their run "
                "folders would clash on a case-insensitive file system; expected arm names "
                "that differ in more than case"
            )


def _left_out(run: TrackedRun, arm: str | None, seed: int | None, why: str) -> SkippedRun:
    """A run left out for what it logged, named with its arm and seed when its rules gave
    them."""
    entry: SkippedRun = {"run": run.name, "reason": why}
    if arm is not None and seed is not None:
        entry.update(arm=arm, seed=seed)
    return entry


def _damaged(run: TrackedRun, arm: str | None, seed_text: str | None) -> SkippedRun:
    """A run whose source is damaged (:attr:`TrackedRun.damage`): left out, never judged on
    the values read before the damage."""
    seed = int(seed_text) if seed_text and _SEED.fullmatch(seed_text) else None
    why = f"its source is damaged: {run.damage}; never judged on what was read before the damage"
    return _left_out(run, arm, seed, why)


def _select(
    found: list[TrackedRun], arm_rule: RunRule, seed_rule: RunRule
) -> tuple[dict[tuple[str, int], TrackedRun], list[SkippedRun]]:
    """The runs that both rules match, by (arm, seed), and those left out with why: a run a
    rule does not match, and a run whose source is damaged."""
    names = [r.name for r in found]
    read = [(r, arm_rule.read(r), seed_rule.read(r)) for r in found]
    for rule, index in ((arm_rule, 1), (seed_rule, 2)):
        if all(item[index] is None for item in read):
            raise TrackerImportError(
                f"{rule.option}: '{rule.text}' matched none of the {counted(len(found), 'run')} "
                f"({_listed(names)}); expected a regex (or field rule) that {rule.where} matches"
            )
    selected: dict[tuple[str, int], TrackedRun] = {}
    skipped: list[SkippedRun] = []
    for run, arm, seed_text in read:
        if run.damage is not None:
            skipped.append(_damaged(run, arm, seed_text))
            continue
        if arm is None or seed_text is None:
            rule = arm_rule if arm is None else seed_rule
            reason = f"{rule.option} '{rule.text}' did not match {rule.where}"
            skipped.append({"run": run.name, "reason": reason})
            continue
        key = (arm, _seed(seed_text, run, seed_rule))
        if key in selected:
            raise TrackerImportError(
                f"--arm-from/--seed-from: runs {selected[key].name!r} and {run.name!r} both give "
                f"arm {key[0]!r}, seed {key[1]}; expected one run per arm and seed (narrow the "
                "rules, or import the two groups into separate folders)"
            )
        selected[key] = run
    return selected, skipped


def _ended_whole(metric: str, run: TrackedRun) -> bool:
    """Whether ``run`` ended as a result that its last value stands for: the tracker says it
    ended, it logged ``metric``, and never diverged."""
    return run.status == ENDED and bool(run.series.get(metric)) and not _diverged_at(metric, run)


def _short_runs(
    selected: dict[tuple[str, int], TrackedRun], metric: str
) -> dict[tuple[str, int], SkippedRun]:
    """The runs that ended (:func:`_ended_whole`) at an earlier step than another run of their
    seed that ended so, each with why: compared, its last value would stand against theirs from
    a later step of training."""
    short: dict[tuple[str, int], SkippedRun] = {}
    for seed in sorted({s for _, s in selected}):
        ended = {
            arm: run.last_step
            for (arm, s), run in sorted(selected.items())
            if s == seed and run.last_step is not None and _ended_whole(metric, run)
        }
        longest = max(ended.values(), default=None)
        later = [arm for arm, step in ended.items() if step == longest]
        for arm, step in ended.items():
            if longest is not None and step is not None and step < longest:
                why = (
                    f"it ends at step {step}, before step {longest} where {', '.join(later)} of "
                    f"seed {seed} end: its last value is from an earlier step of training, so it "
                    "is not compared with theirs (--compare-unequal-steps compares it)"
                )
                short[arm, seed] = _left_out(selected[arm, seed], arm, seed, why)
    return short


def plan_import(
    source: str,
    arm_from: str,
    seed_from: str,
    metric: str,
    lower_is_better: bool = True,
    margin: float | None = None,
    baseline: str | None = None,
    compare_unequal_steps: bool = False,
) -> ImportPlan:
    """Read the runs of ``source`` (``KIND:PATH``) and decide what to import; every check that
    refuses the import is made here, before anything is written.

    Left out (listed in the plan's ``skipped`` with why): a run a rule does not match, a run
    whose source is damaged or cut short (:attr:`TrackedRun.damage`), and unless
    ``compare_unequal_steps``, a run that ended at an earlier step than another of its seed
    (:func:`_short_runs`). Raises :class:`ImportUsageError` naming the option for an unknown
    kind (``--import``), a margin that is not a number > 0 (``--margin``), a rule that does not
    compile (``--arm-from``, ``--seed-from``); :class:`TrackerImportError` for a missing path,
    a source that cannot be read, damage the reader cannot pin on one run, no runs found, a rule
    that matched no run, a seed that is not an integer, an arm that cannot name a folder or
    clashes with another, two runs for one arm and seed, fewer than two arms, a metric no run
    logged (naming those that exist), a baseline that is not an arm."""
    kind, path = parse_source(source)
    _check_options(metric, margin)
    arm_rule = RunRule.parse("--arm-from", arm_from, kind)
    seed_rule = RunRule.parse("--seed-from", seed_from, kind)
    found = _read(kind, path)
    if not found:
        raise TrackerImportError(
            f"--import: no {kind} runs found in {str(path)!r}; expected {_WHAT[kind]}"
        )
    selected, skipped = _select(found, arm_rule, seed_rule)
    if not compare_unequal_steps:
        short = _short_runs(selected, metric)
        selected = {key: run for key, run in selected.items() if key not in short}
        skipped += short.values()
    if not selected:
        raise TrackerImportError(
            f"--arm-from/--seed-from: no run matched both rules ({_listed([r.name for r in found])}"
            "); expected rules that give every run to compare an arm and a seed"
        )
    arms = _check_arms(selected, arm_rule, metric, baseline, skipped)
    base = baseline or arms[0]
    return ImportPlan(
        kind=kind,
        path=path,
        metric=metric,
        lower_is_better=lower_is_better,
        margin=None if margin is None else float(margin),
        arm_rule=arm_rule,
        seed_rule=seed_rule,
        arms=[base, *(a for a in arms if a != base)],
        seeds=sorted({seed for _, seed in selected}),
        runs=selected,
        skipped=skipped,
        compare_unequal_steps=compare_unequal_steps,
    )


def _check_arms(
    selected: dict[tuple[str, int], TrackedRun],
    arm_rule: RunRule,
    metric: str,
    baseline: str | None,
    skipped: list[SkippedRun],
) -> list[str]:
    """The arms of the selected runs in name order, after refusing arms that cannot name a
    folder or clash, fewer than two arms (naming the runs left out for what they logged), a
    metric no run logged and a baseline that is not an arm."""
    arm_runs = {arm: run.name for (arm, _), run in sorted(selected.items())}
    _check_arm_names(arm_runs, arm_rule)
    if len(arm_runs) < 2:
        ((arm, run),) = arm_runs.items()
        left = [f"{s['run']} ({s['reason']})" for s in skipped if "arm" in s]
        also = f"; left out: {'; '.join(left)}" if left else ""
        raise TrackerImportError(
            f"--arm-from: every run gives the one arm {arm!r} (e.g. {run!r}); expected two or "
            f"more arms to compare{also}"
        )
    logged = sorted({m for run in selected.values() for m in run.series})
    if metric not in logged:
        raise TrackerImportError(
            f"--metric: no run logged {metric!r}; the runs logged "
            f"{_listed(logged) if logged else 'no scalar metric'}"
        )
    arms = sorted(arm_runs)
    if baseline is not None and baseline not in arms:
        raise TrackerImportError(
            f"--baseline: {baseline!r} is not an arm; expected one of {_listed(arms)}"
        )
    return arms


def check_out(out: Path, kind: str, path: Path) -> None:
    """Refuse ``out`` unless it does not exist, is empty (but for a lock file), or holds an
    earlier import of the same source (:func:`normlab.run_format.imported.same_source`)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TrackerImportError(f"--out: {str(out)!r} is a file; expected a folder")
    if not out.is_dir() or not [e for e in out.iterdir() if e.name != LOCK_FILE]:
        return
    try:
        earlier = has_experiment(out) and same_source(read_experiment(out), kind, str(path))
    except (OSError, ValueError) as exc:
        raise TrackerImportError(
            f"--out: {str(out)!r} holds an experiment.json that cannot be read ({exc}); "
            "nothing was written: restore it, or give a new or empty folder"
        ) from exc
    if not earlier:
        raise TrackerImportError(
            f"--out: {str(out)!r} is not empty and holds no earlier import of {kind}:{path}; "
            "expected a new or empty folder, or the --out of an earlier import of that source "
            "(which it replaces)"
        )


def _diverged_at(metric: str, run: TrackedRun) -> int | None:
    """The first step at which ``metric`` or the training loss was not finite, or None."""
    steps = [
        step
        for name in {metric, TRAIN_LOSS}
        for step, value in run.series.get(name, [])
        if not math.isfinite(value)
    ]
    return min(steps) if steps else None


def _summary(plan: ImportPlan, spec: dict[str, Any], run: TrackedRun) -> dict[str, Any] | None:
    """The run's ``summary.json`` (:func:`normlab.run_format.summary.build_summary`; None: the
    tracker says it has not ended, so it has none)."""
    if run.status not in (ENDED, FAILED):
        return None
    fmt = script_format(plan.metric_field, plan.lower_is_better)
    values = [v for _, v in run.series.get(plan.metric, [])]
    source = {"source_run": run.name}
    if run.status == FAILED or not values:
        error = run.status_note or (
            f"the tracker run {run.name!r} logged no value of {plan.metric!r}"
        )
        failed = {"steps": run.last_step, "error": error, "traceback": ""}
        return build_summary(fmt, spec, CRASHED, failed, extra=source)
    diverged = _diverged_at(plan.metric, run)
    loss = run.series.get(TRAIN_LOSS)
    measured = {
        "steps": run.last_step,
        "diverged_at": diverged,
        "final_train_loss": loss[-1][1] if loss else None,
    }
    status = DIVERGED if diverged is not None else FINISHED
    return build_summary(
        fmt, spec, status, measured, logged={plan.metric_field: values}, extra=source
    )


def _records(plan: ImportPlan, run: TrackedRun) -> list[dict[str, Any]]:
    """``train`` records of every other scalar and ``eval`` records of the judged metric, by
    step (train before eval at a step)."""
    train: dict[int, dict[str, float]] = {}
    for name, points in run.series.items():
        if name == plan.metric or name in _RESERVED:
            continue
        for step, value in points:
            train.setdefault(step, {})[name] = value
    evals = dict(run.series.get(plan.metric, []))
    records: list[dict[str, Any]] = []
    for step in sorted(set(train) | set(evals)):
        if step in train:
            records.append({"type": TRAIN_RECORD, "step": step, **train[step]})
        if step in evals:
            records.append({"type": EVAL_RECORD, "step": step, plan.metric_field: evals[step]})
    return records


def import_record(plan: ImportPlan) -> ImportRecord:
    """The :class:`normlab.run_format.imported.ImportRecord` of ``plan``."""
    seeds: dict[str, dict[str, int | None]] = {}
    for (arm, seed), run in sorted(plan.runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        seeds.setdefault(str(seed), {})[arm] = run.last_step
    return {
        "kind": plan.kind,
        "path": str(plan.path),
        "metric": plan.metric,
        "field": plan.metric_field,
        "arm_from": plan.arm_rule.text,
        "seed_from": plan.seed_rule.text,
        "runs": {run_id(a, s): r.name for (a, s), r in sorted(plan.runs.items())},
        "skipped": list(plan.skipped),
        "seeds": seeds,
        "status_recorded": plan.kind in STATUS_RECORDED,
        "compare_unequal_steps": plan.compare_unequal_steps,
    }


def _experiment(plan: ImportPlan) -> dict[str, Any]:
    """``experiment.json``: the fields the analysis reads, as for a ``compare --script``
    (:func:`normlab.run_format.experiment_record.experiment_record`), and the import record."""
    return experiment_record(
        testbed=plan.testbed,
        arms=plan.arms,
        baseline_arm=plan.arms[0],
        seeds=plan.seeds,
        margin=plan.margin,
        factors={"norm": plan.arms},
        settings={"import.source": plan.source, "import.metric": plan.metric},
        config={
            "import": plan.source,
            "arm_from": plan.arm_rule.text,
            "seed_from": plan.seed_rule.text,
            "metric": plan.metric,
            "lower_is_better": plan.lower_is_better,
            "margin": plan.margin,
            "baseline": plan.arms[0],
        },
        environment={"normlab_version": __version__, "device": "not recorded (imported)"},
        runs=plan.run_ids(),
        extra={IMPORT_KEY: import_record(plan)},
    )


def _swap(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out``, replacing what ``out`` held."""
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.parent / f".{out.name}.replaced-{uuid.uuid4().hex[:12]}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_import(plan: ImportPlan, out: Path) -> Path:
    """Write ``plan`` as the compare folder ``out``: every file under a temporary folder beside
    it, then that folder renamed into place (replacing ``out`` if it exists). Returns ``out``."""
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.import-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        for (arm, seed), run in plan.runs.items():
            spec = {
                "run_id": run_id(arm, seed),
                "arm": arm,
                "seed": seed,
                "norm": arm,
                "testbed": plan.testbed,
                "source": {"kind": plan.kind, "run": run.name},
            }
            folder = create_run(tmp, spec)
            write_records(folder, _records(plan, run))
            summary = _summary(plan, spec, run)
            if summary is not None:
                finish_run(folder, summary)
        write_experiment(tmp, _experiment(plan))
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def import_runs(
    source: str,
    arm_from: str,
    seed_from: str,
    metric: str,
    out: Path,
    lower_is_better: bool = True,
    margin: float | None = None,
    baseline: str | None = None,
    compare_unequal_steps: bool = False,
) -> ImportPlan:
    """Import the runs of ``source`` (``KIND:PATH``) into the compare folder ``out``: check
    ``out`` (:func:`check_out`), read and check the runs (:func:`plan_import`), write the
    folder (:func:`write_import`). Returns the plan. Raises :class:`TrackerImportError` (one
    line naming the option) for anything the user can fix."""
    kind, path = parse_source(source)
    check_out(Path(out), kind, path)
    plan = plan_import(
        source,
        arm_from,
        seed_from,
        metric,
        lower_is_better,
        margin,
        baseline,
        compare_unequal_steps,
    )
    write_import(plan, out)
    return plan
