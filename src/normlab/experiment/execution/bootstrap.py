"""The first code a run's worker process executes: bind it to its parent, then import the rest.

The runner starts a worker as ``python .../normlab/experiment/execution/bootstrap.py PARENT_PID
RUN_DIR
PROGRESS_FD`` (by file path, so that neither ``normlab/__init__`` nor torch is imported first).
Before any import beyond the standard library, :func:`bind_to_parent` asks the kernel to kill
this process when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux) and then checks
that the parent is still ``PARENT_PID``: if the parent died in between, ``getppid()`` already
names another process (init or a subreaper) and the worker exits at once with
:data:`EXIT_ORPHANED`. From then on the worker cannot outlive its parent, during its imports or
its training, whatever signal ended the parent (``kill -9`` included).

Then it restores the parent's ``sys.path`` (from :data:`SYS_PATH_ENV`), so it imports the same
normlab and the same user modules as the parent did, and hands over to
:func:`normlab.experiment.execution.worker.serve_run`.

This module imports only the standard library at its top; keep it that way.
"""

from __future__ import annotations

import json
import os
import sys

EXIT_ORPHANED = 75
"""Exit status of a worker whose parent was gone before it could bind itself to it."""
SYS_PATH_ENV = "NORMLAB_WORKER_SYS_PATH"
"""Environment variable holding the parent's ``sys.path`` as a JSON list."""
_PR_SET_PDEATHSIG = 1


def bind_to_parent(parent: int) -> None:
    """Die with ``parent``: set the parent-death signal to ``SIGKILL`` (Linux), then exit with
    :data:`EXIT_ORPHANED` unless ``os.getppid() == parent`` (the parent died before the signal
    was set). Elsewhere (no ``prctl``) only the check is made; the worker then notices a dead
    parent through its closed standard input (see
    :func:`normlab.experiment.execution.worker.serve_run`)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            sys.stderr.write(
                f"normlab worker: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}\n"
            )
    if os.getppid() != parent:
        os._exit(EXIT_ORPHANED)


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[PARENT_PID, RUN_DIR, PROGRESS_FD]``."""
    parent, run_dir, progress_fd = int(argv[0]), argv[1], int(argv[2])
    bind_to_parent(parent)
    saved_path = os.environ.get(SYS_PATH_ENV)
    if saved_path:
        sys.path[:] = json.loads(saved_path)
    else:  # run by hand: import the normlab this file belongs to
        here = os.path.abspath(__file__)  # <src>/normlab/experiment/execution/bootstrap.py
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    from normlab.experiment.execution.worker import serve_run

    return serve_run(run_dir, parent, progress_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
