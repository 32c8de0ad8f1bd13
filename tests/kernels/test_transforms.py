"""torch.func transforms and forward-mode AD on every fast backend, against the reference.

Each op of :mod:`normlab.functional` on each CPU-runnable fast backend (``cpp``, ``compiled``,
``triton`` on Triton's interpreter) under ``torch.func.vmap``, ``grad``, ``jvp``, ``jacrev``,
``jacfwd``, ``vmap(grad)`` (per-sample gradients) and ``torch.autograd.forward_ad`` (inputs and
weights requiring grad or not, tangents on x alone or on every input) must give the reference
backend's results, never an error, a missing tangent or a silently wrong one; jvp is also
checked against central finite differences in float64. Shapes are tiny.

The Triton backend runs here only under ``TRITON_INTERPRET=1`` (or on a GPU); otherwise one
shard test re-runs this file's Triton cases in a fresh interpreter process (see
tests/kernels/triton_harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.utils._pytree import tree_leaves

import normlab
import normlab.functional as F
from normlab.kernels import backend_unavailable_reason, backends_for
from triton_harness import DEVICE, IN_PROCESS, run_under_interpreter

B, T, D = 2, 3, 8
V = 2  # the vmapped (per-sample) dimension

# Each op: (function of its tensors and backend, kinds of its tensors). Kinds: "tok" a token
# tensor [B, T, D], "mod" a per-sequence modulation [B, 1, D], "par" a parameter [D].
OPS: dict[str, tuple[Callable[..., object], tuple[str, ...]]] = {
    "layer_norm": (lambda x, w, b, backend: F.layer_norm(x, w, b, backend=backend),
                   ("tok", "par", "par")),
    "rms_norm": (lambda x, w, backend: F.rms_norm(x, w, 1e-6, 1.0, "gemma", backend=backend),
                 ("tok", "par")),
    "add_rms_norm": (lambda x, r, w, backend: F.add_rms_norm(x, r, w, backend=backend),
                     ("tok", "tok", "par")),
    "add_layer_norm": (lambda x, r, w, b, backend: F.add_layer_norm(x, r, w, b, backend=backend),
                       ("tok", "tok", "par", "par")),
    "ada_rms_norm": (lambda x, s, t, backend: F.ada_rms_norm(x, s, t, backend=backend),
                     ("tok", "mod", "tok")),
    "ada_layer_norm": (lambda x, s, t, backend: F.ada_layer_norm(x, s, t, backend=backend),
                       ("tok", "tok", "mod")),
    "gated_residual": (lambda h, o, g, backend: F.gated_residual(h, o, g, backend=backend),
                       ("tok", "tok", "mod")),
    "gated_add_ada_rms_norm": (
        lambda h, o, g, s, t, backend: F.gated_add_ada_rms_norm(h, o, g, s, t, backend=backend),
        ("tok", "tok", "mod", "mod", "tok"),
    ),
}  # fmt: skip

FAST = ("cpp", "compiled", "triton")


def _backends() -> list[object]:
    """The fast backends; Triton's cases run in this process only where its kernels can."""
    params = []
    for name in FAST:
        if name == "triton" and not IN_PROCESS:
            continue  # run by test_transforms_triton_under_interpreter in a fresh process
        params.append(pytest.param(name, id=name))
    return params


def _require(backend: str) -> None:
    if backend not in backends_for(DEVICE):
        pytest.skip(f"backend {backend!r} is not registered for {DEVICE} here")
    reason = backend_unavailable_reason(backend)
    if reason is not None:
        pytest.skip(reason)


if not IN_PROCESS:

    def test_transforms_triton_under_interpreter() -> None:
        pytest.importorskip("triton")
        run_under_interpreter(__file__, "triton")


def _shape(kind: str, batch: tuple[int, ...] = ()) -> tuple[int, ...]:
    return batch + {"tok": (B, T, D), "mod": (B, 1, D), "par": (D,)}[kind]


def _inputs(
    op: str, batched: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[torch.Tensor]:
    """Random inputs of ``op``; ``batched`` adds a leading V to the token and modulation ones."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for kind in OPS[op][1]:
        batch = (V,) if batched and kind != "par" else ()
        t = torch.randn(_shape(kind, batch), generator=g, dtype=torch.float64)
        if kind in ("mod", "par"):
            t = 0.5 * t
        out.append(t.to(DEVICE, dtype))
    return out


def _call(op: str, backend: str) -> Callable[..., tuple[torch.Tensor, ...]]:
    fn = OPS[op][0]

    def call(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = fn(*tensors, backend=backend)
        return out if isinstance(out, tuple) else (out,)

    return call


def _loss(op: str, backend: str) -> Callable[..., torch.Tensor]:
    """Σ outputs ⊙ fixed cotangents (cosines), a scalar to differentiate."""
    call = _call(op, backend)

    def loss(*tensors: torch.Tensor) -> torch.Tensor:
        outs = call(*tensors)
        total = outs[0].new_zeros(())
        for k, o in enumerate(outs):  # deterministic, not random: vmap refuses randomness
            cot = torch.cos(torch.arange(o.numel(), dtype=o.dtype, device=o.device) * (1.3 + k))
            total = total + (o * cot.view(o.shape)).sum()
        return total

    return loss


def _close(got: object, want: object, what: str) -> None:
    got_leaves, want_leaves = tree_leaves(got), tree_leaves(want)
    assert len(got_leaves) == len(want_leaves), what
    for i, (a, e) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        assert a is not None and e is not None, f"{what}: leaf {i} missing"
        torch.testing.assert_close(
            a, e, rtol=1e-5, atol=1e-5, msg=lambda m, i=i: f"{what} {i}: {m}"
        )


def _argnums(op: str) -> tuple[int, ...]:
    return tuple(range(len(OPS[op][1])))


def _in_dims(op: str) -> tuple[int | None, ...]:
    return tuple(None if kind == "par" else 0 for kind in OPS[op][1])


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
def test_vmap(op: str, backend: str) -> None:
    _require(backend)
    inputs = _inputs(op, batched=True)
    got = torch.func.vmap(_call(op, backend), in_dims=_in_dims(op))(*inputs)
    want = torch.func.vmap(_call(op, "torch"), in_dims=_in_dims(op))(*inputs)
    _close(got, want, f"vmap {op} on {backend}")
    # vmap is a loop over samples: each sample equals the unbatched call
    for v in range(V):
        one = [t if kind == "par" else t[v] for t, kind in zip(inputs, OPS[op][1], strict=True)]
        _close(tuple(o[v] for o in got), _call(op, "torch")(*one), f"sample {v}")


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
def test_grad(op: str, backend: str) -> None:
    _require(backend)
    inputs = _inputs(op)
    got = torch.func.grad(_loss(op, backend), argnums=_argnums(op))(*inputs)
    want = torch.func.grad(_loss(op, "torch"), argnums=_argnums(op))(*inputs)
    _close(got, want, f"grad {op} on {backend}")


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
def test_jvp_matches_reference_and_finite_differences(op: str, backend: str) -> None:
    _require(backend)
    inputs = _inputs(op)
    tangents = _inputs(op, seed=1)
    out, tangent_out = torch.func.jvp(_call(op, backend), tuple(inputs), tuple(tangents))
    ref_out, ref_tangent = torch.func.jvp(_call(op, "torch"), tuple(inputs), tuple(tangents))
    _close(out, ref_out, f"jvp primal {op} on {backend}")
    _close(tangent_out, ref_tangent, f"jvp tangent {op} on {backend}")
    # central differences of the formula in float64
    step = 1e-6
    call = _call(op, "torch")
    plus = call(*(p.double() + step * t.double() for p, t in zip(inputs, tangents, strict=True)))
    minus = call(*(p.double() - step * t.double() for p, t in zip(inputs, tangents, strict=True)))
    for i, (tan, hi, lo) in enumerate(zip(tangent_out, plus, minus, strict=True)):
        fd = ((hi - lo) / (2 * step)).to(tan.dtype)
        torch.testing.assert_close(tan, fd, rtol=1e-4, atol=1e-4, msg=lambda m, i=i: f"fd {i}: {m}")


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("jac", ["jacrev", "jacfwd"])
def test_jacobians(jac: str, op: str, backend: str) -> None:
    _require(backend)
    inputs = _inputs(op)
    transform = getattr(torch.func, jac)
    got = transform(_call(op, backend), argnums=_argnums(op))(*inputs)
    want = transform(_call(op, "torch"), argnums=_argnums(op))(*inputs)
    _close(got, want, f"{jac} {op} on {backend}")


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
def test_per_sample_gradients(op: str, backend: str) -> None:
    """vmap(grad): a gradient per sample of the vmapped dimension, parameters shared."""
    _require(backend)
    inputs = _inputs(op, batched=True)
    per_sample = torch.func.vmap(
        torch.func.grad(_loss(op, backend), argnums=_argnums(op)), in_dims=_in_dims(op)
    )
    want = torch.func.vmap(
        torch.func.grad(_loss(op, "torch"), argnums=_argnums(op)), in_dims=_in_dims(op)
    )(*inputs)
    got = per_sample(*inputs)
    _close(got, want, f"vmap(grad) {op} on {backend}")
    # sample 0 against a plain autograd gradient of that sample alone
    one = [
        (t if kind == "par" else t[0]).detach().requires_grad_(True)
        for t, kind in zip(inputs, OPS[op][1], strict=True)
    ]
    plain = torch.autograd.grad(_loss(op, "torch")(*one), one)
    _close(tuple(g[0] for g in got), plain, "sample 0")


def _forward_ad(
    op: str, backend: str, inputs: list[torch.Tensor], tangents: list[torch.Tensor | None]
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs and their tangents of op with dual inputs where a tangent is given."""
    with fwAD.dual_level():
        duals = [
            t if tan is None else fwAD.make_dual(t, tan)
            for t, tan in zip(inputs, tangents, strict=True)
        ]
        outs = _call(op, backend)(*duals)
        unpacked = [fwAD.unpack_dual(o) for o in outs]
    return [u.primal for u in unpacked], [u.tangent for u in unpacked]


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("x_grad", [False, True], ids=["x_plain", "x_requires_grad"])
@pytest.mark.parametrize("w_grad", [False, True], ids=["w_frozen", "w_requires_grad"])
@pytest.mark.parametrize("dual", ["x", "all"])
def test_forward_ad(op: str, backend: str, x_grad: bool, w_grad: bool, dual: str) -> None:
    """torch.autograd.forward_ad: every output's tangent is there and equals the reference's,
    with x and the other inputs requiring grad or not (a frozen block: no grad anywhere)."""
    _require(backend)
    inputs = [t.requires_grad_(x_grad if i == 0 else w_grad) for i, t in enumerate(_inputs(op))]
    tangents = [t if (dual == "all" or i == 0) else None for i, t in enumerate(_inputs(op, seed=1))]
    out, tan = _forward_ad(op, backend, inputs, tangents)
    ref_out, ref_tan = _forward_ad(op, "torch", inputs, tangents)
    assert all(t is not None for t in tan), f"{op} on {backend}: a tangent was dropped"
    _close(out, ref_out, f"forward AD primal {op} on {backend}")
    _close(tan, ref_tan, f"forward AD tangent {op} on {backend}")
    # and reverse mode still works on the same inputs (the compiled backend's reverse mode
    # compiles a variant per case: covered by tests/kernels/test_compiled_backend.py instead)
    if (x_grad or w_grad) and backend != "compiled":
        active = [t for t in inputs if t.requires_grad]
        got = torch.autograd.grad(_loss(op, backend)(*inputs), active)
        want = torch.autograd.grad(_loss(op, "torch")(*inputs), active)
        _close(got, want, f"backward {op} on {backend}")


@pytest.mark.parametrize("backend", _backends())
def test_frozen_module_forward_ad_and_per_sample_grads(backend: str) -> None:
    """The layers: a frozen RMSNorm / LayerNorm passes tangents through, and
    functional_call + vmap(grad) gives per-sample weight gradients, as the reference does."""
    _require(backend)
    x = torch.randn(V, T, D, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    tangent = torch.ones_like(x)
    for make in (lambda: normlab.RMSNorm(D), lambda: normlab.LayerNorm(D)):
        norm = make().to(DEVICE).requires_grad_(False)
        with torch.no_grad():
            for p in norm.parameters():
                p.add_(0.1 * torch.arange(D, dtype=p.dtype, device=p.device))
        results = {}
        for name in (backend, "torch"):
            normlab.set_default_backend(name)
            try:
                with fwAD.dual_level():
                    tan = fwAD.unpack_dual(norm(fwAD.make_dual(x, tangent))).tangent
                params = {k: v.detach() for k, v in norm.named_parameters()}

                def loss(p, xs, norm=norm):
                    return torch.func.functional_call(norm, p, (xs,)).square().sum()

                per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
            finally:
                normlab.set_default_backend("auto")
            assert tan is not None, f"{type(norm).__name__} on {name}: tangent dropped"
            results[name] = (tan, per_sample)
        _close(results[backend], results["torch"], f"{type(norm).__name__} on {backend}")


@pytest.mark.parametrize("backend", _backends())
def test_fast_path_still_runs_outside_transforms(backend: str) -> None:
    """The fallback is taken only while a transform or a forward-AD level is active: plain
    eager calls (with or without autograd) still run the provider."""
    _require(backend)
    module = {
        "cpp": "normlab.kernels.cpu",
        "compiled": "normlab.kernels.compiled",
        "triton": "normlab.kernels.triton.backend",
    }[backend]
    fused = __import__(module, fromlist=["_backend"])._backend
    x = torch.randn(B, T, D, device=DEVICE)
    seen: list[bool] = []

    def probe(r: torch.Tensor) -> torch.Tensor:
        seen.append(fused.uses_reference(r))
        return r

    assert not fused.uses_reference(x)
    torch.func.vmap(probe)(x)
    torch.func.grad(lambda r: probe(r).sum())(x)
    torch.func.jvp(probe, (x,), (x,))
    with fwAD.dual_level():
        probe(fwAD.make_dual(x, x))
        seen.append(fused.uses_reference(x))  # a plain tensor inside a dual level, too
    assert seen == [True] * 5
    assert not fused.uses_reference(x)
    if backend == "compiled":
        return  # its provider compiles on first use: see tests/kernels/test_compiled_backend.py
    calls = []
    provider = fused.provider
    original = provider.forward
    provider.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        F.rms_norm(x, backend=backend)
        F.rms_norm(x.requires_grad_(True), backend=backend).sum().backward()
    finally:
        del provider.forward
    assert len(calls) == 2
