"""What a compare folder written by ``normlab report --import`` records about its source.

The runs of such a folder were trained elsewhere and read from a tracker's store
(:mod:`normlab.trackers`); ``experiment.json`` holds, under :data:`IMPORT_KEY`, an
:class:`ImportRecord`: where they came from, how their arms and seeds were read, which tracker
runs were left out and why, and what the pairing checks could see (arms and last steps per seed).
The report's method section words it (``normlab.report.imported``); a later import into the same
folder is allowed only from the same source (:func:`same_source`).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

__all__ = ["IMPORT_KEY", "ImportRecord", "SkippedRun", "import_record", "same_source"]

IMPORT_KEY = "import"
"""The key of ``experiment.json`` that holds the :class:`ImportRecord` of an imported folder."""


class SkippedRun(TypedDict):
    """A tracker run that is not part of the folder: its name and why; ``arm`` and ``seed`` when
    its rules gave them and it was left out for what it logged (a damaged source, a run cut
    short), so that its seed is unpaired for that arm."""

    run: str
    reason: str
    arm: NotRequired[str]
    seed: NotRequired[int]


class ImportRecord(TypedDict):
    """``experiment.json``'s :data:`IMPORT_KEY`.

    ``kind`` (``tensorboard``, ``mlflow``, ``wandb``, ``csv``, ``jsonl``) and ``path`` (absolute)
    name the source; ``metric`` is the judged metric as the tracker spells it and ``field`` its
    name in the run format (``final_<field>``, ``best_<field>``); ``arm_from`` and ``seed_from``
    the rules that read each run's arm and seed; ``runs`` {run id: the tracker run's name};
    ``skipped`` the tracker runs left out; ``seeds`` {seed (as text): {arm: the last step the run
    logged, or null when it logged nothing}}; ``status_recorded`` whether the tracker records
    whether a run ended, failed or is still running (MLflow, W&B) or not (TensorBoard, tables);
    ``compare_unequal_steps`` whether a run that ended at an earlier step than another of its
    seed was compared all the same (``--compare-unequal-steps``) or left out (absent in folders
    imported before it was recorded).
    """

    kind: str
    path: str
    metric: str
    field: str
    arm_from: str
    seed_from: str
    runs: dict[str, str]
    skipped: list[SkippedRun]
    seeds: dict[str, dict[str, int | None]]
    status_recorded: bool
    compare_unequal_steps: NotRequired[bool]


def import_record(experiment: dict[str, Any]) -> ImportRecord | None:
    """The :class:`ImportRecord` of an ``experiment.json``, or None when the folder was not
    imported (or the record is not an object)."""
    record = experiment.get(IMPORT_KEY)
    return record if isinstance(record, dict) else None  # type: ignore[return-value]


def same_source(experiment: dict[str, Any], kind: str, path: str) -> bool:
    """True when ``experiment`` (an ``experiment.json``) records an import from ``kind`` at the
    absolute ``path``."""
    record = import_record(experiment)
    return record is not None and record.get("kind") == kind and record.get("path") == path
