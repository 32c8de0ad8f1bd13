"""How a study stops short: one exception per kind of ending, which the command turns into its
documented exit status (the study itself knows no exit codes).

- :class:`Invalid`: the options ask for something that cannot run (nothing was written);
- :class:`Refused`: refused before training (the folder, the device, the data, a lock, the
  pairing, settings that differ from finished runs);
- :class:`NoResult`: training ended without a run that finished or diverged;
- :class:`Stopped`: training began but the study could not complete (the executor stopped, a
  full disk, the report or the ladder's analysis could not be written); finished runs are
  kept.

Each holds ``cause``, the error or the one-line message, and ``wrap``, a format string the
cause's one-line description is put into (``"{}"``: the cause alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from normlab.experiment.execution.executors import GridStopped
from normlab.experiment.execution.lock import FolderLockedError

__all__ = [
    "Invalid",
    "NoResult",
    "Refused",
    "ReportNotBuilt",
    "Stopped",
    "StudyError",
    "training_errors",
]


class StudyError(Exception):
    """A study that stopped short (module docstring); ``cause`` is an error or a message (None:
    nothing more to say), ``wrap`` the sentence its description goes into."""

    def __init__(self, cause: BaseException | str | None, wrap: str = "{}") -> None:
        super().__init__(str(cause) if cause is not None else "")
        self.cause = cause
        self.wrap = wrap


class Invalid(StudyError):
    """The options ask for something that cannot run."""


class Refused(StudyError):
    """Refused before training."""


class NoResult(StudyError):
    """No run finished or diverged."""


class Stopped(StudyError):
    """Training began, but the study could not complete."""


class ReportNotBuilt(RuntimeError):
    """Training ended but the report of ``out`` could not be written (``cause``)."""

    def __init__(self, out: Path, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.out = out
        self.cause = cause


@contextmanager
def training_errors() -> Iterator[None]:
    """Within the block, what stops a grid's training becomes a :class:`StudyError`: the
    executor stopping or the report not built → :class:`Stopped`; a lock, a refused check, the
    system (``OSError``, ``MemoryError``) → :class:`Refused`."""
    try:
        yield
    except GridStopped as err:
        raise Stopped(str(err)) from None
    except ReportNotBuilt as err:
        raise Stopped(
            err.cause,
            "report: not built ({}); the runs are kept in "
            + repr(str(err.out)).replace("{", "{{").replace("}", "}}")
            + ": fix the cause, then run `normlab report` on that folder",
        ) from None
    except (FolderLockedError, ValueError, OSError, MemoryError, RecursionError) as err:
        raise Refused(err) from None
