"""What every tracker reader returns: the runs of a store as plain data, whatever the tracker.

A :class:`TrackedRun` is one run as the tracker keeps it: its name (TensorBoard: the folder of its
event files; MLflow and W&B: the run's name; CSV / JSON Lines: the ``run`` column or the file),
the fields that ``--arm-from`` / ``--seed-from`` rules may also read (MLflow ``param:KEY`` and
``tag:KEY``, W&B ``config:KEY``), every scalar series it logged as (step, value) pairs in step
order, and its status when the tracker records one. The readers (``read_<kind>.py``) build them;
:mod:`normlab.trackers.importing` turns them into a compare folder.

A source file that is damaged or cut short (a crash while the tracker wrote it: an event file
or a ``.wandb`` log that ends mid-record or fails its checksum, an MLflow metric file or a table
whose last line was cut) is never read as if it were whole: the reader records it as the run's
:class:`Damage` (the file, what is wrong with it, the last step read before it), and the import
leaves that run out of the verdict; damage the reader cannot pin on one run refuses the import
(:func:`damaged_source_error`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from normlab._checks import UsageValueError

__all__ = [
    "ENDED",
    "FAILED",
    "RUNNING",
    "Damage",
    "ImportUsageError",
    "TrackedRun",
    "TrackerImportError",
    "damaged_source_error",
    "ends_mid_line",
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
    """An import refused for what its options name: one line that names the option
    (``--import``, ``--arm-from``, ``--seed-from``, ``--metric``, ``--out`` …) and what was
    expected. The options are well formed, but the source or the runs in it cannot be used with
    them (a path that does not exist, a damaged file, a rule that matches no run …)."""


class ImportUsageError(TrackerImportError, UsageValueError):
    """An import refused for an option as written, before any source is read: an unknown kind, a
    regex that does not compile, a field rule the kind has not, a margin that is not a number
    > 0."""


@dataclass(frozen=True)
class Damage:
    """A source file of a run that is damaged or cut short: ``file`` (its path), ``problem``
    (what is wrong, in words that follow the file's name: "ends mid-record after byte 150 of
    300"), and ``last_step``, the last step read from it before the damage (None: none was)."""

    file: str
    problem: str
    last_step: int | None = None

    def __str__(self) -> str:
        read = "no step" if self.last_step is None else f"up to step {self.last_step}"
        return f"{self.file!r} {self.problem}; read {read}"


def damaged_source_error(damage: Damage, why: str) -> TrackerImportError:
    """The refusal of an import whose source holds ``damage`` that cannot be pinned on one run
    (``why`` says so): one line naming ``--import``, the file and how far it was read."""
    return TrackerImportError(
        f"--import: {damage}; {why}, so no run of it can be judged; expected whole files "
        "(a file cut while it was written: remove its last, partial line or record, then import "
        "again)"
    )


def ends_mid_line(file: Path) -> bool:
    """Whether ``file`` is not empty and its last line has no line end (``\\n`` or ``\\r``):
    every tracker that writes lines ends each with one, so such a file was cut while it was
    written."""
    with open(file, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) not in (b"\n", b"\r")


@dataclass
class TrackedRun:
    """One run of a tracker's store.

    ``series`` maps each scalar metric's name, as the tracker spells it, to its (step, value)
    pairs sorted by step, one pair per step (a step logged twice keeps its last value: a
    resumed run logs it again). ``status`` is :data:`ENDED`, :data:`FAILED` or :data:`RUNNING`;
    ``status_note`` says what the tracker recorded when it is not :data:`ENDED`. ``damage``: the
    first of its source files found damaged or cut short (None when every one was read whole);
    its ``series`` then hold only what was read before the damage.
    """

    name: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    status: str = ENDED
    status_note: str = ""
    damage: Damage | None = None

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
