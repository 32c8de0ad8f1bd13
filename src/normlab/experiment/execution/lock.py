"""One command at a time per output folder: an exclusive lock on ``OUT/.lock`` (``filelock``)."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout

from normlab.run_format import LOCK_FILE

__all__ = ["LOCK_FILE", "FolderLockedError", "OutputLock", "is_locked"]


class FolderLockedError(RuntimeError):
    """Another process holds the output folder's lock."""


class OutputLock:
    """Context manager holding ``OUT/.lock`` exclusively; raises :class:`FolderLockedError` at
    once (never waits) if another process, or another :class:`OutputLock`, holds it. The lock
    is the operating system's (``flock`` on POSIX), so it dies with the process; the file
    stays."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self._lock: FileLock | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._lock is not None and self._lock.is_locked

    def acquire(self) -> OutputLock:
        """Create the folder if needed and take the lock. Raises :class:`FolderLockedError` if
        another process holds it, ``ValueError`` naming ``--out`` if the folder or its lock file
        cannot be created."""
        folder = self.path.parent
        lock = FileLock(self.path, timeout=0)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:  # a TimeoutError, hence an OSError: caught first
            raise FolderLockedError(
                f"out: {str(self.path.parent)!r} is being written by another normlab command "
                f"(it holds {str(self.path)!r}); wait for it to finish or choose another --out"
            ) from None
        except OSError as err:
            doing = "write in the folder" if folder.is_dir() else "create the folder"
            raise ValueError(
                f"out: cannot {doing} {str(folder)!r} ({err.strerror or err}); expected --out to "
                "name a folder this user can create and write"
            ) from None
        self._lock = lock
        return self

    def release(self) -> None:
        """Let the lock go (nothing if it is not held)."""
        if self._lock is not None:
            self._lock.release(force=True)
            self._lock = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def is_locked(out_dir: Path) -> bool:
    """Whether some process holds ``OUT/.lock`` now (tested by a non-blocking attempt to take
    it, released at once). A run's worker calls it before it trains: a folder whose lock is free
    has no owning command, so a worker left over from a dead command must not write there."""
    lock = FileLock(Path(out_dir) / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    except OSError:  # the folder or its lock file is gone: nobody owns it
        return False
    lock.release(force=True)
    return False
