"""What every tracker reader returns: the runs of a store as plain data, whatever the tracker.

A :class:`TrackedRun` is one run as the tracker keeps it: its name (TensorBoard: the folder of its
event files; MLflow and W&B: the run's name; CSV / JSON Lines: the ``run`` column or the file),
the fields that ``--arm-from`` / ``--seed-from`` rules may also read (MLflow ``param:KEY`` and
``tag:KEY``, W&B ``config:KEY``), every scalar series it logged as (step, value) pairs in step
order, and its status when the tracker records one. The readers (``read_<kind>.py``) build them;
:mod:`normlab.trackers.importing` turns them into a compare folder.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType

__all__ = [
    "ENDED",
    "FAILED",
    "RUNNING",
    "TrackedRun",
    "TrackerImportError",
    "number",
    "require",
    "series_from_points",
]

ENDED = "ended"
"""The tracker says the run ended normally, or records no status at all."""
FAILED = "failed"
"""The tracker says the run failed or was killed (MLflow ``FAILED`` / ``KILLED``; W&B a
non-zero exit code)."""
RUNNING = "running"
"""The tracker says the run has not ended (MLflow ``RUNNING`` / ``SCHEDULED``; a W&B log
without an exit record): still training, or killed without a word."""

EXTRA = "trackers"
"""The optional extra that installs the trackers' libraries: ``pip install "normlab[trackers]"``."""


class TrackerImportError(ValueError):
    """An import refused for its input: one line that names the option (``--import``,
    ``--arm-from``, ``--seed-from``, ``--metric``, ``--out`` …) and what was expected."""


@dataclass
class TrackedRun:
    """One run of a tracker's store.

    ``series`` maps each scalar metric's name, as the tracker spells it, to its (step, value)
    pairs sorted by step, one pair per step (a step logged twice keeps its last value: a
    resumed run logs it again). ``status`` is :data:`ENDED`, :data:`FAILED` or :data:`RUNNING`;
    ``status_note`` says what the tracker recorded when it is not :data:`ENDED`.
    """

    name: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    status: str = ENDED
    status_note: str = ""

    @property
    def last_step(self) -> int | None:
        """The last step at which any metric was logged (None when none was)."""
        steps = [points[-1][0] for points in self.series.values() if points]
        return max(steps) if steps else None


def series_from_points(points: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """(step, value) pairs, in the order logged, as one series: sorted by step, the last value
    logged at a step kept (a stable sort, so ties keep their logged order)."""
    by_step: dict[int, float] = {}
    for step, value in points:
        by_step[int(step)] = float(value)
    return sorted(by_step.items())


def number(value: object) -> float | None:
    """A logged value as a float (non-finite kept), or None for anything that is not a real
    number (booleans, strings, media, nested objects)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def require(module: str, kind: str) -> ModuleType:
    """Import ``module`` (a tracker's library) or raise :class:`TrackerImportError` naming
    ``--import``, the kind and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise TrackerImportError(
            f"--import: reading {kind} runs needs {module.split('.')[0]} ({err}); expected it "
            f'installed: pip install "normlab[{EXTRA}]"'
        ) from None
