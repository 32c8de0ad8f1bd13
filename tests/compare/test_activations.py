"""SavedActivationBytes: the bytes a forward keeps for its backward, parameters left out."""

from __future__ import annotations

import pytest
import torch

import normlab.functional as NF
from normlab.experiment.measure.activations import SavedActivationBytes
from normlab.kernels import backends_for

CPU_BACKENDS = backends_for("cpu")
"""The backends that run on the CPU here (as tests/conftest.py's ``backend`` fixture)."""


def test_counts_each_storage_once_and_a_view_as_its_whole_storage() -> None:
    x = torch.randn(8, 4, requires_grad=True)
    with SavedActivationBytes() as counter:
        h = x * 2.0  # mul by a number saves nothing
        a = h.sin()  # saves h (32 floats)
        b = h[:2].cos()  # saves a view of h: h's storage, already counted
        c = a.exp()  # saves its result (32 floats)
    assert counter.bytes == 2 * 32 * 4
    (a + b.sum() + c).sum().backward()  # the graph still works: nothing was replaced


def test_parameters_are_left_out() -> None:
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4, requires_grad=True)
    with SavedActivationBytes([w]) as counter:
        x @ w  # saves x and w
    assert counter.bytes == 3 * 4 * 4


def test_nothing_is_counted_outside_the_block_or_without_grad() -> None:
    x = torch.randn(16, requires_grad=True)
    with SavedActivationBytes() as counter, torch.no_grad():
        x.sin()
    x.sin()
    assert counter.bytes == 0


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_fused_backends_save_x_and_the_row_statistics(backend: str) -> None:
    """A fused LayerNorm keeps x, μ and 1/σ (N floats each); RMSNorm x and 1/rms: one row
    statistic less. The reference composite keeps intermediates as well."""
    n, d = 32, 64
    x = torch.randn(n, d, requires_grad=True)
    w = torch.ones(d, requires_grad=True)
    b = torch.zeros(d, requires_grad=True)
    with SavedActivationBytes([w, b]) as ln:
        NF.layer_norm(x, w, b, backend=backend)
    with SavedActivationBytes([w]) as rms:
        NF.rms_norm(x, w, backend=backend)
    if backend == "torch":
        assert ln.bytes >= n * d * 4 and rms.bytes >= n * d * 4
    else:
        assert ln.bytes == n * d * 4 + 2 * n * 4
        assert rms.bytes == n * d * 4 + n * 4
