"""The Triton backend against the reference backend and a float64 computation.

How the kernels run here: on a GPU they run compiled; on a CPU they need Triton's interpreter,
which Triton chooses when a kernel is *decorated*, from ``TRITON_INTERPRET`` at that moment. In a
pytest process other modules may already have imported normlab (and triton), and setting the
variable from this module would also change how every other Triton kernel in the process runs.
So unless this process can run the kernels as it is (a GPU, or ``TRITON_INTERPRET=1`` set before
the run), this module only contributes a few "shard" tests, each re-running this file's tests of
one group in a fresh ``python -m pytest`` with ``TRITON_INTERPRET=1``: no shared state, works
under pytest-xdist (the shards spread over workers), and a failure shows the inner report.

Accuracy criterion: for every output and gradient, the Triton error against float64 truth must
be within twice the reference backend's error, plus two units of the dtype's epsilon relative to
the largest truth value, plus a float32 floor relative to the problem's scale: the kernels must
be at least about as exact as the oracle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from triton_harness import (
    DEVICE,
    IN_PROCESS,
    SKIPPED,
    nvidia_compile_unavailable,
    run_compile_script,
    run_python,
    run_under_interpreter,
)

SHARDS = {
    "norms": "test_norm_",
    "modulated": "test_modulated_",
    "ops": "test_op_",
    "review": "test_review_",
}


# --------------------------------------------------------------------------------------------
# Outer mode: re-run the groups under the interpreter in fresh processes.

if not IN_PROCESS:

    @pytest.mark.parametrize("shard", sorted(SHARDS))
    def test_triton_kernels_under_interpreter(shard: str) -> None:
        run_under_interpreter(__file__, SHARDS[shard])


def test_import_without_triton_registers_nothing() -> None:
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import normlab\n"
        "from normlab.kernels import available_backends\n"
        "assert 'triton' not in available_backends(), available_backends()\n"
        "print('ok')\n"
    )
    proc = run_python(["-c", code], {**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_kernels_compile_for_cuda_without_a_gpu() -> None:
    """Compile the kernels to sm_80/sm_90 machine code (no GPU needed): no errors, no spills.

    The interpreter is lenient where the compiler is not; this catches what only the compiler
    sees, and register spills at the default launch shapes.
    """
    run_compile_script(__file__, "--compile-for-cuda")


def test_launches_compile_as_cuda_specialises_them() -> None:
    """Every launch of a set of real calls compiles for sm_90 as the CUDA JIT would specialise
    it, within CUDA's grid limits and without register-pressure spills.

    The interpreter never applies these specialisations: integer arguments equal to 1 become
    compile-time constants, others are marked divisible by 16 or not, pointers aligned or not,
    and bfloat16 is rounded by the hardware cast instead of the interpreter's software rounding.
    """
    run_compile_script(__file__, "--compile-as-cuda")


# --------------------------------------------------------------------------------------------
# In-process mode: the tests proper.

if IN_PROCESS:
    triton = pytest.importorskip("triton")
    import normlab.functional as F
    from normlab.kernels import backends_for
    from normlab.kernels.triton import config, launch
    from normlab.kernels.triton.ops import fused_norm, fused_norm_backward


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def _run(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor | None],
    upstream: Sequence[torch.Tensor],
    backend: str,
    cast: torch.dtype | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs of fn(*inputs) and the gradients of Σ outputs ⊙ upstream w.r.t. the inputs."""
    leaves = [
        None if t is None else (t.to(cast) if cast else t).detach().requires_grad_(True)
        for t in inputs
    ]
    outs = fn(*leaves, backend=backend)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    loss = sum((o.double() * u.double()).sum() for o, u in zip(outs, upstream, strict=True))
    active = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(loss, active, allow_unused=True))
    return [o.detach() for o in outs], [None if t is None else next(grads) for t in leaves]


def check_against_reference(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor | None],
    upstream: Sequence[torch.Tensor],
    dtype: torch.dtype,
    what: str = "",
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Compare outputs and every gradient of the Triton backend with reference and float64."""
    got, got_g = _run(fn, inputs, upstream, "triton")
    ref, ref_g = _run(fn, inputs, upstream, "torch")
    true, true_g = _run(fn, inputs, upstream, "torch", cast=torch.float64)
    names = [f"out{i}" for i in range(len(got))] + [f"grad{i}" for i in range(len(got_g))]
    # The problem's scale: gradients that cancel to ~0 (D = 1) are judged on it, not on |dx|.
    scale = max(t.abs().max().item() for t in true + true_g if t is not None and t.numel())
    for name, g, r, t in zip(names, got + got_g, ref + ref_g, true + true_g, strict=True):
        if t is None:
            assert g is None, f"{what} {name}: expected no gradient"
            continue
        assert g is not None, f"{what} {name}: missing gradient"
        assert g.shape == r.shape and g.dtype == r.dtype, (
            f"{what} {name}: {g.shape} {g.dtype}, reference {r.shape} {r.dtype}"
        )
        assert torch.isfinite(g).all(), f"{what} {name}: non-finite values"
        err = (g.double() - t).abs().max().item()
        err_ref = (r.double() - t).abs().max().item()
        bound = (
            2 * err_ref + 2 * _eps(g.dtype) * t.abs().max().item() + 8 * _eps(torch.float32) * scale
        )
        assert err <= bound, (
            f"{what} {name}: error {err:.3g} > bound {bound:.3g} (ref {err_ref:.3g})"
        )
    return got, got_g


def _grads_of(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
    inputs: Sequence[torch.Tensor | None],
    upstream: Sequence[torch.Tensor],
) -> list[torch.Tensor | None]:
    return _run(fn, inputs, upstream, "triton")[1]


@pytest.fixture
def chunked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make rows wider than 256 take the chunked kernels, in chunks of 128 columns."""
    monkeypatch.setattr(config, "MAX_TILE_D_FORWARD", 256)
    monkeypatch.setattr(config, "MAX_TILE_D_BACKWARD", 256)
    monkeypatch.setattr(config, "CHUNK_D_FORWARD", 128)
    monkeypatch.setattr(config, "CHUNK_D_BACKWARD", 128)


# --------------------------------------------------------------------------------------------
# RMSNorm and LayerNorm


@pytest.mark.parametrize("d", [1, 7, 64, 300, 1100])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_rms_norm_all_castings(d: int, dtype: torch.dtype) -> None:
    x = _randn(3, 5, d, dtype=dtype, scale=3.0)
    w = _randn(d, dtype=dtype, scale=0.1, seed=1)
    dy = _randn(3, 5, d, seed=2)
    for casting, offset in (("llama", 0.0), ("gemma", 1.0), ("fp32", 1.0)):

        def fn(x, w, backend, casting=casting, offset=offset):
            return F.rms_norm(x, w, 1e-6, offset, casting, backend=backend)

        w_in = w if offset else w + 1
        check_against_reference(fn, [x, w_in], [dy], dtype, f"{casting} D={d}")
    check_against_reference(
        lambda x, backend: F.rms_norm(x, None, 1e-6, 0.0, "llama", backend=backend),
        [x],
        [dy],
        dtype,
        f"no weight D={d}",
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_norm_16bit_forward_matches_the_reference_bits(dtype: torch.dtype) -> None:
    """Same rounding points as the reference: equal bits but for rare one-ulp ties."""
    x = _randn(16, 1100, dtype=dtype, scale=3.0)
    w = _randn(1100, dtype=dtype, scale=0.1, seed=1)
    cases = {
        "rms llama": lambda b: F.rms_norm(x, w + 1, 1e-6, 0.0, "llama", backend=b),
        "rms gemma": lambda b: F.rms_norm(x, w, 1e-6, 1.0, "gemma", backend=b),
        "layer": lambda b: F.layer_norm(x, w + 1, w, backend=b),
        "ada rms": lambda b: F.ada_rms_norm(x, w, w.flip(0), backend=b),
    }
    for name, fn in cases.items():
        got, ref = fn("triton"), fn("torch")
        assert (got != ref).float().mean().item() <= 1e-3, name
        torch.testing.assert_close(got, ref, rtol=_eps(dtype), atol=0)


@pytest.mark.parametrize("d", [1, 7, 64, 300, 1100])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_layer_norm(d: int, dtype: torch.dtype) -> None:
    x = _randn(4, 3, d, dtype=dtype, scale=2.0) + 1.5
    w = _randn(d, dtype=dtype, seed=1) * 0.2 + 1
    b = _randn(d, dtype=dtype, seed=2) * 0.1
    dy = _randn(4, 3, d, seed=3)
    check_against_reference(
        lambda x, w, b, backend: F.layer_norm(x, w, b, 1e-5, backend=backend),
        [x, w, b],
        [dy],
        dtype,
        f"affine D={d}",
    )
    check_against_reference(
        lambda x, backend: F.layer_norm(x, None, None, 1e-5, backend=backend),
        [x],
        [dy],
        dtype,
        f"plain D={d}",
    )


@pytest.mark.parametrize("residual_in_fp32", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [7, 300])
def test_norm_add_rms_and_add_layer(d: int, dtype: torch.dtype, residual_in_fp32: bool) -> None:
    x = _randn(2, 6, d, dtype=dtype)
    res = _randn(2, 6, d, dtype=dtype, scale=2.0, seed=1)
    w = _randn(d, dtype=dtype, scale=0.1, seed=2)
    b = _randn(d, dtype=dtype, scale=0.1, seed=3)
    dy = _randn(2, 6, d, seed=4)
    dh = _randn(2, 6, d, seed=5)

    def add_rms(x, r, w, backend):
        return F.add_rms_norm(
            x, r, w, 1e-6, 1.0, "llama", residual_in_fp32=residual_in_fp32, backend=backend
        )

    def add_ln(x, r, w, b, backend):
        return F.add_layer_norm(
            x, r, w, b, 1e-5, residual_in_fp32=residual_in_fp32, backend=backend
        )

    (_, h), _ = check_against_reference(add_rms, [x, res, w], [dy, dh], dtype, "add_rms")
    assert h.dtype == (torch.float32 if residual_in_fp32 else dtype)
    check_against_reference(add_ln, [x, res, w, b], [dy, dh], dtype, "add_layer")
    # residual=None: h is x (rounded as asked); the gradient of the returned h reaches x too.
    check_against_reference(
        lambda x, w, backend: add_rms(x, None, w, backend), [x, w], [dy, dh], dtype, "no residual"
    )


def test_norm_mixed_dtypes() -> None:
    """bfloat16 x with float32 weight, residual and output, as in residual_in_fp32 stacks."""
    x = _randn(5, 64, dtype=torch.bfloat16)
    res = _randn(5, 64, seed=1)
    w = _randn(64, seed=2) * 0.1
    dy, dh = _randn(5, 64, seed=3), _randn(5, 64, seed=4)

    def fn(x, r, w, backend):
        return F.add_rms_norm(x, r, w, 1e-6, 1.0, "gemma", out_dtype=torch.float32, backend=backend)

    (y, h), _ = check_against_reference(fn, [x, res, w], [dy, dh], torch.bfloat16)
    assert y.dtype == torch.float32 and h.dtype == torch.bfloat16


def test_norm_short_rows_share_a_program_and_tail_rows_are_masked() -> None:
    launch = config.forward_launch(301, 7)
    assert launch.rows > 1 and not launch.chunked
    x = _randn(301, 7, dtype=torch.bfloat16, scale=4.0)
    w = _randn(7, seed=1)
    dy = _randn(301, 7, seed=2)
    check_against_reference(
        lambda x, w, backend: F.rms_norm(x, w, backend=backend), [x, w], [dy], torch.bfloat16
    )
    one = x[:1]
    check_against_reference(
        lambda x, w, backend: F.rms_norm(x, w, backend=backend), [one, w], [dy[:1]], torch.bfloat16
    )


@pytest.mark.usefixtures("chunked_path")
@pytest.mark.parametrize("d", [300, 1100])
def test_norm_chunked_long_rows(d: int) -> None:
    assert config.forward_launch(4, d).chunked and config.backward_launch(4, d, 4).chunked
    x = _randn(2, 2, d, dtype=torch.bfloat16, scale=2.0) + 3.0
    res = _randn(2, 2, d, dtype=torch.bfloat16, seed=1)
    w = _randn(d, dtype=torch.bfloat16, seed=2) * 0.1 + 1
    b = _randn(d, dtype=torch.bfloat16, seed=3) * 0.1
    dy, dh = _randn(2, 2, d, seed=4), _randn(2, 2, d, seed=5)
    check_against_reference(
        lambda x, w, backend: F.rms_norm(x, w, 1e-6, 0.0, "llama", backend=backend),
        [x, w],
        [dy],
        torch.bfloat16,
        "rms",
    )
    check_against_reference(
        lambda x, r, w, b, backend: F.add_layer_norm(
            x, r, w, b, residual_in_fp32=True, backend=backend
        ),
        [x, res, w, b],
        [dy, dh],
        torch.bfloat16,
        "add_layer",
    )


def test_norm_widest_rows_default_chunking() -> None:
    d = 65536
    assert config.forward_launch(2, d).chunked
    x = _randn(2, d, dtype=torch.bfloat16, scale=2.0) + 1.0
    w = _randn(d, dtype=torch.bfloat16, seed=1) * 0.1 + 1
    b = _randn(d, dtype=torch.bfloat16, seed=2) * 0.1
    dy = _randn(2, d, seed=3)
    check_against_reference(
        lambda x, w, b, backend: F.layer_norm(x, w, b, backend=backend),
        [x, w, b],
        [dy],
        torch.bfloat16,
    )


@pytest.mark.parametrize("chunked", [False, True])
def test_norm_weight_grads_are_bit_identical_across_runs(
    chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, d = 700, 64
    if chunked:  # the interpreter walks chunked rows one by one: fewer rows
        monkeypatch.setattr(config, "MAX_TILE_D_BACKWARD", 32)
        monkeypatch.setattr(config, "CHUNK_D_BACKWARD", 32)
        n = 24
    group_launch = config.backward_launch(n, d, n)
    assert config.reduction_splits(1, n, group_launch.rows) > 1  # really a two-pass reduction
    x = _randn(n, d, dtype=torch.bfloat16, scale=3.0)
    w = _randn(d, seed=1)
    b = _randn(d, seed=2)
    dy = _randn(n, d, seed=3)

    def fn(x, w, b, backend):
        return F.layer_norm(x, w, b, backend=backend)

    first = _grads_of(fn, [x, w, b], [dy])
    second = _grads_of(fn, [x, w, b], [dy])
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)
    check_against_reference(fn, [x, w, b], [dy], torch.bfloat16)


def test_norm_float64_goes_to_the_reference() -> None:
    x = _randn(3, 10, dtype=torch.float64)
    w = _randn(10, dtype=torch.float64, seed=1)
    got = F.rms_norm(x, w, backend="triton")
    assert torch.equal(got, F.rms_norm(x, w, backend="torch"))


def test_norm_empty_batch() -> None:
    x = torch.zeros(0, 4, 16, device=DEVICE, requires_grad=True)
    w = torch.ones(16, device=DEVICE, requires_grad=True)
    y = F.rms_norm(x, w, backend="triton")
    assert y.shape == x.shape
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    assert gx.shape == x.shape and torch.equal(gw, torch.zeros_like(w))


# --------------------------------------------------------------------------------------------
# Conditioned norms and gated residuals

MODULATIONS = {
    "seq_bd": lambda b, t, d: (b, d),  # per sequence, functional inserts the token axis
    "seq_b1d": lambda b, t, d: (b, 1, d),
    "token": lambda b, t, d: (b, t, d),
    "position": lambda b, t, d: (1, t, d),  # broadcast over the batch: expanded, summed back
}


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("mode", sorted(MODULATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_modulated_ada_norms(kind: str, mode: str, dtype: torch.dtype) -> None:
    b, t, d = 3, 5, 64
    x = _randn(b, t, d, dtype=dtype, scale=2.0)
    shape = MODULATIONS[mode](b, t, d)
    s = _randn(*shape, dtype=dtype, scale=0.3, seed=1)
    sh = _randn(*shape, dtype=dtype, scale=0.3, seed=2)
    dy = _randn(b, t, d, seed=3)
    fn = F.ada_rms_norm if kind == "rms" else F.ada_layer_norm
    check_against_reference(
        lambda x, s, sh, backend: fn(x, s, sh, backend=backend), [x, s, sh], [dy], dtype, mode
    )
    check_against_reference(
        lambda x, s, backend: fn(x, s, None, backend=backend), [x, s], [dy], dtype, "no shift"
    )


def test_modulated_two_dimensional_inputs() -> None:
    n, d = 9, 300
    x = _randn(n, d, dtype=torch.bfloat16)
    s_shared = _randn(d, scale=0.3, seed=1)
    t_rows = _randn(n, d, dtype=torch.bfloat16, scale=0.3, seed=2)
    dy = _randn(n, d, seed=3)
    check_against_reference(
        lambda x, s, t, backend: F.ada_rms_norm(x, s, t, backend=backend),
        [x, s_shared, t_rows],
        [dy],
        torch.bfloat16,
    )


@pytest.mark.parametrize("mode", ["seq_b1d", "token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_modulated_gated_residual(mode: str, dtype: torch.dtype) -> None:
    b, t, d = 2, 7, 300
    h = _randn(b, t, d, dtype=dtype)
    o = _randn(b, t, d, dtype=dtype, seed=1)
    g = _randn(*MODULATIONS[mode](b, t, d), dtype=dtype, seed=2)
    dh = _randn(b, t, d, seed=3)
    check_against_reference(
        lambda h, o, g, backend: F.gated_residual(h, o, g, backend=backend), [h, o, g], [dh], dtype
    )


BLOCK_MODES = {
    "per_sequence": ("seq_b1d", "seq_b1d", "seq_b1d"),
    "per_token": ("token", "token", "token"),
    "gate_token_norm_sequence": ("token", "seq_bd", "seq_b1d"),
    "shared_and_sequence": ("seq_b1d", "seq_b1d", "position"),
}


# Every modulation mode × dtype at D = 300; the row-width extremes for the two main modes.
BLOCK_CASES = [(300, mode, dtype) for mode in sorted(BLOCK_MODES) for dtype in DTYPES] + [
    (d, mode, dtype)
    for d in (7, 1100)
    for mode in ("per_sequence", "per_token")
    for dtype in (torch.float32, torch.bfloat16)
]


@pytest.mark.parametrize(("d", "mode", "dtype"), BLOCK_CASES, ids=str)
def test_modulated_gated_add_ada_rms_norm_full_backward(
    d: int, mode: str, dtype: torch.dtype
) -> None:
    b, t = 2, 6
    gate_mode, scale_mode, shift_mode = BLOCK_MODES[mode]
    h = _randn(b, t, d, dtype=dtype, scale=2.0)
    o = _randn(b, t, d, dtype=dtype, seed=1)
    g = _randn(*MODULATIONS[gate_mode](b, t, d), dtype=dtype, seed=2)
    s = _randn(*MODULATIONS[scale_mode](b, t, d), dtype=dtype, scale=0.3, seed=3)
    sh = _randn(*MODULATIONS[shift_mode](b, t, d), dtype=dtype, scale=0.3, seed=4)
    dy, dh = _randn(b, t, d, seed=5), _randn(b, t, d, seed=6)

    def block(h, o, g, s, sh, backend):
        return F.gated_add_ada_rms_norm(h, o, g, s, sh, 1e-6, backend=backend)

    (y, h_new), grads = check_against_reference(block, [h, o, g, s, sh], [dy, dh], dtype, mode)
    assert y.dtype == dtype and h_new.dtype == dtype
    assert all(gr is not None for gr in grads)  # dh, do, dg, ds, dt
    # only h' used downstream (the last block's y unused): gradients through h' alone
    check_against_reference(
        lambda h, o, g, s, backend: block(h, o, g, s, None, backend)[1],
        [h, o, g, s],
        [dh],
        dtype,
        "h' only",
    )


@pytest.mark.usefixtures("chunked_path")
def test_modulated_chunked_long_rows() -> None:
    b, t, d = 2, 3, 1100
    h = _randn(b, t, d, dtype=torch.bfloat16, scale=2.0)
    o = _randn(b, t, d, dtype=torch.bfloat16, seed=1)
    g = _randn(b, 1, d, dtype=torch.bfloat16, seed=2)
    s = _randn(b, 1, d, dtype=torch.bfloat16, scale=0.3, seed=3)
    sh = _randn(b, t, d, dtype=torch.bfloat16, scale=0.3, seed=4)
    dy, dh = _randn(b, t, d, seed=5), _randn(b, t, d, seed=6)
    check_against_reference(
        lambda h, o, g, s, sh, backend: F.gated_add_ada_rms_norm(h, o, g, s, sh, backend=backend),
        [h, o, g, s, sh],
        [dy, dh],
        torch.bfloat16,
    )
    check_against_reference(
        lambda x, s, sh, backend: F.ada_layer_norm(x, s, sh, backend=backend),
        [h, s, sh],
        [dy],
        torch.bfloat16,
    )


def test_modulated_per_sequence_grads_are_bit_identical_across_runs() -> None:
    b, t, d = 2, 300, 64
    h = _randn(b, t, d, dtype=torch.bfloat16, scale=2.0)
    o = _randn(b, t, d, dtype=torch.bfloat16, seed=1)
    g = _randn(b, d, seed=2)
    s = _randn(b, d, scale=0.3, seed=3)
    sh = _randn(b, d, scale=0.3, seed=4)
    dy, dh = _randn(b, t, d, seed=5), _randn(b, t, d, seed=6)
    launch = config.backward_launch(b * t, d, t)
    assert config.reduction_splits(b, t, launch.rows) > 1

    def block(h, o, g, s, sh, backend):
        return F.gated_add_ada_rms_norm(h, o, g, s, sh, backend=backend)

    first = _grads_of(block, [h, o, g, s, sh], [dy, dh])
    second = _grads_of(block, [h, o, g, s, sh], [dy, dh])
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


# --------------------------------------------------------------------------------------------
# Custom-op registration: torch.library checks, torch.compile, torch.export


def test_op_backend_is_registered_for_this_device() -> None:
    assert "triton" in backends_for(DEVICE)


def _op_cases() -> dict[str, tuple]:
    x = _randn(6, 40, dtype=torch.bfloat16)
    r = _randn(6, 40, seed=1)
    w = _randn(40, seed=2)
    b = _randn(40, seed=3)
    seq = _randn(2, 40, scale=0.3, seed=4)
    tok = _randn(6, 40, dtype=torch.bfloat16, scale=0.3, seed=5)
    return {
        "rms_llama": (x, None, None, w, None, None, None, "rms", 1e-6, 1.0, torch.bfloat16,
                      torch.bfloat16, None),
        "add_layer": (x, r, None, w, b, None, None, "layer", 1e-5, 0.0, None, torch.float32,
                      torch.float32),
        "gated_ada": (x, tok, seq, None, None, seq, tok, "rms", 1e-6, 0.0, None,
                      torch.bfloat16, torch.bfloat16),
        "gated_residual": (x, tok, seq, None, None, None, None, "none", 1.0, 0.0, None,
                           torch.bfloat16, torch.bfloat16),
    }  # fmt: skip


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit")
@pytest.mark.parametrize("case", ["rms_llama", "add_layer", "gated_ada", "gated_residual"])
def test_op_opcheck(case: str) -> None:
    args = list(_op_cases()[case])
    for i in range(7):
        if args[i] is not None:
            args[i] = args[i].clone().requires_grad_(True)
    torch.library.opcheck(fused_norm, tuple(args))


def test_op_fake_tensor_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        args = [
            mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
            for a in _op_cases()["add_layer"]
        ]
        y, h, mean, rstd = fused_norm(*args)
    assert y.shape == (6, 40) and y.dtype == torch.float32
    assert h.shape == (6, 40) and h.dtype == torch.float32
    assert mean.shape == (6,) and rstd.shape == (6,)


def _second_derivative_cases() -> dict[str, tuple[Callable[..., object], list[torch.Tensor]]]:
    x, r, w = _randn(3, 4, 24), _randn(3, 4, 24, seed=1), _randn(24, seed=2)
    b, seq, tok = _randn(24, seed=3), _randn(3, 24, scale=0.3, seed=4), _randn(3, 4, 24, seed=5)
    return {
        "rms_gemma": (lambda x, w, backend: F.rms_norm(x, w, 1e-6, 1.0, "gemma", backend=backend),
                      [x, w]),
        "add_layer": (lambda x, r, w, b, backend: F.add_layer_norm(x, r, w, b, backend=backend),
                      [x, r, w, b]),
        "gated_ada": (lambda h, o, g, s, t, backend: F.gated_add_ada_rms_norm(
                          h, o, g, s, t, backend=backend), [x, r, seq, seq * 0.5, tok]),
    }  # fmt: skip


@pytest.mark.parametrize("case", ["rms_gemma", "add_layer", "gated_ada"])
def test_op_second_derivatives_match_the_reference(case: str) -> None:
    """A gradient penalty through the custom op: with create_graph=True its backward builds the
    gradients as a graph (the Triton kernels' outputs carry none), so the penalty's own
    gradient is as close to float64 truth as the reference backend's."""
    fn, inputs = _second_derivative_cases()[case]

    def penalised(backend: str, cast: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
        leaves = [(t.to(cast) if cast else t).detach().requires_grad_(True) for t in inputs]
        outs = fn(*leaves, backend=backend)
        outs = outs if isinstance(outs, tuple) else (outs,)
        first = torch.autograd.grad(sum(o.pow(3).sum() for o in outs), leaves, create_graph=True)
        penalty = sum(g.square().sum() for g in first if g is not None)
        return torch.autograd.grad(sum(o.sum() for o in outs) + penalty, leaves)

    truth = penalised("torch", cast=torch.float64)
    for i, (got, ref, true) in enumerate(
        zip(penalised("triton"), penalised("torch"), truth, strict=True)
    ):
        err = (got.double() - true).abs().max().item()
        err_ref = (ref.double() - true).abs().max().item()
        bound = 2 * err_ref + 8 * _eps(torch.float32) * true.abs().max().item()
        assert err <= bound, f"{case} input {i}: error {err:.3g} > {bound:.3g}"


def _block_step(h, o, mod):
    g, s, t = mod.chunk(3, dim=-1)
    y, h_new = F.gated_add_ada_rms_norm(h, o, g, s, t, backend="triton")
    return (y.float() * 2).sum() + h_new.float().square().sum()


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit")
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
def test_op_torch_compile_fullgraph_matches_eager(compile_backend: str) -> None:
    h = _randn(2, 5, 32, dtype=torch.bfloat16).requires_grad_(True)
    o = _randn(2, 5, 32, dtype=torch.bfloat16, seed=1).requires_grad_(True)
    mod = _randn(2, 96, scale=0.3, seed=2).requires_grad_(True)
    eager = _block_step(h, o, mod)
    eager_grads = torch.autograd.grad(eager, (h, o, mod))
    compiled = torch.compile(_block_step, fullgraph=True, backend=compile_backend)
    got = compiled(h, o, mod)
    got_grads = torch.autograd.grad(got, (h, o, mod))
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-4)
    for a, e in zip(got_grads, eager_grads, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_op_torch_export() -> None:
    class Block(torch.nn.Module):
        def forward(self, x, w):
            y, h = F.add_rms_norm(x, x * 0.5, w, 1e-6, 1.0, "gemma", backend="triton")
            return y, h

    x = _randn(2, 4, 48, dtype=torch.bfloat16)
    w = _randn(48, seed=1)
    dims = {"x": {0: torch.export.Dim("batch"), 1: torch.export.Dim("tokens")}, "w": None}
    program = torch.export.export(Block(), (x, w), dynamic_shapes=dims)
    targets = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert torch.ops.normlab.fused_norm.default in targets
    other = _randn(3, 5, 48, dtype=torch.bfloat16, seed=2)  # another batch and length
    for a, e in zip(program.module()(other, w), Block()(other, w), strict=True):
        assert torch.equal(a, e)


# --------------------------------------------------------------------------------------------
# Found in review: what a CUDA GPU would hit and the interpreter hides (the ``review`` shard).
# 64-bit row offsets: row r of a [N, D] view starts r·stride elements in; with N·stride ≥ 2³¹
# (65536 rows of 65536 bf16 values, or a split view of a wide Linear output) an int32 product
# wraps. A row stride of 2³⁰ + 64 puts row 2 past 2³¹ with 3 rows: the views share one
# untouched 4 GiB allocation (its pages are never written, so it costs no memory on a CPU).

_HUGE_STRIDE = 2**30 + 64
_ROWS, _D = 3, 64


def _huge_views(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of [3, D] tensors as views with row stride 2³⁰ + 64 into one shared allocation."""
    dtype = values[0].dtype
    base = torch.empty(2 * _HUGE_STRIDE + _D * len(values), dtype=dtype, device=DEVICE)
    views = []
    for k, v in enumerate(values):
        view = base.as_strided((_ROWS, _D), (_HUGE_STRIDE, 1), storage_offset=k * _D)
        view.copy_(v)
        views.append(view)
    return views


def _huge_case(case: str):
    """(fn of the leaves, token tensors, other leaves, upstream gradients), all bfloat16."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, torch.bfloat16)

    w, b = rnd(_D, scale=0.1) + 1, rnd(_D, scale=0.1)
    if case == "rms_llama":
        return (
            lambda x, w: F.rms_norm(x, w, 1e-6, 0.0, "llama", backend="triton"),
            [rnd(_ROWS, _D, scale=2.0)],
            [w],
            [rnd(_ROWS, _D)],
        )
    if case == "add_layer":
        return (
            lambda x, r, w, b: F.add_layer_norm(x, r, w, b, backend="triton"),
            [rnd(_ROWS, _D, scale=2.0), rnd(_ROWS, _D)],
            [w, b],
            [rnd(_ROWS, _D), rnd(_ROWS, _D)],
        )
    assert case == "gated_ada_per_token"
    return (
        lambda h, o, gate, s, t: F.gated_add_ada_rms_norm(h, o, gate, s, t, backend="triton"),
        [rnd(_ROWS, _D, scale=2.0), rnd(_ROWS, _D), rnd(_ROWS, _D), rnd(_ROWS, _D, scale=0.3),
         rnd(_ROWS, _D, scale=0.3)],
        [],
        [rnd(_ROWS, _D), rnd(_ROWS, _D)],
    )  # fmt: skip


def _outputs_and_grads(fn, inputs, upstream):
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = torch.autograd.grad(outs, leaves, grad_outputs=upstream)
    return [o.detach() for o in outs], list(grads)


def huge_rows_mismatches(case: str, path: str) -> list[str]:
    """Names of the outputs and gradients that differ between huge-stride and dense inputs."""
    if path == "chunked":  # rows wider than 32 columns take the chunked kernels
        for name in (
            "MAX_TILE_D_FORWARD",
            "MAX_TILE_D_BACKWARD",
            "CHUNK_D_FORWARD",
            "CHUNK_D_BACKWARD",
        ):
            setattr(config, name, 32)
        assert config.forward_launch(_ROWS, _D).chunked
        assert config.backward_launch(_ROWS, _D, _ROWS).chunked
    fn, tokens, others, upstream = _huge_case(case)
    huge = _huge_views(tokens + upstream)
    assert all(t.stride(0) * (_ROWS - 1) >= 2**31 for t in huge)
    want_y, want_g = _outputs_and_grads(fn, tokens + others, upstream)
    got_y, got_g = _outputs_and_grads(fn, huge[: len(tokens)] + others, huge[len(tokens) :])
    names = [f"out{i}" for i in range(len(want_y))] + [f"grad{i}" for i in range(len(want_g))]
    return [
        name
        for name, got, want in zip(names, got_y + got_g, want_y + want_g, strict=True)
        if not torch.equal(got, want)
    ]


@pytest.mark.parametrize("path", ["tile", "chunked"])
@pytest.mark.parametrize("case", ["rms_llama", "add_layer", "gated_ada_per_token"])
def test_review_row_offsets_past_int32(case: str, path: str) -> None:
    """Outputs and gradients with every token tensor (inputs, modulation, upstream gradients)
    at a row stride that puts row 2 past 2³¹ elements equal those of contiguous copies.

    Run in a child process: offsets that wrap in int32 read far outside the tensors, which
    crashes the process rather than failing an assertion."""
    if DEVICE == "cuda" and torch.cuda.mem_get_info()[0] < 8 * 2**30:
        pytest.skip("needs 8 GiB of free GPU memory")
    proc = run_python([str(Path(__file__).resolve()), "--huge-rows", case, path], dict(os.environ))
    assert proc.returncode == 0, (
        f"{case} {path}: exit {proc.returncode} (negative: killed by that signal, as when a "
        f"row offset wraps in int32)\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    assert proc.stdout.strip().endswith("equal"), proc.stdout[-3000:]


def test_review_more_rows_than_int32_indexes_are_refused() -> None:
    """Row indices are int32 in the kernels: 2³¹ rows would wrap in the last programs and
    write out of bounds, so the launchers refuse them (before allocating anything)."""
    rows = torch.zeros(1, 16, device=DEVICE).expand(2**31, 16)  # no memory behind it
    with pytest.raises(ValueError, match="rows"):
        launch.norm_forward(
            rows, None, None, None, None, None, None, kind="rms", eps=1e-6, weight_offset=0.0,
            round_dtype=None, out_dtype=torch.float32, h_dtype=None,
        )  # fmt: skip
    rstd = torch.zeros(1, device=DEVICE).expand(2**31)
    with pytest.raises(ValueError, match="rows"):
        launch.norm_backward(
            rows, None, rows, None, rstd, None, None, None, None, kind="rms", weight_offset=0.0,
            round_dtype=None, n_rows=2**31, d=16, x_dtype=torch.float32, addend_dtype=None,
            bias_dtype=None, shift_rows=0, shift_dtype=None, needs=[True] + [False] * 6,
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Custom-op contract


def _backward_args(n: int) -> tuple:
    x = torch.randn(n, 40, device=DEVICE)
    w = torch.randn(40, device=DEVICE)
    _y, _h, mean, rstd = fused_norm(
        x, None, None, w, None, None, None, "layer", 1e-5, 0.0, None, torch.float32, None
    )
    dy = torch.randn(n, 40, device=DEVICE)
    # dx asked for, the weight's gradient not: an empty (unproduced) output among real ones
    needs = [True, False, False, False, False, False, False]
    return (dy, None, x, mean, rstd, w, None, None, None, "layer", 0.0, None, n, 40,
            torch.float32, None, None, 0, None, needs)  # fmt: skip


@pytest.mark.parametrize("n", [0, 5])
def test_review_backward_fake_matches_real_whatever_the_default_dtype(n: int) -> None:
    """The backward op's empty (unproduced) outputs are float32 in the real and the fake
    implementation alike, also when the default dtype is float64."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        args = _backward_args(n)
        real = fused_norm_backward(*args)
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = fused_norm_backward(*fake_args)
    finally:
        torch.set_default_dtype(previous)
    for i, (r, f) in enumerate(zip(real, fake, strict=True)):
        assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), i


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit")
def test_review_backward_op_opcheck() -> None:
    torch.library.opcheck(fused_norm_backward, _backward_args(5))


def test_review_addend_without_stored_h_is_refused() -> None:
    """h = x + addend must be stored (h_dtype): the backward differentiates the norm of the h
    it is handed (x when none is stored) and the chunked forward re-reads x or the stored h,
    so an addend without h_dtype would be normalised in one place and ignored in another."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4, 40, device=DEVICE)
    args = (x, x, None, None, None, None, None, "rms", 1e-6, 0.0, None, torch.float32, None)
    with pytest.raises(ValueError, match="h_dtype"):
        fused_norm(*args)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match="h_dtype"):
        fused_norm(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


# --------------------------------------------------------------------------------------------
# Without a GPU or the interpreter, the shard tests run the tests above in subprocesses: they
# are dropped from this process's collection rather than reported as skipped one by one.

if not IN_PROCESS:
    for _name in [n for n in list(globals()) if n.startswith(tuple(SHARDS.values()))]:
        del globals()[_name]


# --------------------------------------------------------------------------------------------
# ``python tests/kernels/test_triton_kernels.py --compile-for-cuda`` (run by the test of that name).

_BF16_ARGS = ("X", "ADDEND", "GATE", "SCALE", "SHIFT", "Y", "H_OUT", "HN", "DY", "DH", "DX")
_FORWARD_OPS = {
    "rms_llama": {"HAS_WEIGHT": True, "ROUND_DTYPE": "bf16"},
    "add_layer": {"CENTER": True, "HAS_ADDEND": True, "STORE_H": True, "HAS_WEIGHT": True,
                  "HAS_BIAS": True},
    "gated_ada": {"HAS_ADDEND": True, "HAS_GATE": True, "STORE_H": True, "HAS_SCALE": True,
                  "HAS_SHIFT": True},
}  # fmt: skip
_BACKWARD_OPS = {
    "rms_llama": {"HAS_WEIGHT": True, "ROUND_DTYPE": "bf16", "NEED_DWEIGHT": True},
    "add_layer": {"CENTER": True, "HAS_DH": True, "HAS_WEIGHT": True, "HAS_ADDEND": True,
                  "NEED_DADDEND": True, "NEED_DWEIGHT": True, "NEED_DBIAS": True},
    "gated_ada_sequence": {"HAS_DH": True, "HAS_SCALE": True, "HAS_ADDEND": True,
                           "HAS_GATE": True, "NEED_DADDEND": True, "NEED_DSCALE": True,
                           "NEED_DSHIFT": True, "NEED_DGATE": True, "REDUCE_SCALE": True,
                           "REDUCE_SHIFT": True, "REDUCE_GATE": True},
    "gated_ada_token": {"HAS_DH": True, "HAS_SCALE": True, "HAS_ADDEND": True, "HAS_GATE": True,
                        "NEED_DADDEND": True, "NEED_DSCALE": True, "NEED_DSHIFT": True,
                        "NEED_DGATE": True},
}  # fmt: skip


def compile_for_cuda() -> int:
    """Compile every kernel family at the default launch shapes; 0 ok, 1 failures, 3 skipped."""
    import triton
    import triton.language as tl

    reason = nvidia_compile_unavailable()
    if reason is not None:
        print(reason)
        return SKIPPED
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from normlab.kernels.triton import backward, config, forward, reduce

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

    def build(arch, kernel, constexprs, num_warps):
        constexprs = {k: (tl.bfloat16 if v == "bf16" else v) for k, v in constexprs.items()}
        signature, attrs = {}, {}
        for i, name in enumerate(kernel.arg_names):
            if name in constexprs:
                signature[name] = "constexpr"
            elif name in ("eps", "weight_offset"):
                signature[name] = "fp32"
            elif name[0].isupper() and name != "D":  # a pointer, 16-byte aligned
                signature[name] = "*bf16" if name in _BF16_ARGS else "*fp32"
                attrs[(i,)] = [["tt.divisibility", 16]]
            else:
                signature[name] = "i32"
                if name == "D" or name.startswith("stride"):
                    attrs[(i,)] = [["tt.divisibility", 16]]
        source = ASTSource(kernel, signature, constexprs, attrs)
        target = GPUTarget("cuda", arch, 32)
        options = {"num_warps": num_warps, "enable_fp_fusion": True}
        return triton.compile(source, target=target, options=options)

    def flags_off(kernel):
        names = [kernel.arg_names[i] for i in kernel.constexprs]
        return {name: False for name in names if name not in ("ROWS", "BLOCK_D")}

    fwd_off = {**flags_off(forward.norm_forward_tile_kernel), "NORM": True, "ROUND_DTYPE": None}
    bwd_off = {**flags_off(backward.norm_backward_tile_kernel), "NORM": True, "ROUND_DTYPE": None}
    bwd_off.update(HAS_DY=True, NEED_DX=True)
    cases = []
    for arch, widths in ((90, (64, 4096, 65536)), (80, (1024, 8192))):
        for d in widths:
            fl = config.forward_launch(1 << 16, d)
            bl = config.backward_launch(1 << 16, d, 1 << 16)
            fk = forward.norm_forward_tile_kernel
            bk = backward.norm_backward_tile_kernel
            fshape, bshape = {"BLOCK_D": fl.block_d}, {"BLOCK_D": bl.block_d}
            if fl.chunked:
                fk = forward.norm_forward_chunked_kernel
            else:
                fshape["ROWS"] = fl.rows
            if bl.chunked:
                bk = backward.norm_backward_chunked_kernel
            else:
                bshape["ROWS"] = bl.rows
            for op, flags in _FORWARD_OPS.items():
                cx = {**fwd_off, **flags, **fshape}
                cases.append((f"sm_{arch} forward {op} D={d}", arch, fk, cx, fl.num_warps))
            for op, flags in _BACKWARD_OPS.items():
                cx = {**bwd_off, **flags, **bshape}
                cases.append((f"sm_{arch} backward {op} D={d}", arch, bk, cx, bl.num_warps))
        reduce_cx = {"SOFT_BF16": False, "BLOCK_S": 32, "BLOCK_D": 128}
        cases.append((f"sm_{arch} sum_partials", arch, reduce.sum_partials_kernel, reduce_cx, 8))

    failures = []
    for label, arch, kernel, cx, warps in cases:
        try:
            compiled = build(arch, kernel, cx, warps)
        except Exception as err:  # report every kernel that fails, not only the first
            failures.append(f"{label}: {type(err).__name__}: {err}")
            continue
        usage = ""
        if cuobjdump.exists():
            with tempfile.TemporaryDirectory() as tmp:
                cubin = Path(tmp) / "kernel.cubin"
                cubin.write_bytes(compiled.asm["cubin"])
                dump = subprocess.run(
                    [str(cuobjdump), "--dump-resource-usage", str(cubin)],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout
            usage = next((line.strip() for line in dump.splitlines() if "REG:" in line), "")
            if usage and not ("STACK:0" in usage and "LOCAL:0" in usage):
                failures.append(f"{label}: spills registers ({usage})")
        print(f"{label:45s} {usage.split(' CONSTANT')[0]}")
    print("\n".join(failures) or "all kernels compiled")
    return 1 if failures else 0


# --------------------------------------------------------------------------------------------
# ``python tests/kernels/test_triton_kernels.py --compile-as-cuda``: compile the launches of real
# calls as the CUDA JIT specialises them, without a GPU (and without launching anything).


# ptxas counts the few registers it saves around the IEEE div/sqrt slow-path subroutine of
# ``inv_sqrt`` as spills (4 to 36 bytes in some specialisations, e.g. N = 1); register pressure
# spills at these tile shapes would be far larger.
SPILL_BYTES_TOLERATED = 64


def compile_as_cuda() -> int:
    """0: all compiled clean; 1: failures; 3: this Triton cannot compile for NVIDIA here."""
    import triton

    reason = nvidia_compile_unavailable()
    if reason is not None:
        print(reason)
        return SKIPPED
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature
    except ImportError as err:
        print(f"this Triton cannot specialise launches ahead of time: {err}")
        return SKIPPED
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    ptxas = get_ptxas(90).path  # the one Triton assembles sm_90 with (the bundled old one fails)
    if not ptxas or not Path(ptxas).exists():
        print("this Triton ships no ptxas for sm_90")
        return SKIPPED

    from normlab.kernels.triton import backend as triton_backend
    from normlab.kernels.triton import launch

    target = GPUTarget("cuda", 90, 32)
    cuda_backend = make_backend(target)
    seen: dict[tuple[str, str], str] = {}
    failures: list[str] = []

    def spills(ptx: str) -> tuple[int, int]:
        """ptxas's spill stores and loads, in bytes."""
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "kernel.ptx"
            src.write_text(ptx)
            # Triton's own ptxas command line (backends/nvidia/compiler.py, make_cubin)
            cmd = [str(ptxas), "-lineinfo", "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a"]
            out = subprocess.run(
                [*cmd, str(src), "-o", str(Path(tmp) / "k.o")],
                capture_output=True,
                text=True,
                check=False,
            )
        text = out.stdout + out.stderr
        if out.returncode or "spill stores" not in text:
            raise RuntimeError(f"ptxas -v failed:\n{text[-2000:]}")
        return (
            sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", text)),
            sum(int(v) for v in re.findall(r"(\d+) bytes spill loads", text)),
        )

    class AsCuda:
        """Stands in for a kernel: specialises and compiles each launch, launches nothing."""

        def __init__(self, kernel):
            self.kernel = kernel
            self.binder = create_function_from_signature(
                kernel.signature, kernel.params, cuda_backend
            )

        def __getitem__(self, grid):
            def call(*args, **kwargs):
                grid3 = tuple(grid) + (1,) * (3 - len(grid))
                name = self.kernel.fn.__name__
                if not (grid3[0] < 2**31 and grid3[1] <= 65535 and grid3[2] <= 65535):
                    failures.append(f"{name}: grid {grid3} past CUDA's limits")
                bound, spec, options = self.binder(*args, **kwargs)
                key = (name, f"{spec} {options}")
                if key in seen:
                    return
                options, signature, constexprs, attrs = self.kernel._pack_args(
                    cuda_backend, kwargs, bound, spec, options
                )
                names = self.kernel.arg_names
                label = f"{name} { ({names[path[0]]: v for path, v in constexprs.items()}) }"
                try:
                    compiled = triton.compile(
                        ASTSource(self.kernel, signature, constexprs, attrs),
                        target=target,
                        options=options.__dict__,
                    )
                except Exception as err:  # report every launch that fails
                    seen[key] = "failed"
                    failures.append(f"{label}: {type(err).__name__}: {str(err)[:2000]}")
                    return
                ptx = compiled.asm["ptx"]
                seen[key] = "ok"
                spilled = spills(ptx)
                if max(spilled) > SPILL_BYTES_TOLERATED:
                    failures.append(f"{label}: spills (stores, loads) {spilled} bytes")

            return call

    for name in (
        "norm_forward_tile_kernel",
        "norm_forward_chunked_kernel",
        "norm_backward_tile_kernel",
        "norm_backward_chunked_kernel",
        "sum_partials_kernel",
    ):
        setattr(launch, name, AsCuda(getattr(launch, name)))
    launch._soft_bf16 = lambda t: False  # what a CUDA tensor gets
    triton_backend.check_device = lambda x: None  # CPU tensors stand in for CUDA ones
    b = triton_backend

    def leaf(*shape, dtype):
        return torch.randn(*shape).to(dtype).requires_grad_(True)

    def grads(outs, leaves):
        outs = outs if isinstance(outs, tuple) else (outs,)
        loss = sum(o.float().sum() for o in outs)
        torch.autograd.grad(loss, [t for t in leaves if t.requires_grad], allow_unused=True)

    # D = 1 and N = 1 make the integer arguments 1 (constants); a split [B, 3D] modulation
    # gives unaligned pointers; 1100 and 65536 take the tile and the chunked kernels.
    for d in (1, 64, 1100, 65536):
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for n in (1, 6):
                bs, t = (1, n) if n < 4 else (2, n // 2)
                x, r = leaf(bs, t, d, dtype=dt), leaf(bs, t, d, dtype=dt)
                w, bias = leaf(d, dtype=dt), leaf(d, dtype=dt)
                grads(b.rms_norm(x, w, 1e-6, 0.0, "llama", dt, dt), [x, w])
                grads(b.rms_norm(x, w, 1e-6, 1.0, "gemma", dt, dt), [x, w])
                grads(b.layer_norm(x, w, bias, 1e-5, dt), [x, w, bias])
                for fp32 in (False, True):
                    grads(b.add_rms_norm(x, r, w, 1e-6, 0.0, "llama", fp32, dt), [x, r, w])
                    grads(b.add_layer_norm(x, r, w, bias, 1e-5, fp32, dt), [x, r, w, bias])
                mod = leaf(bs, 3 * d, dtype=dt)
                g, s, sh = (m.unsqueeze(1) for m in mod.chunk(3, dim=-1))
                gt, st, sht = (leaf(bs, t, d, dtype=dt) for _ in range(3))
                for scale, shift in ((s, sh), (st, sht), (s, None)):
                    grads(b.ada_rms_norm(x, scale, shift, 1e-6, dt), [x, mod, st, sht])
                    grads(b.ada_layer_norm(x, scale, shift, 1e-6, dt), [x, mod, st, sht])
                for gate in (g, gt):
                    grads(b.gated_residual(x, r, gate), [x, r, mod, gt])
                for gate, scale, shift in ((g, s, sh), (gt, st, sht), (gt, s, sh)):
                    grads(
                        b.gated_add_ada_rms_norm(x, r, gate, scale, shift, 1e-6, dt),
                        [x, r, mod, gt, st, sht],
                    )
    print(f"{len(seen)} kernel specialisations compiled for sm_90")
    print("\n".join(failures) or "all clean")
    return 1 if failures else 0


if __name__ == "__main__" and sys.argv[1:] == ["--compile-for-cuda"]:
    sys.exit(compile_for_cuda())
if __name__ == "__main__" and sys.argv[1:] == ["--compile-as-cuda"]:
    sys.exit(compile_as_cuda())
if __name__ == "__main__" and sys.argv[1:2] == ["--huge-rows"] and IN_PROCESS:
    mismatches = huge_rows_mismatches(*sys.argv[2:4])
    print(f"differ: {mismatches}" if mismatches else "equal")
    sys.exit(1 if mismatches else 0)
