"""Log a run of your own training loop in normlab's run format, so ``normlab compare --script``
can pair, check and judge it (docs/own-loop.md).

::

    import normlab.track

    with normlab.track.init() as run:          # arm, seed and run folder from compare
        model = build(norm=run.norm, seed=run.seed)
        run.fingerprint(model, first_batch)    # the pairing guard's evidence
        for step in range(1, steps + 1):
            ...
            run.log(step, loss=loss, grad_norm=gn, tokens=batch_tokens)
        run.log_eval(step, val_loss=val_loss)
    # leaving the block calls run.finish(); an exception records the run as crashed

Started by compare, :func:`init` reads the arm (norm, placement, precision), the seed and the
run folder from the environment (:data:`normlab.run_format.script.ENV`); started on its own, it
takes them as arguments (the folder defaults to ``normlab-runs/<arm>__s<seed>``). Under
torchrun only rank 0 (``RANK`` unset or 0) writes; the other ranks' calls do nothing. Every file
goes through :mod:`normlab.run_format.folder`: records are appended one whole line at a time,
the summary and the fingerprint are written to a temporary name and renamed.
"""

from __future__ import annotations

import math
import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn

from normlab._resources import peak_memory
from normlab.audit.model import is_norm_module
from normlab.experiment.config import arm_name
from normlab.models.init import combined_digest, tensor_digest
from normlab.run_format import (
    CRASHED,
    DIVERGED,
    EVAL_RECORD,
    FINISHED,
    TRAIN_RECORD,
    run_id,
    testbed_format,
)
from normlab.run_format.folder import (
    append_record,
    has_run_config,
    read_run_config,
    write_fingerprint,
    write_run_config,
)
from normlab.run_format.script import ENV, RUN_DIR_ENV, SEED_ENV
from normlab.run_format.summary import IDENTITY, build_summary, finish_run

__all__ = ["DEFAULT_ROOT", "Run", "batch_digest", "init", "shared_digests"]

DEFAULT_ROOT = Path("normlab-runs")
"""Where a standalone run's folder goes when none is given: ``normlab-runs/<arm>__s<seed>``."""
_DEFAULTS = {"placement": "pre", "precision": "fp32"}


def _is_rank_zero() -> bool:
    rank = os.environ.get("RANK", "0").strip() or "0"
    return rank == "0"


def shared_digests(model: nn.Module) -> dict[str, str]:
    """{parameter name: digest} of every parameter of ``model`` outside its norm modules (a
    module is a norm when :func:`normlab.audit.model.is_norm_module` says so; every parameter
    under it is left out). The digest is SHA-256 over dtype, shape and the raw bytes
    (:func:`normlab.models.init.tensor_digest`), so equal digests mean bit-equal values."""
    norm_prefixes = [f"{name}." for name, m in model.named_modules() if name and is_norm_module(m)]
    whole_model_is_norm = is_norm_module(model)
    return {
        name: tensor_digest(p.detach().cpu())
        for name, p in model.named_parameters()
        if not whole_model_is_norm and not any(name.startswith(pre) for pre in norm_prefixes)
    }


def batch_digest(batch: Any) -> str:
    """One digest of a batch: a tensor, or a (nested) tuple, list or mapping of tensors (other
    leaves count by their ``repr``). Each leaf is digested as in :func:`shared_digests`, named
    by its path (``0``, ``input_ids``, ``1.labels``), and the names and digests are combined in
    name order (:func:`normlab.models.init.combined_digest`)."""
    leaves: dict[str, str] = {}

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            leaves[path] = tensor_digest(obj.detach().cpu().contiguous())
        elif isinstance(obj, Mapping):
            for key in obj:
                walk(obj[key], f"{path}.{key}" if path else str(key))
        elif isinstance(obj, (tuple, list)):
            for i, item in enumerate(obj):
                walk(item, f"{path}.{i}" if path else str(i))
        else:
            leaves[path] = repr(obj)

    walk(batch, "")
    return combined_digest(leaves)


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a number or a one-element tensor, got {value!r}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    return value


class Run:
    """One run of a user's training loop: its arm, seed and folder, and what it logs.

    Attributes: ``norm``, ``placement``, ``precision`` (the arm's factors), ``seed``,
    ``run_dir``, ``active`` (False on torchrun ranks other than 0: nothing is written).
    """

    def __init__(
        self,
        norm: str,
        placement: str,
        precision: str,
        seed: int,
        run_dir: Path,
        active: bool = True,
    ) -> None:
        self.norm, self.placement, self.precision, self.seed = norm, placement, precision, seed
        self.run_dir = Path(run_dir)
        self.active = active
        self.finished = False
        self._started = time.perf_counter()
        self._tokens = 0
        self._first_log: tuple[float, int] | None = None
        self._last_log: tuple[float, int] | None = None
        self._last_step = 0
        self._last_loss: float | None = None
        self._diverged_at: int | None = None
        self._evals: dict[str, list[float]] = {}
        if active:
            self._spec = self._run_config()

    # -- the run's identity ------------------------------------------------------------------

    def _run_config(self) -> dict[str, Any]:
        """The folder's ``run.json`` (written by compare), or a new one for a standalone run."""
        if has_run_config(self.run_dir):
            spec = read_run_config(self.run_dir)
        else:
            arm = arm_name(self.norm, self.placement)
            spec = {
                "run_id": run_id(arm, self.seed),
                "arm": arm,
                "seed": self.seed,
                "norm": self.norm,
                "placement": self.placement,
                "precision": self.precision,
                "train": {"steps": 0},
            }
            write_run_config(self.run_dir, spec)
        return spec

    # -- logging -------------------------------------------------------------------------------

    def log(self, step: int, **metrics: Any) -> None:
        """Append a ``train`` record: ``step`` and ``metrics`` as given (numbers or one-element
        tensors); ``tokens`` (this step's tokens) is added up into ``tokens_seen``. A non-finite
        value marks the run diverged at its first such step (the run's status at
        :meth:`finish`)."""
        now = time.perf_counter()
        record = self._record(TRAIN_RECORD, step, metrics)
        if "tokens" in record:
            self._tokens += int(record["tokens"])
            record["tokens_seen"] = self._tokens
        if self._first_log is None:
            self._first_log = (now, self._tokens)
        self._last_log = (now, self._tokens)
        if "loss" in record:
            self._last_loss = record["loss"]
        self._write(record)

    def log_eval(self, step: int, **metrics: Any) -> None:
        """Append an ``eval`` record: ``step``, ``metrics`` as given, ``tokens_seen`` and
        ``elapsed_s`` (seconds since :func:`init`). The last value of each metric becomes the
        summary's ``final_<name>``; a non-finite value marks the run diverged."""
        record = self._record(EVAL_RECORD, step, metrics)
        record["tokens_seen"] = self._tokens
        record["elapsed_s"] = time.perf_counter() - self._started
        for name in metrics:
            self._evals.setdefault(name, []).append(record[name])
        self._write(record)

    def _record(self, kind: str, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        step = int(_number("step", step))
        record: dict[str, Any] = {"type": kind, "step": step}
        for name, value in metrics.items():
            value = _number(name, value)
            if isinstance(value, float) and not math.isfinite(value) and self._diverged_at is None:
                self._diverged_at = step
            record[name] = value
        self._last_step = max(self._last_step, step)
        return record

    def _write(self, record: dict[str, Any]) -> None:
        if self.active:
            append_record(self.run_dir, record)

    def fingerprint(self, model: nn.Module, batch: Any) -> dict[str, Any]:
        """Record the pairing guard's evidence in ``fingerprint.json``: the digest of every
        initial parameter outside the norm modules (:func:`shared_digests`) and of the first
        batch (:func:`batch_digest`). Call it after the model is built and before the first
        step; compare refuses to judge a seed whose arms' fingerprints differ. Returns what it
        recorded."""
        record = {"parameters": shared_digests(model), "batch": batch_digest(batch)}
        if self.active:
            write_fingerprint(self.run_dir, record)
        return record

    # -- the end -------------------------------------------------------------------------------

    def throughput(self) -> float | None:
        """Tokens per second over the logged steps after the first:
        (tokens_seen at the last ``log`` − at the first) / (time of the last ``log`` − of the
        first), so the first step's warm-up is left out; None with fewer than two logged
        steps or no ``tokens``."""
        if self._first_log is None or self._last_log is None:
            return None
        (t0, n0), (t1, n1) = self._first_log, self._last_log
        return (n1 - n0) / (t1 - t0) if t1 > t0 and n1 > n0 else None

    def summary(self, status: str, **extra: Any) -> dict[str, Any]:
        """The run's summary (:func:`normlab.run_format.summary.build_summary`): identity,
        status, ``steps`` (the last step logged), ``tokens``, ``final_train_loss`` (the last
        ``loss`` logged), ``tokens_per_s`` (:meth:`throughput`), ``peak_memory_bytes``
        (:func:`normlab._resources.peak_memory`: CUDA's max allocated bytes when CUDA is in use,
        else the peak resident set), ``wall_s``; then ``final_<m>`` for every metric logged with
        :meth:`log_eval` and ``best_<m>`` for the metric compare judges (its best finite value:
        :func:`normlab.run_format.summary.logged_quality`); ``extra`` overrides or adds
        fields."""
        spec = self._spec if self.active else {}
        fmt = testbed_format(spec["testbed"]) if "testbed" in spec else None
        identity = {key: spec.get(key, getattr(self, key, None)) for key in IDENTITY}
        device = torch.device("cuda") if torch.cuda.is_initialized() else torch.device("cpu")
        peak, kind = peak_memory(device)
        measured = {
            "diverged_at": self._diverged_at,
            "steps": self._last_step,
            "tokens": self._tokens,
            "final_train_loss": self._last_loss,
            "tokens_per_s": self.throughput(),
            "peak_memory_bytes": peak,
            "peak_memory_kind": kind,
            "wall_s": time.perf_counter() - self._started,
            "device": str(device),
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
        }
        return build_summary(fmt, identity, status, measured, logged=self._evals, extra=extra)

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Write ``summary.json`` (:meth:`summary`; status ``diverged`` when a logged value was
        not finite, else ``finished``) and return it. ``extra`` gives measured values the API
        cannot see (e.g. ``tokens_per_s=…``, ``peak_memory_bytes=…``) or adds fields."""
        status = DIVERGED if self._diverged_at is not None else FINISHED
        return self._end(self.summary(status, **extra))

    def crash(self, error: BaseException) -> dict[str, Any]:
        """Write a ``crashed`` summary holding ``error`` and its traceback, and return it."""
        summary = self.summary(
            CRASHED,
            error=f"{type(error).__name__}: {error}",
            traceback="".join(traceback.format_exception(error)),
        )
        return self._end(summary)

    def _end(self, summary: dict[str, Any]) -> dict[str, Any]:
        if self.active:
            finish_run(self.run_dir, summary)
        self.finished = True
        return summary

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self.crash(exc)  # the exception goes on
        elif not self.finished:
            self.finish()


def init(
    norm: str | None = None,
    seed: int | None = None,
    run_dir: str | Path | None = None,
    placement: str | None = None,
    precision: str | None = None,
) -> Run:
    """Start logging a run. Under ``normlab compare --script`` the environment gives the arm,
    the seed and the run folder (and wins over the arguments); on its own, the arguments do:
    ``norm`` is required, ``seed`` defaults to 0, ``placement`` to ``pre``, ``precision`` to
    ``fp32`` and ``run_dir`` to ``normlab-runs/<norm>-<placement>__s<seed>``. Raises
    ``ValueError`` naming what is missing or malformed."""
    given = {"norm": norm, "placement": placement, "precision": precision}
    factors: dict[str, str] = {}
    for factor, value in given.items():
        env = os.environ.get(ENV[factor])
        chosen = env if env else value
        if chosen is None:
            chosen = _DEFAULTS.get(factor)
        if not chosen:
            raise ValueError(
                f"{factor}: not set; expected normlab.track.init({factor}=...) or a run started "
                f"by normlab compare --script (which sets {ENV[factor]})"
            )
        factors[factor] = str(chosen)
    raw_seed = os.environ.get(SEED_ENV)
    try:
        chosen_seed = int(raw_seed) if raw_seed else int(seed if seed is not None else 0)
    except ValueError:
        raise ValueError(
            f"seed: expected an integer, got {raw_seed if raw_seed else seed!r}"
        ) from None
    folder = os.environ.get(RUN_DIR_ENV) or run_dir
    if not folder:
        folder = DEFAULT_ROOT / run_id(arm_name(factors["norm"], factors["placement"]), chosen_seed)
    return Run(
        factors["norm"],
        factors["placement"],
        factors["precision"],
        chosen_seed,
        Path(folder),
        active=_is_rank_zero(),
    )
