"""Timing that survives a noisy machine: paired with a copy, round-robin, summarised by medians.

Every repetition times a plain copy of the same size right before each candidate, so each
candidate time has its own copy-bandwidth reference taken under the same conditions (memory
bandwidth of a shared machine drifts by 2x within seconds). Candidates that are compared with
each other are timed in turn within every repetition (:func:`measure_round_robin`), so a slow
minute slows them all alike. The figures a caller gets are medians over repetitions: of the
time, and of the per-repetition fraction of copy bandwidth.
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
    """A copy of ``numel`` elements of ``dtype`` on ``device``: the bandwidth yardstick.

    The source holds random values, like the inputs of the ops it is compared with: pages of one
    repeated value can be merged or compressed by a virtual machine's host, which would make the
    yardstick faster than any real tensor can be read."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.src = torch.randn(numel, generator=gen).to(device=device, dtype=dtype)
        self.dst = torch.empty_like(self.src)
        self.bytes = 2 * numel * self.src.element_size()

    def seconds(self) -> float:
        return time_call(lambda: self.dst.copy_(self.src), self.src.device)

    def gbps(self, reps: int = 5) -> float:
        """Median copy bandwidth over ``reps`` copies, after one warm-up copy."""
        self.seconds()
        return self.bytes / statistics.median(self.seconds() for _ in range(reps)) / 1e9


def _summary(times: list[float], copies: list[float], model_bytes: int, copy_bytes: int) -> Timing:
    copy_bw = [copy_bytes / t for t in copies]
    fractions = [(model_bytes / t) / bw for t, bw in zip(times, copy_bw, strict=True)]
    return Timing(
        median_s=statistics.median(times),
        min_s=min(times),
        copy_gbps=statistics.median(copy_bw) / 1e9,
        fraction=statistics.median(fractions),
        fraction_best=(model_bytes / min(times)) / max(copy_bw),
        reps=len(times),
    )


def measure_round_robin(
    fns: dict[str, Callable[[], object]],
    model_bytes: int,
    copy: CopyReference,
    device: torch.device,
    reps: int,
    warmup: int = 1,
    budget_s: float | None = None,
    min_reps: int = 3,
    after: Callable[[str], object] | None = None,
) -> dict[str, Timing]:
    """Time every candidate ``reps`` times, in turn within each repetition, each after a copy.

    Stops early once ``budget_s`` seconds per candidate have passed and at least ``min_reps``
    repetitions are in. On a shared machine noise only ever adds time, so besides the medians
    the fastest candidate over the fastest copy (``fraction_best``) is the least disturbed
    estimate. ``after(name)`` runs untimed after each call (to free its outputs).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    copies: dict[str, list[float]] = {name: [] for name in fns}
    started = time.perf_counter()
    for rep in range(max(1, reps)):
        for name, fn in fns.items():
            copies[name].append(copy.seconds())
            times[name].append(time_call(fn, device))
            if after is not None:
                after(name)
        spent = time.perf_counter() - started
        if budget_s is not None and spent > budget_s * len(fns) and rep + 1 >= min_reps:
            break
    return {name: _summary(times[name], copies[name], model_bytes, copy.bytes) for name in fns}
