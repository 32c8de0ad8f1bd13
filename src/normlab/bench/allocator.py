"""The CPU allocator setting that keeps large-tensor timings honest.

glibc's malloc returns every large block (above ``M_MMAP_THRESHOLD``) to the kernel when it is
freed and maps a fresh one on the next allocation, so each new output of a large op page-faults
on first touch: a 64M-element norm then runs up to 10x slower than its kernel. Two environment
variables, read by glibc when the process starts, keep freed memory in the heap instead:

    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000

jemalloc or tcmalloc loaded through ``LD_PRELOAD`` reuse memory on their own.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}
_REEXEC_MARK = "NORMLAB_BENCH_REEXECUTED"


def uses_glibc_malloc() -> bool:
    """True when the process allocates with glibc's malloc (no jemalloc/tcmalloc preloaded)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    preload = os.environ.get("LD_PRELOAD", "")
    return not any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc"))


def missing_settings() -> dict[str, str]:
    """The malloc variables this process lacks (empty when timings are not distorted)."""
    if not uses_glibc_malloc():
        return {}
    return {k: v for k, v in MALLOC_ENV.items() if os.environ.get(k) != v}


def settings_line() -> str:
    """The exact environment prefix to put before the command."""
    return " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())


def warning_text() -> str | None:
    """A warning for the user, or None when the allocator will not distort figures."""
    missing = missing_settings()
    if not missing:
        return None
    return (
        "glibc malloc returns large blocks to the OS on free, so every fresh output page-faults "
        "and CPU timings of large tensors read up to 10x slow. Run with:\n  "
        f"{settings_line()} normlab bench ..."
    )


def restart_argv() -> list[str] | None:
    """The command line that restarts this process as the same ``normlab`` command, or None.

    Two launchers are recognised: the ``normlab`` console script (``python <script> …``) and
    ``python -m normlab …`` (``__main__`` is the package's ``__main__`` module). Any other host
    (pytest, a notebook, an embedding program) is left alone, and so is a process that was
    already restarted once."""
    if os.environ.get(_REEXEC_MARK):
        return None
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ("normlab", "normlab.__main__"):
        return [sys.executable, "-m", "normlab", *sys.argv[1:]]
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "normlab" and script.exists():
        return [sys.executable, str(script), *sys.argv[1:]]
    return None


def can_reexec() -> bool:
    """Whether this process is a ``normlab`` command that may restart itself (see
    :func:`restart_argv`)."""
    return restart_argv() is not None


def reexec_with_settings() -> None:
    """Replace this process by the same command with :data:`MALLOC_ENV` set (never returns)."""
    argv = restart_argv()
    if argv is None:
        raise RuntimeError("this process is not a normlab command that can restart itself")
    env = {**os.environ, **MALLOC_ENV, _REEXEC_MARK: "1"}
    os.execve(sys.executable, argv, env)
