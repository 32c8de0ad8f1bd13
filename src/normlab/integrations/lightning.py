"""A ``lightning.pytorch.Callback`` that logs a Lightning ``Trainer`` run in normlab's run format
(:mod:`normlab.track`), so that ``normlab compare --script`` can judge it.

::

    import normlab
    from normlab.integrations.lightning import NormlabCallback

    run = normlab.track.init(norm=args.norm, seed=args.seed, run_dir=args.out)
    module = MyModule(norm=run.norm)   # or normlab.replace_norms(module, to=run.norm)
    trainer = lightning.Trainer(max_steps=..., callbacks=[NormlabCallback(run)],
                                logger=False, enable_checkpointing=False)
    trainer.fit(module, train_loader, val_loader)

What it records, on global rank zero only (``trainer.is_global_zero``; and, as
:mod:`normlab.track`, only where ``RANK`` is unset or 0):

- at the first training batch (``on_train_batch_start``, before the first optimizer step): the
  pairing guard's fingerprint, the digests of the module's initial parameters outside the norms
  and of that batch (:meth:`normlab.track.Run.fingerprint`);
- at each optimizer step (``on_train_batch_end`` once ``trainer.global_step`` moved on): a
  ``train`` record at that step with ``loss`` (the mean of the step's batches' losses, from what
  ``training_step`` returned), ``grad_norm`` (‖g‖₂ over the module's gradients, before
  clipping, measured in ``on_before_optimizer_step``) and ``tokens`` (the step's tokens: the
  ``tokens`` callable of each batch, by default the number of elements of the batch's first
  tensor, e.g. the input ids);
- at ``on_validation_epoch_end`` (not during the sanity check): an ``eval`` record with the
  ``trainer.callback_metrics`` named in ``metrics``, by default every one whose name starts with
  ``val`` (``self.log("val_loss", ...)`` in ``validation_step``);
- at ``on_fit_end``: :meth:`~normlab.track.Run.finish` (the summary); a validation after that
  (``trainer.validate``) is logged too and rewrites the summary;
- at ``on_exception``: :meth:`~normlab.track.Run.crash`, a ``crashed`` summary with the error
  and its traceback (Lightning then raises it again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from normlab.integrations._common import (
    first_tensor,
    grad_norm,
    missing_library,
    number,
    open_run,
)
from normlab.track import Run

try:
    from lightning.pytorch import Callback
except ImportError:
    raise missing_library(__name__, "lightning", "lightning") from None

__all__ = ["VALIDATION_PREFIX", "NormlabCallback", "batch_tokens"]

VALIDATION_PREFIX = "val"
"""The callback metrics logged by default: those whose name starts with it."""


def batch_tokens(batch: Any) -> int:
    """The default token count of a batch: the number of elements of its first tensor (a
    tensor, or the first in a nested tuple, list or mapping); 0 without one."""
    first = first_tensor(batch)
    return 0 if first is None else int(first.numel())


class NormlabCallback(Callback):
    """Log a ``lightning.pytorch.Trainer`` run through :mod:`normlab.track` (see the module
    docs).

    ``run``: the :class:`normlab.track.Run` to log to; without it, one is opened with
    :func:`normlab.track.init` (``norm``, ``seed``, ``run_dir``; under ``compare --script`` the
    environment gives them) and is :attr:`run`. ``metrics``: the callback metrics each
    validation logs (None: those starting with ``val``). ``tokens``: a batch's token count
    (default :func:`batch_tokens`).
    """

    def __init__(
        self,
        run: Run | None = None,
        *,
        norm: str | None = None,
        seed: int | None = None,
        run_dir: str | Path | None = None,
        metrics: Sequence[str] | None = None,
        tokens: Callable[[Any], int] = batch_tokens,
    ) -> None:
        if metrics is not None and (
            isinstance(metrics, str) or not all(isinstance(m, str) and m for m in metrics)
        ):
            raise ValueError(f"metrics: expected a list of metric names or None, got {metrics!r}")
        if not callable(tokens):
            raise TypeError(f"tokens: expected a callable batch -> int, got {tokens!r}")
        self.run = open_run(run, norm, seed, run_dir)
        self.metrics = None if metrics is None else tuple(metrics)
        self.tokens = tokens
        self._fingerprinted = False
        self._ended = False
        self._step = 0  # trainer.global_step at the last train record
        self._losses: list[float] = []
        self._tokens = 0
        self._grad_norm: float | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._ended = False
        self._step = trainer.global_step
        self._losses, self._tokens, self._grad_norm = [], 0, None

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_global_zero and not self._fingerprinted:
            self._fingerprinted = True
            self.run.fingerprint(pl_module, batch)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if trainer.is_global_zero:
            self._grad_norm = grad_norm(pl_module.parameters())

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        loss = number(outputs.get("loss") if isinstance(outputs, Mapping) else outputs)
        if loss is not None:
            self._losses.append(loss)
        self._tokens += int(self.tokens(batch))
        if trainer.global_step <= self._step:
            return  # gradients still accumulating: the step is not done
        self._step = trainer.global_step
        metrics: dict[str, float | int] = {}
        if self._losses:
            metrics["loss"] = sum(self._losses) / len(self._losses)
        if self._grad_norm is not None:
            metrics["grad_norm"] = self._grad_norm
        if self._tokens:
            metrics["tokens"] = self._tokens
        self.run.log(self._step, **metrics)
        self._losses, self._tokens, self._grad_norm = [], 0, None

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        values: dict[str, float] = {}
        for name, value in trainer.callback_metrics.items():
            wanted = (
                name.startswith(VALIDATION_PREFIX) if self.metrics is None else name in self.metrics
            )
            x = number(value) if wanted else None
            if x is not None:
                values[name] = x
        if values:
            self.run.log_eval(trainer.global_step, **values)
            if self._ended:
                self.run.finish()

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self._ended = True
            self.run.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if trainer.is_global_zero:
            self.run.crash(exception)
