"""Bytes that a forward pass keeps alive for its backward: the activation memory of a model.

While :class:`SavedActivationBytes` is active, every tensor that autograd saves for the backward
pass (``ctx.save_for_backward``, the inputs a built-in op keeps) goes through its pack hook,
which records the tensor's storage. The figure is the sum of the sizes of the distinct storages,
parameters left out:

    saved bytes = Σ over distinct storages s saved, s not a parameter's, of nbytes(s)

A view counts its whole storage (that is what it keeps alive), and a storage saved by several
ops counts once. Unlike a process's resident memory it does not depend on the allocator, the
libraries loaded or the machine, so it tells two norms apart exactly: LayerNorm's backward keeps
the mean and 1/σ of every row, RMSNorm's only 1/rms, a fused kernel less than a composite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType

import torch


class SavedActivationBytes:
    """Context manager counting the bytes saved for backward while it is active.

    ``exclude``: tensors whose storages are not counted (the model's parameters). Read
    :attr:`bytes` after the block.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {_storage_key(t) for t in exclude}
        self._sizes: dict[object, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @property
    def bytes(self) -> int:
        """Σ nbytes over the distinct non-parameter storages saved so far."""
        return sum(self._sizes.values())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self._excluded and key not in self._sizes:
            self._sizes[key] = _storage_bytes(t)
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedActivationBytes:
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hooks.__exit__(exc_type, exc, tb)


def _storage_key(t: torch.Tensor) -> object:
    """The storage's device and address; the tensor's identity for storage-less tensors."""
    try:
        storage = t.untyped_storage()
        if storage.data_ptr() != 0:
            return (str(t.device), storage.data_ptr())
    except (RuntimeError, NotImplementedError):
        pass
    return ("tensor", id(t))


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


def run_hooked_pass(
    model: torch.nn.Module,
    run_batch: Callable[[torch.nn.Module], object],
    handles: Iterable[torch.utils.hooks.RemovableHandle],
) -> None:
    """Run ``run_batch(model)`` once in eval mode, then remove the hooks ``handles`` and
    restore the training mode, even when the forward raises."""
    was_training = model.training
    model.eval()
    try:
        run_batch(model)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
