"""Identities of DESIGN §1, checked with hypothesis on every CPU backend.

RMSNorm x̂ is invariant to x → c·x for c > 0 and flips sign for c < 0 (LayerNorm too);
LayerNorm x̂ is invariant to x → x + a·1, RMSNorm's is not; mean(x̂²) ≈ 1 for RMSNorm,
mean ≈ 0 and variance ≈ 1 for LayerNorm; a zero vector gives finite zeros; float16 input up to
|x| = 60000 gives finite, correct output (x² would overflow float16 past |x| ≈ 256).
"""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import normlab.functional as NF

TINY_EPS = 1e-12  # "ignoring ε": far below every mean square the strategies allow


def vectors(lo: float, hi: float, min_size: int = 2, max_size: int = 64) -> st.SearchStrategy:
    return st.lists(
        st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False),
        min_size=min_size,
        max_size=max_size,
    ).map(lambda v: torch.tensor(v, dtype=torch.float64))


def ln(x: torch.Tensor, backend: str, eps: float = TINY_EPS) -> torch.Tensor:
    return NF.layer_norm(x, eps=eps, backend=backend)


def rms(x: torch.Tensor, backend: str, eps: float = TINY_EPS) -> torch.Tensor:
    return NF.rms_norm(x, eps=eps, backend=backend)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


scales = st.floats(1e-2, 1e2).flatmap(lambda m: st.sampled_from([m, -m]))


@settings(deadline=None, max_examples=60)
@given(x=vectors(-100, 100), c=scales)
def test_rescaling_keeps_or_flips_xhat(x: torch.Tensor, c: float, backend: str) -> None:
    assume(x.square().mean() >= 1e-2 and x.var(unbiased=False) >= 1e-2)
    sign = math.copysign(1.0, c)
    close(rms(c * x, backend), sign * rms(x, backend))
    close(ln(c * x, backend), sign * ln(x, backend))


@settings(deadline=None, max_examples=60)
@given(x=vectors(-100, 100), a=st.floats(-100, 100))
def test_layer_norm_ignores_a_shift(x: torch.Tensor, a: float, backend: str) -> None:
    assume(x.var(unbiased=False) >= 1e-2)
    close(ln(x + a, backend), ln(x, backend), tol=1e-5)


@settings(deadline=None, max_examples=60)
@given(x=vectors(-10, 10), a=st.floats(1, 10).flatmap(lambda m: st.sampled_from([m, -m])))
def test_rms_norm_does_not_ignore_a_shift(x: torch.Tensor, a: float, backend: str) -> None:
    """mean(x̂) = μ/√(σ² + μ²) is strictly increasing in μ when σ > 0. With |x| ≤ 10, σ ≥ 1 and
    1 ≤ |a| ≤ 10, a shift by a moves it by at least 1/401^1.5 ≈ 1.2e-4."""
    assume(x.var(unbiased=False) >= 1)
    moved = (rms(x + a, backend) - rms(x, backend)).abs().max().item()
    assert moved > 1e-4


# 16-bit outputs are rounded per element (relative 2⁻⁸ in bf16, 2⁻¹¹ in fp16); a mean of
# squares of rounded values is off by at most about twice that.
MOMENT_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
dtypes = st.sampled_from(list(MOMENT_TOL))


@settings(deadline=None, max_examples=60)
@given(x=vectors(-1000, 1000), dtype=dtypes)
def test_rms_norm_has_unit_mean_square(x: torch.Tensor, dtype: torch.dtype, backend: str) -> None:
    x = x.to(dtype)
    assume(x.double().square().mean() >= 1)
    y = NF.rms_norm(x, eps=TINY_EPS, backend=backend).double()
    assert abs(y.square().mean().item() - 1) <= MOMENT_TOL[dtype]


@settings(deadline=None, max_examples=60)
@given(x=vectors(-1000, 1000), dtype=dtypes)
def test_layer_norm_has_zero_mean_unit_variance(
    x: torch.Tensor, dtype: torch.dtype, backend: str
) -> None:
    x = x.to(dtype)
    assume(x.double().var(unbiased=False) >= 1)
    y = NF.layer_norm(x, eps=TINY_EPS, backend=backend).double()
    assert abs(y.mean().item()) <= MOMENT_TOL[dtype]
    assert abs(y.var(unbiased=False).item() - 1) <= 2 * MOMENT_TOL[dtype]


def zero_input_calls(x: torch.Tensor, gate: torch.Tensor, backend: str) -> list[torch.Tensor]:
    """Every function on x = 0 (and a zero residual / branch): each must give x̂ = 0."""
    z = torch.zeros_like(x)
    s = gate.detach().clone().requires_grad_()
    return [
        NF.layer_norm(x, backend=backend),
        NF.rms_norm(x, backend=backend),
        NF.rms_norm(x, casting="gemma", backend=backend),
        NF.rms_norm(x, casting="fp32", backend=backend),
        NF.add_rms_norm(x, z, backend=backend)[0],
        NF.add_layer_norm(x, z, backend=backend)[0],
        NF.ada_rms_norm(x, s, backend=backend),
        NF.ada_layer_norm(x, s, backend=backend),
        NF.gated_add_ada_rms_norm(x, z, gate, s, backend=backend)[0],
    ]


@settings(deadline=None, max_examples=20)
@given(d=st.integers(1, 64), dtype=dtypes)
def test_zero_vector_gives_finite_zeros(d: int, dtype: torch.dtype, backend: str) -> None:
    x = torch.zeros(2, d, dtype=dtype, requires_grad=True)
    gate = torch.full((2, d), 0.5, dtype=dtype)
    for y in zero_input_calls(x, gate, backend):
        assert torch.equal(y.double(), torch.zeros(2, d, dtype=torch.float64))
        (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
        assert torch.isfinite(g).all()


half_floats = st.floats(-60000, 60000, width=16, allow_nan=False, allow_infinity=False)


@settings(deadline=None, max_examples=60)
@given(v=st.lists(half_floats, min_size=1, max_size=64))
def test_float16_up_to_60000(v: list[float], backend: str) -> None:
    """Finite and correct in float16 up to |x| = 60000: statistics accumulate in float32."""
    x = torch.tensor(v, dtype=torch.float16, requires_grad=True)
    xd = x.detach().double()
    rms_ref = xd / torch.sqrt(xd.square().mean() + 1e-6)
    mu = xd.mean()
    ln_ref = (xd - mu) / torch.sqrt((xd - mu).square().mean() + 1e-5)
    for y, ref in (
        (NF.rms_norm(x, eps=1e-6, backend=backend), rms_ref),
        (NF.add_rms_norm(x, None, eps=1e-6, backend=backend)[0], rms_ref),
        (NF.ada_rms_norm(x, torch.zeros_like(x), eps=1e-6, backend=backend), rms_ref),
        (NF.layer_norm(x, eps=1e-5, backend=backend), ln_ref),
    ):
        assert torch.isfinite(y).all()
        scale = ref.abs().max().item()
        assert ((y.double() - ref).abs() <= 2**-9 * (scale + ref.abs())).all()
        (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
        assert torch.isfinite(g).all()
