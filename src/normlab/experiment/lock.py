"""One command at a time per output folder: an exclusive ``fcntl.flock`` on ``OUT/.lock``."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_FILE = ".lock"


class FolderLockedError(RuntimeError):
    """Another process holds the output folder's lock."""


class OutputLock:
    """Context manager holding ``OUT/.lock`` exclusively; raises :class:`FolderLockedError` at
    once (never waits) if another process holds it. The lock dies with the process."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> OutputLock:
        """Create the folder if needed and take the lock. Raises :class:`FolderLockedError` if
        another process holds it, ``ValueError`` naming ``--out`` if the folder or its lock file
        cannot be created."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            doing = "write in the folder" if folder.is_dir() else "create the folder"
            raise ValueError(
                f"out: cannot {doing} {str(folder)!r} ({err.strerror or err}); expected --out to "
                "name a folder this user can create and write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise FolderLockedError(
                f"out: {str(self.path.parent)!r} is being written by another normlab command "
                f"(it holds {str(self.path)!r}); wait for it to finish or choose another --out"
            ) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
