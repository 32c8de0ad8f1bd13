"""Optional third-party packages imported without their import-time warnings.

torchao warns, through its logger, about its CUDA extensions when they fail to load on a
CPU-only torch, and registers Enum classes as pytree constants, which newer torch warns about
through ``torch.utils._pytree``'s logger; neither concerns what normlab does with it. torchao is
imported by normlab's post-training quantization (:func:`import_quietly`) and by transformers'
model classes when it is installed (normlab builds them inside :func:`quiet_loggers`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["NOISY_LOGGERS", "import_quietly", "quiet_loggers"]

NOISY_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers that warn at torchao's import about what does not concern normlab (see above)."""


@contextmanager
def quiet_loggers(names: tuple[str, ...] = NOISY_LOGGERS) -> Iterator[None]:
    """Raise these loggers to ERROR for the block (their warnings dropped, errors kept)."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def import_quietly(name: str) -> ModuleType:
    """``importlib.import_module(name)`` with the :data:`NOISY_LOGGERS` quiet; ImportError as
    the import raises it."""
    with quiet_loggers():
        return importlib.import_module(name)
