"""Size of this CPU's last-level cache, read from Linux sysfs, ``lscpu``, or a default."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path

DEFAULT_LLC_BYTES = 32 * 1024 * 1024
"""Used when the size cannot be read (non-Linux hosts): a large server L3."""

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int | None:
    """Bytes in a size such as ``"32768K"``, ``"32 MiB"`` or ``"1.5M"``; None if unreadable."""
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG]?)(?:i?B)?\b", text.strip(), re.IGNORECASE)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _from_sysfs(root: Path) -> int | None:
    best: tuple[int, int] | None = None  # (level, size)
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or size is None:
            continue
        if best is None or level > best[0]:
            best = (level, size)
    return None if best is None else best[1]


def _from_lscpu() -> int | None:
    if shutil.which("lscpu") is None:
        return None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = {}
    for line in out.splitlines():
        m = re.match(r"^\s*L([1-4])d?\s*cache:\s*(.+)$", line)
        if m:
            size = parse_size(m.group(2))
            if size is not None:
                sizes[int(m.group(1))] = size
    return sizes[max(sizes)] if sizes else None


@functools.cache
def last_level_cache_bytes() -> int:
    """The last-level data cache of CPU 0 in bytes (sysfs, then lscpu, then the default)."""
    size = _from_sysfs(Path("/sys/devices/system/cpu/cpu0/cache"))
    if size is None:
        size = _from_lscpu()
    return size if size else DEFAULT_LLC_BYTES
