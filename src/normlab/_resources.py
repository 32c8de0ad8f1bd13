"""The machine's memory and disk, and size checks made before anything is allocated.

A command given an absurd size (a billion seeds, a 10¹⁴-byte data cap, a million-wide model, a
two-billion-wide probe) estimates what it would allocate and refuses up front, naming the option
and both numbers, instead of being killed by the kernel's out-of-memory killer (or filling the
disk) minutes later.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def available_memory() -> int:
    """Bytes of memory available to a new allocation: ``MemAvailable`` of ``/proc/meminfo``
    (Linux), else the physical memory (``sysconf``), else 2⁶³ (unknown: no check)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 2**63


def free_disk(path: str | os.PathLike[str]) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent);
    2⁶³ when it cannot be told (or the file system reports a total size of 0)."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        try:
            if candidate.exists():
                usage = shutil.disk_usage(candidate)
                # a pseudo file system (proc, sysfs) reports no size at all: nothing to check
                return usage.free if usage.total else 2**63
        except OSError:
            continue
    return 2**63


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, 3 significant digits: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


class DoesNotFitError(ValueError):
    """What was asked for needs more memory or disk than the machine has: a refusal about the
    machine, not about an option's spelling (the CLI exits 1 for it, not 2)."""


def check_fits(needed: float, available: int, what: str, where: str, hint: str) -> None:
    """Raise :class:`DoesNotFitError` (a ``ValueError``) ``"{what} needs about N, but only M is
    available {where}; {hint}"`` unless ``needed <= available``."""
    if needed <= available:
        return
    raise DoesNotFitError(
        f"{what} needs about {format_bytes(needed)}, but only {format_bytes(available)} is "
        f"available {where}; {hint}"
    )


def check_fits_memory(needed: float, what: str, hint: str) -> None:
    """:func:`check_fits` against :func:`available_memory`."""
    check_fits(needed, available_memory(), what, "in memory", hint)


def peak_rss_bytes() -> int:
    """This process's own peak resident set size, in bytes.

    Linux: ``VmHWM`` from ``/proc/self/status`` (kB × 1024), the high-water mark of this
    process's own address space. ``getrusage``'s ``ru_maxrss`` is not used there: the kernel
    carries it over fork and exec, so a worker spawned by a grid process that once held more
    memory would report the parent's peak instead of its own. Elsewhere: ``ru_maxrss`` (bytes on
    macOS, kB on the other systems).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if platform.system() == "Darwin" else rss * 1024)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This process's peak memory on ``device`` and what was measured: CUDA's max allocated
    bytes (``"cuda_max_allocated"``) on a GPU, else the peak resident set
    (:func:`peak_rss_bytes`, ``"max_rss"``)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return peak_rss_bytes(), "max_rss"
