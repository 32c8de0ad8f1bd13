"""A ``transformers.TrainerCallback`` that logs a Hugging Face ``Trainer`` run in normlab's run
format (:mod:`normlab.track`), so that ``normlab compare --script`` can judge it.

::

    import normlab
    from normlab.integrations.hf import NormlabCallback

    with normlab.track.init(norm=args.norm, seed=args.seed, run_dir=args.out) as run:
        set_seed(run.seed)
        model = LlamaForCausalLM(config)              # the same initial values in every arm
        normlab.replace_norms(model, to=run.norm)     # the arm's norm in every norm slot
        trainer = Trainer(model, training_args, ..., callbacks=[NormlabCallback(run)])
        trainer.train()                               # a raise is recorded by the with block

What it records, on the main process only (``state.is_world_process_zero``; and, as
:mod:`normlab.track`, only where ``RANK`` is unset or 0):

- at the first training forward (the model's inputs as the Trainer gives them, before the first
  optimizer step): the pairing guard's fingerprint, the digests of the initial parameters
  outside the norms and of that first batch (:meth:`normlab.track.Run.fingerprint`);
- at ``on_log``: a ``train`` record at ``state.global_step`` with ``loss``, ``grad_norm`` and
  ``learning_rate`` as the Trainer logged them, and ``tokens``, the tokens since the last log:
  from ``state.num_input_tokens_seen`` when the Trainer counts them
  (``include_num_input_tokens_seen``, every process), else the elements of the model's main
  input (``input_ids``) in this process's training forwards;
- at ``on_evaluate``: an ``eval`` record with ``eval_loss`` under the name ``metric``
  (``val_loss`` by default: the name ``compare --metric`` judges) and every other ``eval_*``
  metric without its prefix (the Trainer's timings left out);
- at ``on_train_end``: :meth:`~normlab.track.Run.finish` (the summary). An evaluation after
  that (``trainer.evaluate()`` after ``trainer.train()``) is logged too and rewrites the summary.

A ``TrainerCallback`` sees no exception: run ``trainer.train()`` inside the ``with`` block of the
run you give the callback (as above), or inside ``with callback:``; either writes a ``crashed``
summary with the error and its traceback, and the exception goes on.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from normlab.integrations._common import missing_library, number, open_run
from normlab.track import Run

try:
    from transformers import TrainerCallback
except ImportError:
    raise missing_library(__name__, "transformers", "hf") from None

__all__ = ["NormlabCallback"]

TRAIN_KEYS = ("loss", "grad_norm", "learning_rate")
"""What a ``train`` record takes from the Trainer's logs."""
EVAL_PREFIX = "eval_"
EVAL_LOSS = "eval_loss"
_TIMINGS = ("_runtime", "_per_second", "_preparation_time")


class NormlabCallback(TrainerCallback):
    """Log a ``transformers.Trainer`` run through :mod:`normlab.track` (see the module docs).

    ``run``: the :class:`normlab.track.Run` to log to; without it, one is opened with
    :func:`normlab.track.init` (``norm``, ``seed``, ``run_dir``; under ``compare --script`` the
    environment gives them) and is :attr:`run`. ``metric``: the name ``eval_loss`` is logged
    under.
    """

    def __init__(
        self,
        run: Run | None = None,
        *,
        norm: str | None = None,
        seed: int | None = None,
        run_dir: str | Path | None = None,
        metric: str = "val_loss",
    ) -> None:
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric: expected a metric name, got {metric!r}")
        self.run = open_run(run, norm, seed, run_dir)
        self.metric = metric
        self._hook: RemovableHandle | None = None
        self._fingerprinted = False
        self._main = True
        self._ended = False
        self._forward_tokens = 0  # this process's main-input elements since the last log
        self._trainer_tokens = 0  # state.num_input_tokens_seen at the last log

    # -- the Trainer's events --------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._main = bool(state.is_world_process_zero)
        self._ended = False
        self._trainer_tokens = int(state.num_input_tokens_seen or 0)
        model = kwargs.get("model")
        if self._main and isinstance(model, nn.Module) and self._hook is None:
            self._hook = model.register_forward_pre_hook(self._on_forward, with_kwargs=True)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not self._main or not logs or "loss" not in logs:
            return  # evaluation logs come through on_evaluate; the final summary has no "loss"
        metrics = {k: v for k in TRAIN_KEYS if (v := number(logs.get(k))) is not None}
        seen = int(state.num_input_tokens_seen or 0)
        if seen > self._trainer_tokens:
            tokens, self._trainer_tokens = seen - self._trainer_tokens, seen
        else:
            tokens = self._forward_tokens
        self._forward_tokens = 0
        if tokens:
            metrics["tokens"] = tokens
        self.run.log(state.global_step, **metrics)

    def on_evaluate(
        self,
        args: Any,
        state: Any,
        control: Any,
        metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self._main or not metrics:
            return
        values: dict[str, float] = {}
        for name, value in metrics.items():
            if not name.startswith(EVAL_PREFIX) or name.endswith(_TIMINGS):
                continue
            x = number(value)
            if x is not None:
                values[self.metric if name == EVAL_LOSS else name[len(EVAL_PREFIX) :]] = x
        if values:
            self.run.log_eval(state.global_step, **values)
            if self._ended:
                self.run.finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._main:
            self._ended = True
            self.run.finish()

    # -- the model's forward ---------------------------------------------------------------------

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Before each forward of the model in training mode: the fingerprint at the first, and
        the main input's elements (the tokens) at every one."""
        if not module.training:
            return
        if not self._fingerprinted:
            self._fingerprinted = True
            self.run.fingerprint(module, {"args": list(args), **kwargs} if args else kwargs)
        name = getattr(module, "main_input_name", "input_ids")
        main = kwargs.get(name, args[0] if args else None)
        numel = getattr(main, "numel", None)
        if callable(numel):
            self._forward_tokens += int(numel())

    # -- a crash ---------------------------------------------------------------------------------

    def __enter__(self) -> NormlabCallback:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """An exception inside ``with callback:`` is recorded as the run's crash (and goes
        on); leaving the block without one finishes the run if training did not."""
        self.run.__exit__(exc_type, exc, tb)
