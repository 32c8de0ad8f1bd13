"""The time of one training step: CUDA events on a CUDA device, the host clock elsewhere.

On CUDA the step's kernels run asynchronously; :class:`StepTimer` records an event on the
current stream before the step and one after it, waits for the second, and reads the time
between them from the device (``Event.elapsed_time``, milliseconds, → seconds). Elsewhere it is
``time.perf_counter()`` around the step, which the caller ends after synchronising the device.
"""

from __future__ import annotations

import time

import torch

__all__ = ["StepTimer"]


class StepTimer:
    """``start()`` before a step, ``stop()`` after it: the step's seconds."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._begin: torch.cuda.Event | None = None
        self._started = 0.0

    def start(self) -> None:
        if self.cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._begin.record()
        self._started = time.perf_counter()

    def stop(self) -> float:
        """Seconds since :meth:`start`: t_end − t_begin of the two CUDA events (their own
        clock, after waiting for the second), else the host clock's difference."""
        if self.cuda and self._begin is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return self._begin.elapsed_time(end) / 1000.0
        return time.perf_counter() - self._started
