"""The fast backends: ``"compiled"`` (Inductor) and ``"cpp"`` (C++ kernels).

Both are also in the shared matrix (tests/kernels/test_functional_matrix.py); here: each op's
forward and every gradient against the reference at small shapes in float32 and bfloat16, no
recompilation across batch sizes, lazy compilation, autograd use patterns, the C++ path's
large-shape code (non-temporal stores, column sums split across lanes), its determinism and its
fallback when no compiler exists. Shapes are few: compiling is slow on two cores.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import normlab.functional as NF
from normlab.kernels import auto_backend, backends_for
from normlab.kernels import cpu as cpp
from normlab.kernels.cpu import _build

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (6e-2, 6e-2)}

Op = Callable[..., tuple[torch.Tensor, ...]]


def _ops() -> dict[str, tuple[Op, tuple[str, ...]]]:
    """name -> (f(backend, **tensors) -> outputs, names of the tensors it takes)."""
    return {
        "layer_norm": (
            lambda b, x, w, bias: (NF.layer_norm(x, w, bias, backend=b),),
            ("x", "w", "bias"),
        ),
        "rms_norm_llama": (lambda b, x, w: (NF.rms_norm(x, w, backend=b),), ("x", "w")),
        "rms_norm_gemma": (
            lambda b, x, w: (NF.rms_norm(x, w, 1e-6, 1.0, "gemma", backend=b),),
            ("x", "w"),
        ),
        "add_rms_norm": (
            lambda b, x, r, w: NF.add_rms_norm(x, r, w, backend=b),
            ("x", "r", "w"),
        ),
        "add_layer_norm": (
            lambda b, x, r, w, bias: NF.add_layer_norm(x, r, w, bias, backend=b),
            ("x", "r", "w", "bias"),
        ),
        "ada_rms_norm": (
            lambda b, x, s, t: (NF.ada_rms_norm(x, s, t, backend=b),),
            ("x", "s", "t"),
        ),
        "ada_layer_norm": (
            lambda b, x, s, t: (NF.ada_layer_norm(x, s, t, backend=b),),
            ("x", "s", "t"),
        ),
        "gated_residual": (
            lambda b, x, r, g: (NF.gated_residual(x, r, g, backend=b),),
            ("x", "r", "g"),
        ),
        "gated_add_ada_rms_norm": (
            lambda b, x, r, g, s, t: NF.gated_add_ada_rms_norm(x, r, g, s, t, backend=b),
            ("x", "r", "g", "s", "t"),
        ),
    }


def _tensors(
    names: tuple[str, ...], shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    d = shape[-1]
    per_seq = (shape[0], d)  # modulation per sequence for [B, T, D]

    def randn(*s: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return (torch.randn(*s, generator=gen) * std + mean).to(dtype)

    make = {
        "x": lambda: randn(*shape, std=2.0, mean=0.5),
        "r": lambda: randn(*shape),
        "w": lambda: randn(d, std=0.2, mean=1.0),
        "bias": lambda: randn(d, std=0.2),
        "s": lambda: randn(*per_seq, std=0.2),
        "t": lambda: randn(*shape, std=0.2),  # per token
        "g": lambda: randn(*per_seq, std=0.5),
    }
    return {k: make[k]() for k in names}


def _run(
    fn: Op, backend: str, tensors: dict[str, torch.Tensor], seed: int = 1
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    leaves = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    outs = fn(backend, **leaves)
    gen = torch.Generator().manual_seed(seed)
    grad_outs = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, list(leaves.values()), grad_outs)
    return tuple(o.detach() for o in outs), grads


def _close(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float], what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    scale = b.double().abs().max().clamp_min(1.0)
    err = (a.double() - b.double()).abs().max()
    assert err <= tol[0] * scale + tol[1], f"{what}: max error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(_ops()))
@pytest.mark.parametrize("backend", ["compiled", "cpp"])
def test_forward_and_gradients_match_reference(name: str, dtype: torch.dtype, backend: str) -> None:
    if backend == "cpp" and not cpp.available():
        pytest.skip(f"the cpp backend is unavailable here: {cpp.unavailable_reason()}")
    fn, names = _ops()[name]
    tensors = _tensors(names, (2, 6, 96), dtype)
    outs, grads = _run(fn, backend, tensors)
    ref_outs, ref_grads = _run(fn, "torch", tensors)
    for i, (a, b) in enumerate(zip(outs, ref_outs, strict=True)):
        _close(a, b, TOL[dtype], f"{backend} {name} output {i}")
    for key, a, b in zip(tensors, grads, ref_grads, strict=True):
        _close(a, b, GRAD_TOL[dtype], f"{backend} {name} grad of {key}")


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def test_compiled_does_not_recompile_for_new_batch_sizes() -> None:
    w = torch.randn(64)
    x = torch.randn(4, 5, 64, requires_grad=True)
    NF.rms_norm(x, w, backend="compiled").sum().backward()  # compiles forward and backward
    before = _graph_count()
    for batch, seq in ((3, 7), (9, 2), (2, 33)):
        x = torch.randn(batch, seq, 64, requires_grad=True)
        y = NF.rms_norm(x, w, backend="compiled")
        y.sum().backward()
        assert y.shape == x.shape and x.grad is not None
    assert _graph_count() == before, "a new batch size triggered a recompilation"


def test_compiled_autograd_patterns() -> None:
    """Second call, new shapes, with and without gradients, and under no_grad."""
    w = torch.randn(32, requires_grad=True)
    for shape in ((8, 32), (3, 4, 32), (8, 32)):
        x = torch.randn(shape)
        y_ref = NF.rms_norm(x, w, backend="torch")
        y = NF.rms_norm(x, w, backend="compiled")  # x needs no grad, w does
        torch.testing.assert_close(y, y_ref)
        (gw,) = torch.autograd.grad(y.square().sum(), [w])
        (gw_ref,) = torch.autograd.grad(y_ref.square().sum(), [w])
        torch.testing.assert_close(gw, gw_ref, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            torch.testing.assert_close(NF.rms_norm(x, w, backend="compiled"), y_ref)
    one = torch.randn(1, 32)  # a single row uses the reference formula
    torch.testing.assert_close(
        NF.rms_norm(one, w, backend="compiled"), NF.rms_norm(one, w, backend="torch")
    )


def test_nothing_is_compiled_at_import() -> None:
    code = (
        "import sys, normlab, normlab.functional\n"
        "from normlab.kernels.cpu import _build\n"
        "assert 'torch._inductor' not in sys.modules, 'inductor imported at import'\n"
        "assert not _build._libraries, 'C++ kernels built at import'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_both_backends_are_registered_and_auto_picks_cpp_on_cpu() -> None:
    assert {"compiled", "cpp"} <= set(backends_for("cpu"))
    assert "compiled" in backends_for("cuda")
    expected = "cpp" if cpp.available() else "torch"
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        assert auto_backend(torch.zeros(2, 8, dtype=dtype)) == expected


def test_cpp_without_a_compiler_auto_falls_back_and_asking_for_cpp_raises(tmp_path) -> None:
    """``auto`` uses the reference silently; ``backend="cpp"`` (argument, or NORMLAB_BACKEND)
    raises an error that says why (no compiler) and what to do, instead of timing or running
    the reference formula under the cpp name."""
    code = (
        "import pytest, torch, normlab.functional as NF\n"
        "from normlab.kernels import (BackendUnavailableError, auto_backend, backend_available,\n"
        "    backend_unavailable_reason, backends_for, cpu)\n"
        "x = torch.randn(4, 16)\n"
        "assert not cpu.available() and 'compiler' in cpu.build_error()\n"
        "assert auto_backend(x) == 'torch' and not backend_available('cpp')\n"
        "assert 'NORMLAB_CXX' in backend_unavailable_reason('cpp')\n"
        "assert 'cpp' in backends_for('cpu')\n"
        "assert 'cpp' not in backends_for('cpu', available_only=True)\n"
        "ref = NF.rms_norm(x, backend='torch')\n"
        "torch.testing.assert_close(NF.rms_norm(x, backend='auto'), ref)\n"
        "with pytest.raises(BackendUnavailableError) as info:\n"
        "    NF.rms_norm(x)  # NORMLAB_BACKEND=cpp\n"
        "msg = str(info.value)\n"
        "for part in ('backend:', 'NORMLAB_BACKEND', 'no C++ compiler', 'no-such-compiler',\n"
        "             'NORMLAB_CXX', \"backend='auto'\", \"backend='torch'\"):\n"
        "    assert part in msg, (part, msg)\n"
        "with pytest.raises(BackendUnavailableError, match=\"'cpp' was asked for.*compiler\"):\n"
        "    NF.add_rms_norm(x, x, backend='cpp')\n"
        "with pytest.raises(RuntimeError, match='unavailable'):\n"
        "    cpu.rms_norm(x, None, 1e-6, 0.0, 'llama', x.dtype, x.dtype)\n"
    )
    env = {
        **os.environ,
        "NORMLAB_CXX": "no-such-compiler",
        "CXX": "no-such-compiler",
        "NORMLAB_BACKEND": "cpp",
        "PATH": str(tmp_path),  # no g++, c++ or clang++ here
        "NORMLAB_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def _fresh_build_state(monkeypatch: pytest.MonkeyPatch, cache: Path | None) -> None:
    """Point the builder at ``cache`` (None: leave it) and forget any earlier build."""
    if cache is not None:
        monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr(_build, "_libraries", {})
    monkeypatch.setattr(_build, "_errors", {})


def test_a_build_announces_itself_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The first use compiles for tens of seconds: one log message says so before it starts,
    however many flag sets are tried (every one fails here, without running a compiler)."""
    if _build.compiler() is None:
        pytest.skip("no C++ compiler: the build stops before compiling")
    _fresh_build_state(monkeypatch, tmp_path)
    calls = []

    def failing_compile(cxx: str, flags: list[str], target: Path) -> str:
        calls.append(flags)
        return "error: not compiled in this test"

    monkeypatch.setattr(_build, "_compile", failing_compile)
    with caplog.at_level(logging.INFO, logger="normlab"):
        assert _build.load_library() is None
    records = [r for r in caplog.records if r.name == "normlab.kernels.cpu._build"]
    assert len(calls) > 1
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "compiling normlab's C++ CPU kernels" in message
    assert str(tmp_path) in message and "once" in message
    assert "not compiled in this test" in _build.build_error()


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
def test_loading_the_cached_library_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _fresh_build_state(monkeypatch, None)
    with caplog.at_level(logging.INFO, logger="normlab"):
        assert _build.load_library() is not None
    assert not [r for r in caplog.records if r.name.startswith("normlab.kernels")]


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
def test_cpp_large_rows_stream_and_split_column_sums() -> None:
    """Past the cache size the kernels stream their stores; weight and per-sequence modulation
    gradients are summed over lanes that cut groups of rows."""
    torch.manual_seed(0)
    d = 1000  # not a multiple of the 64-byte line
    rows = -(-cpp.last_level_cache_bytes() // (4 * d)) + 7
    x = torch.randn(rows, d)
    assert cpp._stream(x) == 1
    w = torch.randn(d)
    for backend_x in (x, x.bfloat16()):
        outs, grads = _run(
            lambda b, x, w: (NF.rms_norm(x, w, backend=b),), "cpp", {"x": backend_x, "w": w}
        )
        ref_outs, ref_grads = _run(
            lambda b, x, w: (NF.rms_norm(x, w, backend=b),), "torch", {"x": backend_x, "w": w}
        )
        tol = TOL[backend_x.dtype]
        _close(outs[0], ref_outs[0], tol, "y")
        _close(grads[0], ref_grads[0], GRAD_TOL[backend_x.dtype], "dx")
        _close(grads[1], ref_grads[1], (1e-4, 1e-3), "dw")
    # per sequence modulation with 13 groups of rows: group boundaries fall inside lanes
    b, t = 13, 50
    xs = torch.randn(b, t, 64)
    s, sh = torch.randn(b, 64) * 0.1, torch.randn(b, 1, 64)
    fn = _ops()["ada_rms_norm"][0]
    _, grads = _run(fn, "cpp", {"x": xs, "s": s, "t": sh})
    _, ref = _run(fn, "torch", {"x": xs, "s": s, "t": sh})
    for a, r in zip(grads, ref, strict=True):
        _close(a, r, (1e-4, 1e-4), "ada grads")


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
def test_cpp_results_are_deterministic_and_thread_count_invariant() -> None:
    torch.manual_seed(0)
    x = torch.randn(300, 256)
    w = torch.randn(256)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = NF.rms_norm(xg, wg, backend="cpp")
            y.backward(torch.ones_like(y))
            results.append((y.detach(), xg.grad, wg.grad))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(_ops()))
def test_cpp_blocks_and_tail_match_reference(name: str, dtype: torch.dtype) -> None:
    """D = 224: three 64-column blocks and a 32-column tail. bfloat16 runs the blocks in the
    interleaved order its widening instructions give, with the gain, the d̂ rows and the column
    sums kept in that order and put back when stored; the tail runs in column order."""
    fn, names = _ops()[name]
    tensors = _tensors(names, (2, 5, 224), dtype, seed=4)
    outs, grads = _run(fn, "cpp", tensors)
    ref_outs, ref_grads = _run(fn, "torch", tensors)
    for i, (a, b) in enumerate(zip(outs, ref_outs, strict=True)):
        _close(a, b, TOL[dtype], f"cpp {name} output {i}")
    for key, a, b in zip(tensors, grads, ref_grads, strict=True):
        _close(a, b, GRAD_TOL[dtype], f"cpp {name} grad of {key}")


def _assert_bf16_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within one bfloat16 rounding of the float64 value, subnormals included: a flushed
    subnormal (a zero where |want| exceeds one subnormal step) fails."""
    want = want.detach().double()
    err = (got.double() - want).abs()
    tol = 2.0**-8 * want.abs() + 2.0**-133
    assert (err <= tol).all(), f"{what}: worst excess {(err - tol).max():.3g}"


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
def test_cpp_bfloat16_zero_and_subnormal_results_are_not_flushed() -> None:
    """The kernels convert 32 results at a time with an instruction that flushes subnormals to
    zero; a group holding a ±0 result is redone exactly. Outputs here mix exact zeros and
    subnormals with normal values in y, in the residual sum h and in dx."""
    gen = torch.Generator().manual_seed(5)
    d = 128  # two blocks
    tiny = 2.0**-130

    # LayerNorm: y = x̂·w + b with a tiny gain (subnormal y), a zero row and a zero bias;
    # rows of magnitude 1e18 (rstd ~ 1e-18) turn dy ~ 1e-21 into subnormal dx.
    x = torch.randn(6, d, generator=gen)
    x[1] = 0.0
    x[4:] *= 1e18
    w = torch.full((d,), 3 * tiny)
    w[::3] = 1.0
    b = torch.zeros(d)
    dy = torch.randn(6, d, generator=gen) * 1e-21
    xb, wb, bb, dyb = (t.bfloat16() for t in (x, w, b, dy))
    xg = xb.clone().requires_grad_()
    y = NF.layer_norm(xg, wb, bb, backend="cpp")
    (dx,) = torch.autograd.grad(y, xg, dyb)
    x64 = xb.double().requires_grad_()
    want = NF.layer_norm(x64, wb.double(), bb.double(), backend="torch")
    (dx_want,) = torch.autograd.grad(want, x64, dyb.double())
    _assert_bf16_close(y, want, "layer_norm y")
    _assert_bf16_close(dx[4:], dx_want[4:], "layer_norm dx of large rows")
    for t in (want, dx_want[4:]):  # the case under test occurs
        assert ((t.abs() > 2.0**-133) & (t.abs() < 2.0**-126)).any()

    # Residual sum of subnormal inputs: h = x + r is exact, zero where r = −x.
    xs = (torch.randn(4, d, generator=gen) * tiny).bfloat16()
    rs = (torch.randn(4, d, generator=gen) * tiny).bfloat16()
    rs[:, :40] = -xs[:, :40]
    _, h = NF.add_rms_norm(xs, rs, torch.ones(d).bfloat16(), backend="cpp")
    h_want = (xs.double() + rs.double()).bfloat16()
    assert torch.equal(h.view(torch.int16), h_want.view(torch.int16))
    assert (h_want[:, :40] == 0).all() and (h_want[:, 40:] != 0).any()


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
def test_cpp_bfloat16_llama_rounding_keeps_infinite_products_and_huge_rows() -> None:
    """The "llama" casting rounds x̂ to bf16 before the gain. A subnormal x̂ times an infinite
    gain is infinite (a fast rounding that flushed x̂ would give NaN). Rows of magnitude 2^60 with
    gradients of 2^70 keep finite gradients (sums of d̂·h instead of d̂·x̂ would overflow)."""
    d = 128
    x = torch.ones(2, d)
    x[:, 5] = 2.0**-127
    w = torch.ones(d)
    w[5] = float("inf")
    with torch.no_grad():
        got = NF.rms_norm(x.bfloat16(), w.bfloat16(), backend="cpp")
        want = NF.rms_norm(x.bfloat16(), w.bfloat16(), backend="torch")
    assert got[:, 5].isinf().all() and not got.isnan().any()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))

    gen = torch.Generator().manual_seed(6)
    xb = (torch.randn(4, d, generator=gen) * 2.0**60).bfloat16()
    dy = (torch.randn(4, d, generator=gen) * 2.0**70).bfloat16()
    wb = (torch.rand(d, generator=gen) + 0.5).bfloat16()
    xg = xb.clone().requires_grad_()
    (dx,) = torch.autograd.grad(NF.rms_norm(xg, wb, backend="cpp"), xg, dy)
    x64 = xb.double().requires_grad_()
    (dx_want,) = torch.autograd.grad(NF.rms_norm(x64, wb.double(), backend="torch"), x64, dy)
    assert dx.isfinite().all()
    _close(dx, dx_want.to(dx.dtype), GRAD_TOL[torch.bfloat16], "dx of huge rows")


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
@pytest.mark.parametrize("casting", ["llama", "gemma"])
def test_cpp_bfloat16_rounding_is_bit_exact_at_the_edges(casting: str) -> None:
    """Subnormal and infinite results round exactly as PyTorch rounds them (the hardware bf16
    conversion flushes subnormals: those lanes are redone), NaN stays NaN. NaN bit patterns are
    not compared: PyTorch's own vectorised and scalar conversions write different ones."""
    d = 64
    x = torch.randn(6, d)
    x[0, :8] = torch.tensor([1e-39, -2e-39, 3e-40, 1e-38, 0.0, -0.0, 5e-39, 1e-45])
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] *= 1e-20  # tiny row: x̂ stays O(1), the gain below makes some outputs subnormal
    w = torch.ones(d)
    w[:16] = 1e-37
    xb, wb = x.bfloat16(), w.bfloat16()
    with torch.no_grad():
        got = NF.rms_norm(xb, wb, 1e-6, casting=casting, backend="cpp")
        want = NF.rms_norm(xb, wb, 1e-6, casting=casting, backend="torch")
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert (want[~nan] != 0).any() and (want[~nan].abs() < 1.2e-38).any()  # subnormals occur


@pytest.mark.skipif(not cpp.available(), reason="no C++ compiler for the cpp backend")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
def test_cpp_layer_norm_variance_of_mean_dominated_rows(dtype: torch.dtype, residual: bool) -> None:
    """The C++ LayerNorm takes σ² = Σh²/D − μ² only when μ² ≤ σ²; a row whose mean dwarfs its
    spread (|μ| = 100σ here, where that formula loses ~13 of float32's 24 bits) takes the centred
    second pass. Rows of both kinds, in one call, match the float64 reference closely. float32
    is the telling case: bfloat16 inputs cannot hold a row with μ/σ large enough for the
    shortcut's error to exceed bfloat16's own rounding of y."""
    gen = torch.Generator().manual_seed(3)
    d = 4096 + 48  # a masked tail after the 64-wide blocks
    z = torch.randn(4, d, generator=gen, dtype=torch.float64)
    z = (z - z.mean(-1, keepdim=True)) / z.std(-1, unbiased=False, keepdim=True)
    offsets = torch.tensor([0.0, 0.5, 100.0, -100.0], dtype=torch.float64)[:, None]
    x = (offsets + z).to(dtype)
    w = torch.rand(d, generator=gen).to(dtype) + 0.5
    b = torch.randn(d, generator=gen).to(dtype)
    r = torch.zeros_like(x) if residual else None
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    xg = x.clone().requires_grad_()
    if residual:
        got = NF.add_layer_norm(xg, r, w, b, backend="cpp")[0]
    else:
        got = NF.layer_norm(xg, w, b, backend="cpp")
    (dx,) = torch.autograd.grad(got, xg, dy)
    x64 = x.double().requires_grad_()
    want = NF.layer_norm(x64, w.double(), b.double(), backend="torch")
    (dx_want,) = torch.autograd.grad(want, x64, dy.double())
    tol = 2e-6 if dtype == torch.float32 else 1.6e-2  # one bf16 rounding of y
    err = ((got.double() - want).abs() / want.abs().clamp_min(1.0)).amax(-1)
    assert (err <= tol).all(), err
    # dx = rstd·(d̂ − mean d̂ − x̂·mean(d̂·x̂)): relative to the row's largest rstd·|d̂|
    scale = (dy.double() * w.double()).abs().amax(-1) / x64.detach().std(-1, unbiased=False)
    dx_err = (dx.double() - dx_want).abs().amax(-1) / scale
    assert (dx_err <= (2e-6 if dtype == torch.float32 else 2e-2)).all(), dx_err
