"""Review tests of the Triton kernels: what a CUDA GPU would hit and the interpreter hides.

Runs like ``tests/kernels/test_triton_kernels.py``: in process under ``TRITON_INTERPRET=1`` (or on
a GPU), otherwise one shard test re-runs this file's ``test_review_`` tests under the interpreter
in a fresh process. ``test_review_kernels_compile_as_cuda_specialises_them`` compiles (no GPU
needed) the launches of real calls for sm_90 with the argument specialisations of Triton's CUDA
JIT, which the interpreter never applies: integer arguments equal to 1 become compile-time
constants, others are marked divisible by 16 or not, pointers aligned or not, and bfloat16 is
rounded by the hardware cast instead of the interpreter's software rounding.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
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

if not IN_PROCESS:

    def test_triton_review_under_interpreter() -> None:
        run_under_interpreter(__file__, "test_review_ and not compile_as_cuda")


def test_review_kernels_compile_as_cuda_specialises_them() -> None:
    """Every launch of a set of real calls compiles for sm_90 as the CUDA JIT would specialise
    it, within CUDA's grid limits and without register-pressure spills."""
    run_compile_script(__file__, "--compile-as-cuda")


if IN_PROCESS:
    triton = pytest.importorskip("triton")
    import normlab.functional as F
    from normlab.kernels.triton import config, launch
    from normlab.kernels.triton.ops import fused_norm, fused_norm_backward


# --------------------------------------------------------------------------------------------
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


if not IN_PROCESS:
    for _name in [n for n in list(globals()) if n.startswith("test_review_")]:
        if "compile_as_cuda" not in _name:
            del globals()[_name]


# --------------------------------------------------------------------------------------------
# ``python tests/kernels/test_triton_review.py --compile-as-cuda``: compile the launches of real
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


if __name__ == "__main__" and sys.argv[1:] == ["--compile-as-cuda"]:
    sys.exit(compile_as_cuda())
if __name__ == "__main__" and sys.argv[1:2] == ["--huge-rows"] and IN_PROCESS:
    mismatches = huge_rows_mismatches(*sys.argv[2:4])
    print(f"differ: {mismatches}" if mismatches else "equal")
    sys.exit(1 if mismatches else 0)
