"""The training precision of a run: autocast around forward and loss, and for fp16 a gradient
scaler whose skipped steps are counted, not treated as divergence.

- ``fp32``: no autocast, no scaler; the training computation is exactly the plain loop's.
- ``bf16``: ``torch.autocast(device_type, dtype=torch.bfloat16)`` around forward + loss; the
  parameters, gradients and optimizer state stay float32 (the master weights).
- ``fp16``: the same with ``torch.float16``, plus ``torch.amp.GradScaler(device_type)``: the loss
  is multiplied by the scale S before backward, the gradients are divided by S
  (``unscale_``) before clipping, and a step whose gradients hold an inf or NaN is skipped and S
  halved (S doubles after ``growth_interval`` clean steps). A skipped step is detected as a
  drop of S across ``update()``.

Validation, health statistics and post-training numbers are computed in float32 on the float32
master weights, whatever the training precision.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from normlab.distributed.wrap import DEFAULT_PRECISION, PRECISIONS

__all__ = [
    "AUTOCAST_DTYPES",
    "DEFAULT_PRECISION",
    "TRAINING_PRECISIONS",
    "PrecisionStep",
    "StepOutcome",
    "autocast_for",
    "check_precision",
]

TRAINING_PRECISIONS: tuple[str, ...] = PRECISIONS
"""The precisions a run may train in (``fp32``, ``bf16``, ``fp16``): the same names as the
distributed wrapping's mixed-precision policies."""
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each 16-bit training precision."""


def check_precision(precision: object, name: str = "precision") -> str:
    """``precision`` if it is one of :data:`TRAINING_PRECISIONS`, else ``ValueError`` naming
    ``name`` (fp8, for instance, is a post-training format here, not a training precision)."""
    if precision not in TRAINING_PRECISIONS:
        raise ValueError(
            f"{name}: {precision!r} is not a training precision; expected one of "
            f"{', '.join(TRAINING_PRECISIONS)}"
        )
    return str(precision)


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context for forward + loss at ``precision`` on ``device``: ``torch.autocast`` with
    the 16-bit dtype, or a no-op context for fp32."""
    check_precision(precision)
    if precision not in AUTOCAST_DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


@dataclass
class StepOutcome:
    """What one optimisation step did: ``grad_norm`` (of the unscaled gradients, before
    clipping), whether the optimizer ``stepped``, whether the gradient scaler ``skipped`` it
    (fp16 only: an inf/NaN in the scaled gradients), and what ``read_grads`` returned (None
    when not given)."""

    grad_norm: float
    stepped: bool
    skipped: bool
    read: Any = None


class PrecisionStep:
    """Backward, clipping and optimizer step of one training step at a precision.

    For fp32 and bf16 it is the plain sequence ``loss.backward()``, clip, ``optimizer.step()``
    when the loss and the gradient norm are finite. For fp16, with a
    :class:`torch.amp.GradScaler` (``init_scale`` as given, torch's default 2¹⁶ otherwise):
    ``scale(loss).backward()``, ``unscale_``, clip, ``scaler.step`` (which skips the step on
    inf/NaN gradients), ``update``; the number of skipped steps is :attr:`n_skipped`.
    ``read_grads()``, if given, is called with the gradients unscaled, before clipping (the
    per-group gradient norms are read there); its result is the outcome's ``read``.
    """

    def __init__(
        self,
        precision: str,
        device: torch.device,
        optimizer: torch.optim.Optimizer,
        init_scale: float | None = None,
    ) -> None:
        self.precision = check_precision(precision)
        self.device = device
        self.optimizer = optimizer
        self.n_skipped = 0
        self.scaler: torch.amp.GradScaler | None = None
        if precision == "fp16":
            kwargs = {} if init_scale is None else {"init_scale": float(init_scale)}
            self.scaler = torch.amp.GradScaler(device.type, **kwargs)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward + loss context (see :func:`autocast_for`)."""
        return autocast_for(self.precision, self.device)

    def run(
        self,
        loss: torch.Tensor,
        loss_value: float,
        clip: Callable[[], float],
        read_grads: Callable[[], Any] | None = None,
    ) -> StepOutcome:
        """Backward of ``loss`` (whose ``.item()`` is ``loss_value``), then ``read_grads()``,
        ``clip()`` (returns the total gradient norm) and the optimizer step, as the class
        docstring says."""
        if self.scaler is None:
            loss.backward()
            read = read_grads() if read_grads is not None else None
            grad_norm = clip()
            finite = math.isfinite(loss_value) and math.isfinite(grad_norm)
            if finite:
                self.optimizer.step()
            return StepOutcome(grad_norm, finite, False, read)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        read = read_grads() if read_grads is not None else None
        grad_norm = clip()
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < scale
        self.n_skipped += skipped
        return StepOutcome(grad_norm, not skipped, skipped, read)
