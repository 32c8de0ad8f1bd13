"""What both callbacks share: opening the run, reading numbers and token counts, the missing
library's one-line error."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import normlab.track
from normlab.track import Run


def missing_library(module: str, library: str, extra: str) -> ImportError:
    """The one-line error of a callback module whose library is not installed."""
    return ImportError(f"{module} needs {library}: pip install 'normlab[{extra}]'")


def open_run(
    run: Run | None, norm: str | None, seed: int | None, run_dir: str | Path | None
) -> Run:
    """``run`` when given (``norm``, ``seed`` and ``run_dir`` must then be None), else
    :func:`normlab.track.init` with them."""
    if run is None:
        return normlab.track.init(norm=norm, seed=seed, run_dir=run_dir)
    if not isinstance(run, Run):
        raise TypeError(f"run: expected a normlab.track.Run, got {type(run).__name__}")
    pairs = (("norm", norm), ("seed", seed), ("run_dir", run_dir))
    given = [name for name, value in pairs if value is not None]
    if given:
        raise ValueError(
            f"{given[0]}: the run is given (run=...); expected either a run or "
            "norm/seed/run_dir to open one, not both"
        )
    return run


def number(value: Any) -> float | None:
    """``value`` as a float when it is a real number or a one-element tensor, else None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        return float(value.detach().float().item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor of a batch: a tensor, or a (nested) tuple, list or mapping holding one
    (in order), None when there is none."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (tuple, list)) or isinstance(batch, Mapping):
        for item in values:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def grad_norm(parameters: Any) -> float | None:
    """‖g‖₂ over every gradient of ``parameters`` (float32 sums; None without gradients)."""
    norms = [
        torch.linalg.vector_norm(p.grad.detach().float()).cpu()
        for p in parameters
        if p.grad is not None
    ]
    if not norms:
        return None
    return float(torch.linalg.vector_norm(torch.stack(norms)))
