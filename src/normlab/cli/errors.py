"""How the command line reports failures: one line that names the file, option or key, and the
documented exit status, never a traceback for something the user can fix.

:data:`EXIT_STATUSES` is the one table of exit statuses of every command (``compare``,
``report``, ``bench``, ``audit``, ``explain``, ``coord-check``): each status's number, name and
meaning. Every command exits with one of its constants (:data:`EXIT_OK` …), and words its
``--help`` with :func:`exit_status_help`, which takes the numbers and names from the table. The
rule between the two refusals: :data:`EXIT_USAGE` when what was written cannot be taken (an
option, argument or config value of the wrong type or range, an unknown name, options that do
not go together: :func:`is_usage_error` for the errors raised below the command line);
:data:`EXIT_REFUSED` when it was written well but what it names cannot be used (a path that
does not exist or holds something else, a damaged or locked folder or file, inputs that do not
fit the options, a device that is not there, a machine without the memory).

Every error is one line on standard error, ``normlab <command>: error: <message>``: its line
breaks and runs of spaces folded, and never wrapped at the terminal's width (it is written as
it is, not through rich), so that a script can tell errors (stderr) from results (stdout) and
read each error as one line.

* :func:`print_error`, :func:`fail`: print that line; ``fail`` also returns the
  ``typer.Exit`` to raise, with :data:`EXIT_USAGE` for an error in an option's value
  (:func:`is_usage_error`) and the caller's status otherwise.
* :class:`OneLineErrors`: the root command group; typer's own usage errors (an unknown option,
  a value of the wrong type, a command's ``typer.BadParameter``) end the same way, exit status
  :data:`EXIT_USAGE`, instead of typer's framed box that wraps to the terminal.
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
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from normlab._checks import UsageValueError

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_STOPPED = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


@dataclass(frozen=True)
class ExitStatus:
    """One exit status: its number, its name (as the help and the README name it) and what it
    means for every command."""

    code: int
    name: str
    meaning: str


EXIT_STATUSES: tuple[ExitStatus, ...] = (
    ExitStatus(EXIT_OK, "ok", "the command did its work"),
    ExitStatus(
        EXIT_REFUSED,
        "refused",
        "nothing was done: the command line is well formed, but what it names cannot be used "
        "(a path that does not exist or holds something else, a damaged or locked folder or "
        "file, inputs that do not fit the options, a device that is not there, a machine "
        "without the memory or disk)",
    ),
    ExitStatus(
        EXIT_USAGE,
        "usage",
        "nothing was done: an option, argument or config value the command does not take (of "
        "the wrong type or range, an unknown name, options that do not go together)",
    ),
    ExitStatus(
        EXIT_FAILED,
        "failed",
        "the work was done and its answer is a failure: every run crashed (compare), no row was "
        "measured (bench), the verdict is defect (audit norm), μP's sizes are not flat "
        "(coord-check)",
    ),
    ExitStatus(
        EXIT_STOPPED,
        "stopped",
        "the work began but could not complete (a full disk or another system error while "
        "training, the report not written); what was done is kept, and the same command resumes",
    ),
    ExitStatus(EXIT_INTERRUPTED, "interrupted", "interrupted (Ctrl-C, SIGINT)"),
    ExitStatus(EXIT_TERMINATED, "terminated", "terminated (SIGTERM; 129 for SIGHUP)"),
)
"""The exit statuses of every ``normlab`` command, in the README's table (tests/test_exit_statuses
checks that the two agree and that every refusal of every command exits as this table says)."""
_BY_NAME = {status.name: status for status in EXIT_STATUSES}


def exit_status_help(**when: str) -> str:
    """A command's ``Exit status:`` paragraph: ``0 (ok) when …; 1 (refused) when …`` in the
    table's order, ``when`` giving, for each status name the command exits with, when it does
    (a name outside :data:`EXIT_STATUSES` raises ``KeyError``)."""
    unknown = sorted(set(when) - _BY_NAME.keys())
    if unknown:
        raise KeyError(f"not an exit status of the table: {', '.join(unknown)}")
    parts = [f"{s.code} ({s.name}) {when[s.name]}" for s in EXIT_STATUSES if s.name in when]
    return "Exit status: " + "; ".join(parts) + "."


try:  # recent typer vendors click as typer._click; older typer runs on click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore


class Terminated(KeyboardInterrupt):
    """The process received ``signum`` (``SIGTERM``, ``SIGHUP``); handled as an interrupt."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def interrupt_exit_code(err: BaseException) -> int:
    """128 + the signal for :class:`Terminated` (:data:`EXIT_TERMINATED` for ``SIGTERM``), else
    :data:`EXIT_INTERRUPTED` (``SIGINT``)."""
    return 128 + err.signum if isinstance(err, Terminated) else EXIT_INTERRUPTED


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
        return one_line(str(err)) or type(err).__name__
    return None


def one_line(message: str) -> str:
    """``message`` on one line: each line with its runs of whitespace folded to one space, the
    lines joined by ``"; "`` (by a space after a line that ends in ``:``, a heading such as
    ``invalid experiment config:`` over one problem a line)."""
    text = ""
    for line in (" ".join(part.split()) for part in message.splitlines()):
        if line:
            text += line if not text else (" " if text.endswith(":") else "; ") + line
    return text


def error_line(command: str | None, message: str) -> str:
    """``normlab <command>: error: <message>`` (``normlab: error: …`` without a command), the
    message made :func:`one_line`."""
    where = f"normlab {command}" if command else "normlab"
    return f"{where}: error: {one_line(message)}"


def print_error(command: str | None, message: str) -> None:
    """Write :func:`error_line` to standard error as one line, never wrapped."""
    sys.stderr.write(error_line(command, message) + "\n")
    sys.stderr.flush()


def is_usage_error(err: BaseException) -> bool:
    """Whether ``err`` is about a value as written, not about the machine or the files
    (:data:`EXIT_USAGE`, not :data:`EXIT_REFUSED`): a :class:`normlab._checks.UsageValueError`,
    which the checks below the command line raise for such a value (``--model-set`` settings,
    a ``--model`` that names no model there is, a ``--parametrization mup`` the model cannot
    take, a malformed ``--device``, an ``--import`` option as written …)."""
    return isinstance(err, UsageValueError)


def fail(command: str | None, err: BaseException | str, code: int) -> typer.Exit:
    """Print ``err`` as :func:`print_error` does (an exception as :func:`describe_error` words
    it) and return the ``typer.Exit`` to raise: :data:`EXIT_USAGE` for a usage error
    (:func:`is_usage_error`), else ``code``."""
    if isinstance(err, BaseException):
        message = describe_error(err) or str(err) or type(err).__name__
        code = EXIT_USAGE if is_usage_error(err) else code
    else:
        message = err
    print_error(command, message)
    return typer.Exit(code)


def _command_of(err: ClickException) -> str | None:
    """The subcommand path of a usage error's context (``audit norm``), without the program."""
    ctx = getattr(err, "ctx", None)
    names = []
    while ctx is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names[:-1])) or None


class OneLineErrors(TyperGroup):
    """The ``normlab`` command group: a usage error of any command (typer's own, or a command's
    ``typer.BadParameter``) is printed by :func:`print_error` as one line and exits with its
    status (:data:`EXIT_USAGE`); ``Ctrl-D`` at a prompt (typer's abort) exits 1. Everything else
    runs as typer runs it."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as err:  # the help is already printed
            _exit(err.exit_code)
        except ClickException as err:
            print_error(_command_of(err), err.format_message())
            _exit(err.exit_code)
        except typer.Abort:
            print_error(None, "aborted")
            _exit(EXIT_REFUSED)
        _exit(result if isinstance(result, int) else 0)  # an Exit's status, else success


def _exit(code: int) -> NoReturn:
    sys.exit(code)


def check_utf8_path(path: str | Path | None, option: str) -> None:
    """Raise ``ValueError`` naming ``option`` if ``path`` is not valid UTF-8 (e.g. a name given
    as raw bytes in another encoding): everything the command writes (report, JSON) is UTF-8
    text that names it, so the file or folder cannot be used (:data:`EXIT_REFUSED`)."""
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
    on standard error and exit status :data:`EXIT_REFUSED` (:data:`EXIT_USAGE` for a usage
    error; an interrupt: 130, or 143 for ``SIGTERM``).
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
        print_error(None, message)
        sys.exit(EXIT_USAGE if is_usage_error(err) else EXIT_REFUSED)
