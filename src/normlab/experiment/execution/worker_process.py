"""The runner's handle on one run's worker process: start it, release it, read its progress,
stop it.

The worker is a fresh Python started on :mod:`normlab.experiment.execution.bootstrap` by file path,
so that its first instructions bind it to this process (parent-death signal, parent pid check)
before it imports normlab or torch. Two pipes connect them:

* its standard input: the runner writes ``go`` to let a standby worker train; closing it (or
  this process dying, which closes it) tells the worker to stop;
* a progress pipe (``PROGRESS_FD`` in its argv): the worker writes each finished step as
  ``"N\\n"``; the runner reads what is there without blocking.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from normlab.experiment.execution import bootstrap

BOOTSTRAP_PATH = Path(bootstrap.__file__).resolve()
"""The file a worker process runs (see :mod:`normlab.experiment.execution.bootstrap`)."""


class WorkerProcess:
    """One run's worker process (started at construction; see the module docstring).

    The environment of the calling process at construction (e.g. inside
    :func:`normlab.experiment.execution.executors.worker_environment`) is the worker's.
    """

    def __init__(self, run_dir: Path, name: str) -> None:
        self.name = name
        read_end, write_end = os.pipe()
        env = dict(os.environ)
        env[bootstrap.SYS_PATH_ENV] = json.dumps([p for p in sys.path if isinstance(p, str)])
        try:
            self._popen = subprocess.Popen(
                [
                    sys.executable,
                    str(BOOTSTRAP_PATH),
                    str(os.getpid()),
                    str(run_dir),
                    str(write_end),
                ],
                stdin=subprocess.PIPE,
                pass_fds=(write_end,),
                env=env,
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        self._progress = read_end
        self._partial = b""
        self.pid = self._popen.pid

    def release(self) -> None:
        """Let the (standby) worker start training."""
        try:
            assert self._popen.stdin is not None
            self._popen.stdin.write(b"go\n")
            self._popen.stdin.flush()
        except (BrokenPipeError, ValueError):  # it already exited; its exit code will tell
            pass

    def last_step(self) -> int | None:
        """The last step the worker reported since the previous call, or ``None``."""
        chunks = []
        while True:
            try:
                chunk = os.read(self._progress, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        data = self._partial + b"".join(chunks)
        *lines, self._partial = data.split(b"\n")
        steps = [int(line) for line in lines if line.strip().isdigit()]
        return steps[-1] if steps else None

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        """The exit status (negative: the signal that ended it), ``None`` while it runs."""
        return self._popen.poll()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the process to end (at most ``timeout`` seconds)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def terminate(self) -> None:
        """Close its input and send ``SIGTERM`` (without waiting)."""
        self._close_input()
        if self._popen.poll() is None:
            self._popen.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        """:meth:`terminate`, wait, and ``SIGKILL`` after ``timeout`` seconds; then
        :meth:`close`."""
        self.terminate()
        if self._popen.poll() is None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
        self.close()

    def close(self) -> None:
        """Release the pipes (after the process ended)."""
        self._close_input()
        if self._progress >= 0:
            os.close(self._progress)
            self._progress = -1

    def _close_input(self) -> None:
        if self._popen.stdin is not None and not self._popen.stdin.closed:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()
