"""Timing that survives a noisy machine: paired with a copy, repeated, summarised by medians.

Every repetition times a plain copy of the same size right before the candidate, so each
candidate time has its own copy-bandwidth reference taken under the same conditions (memory
bandwidth of a shared machine drifts by 2x within seconds). The figures a caller gets are
medians over repetitions: of the time, and of the per-repetition fraction of copy bandwidth.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Wall-clock seconds of one call, queued device work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Timing:
    """Medians over repetitions of one candidate, each paired with a copy."""

    median_s: float
    min_s: float
    copy_gbps: float  # median bandwidth of the paired copies (read + write bytes)
    fraction: float  # median of (candidate GB/s under the bytes model) / (paired copy GB/s)
    fraction_best: float  # (model bytes / fastest candidate) / (copy bytes / fastest copy)
    reps: int

    @property
    def achieved_gbps(self) -> float:
        return self.fraction * self.copy_gbps


class CopyReference:
    """A copy of ``numel`` elements of ``dtype`` on ``device``: the bandwidth yardstick."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.src = torch.ones(numel, dtype=dtype, device=device)
        self.dst = torch.empty_like(self.src)
        self.bytes = 2 * numel * self.src.element_size()

    def seconds(self) -> float:
        return time_call(lambda: self.dst.copy_(self.src), self.src.device)

    def gbps(self, reps: int = 5) -> float:
        """Median copy bandwidth over ``reps`` copies, after one warm-up copy."""
        self.seconds()
        return self.bytes / statistics.median(self.seconds() for _ in range(reps)) / 1e9


def measure(
    fn: Callable[[], object],
    model_bytes: int,
    copy: CopyReference,
    device: torch.device,
    reps: int,
    warmup: int = 1,
    budget_s: float | None = None,
    min_reps: int = 3,
) -> Timing:
    """Time ``fn`` ``reps`` times, each right after a copy.

    Stops early once ``budget_s`` seconds have passed and at least ``min_reps`` repetitions are
    in. On a shared machine noise only ever adds time, so besides the medians the fastest
    candidate over the fastest copy (``fraction_best``) is the least disturbed estimate.
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    copies: list[float] = []
    fractions: list[float] = []
    started = time.perf_counter()
    for _ in range(max(1, reps)):
        t_copy = copy.seconds()
        t = time_call(fn, device)
        copy_bw = copy.bytes / t_copy
        times.append(t)
        copies.append(copy_bw)
        fractions.append((model_bytes / t) / copy_bw)
        spent = time.perf_counter() - started
        if budget_s is not None and spent > budget_s and len(times) >= min_reps:
            break
    return Timing(
        median_s=statistics.median(times),
        min_s=min(times),
        copy_gbps=statistics.median(copies) / 1e9,
        fraction=statistics.median(fractions),
        fraction_best=(model_bytes / min(times)) / max(copies),
        reps=len(times),
    )
