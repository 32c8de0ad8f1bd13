"""A uniform average of a model's weights over the last steps of its training
(``train.average_last``), kept outside the model and evaluated at the end.

With K = :func:`~normlab.run_format.train_options.fraction_steps` (n, a) of a run's n steps, the
average is θ̄ = (1 / K) Σ_{s = n − K + 1}^{n} θ_s, θ_s every parameter after step s (a step the
fp16 gradient scaler skipped counts, with the weights it left). The sum is accumulated in
float64 on the parameter's device, outside the model; the model is only read
(``torch.no_grad``), never written, so the training is the same with or without it.
:meth:`WeightAverage.swapped_in` puts θ̄ (cast to each parameter's dtype) into the model for an
evaluation and puts the trained weights back, bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """Σ θ_s over the steps from ``first_step`` on (1-based) of ``model``'s parameters, by
    name; :meth:`update` after every step, :meth:`swapped_in` to evaluate the mean."""

    def __init__(self, model: nn.Module, first_step: int) -> None:
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 1:
            raise ValueError(f"first_step: expected an int >= 1, got {first_step!r}")
        self.model = model
        self.first_step = first_step
        self.count = 0
        self.sums: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Add the weights after ``step`` when it is one of the averaged steps."""
        if step < self.first_step:
            return
        for name, p in self.model.named_parameters():
            value = p.detach().to(torch.float64)
            if name in self.sums:
                self.sums[name] += value
            else:
                self.sums[name] = value.clone()
        self.count += 1

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[nn.Module]:
        """The model holding the averaged weights θ̄ = Σ θ_s / K for the ``with`` block, its
        own weights back (exact copies) afterwards. RuntimeError before any averaged step."""
        if self.count == 0:
            raise RuntimeError(
                f"no averaged step yet: averaging starts after step {self.first_step}"
            )
        params = dict(self.model.named_parameters())
        kept = {name: params[name].detach().clone() for name in self.sums}
        try:
            with torch.no_grad():
                for name, total in self.sums.items():
                    params[name].copy_((total / self.count).to(params[name].dtype))
            yield self.model
        finally:
            with torch.no_grad():
                for name, value in kept.items():
                    params[name].copy_(value)
