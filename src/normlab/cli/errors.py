"""How the command line reports failures: one line that names the file, option or key, and the
documented exit status, never a traceback for something the user can fix.

* :func:`signals_as_interrupt`: ``SIGTERM`` (and ``SIGHUP``) raise :class:`Terminated`, a
  ``KeyboardInterrupt``, so that a terminated command cleans up exactly as after Ctrl-C (its
  workers stopped, its folder resumable) and exits ``128 + signal`` (143 for ``SIGTERM``).
* :func:`describe_error`: the one-line message of an error raised by the user's input or the
  system (``ValueError`` and its kin, ``OSError`` such as a full disk, ``MemoryError``), or
  ``None`` for a programming error, whose traceback is kept.
* :func:`check_utf8_path`: refuse up front a path that is not valid UTF-8 (it could not be
  written into the UTF-8 report afterwards).
* :func:`main_guard`: the console script's last line of defence, used by
  :func:`normlab.cli.main`.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

EXIT_ERROR = 1
"""Exit status of a command refused for its input (bad option, file, folder)."""


class Terminated(KeyboardInterrupt):
    """The process received ``signum`` (``SIGTERM``, ``SIGHUP``); handled as an interrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def interrupt_exit_code(err: BaseException) -> int:
    """128 + the signal for :class:`Terminated` (143 for ``SIGTERM``), else 130 (``SIGINT``)."""
    return 128 + err.signum if isinstance(err, Terminated) else 130


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Within the block, ``SIGTERM`` and ``SIGHUP`` raise :class:`Terminated` in the main thread
    (the previous handlers come back after it). Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


def describe_os_error(err: OSError) -> str:
    """``err`` on one line: what failed, on which file, and for a full disk how to go on."""
    reason = err.strerror or str(err) or type(err).__name__
    where = ""
    if err.filename is not None:
        where = f" ({_shown_path(err.filename)}"
        if err.filename2 is not None:
            where += f" -> {_shown_path(err.filename2)}"
        where += ")"
    hint = ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "; free some space, then run the same command again to resume"
    elif err.errno == errno.ELOOP:
        hint = "; a symbolic link points back to itself"
    return f"{reason}{where}{hint}"


def _shown_path(name: str | bytes | int) -> str:
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return repr(str(name).encode("utf-8", "backslashreplace").decode("utf-8"))


def describe_error(err: BaseException) -> str | None:
    """The one-line message for an error the user or the system caused, or ``None`` for one
    that is a bug (let its traceback show)."""
    if isinstance(err, OSError):
        return describe_os_error(err)
    if isinstance(err, MemoryError):
        return "not enough memory for this command; use smaller sizes (or fewer in parallel)" + (
            f": {err}" if str(err) else ""
        )
    if isinstance(err, UnicodeError):
        return f"text that is not valid UTF-8: {err}"
    if isinstance(err, (ValueError, RecursionError)):
        return " ".join(str(err).split()) or type(err).__name__
    return None


def check_utf8_path(path: str | Path | None, option: str) -> None:
    """Raise ``ValueError`` naming ``option`` if ``path`` is not valid UTF-8 (e.g. a name given
    as raw bytes in another encoding): everything the command writes (report, JSON) is UTF-8
    text that names it."""
    if path is None:
        return
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ValueError(
            f"{option}: the path {shown!r} is not valid UTF-8; expected a UTF-8 path (rename it, "
            "or pick another one)"
        ) from None


def main_guard(run: Callable[[], object]) -> None:
    """Run the CLI ``run``; an error that escaped its command becomes ``normlab: error: ...``
    on standard error and exit status 1 (an interrupt: 130, or 143 for ``SIGTERM``).
    Programming errors keep their traceback."""
    try:
        run()  # compare handles SIGTERM itself; other commands keep the default (killed)
    except KeyboardInterrupt as err:
        print("normlab: interrupted", file=sys.stderr)
        sys.exit(interrupt_exit_code(err))
    except Exception as err:
        message = describe_error(err)
        if message is None:
            raise
        print(f"normlab: error: {message}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
