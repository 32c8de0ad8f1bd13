"""Load the output folder of ``normlab compare`` (docs/run-format.md) into plain records.

Only the files on disk are read: ``experiment.json``, ``data/data.json`` and, for every run,
``runs/<run_id>/run.json`` and ``summary.json``. A run folder without ``summary.json`` is
reported as ``unfinished`` (still training, or killed before it could write its summary).

When ``experiment.json`` lists its runs (``"runs"``, as ``normlab compare`` writes it), only those
runs count: folders under ``runs/`` left by an earlier command with other seeds or arms are
listed in :attr:`CompareFolder.ignored_runs` and left out of everything else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.run_format import (
    CRASHED,
    DATA_DIR,
    DATA_INFO_FILE,
    DEFAULT_TESTBED,
    DONE_STATUSES,
    EXPERIMENT_FILE,
    TESTBED_FORMATS,
    UNFINISHED,
    parse_run_id,
    testbed_format,
)
from normlab.run_format import folder as run_folder
from normlab.run_format.experiment_record import check_experiment

__all__ = [
    "DONE_STATUSES",
    "CompareFolder",
    "CompareFolderError",
    "RunResult",
    "load_compare_folder",
]

DEFAULT_MARGIN_BPB = TESTBED_FORMATS["gpt"].margin_default
MARGIN_KEYS: dict[str, tuple[str, float]] = {
    name: (t.margin_key, t.margin_default) for name, t in TESTBED_FORMATS.items()
}
"""Per testbed: the key of the equivalence margin in ``experiment.json`` and its value when the
key is absent (from :data:`normlab.run_format.TESTBED_FORMATS`)."""


class CompareFolderError(ValueError):
    """The folder is not a ``normlab compare`` output folder, or holds no usable run."""


@dataclass(frozen=True)
class RunResult:
    """One run of the grid: its identity, status and the fields of its ``summary.json``."""

    run_id: str
    arm: str
    seed: int
    status: str
    path: Path
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """True for runs that finished or diverged."""
        return self.status in DONE_STATUSES

    @property
    def metrics_path(self) -> Path:
        """The run's ``metrics.jsonl`` (it may not exist)."""
        return run_folder.metrics_path(self.path)

    @property
    def samples_path(self) -> Path:
        """The run's ``samples.npy``: the first generated images of a finished DiT run (it may
        not exist)."""
        return run_folder.samples_path(self.path)

    @property
    def reference_path(self) -> Path:
        """The run's ``reference.npy``: validation images with the labels of its samples (it
        may not exist)."""
        return run_folder.reference_path(self.path)

    def value(self, metric: str) -> float | None:
        """``summary[metric]`` as a finite float, or None when absent, null or non-numeric."""
        raw = self.summary.get(metric)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            return None
        v = float(raw)
        return v if math.isfinite(v) else None


@dataclass(frozen=True)
class CompareFolder:
    """The experiment description and every run found in a compare output folder."""

    path: Path
    experiment: dict[str, Any]
    data: dict[str, Any]
    arms: list[str]
    baseline_arm: str
    seeds: list[int]
    margin: float | None
    """The equivalence margin of the testbed's quality metric, in its unit (GPT: bits per byte,
    ``margin_bpb``; DiT: validation MSE, ``margin_val_loss``; a script's metric, ``margin``);
    None for a script's runs compared without ``--margin`` (no equivalence test)."""
    runs: list[RunResult]
    ignored_runs: tuple[str, ...] = ()
    """Run folders under ``runs/`` that ``experiment.json`` does not list (left out)."""
    testbed: str = "gpt"
    """``gpt`` or ``dit`` (``experiment.json``'s ``testbed``; absent in older folders: gpt)."""

    @property
    def margin_bpb(self) -> float | None:
        """The GPT testbed's margin in bits per byte (:attr:`margin`)."""
        return self.margin

    def runs_of(self, arm: str) -> list[RunResult]:
        """The runs of ``arm``, ordered by seed."""
        return sorted((r for r in self.runs if r.arm == arm), key=lambda r: r.seed)


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CompareFolderError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(obj, dict):
        raise CompareFolderError(f"{path} must hold a JSON object, got {type(obj).__name__}")
    return obj


def _experiment_fields(
    experiment: dict[str, Any], where: Path
) -> tuple[list[str], str, list[int], float | None, str]:
    try:
        check_experiment(experiment, where)  # the one shape of experiment.json
    except ValueError as err:
        raise CompareFolderError(str(err)) from None
    arms = experiment["arms"]
    baseline = experiment.get("baseline_arm", arms[0])
    seeds = experiment.get("seeds", [])
    testbed = experiment.get("testbed", DEFAULT_TESTBED)
    fmt = testbed_format(testbed)  # a script testbed's name carries its metric
    key, default = fmt.margin_key, fmt.margin_default
    margin = experiment.get(key)
    if margin is None:
        margin = default or None  # a script's runs without --margin: no equivalence test
    if margin is None:
        return list(arms), baseline, list(seeds), None, testbed
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise CompareFolderError(f"{where}: {key!r} must be a number > 0, got {margin!r}")
    return list(arms), baseline, list(seeds), float(margin), testbed


def _listed_runs(experiment: dict[str, Any], where: Path) -> set[str] | None:
    """The run ids that ``experiment.json`` lists, or ``None`` if it lists none (older folders:
    every run folder then counts)."""
    listed = experiment.get("runs")
    return None if listed is None else set(listed)  # its shape: check_experiment


def _looks_like_run(run_dir: Path) -> bool:
    """A run folder has a run.json or summary.json, or at least a '<arm>__s<seed>' name."""
    has_file = run_folder.has_run_config(run_dir) or run_folder.has_summary(run_dir)
    return has_file or parse_run_id(run_dir.name) is not None


def _load_run(run_dir: Path) -> RunResult:
    try:
        config = run_folder.read_run_config(run_dir) if run_folder.has_run_config(run_dir) else {}
        summary = run_folder.read_summary(run_dir) or {}
    except ValueError as err:
        raise CompareFolderError(str(err)) from err
    named = parse_run_id(run_dir.name)
    arm = summary.get("arm", config.get("arm", named[0] if named else None))
    seed = summary.get("seed", config.get("seed", named[1] if named else None))
    if not isinstance(arm, str) or isinstance(seed, bool) or not isinstance(seed, int):
        raise CompareFolderError(
            f"{run_dir}: cannot tell the run's arm and seed (expected them in summary.json or "
            f"run.json, or a folder name '<arm>__s<seed>'), got arm={arm!r}, seed={seed!r}"
        )
    status = summary["status"] if summary else UNFINISHED  # checked by read_summary
    run_id = str(summary.get("run_id", config.get("run_id", run_dir.name)))
    return RunResult(run_id, arm, seed, status, run_dir, summary, config)


def _check_unique(runs: list[RunResult]) -> None:
    """Refuse two run folders for one (arm, seed): a copied folder would count that seed twice
    in the stability counts and make the pairing pick one of them silently."""
    seen: dict[tuple[str, int], Path] = {}
    for r in runs:
        first = seen.setdefault((r.arm, r.seed), r.path)
        if first != r.path:
            raise CompareFolderError(
                f"{first.name} and {r.path.name} are both arm {r.arm!r}, seed {r.seed}: a run "
                "must have one folder; move or delete the copy"
            )


def load_compare_folder(out_dir: Path | str) -> CompareFolder:
    """Read a compare output folder.

    Raises :class:`CompareFolderError` (a ValueError) when ``out_dir`` is not a folder, has no
    ``experiment.json`` or ``runs/``, when two run folders hold the same arm and seed, or when
    no run finished or diverged.
    """
    if not isinstance(out_dir, (str, Path)):
        raise TypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    path = Path(out_dir)
    if not path.is_dir():
        raise CompareFolderError(f"out_dir must be an existing folder, got {str(path)!r}")
    exp_path = path / EXPERIMENT_FILE
    if not exp_path.is_file():
        raise CompareFolderError(
            f"{path} is not a 'normlab compare' output folder: it has no {EXPERIMENT_FILE}"
        )
    experiment = _read_json_object(exp_path)
    arms, baseline, seeds, margin, testbed = _experiment_fields(experiment, exp_path)
    data_path = path / DATA_DIR / DATA_INFO_FILE
    if data_path.is_file():
        data = _read_json_object(data_path)
    else:
        data = dict(experiment.get("data") or {})
    run_dirs = run_folder.run_folders(path)
    listed = _listed_runs(experiment, exp_path)
    ignored = tuple(d.name for d in run_dirs if listed is not None and d.name not in listed)
    runs = [_load_run(d) for d in run_dirs if d.name not in ignored and _looks_like_run(d)]
    _check_unique(runs)
    if not any(r.done for r in runs):
        counts = {s: sum(r.status == s for r in runs) for s in (CRASHED, UNFINISHED)}
        raise CompareFolderError(
            f"{path} holds no finished run ({len(runs)} run folders: {counts['crashed']} crashed, "
            f"{counts['unfinished']} unfinished); nothing to report"
        )
    extra_arms = sorted({r.arm for r in runs} - set(arms))
    return CompareFolder(
        path=path,
        experiment=experiment,
        data=data,
        arms=arms + extra_arms,
        baseline_arm=baseline,
        seeds=seeds,
        margin=margin,
        runs=sorted(runs, key=lambda r: (r.arm, r.seed)),
        ignored_runs=ignored,
        testbed=testbed,
    )
