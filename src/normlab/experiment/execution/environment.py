"""The machine a grid runs on: device, threads and versions, recorded with every experiment."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from normlab._checks import UsageValueError


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def default_threads() -> int:
    """Torch threads per worker when none are given: half the available CPUs, at least 1.

    Half, because logical CPUs are often hyper-threads of one core, and because a worker whose
    threads outnumber the free cores loses far more to waiting at every parallel region than
    it gains (10× slower on a busy 2-CPU machine in our measurements).
    """
    return max(1, available_cpus() // 2)


def resolve_device(device: str) -> str:
    """``"auto"`` → ``"cuda"`` when a GPU is visible, else ``"cpu"``; other names are checked."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:  # torch: "Invalid device string"
        raise UsageValueError(
            f"device: {device!r} is not a device name; expected auto, cpu, cuda, cuda:N or mps"
        ) from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} was asked for but no CUDA device is available")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device: {device!r} was asked for but MPS is not available")
    return device


def environment(device: str, threads: int) -> dict[str, Any]:
    """Versions and hardware: normlab, torch, Python, platform, device (and GPU name), threads."""
    from normlab._version import __version__

    env: dict[str, Any] = {
        "normlab_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "device": device,
        "threads": threads,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": available_cpus(),
    }
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env
