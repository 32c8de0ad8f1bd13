"""The exactness claims of README.md and docs/DESIGN.md §1, on every backend that runs on the CPU.

- LayerNorm over a last dimension of size 1: x̂ = 0 whatever x, so every input gradient is
  exactly 0 (layer_norm, add_layer_norm, ada_layer_norm; every dtype).
- The ``llama`` and ``gemma`` castings against the Hugging Face formulas (written out below;
  the HF classes too when transformers is installed), in bfloat16 and float16, with the weight
  in the input's dtype and in float32, at D ∈ {1, 2, 64, 1024, 4099, 8192}: bit for bit on the
  ``torch`` backend; on the others an element may be one 16-bit rounding step of x̂ (``llama``)
  or of the output (``gemma``) away, which is at most 2 (resp. 1) ulps of the output, in at most
  1 of 1000 elements (see :data:`MAX_RATE`). The cause: those backends sum x² for mean(x²) in
  another order than PyTorch's CPU ``mean`` (and PyTorch's vectorised ``rsqrt`` is not always
  the correctly rounded 1/sqrt), so m and rstd may differ in their last float32 bits, and a
  16-bit rounding that lies that close to its midpoint goes the other way.
- ``eps=None, casting="gemma"`` against ``torch.nn.RMSNorm``: bit for bit on ``torch``; on the
  others within :data:`NN_RMSNORM_ULPS` ulps (float32 / float64: same cause, in the output's own
  precision), and in 16-bit within 1 ulp in at most 1 of 1000 elements.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
from normlab.kernels import get_default_backend, set_default_backend

HALF = [torch.bfloat16, torch.float16]
HALF_IDS = ["bfloat16", "float16"]
ALL = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
ALL_IDS = ["float32", "float64", "bfloat16", "float16"]
DIMS = [1, 2, 64, 1024, 4099, 8192]
EPS = 1e-6
ELEMENTS = 1 << 16  # per case: rows × D (at least 8 rows)

MAX_RATE = 1e-3  # stated: at most 1 of 1000 16-bit elements differ (measured: ≤ 520 per million)
CASTING_ULPS = {"llama": 2, "gemma": 1}  # stated bound per casting, in ulps of the 16-bit output
NN_RMSNORM_ULPS = {torch.float32: 8, torch.float64: 16, torch.bfloat16: 1, torch.float16: 1}


def hf_llama(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm / Qwen3RMSNorm.forward: x̂ rounded to x's dtype, then times w."""
    h = x.to(torch.float32)
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + eps)
    return w * h.to(x.dtype)


def hf_olmo2(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Olmo2RMSNorm.forward: w times the float32 x̂, one cast at the end."""
    h = x.to(torch.float32)
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + eps)
    return (w * h).to(x.dtype)


def hf_gemma3(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma3RMSNorm.forward: x̂ in float32 times (1 + w) in float32, one cast at the end."""
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = out * (1.0 + w.float())
    return out.type_as(x)


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many representable values of the dtype lie between actual and expected (0: equal).

    The bit patterns, read as sign-magnitude integers, are in the order of the values."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.contiguous().view(ints).to(torch.int64)
        magnitude = bits & (torch.iinfo(ints).max)
        return torch.where(bits < 0, -magnitude, magnitude)

    return (ordered(actual) - ordered(expected)).abs()


def check_claim(
    actual: torch.Tensor, expected: torch.Tensor, backend: str, max_ulps: int, max_rate: float
) -> None:
    """Bit for bit on the reference backend; elsewhere ≤ max_ulps apart, in ≤ max_rate of them."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not bool(expected.isnan().any()) and not bool(actual.isnan().any())
    if backend == "torch":
        differ = int((actual != expected).sum())
        assert differ == 0, f"{differ} of {actual.numel()} elements differ on the torch backend"
        return
    distance = ulp_distance(actual, expected)
    worst = int(distance.max())
    assert worst <= max_ulps, f"an element is {worst} ulps away (stated bound: {max_ulps})"
    rate = (distance > 0).double().mean().item()
    assert rate <= max_rate, f"{rate * 1e6:.0f} per million elements differ (bound {max_rate})"


def _rows(d: int) -> int:
    return max(8, ELEMENTS // d)


def _inputs(
    dtype: torch.dtype, d: int, w_mean: float, w_dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(_rows(d), d, generator=g)).to(dtype)
    w = (w_mean + 0.2 * torch.randn(d, generator=g)).to(w_dtype)
    return x, w


W_DTYPES = ["same", "float32"]


def _w_dtype(dtype: torch.dtype, which: str) -> torch.dtype:
    return dtype if which == "same" else torch.float32


# --- LayerNorm over D = 1 -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL, ids=ALL_IDS)
def test_layer_norm_over_one_column_has_zero_input_gradient(
    dtype: torch.dtype, backend: str
) -> None:
    """x̂ = (x − μ)·rstd = 0 for D = 1, so ∂y/∂x = 0 exactly, however small ε (1/√ε large)."""
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(6, 5, 1, generator=g)).to(dtype).requires_grad_()
    r = (3 * torch.randn(6, 5, 1, generator=g)).to(dtype).requires_grad_()
    w = torch.randn(1, generator=g).to(dtype).requires_grad_()
    b = torch.randn(1, generator=g).to(dtype).requires_grad_()
    s = torch.randn(6, 1, 1, generator=g).to(dtype)
    t = torch.randn(6, 1, 1, generator=g).to(dtype)
    dy = torch.randn(6, 5, 1, generator=g).to(dtype)
    for eps in (1e-5, 1e-12):
        y = NF.layer_norm(x, w, b, eps, backend=backend)
        (dx,) = torch.autograd.grad(y, x, dy)
        assert torch.equal(dx, torch.zeros_like(dx)), f"layer_norm eps={eps}: {dx.abs().max()}"

        y, _ = NF.add_layer_norm(x, r, w, b, eps, backend=backend)
        dx, dr = torch.autograd.grad(y, (x, r), dy)
        assert torch.equal(dx, torch.zeros_like(dx)), f"add_layer_norm eps={eps}"
        assert torch.equal(dr, torch.zeros_like(dr)), f"add_layer_norm eps={eps}"

        # with h's gradient too: the norm adds exactly nothing to it
        y, h = NF.add_layer_norm(x, r, w, b, eps, backend=backend)
        dh = torch.randn(h.shape, generator=g).to(h.dtype)
        dx, dr = torch.autograd.grad((y, h), (x, r), (dy, dh))
        assert torch.equal(dx, dh.to(dx.dtype)), f"add_layer_norm (y, h) eps={eps}"
        assert torch.equal(dr, dh.to(dr.dtype)), f"add_layer_norm (y, h) eps={eps}"

        y = NF.ada_layer_norm(x, s, t, eps, backend=backend)
        (dx,) = torch.autograd.grad(y, x, dy)
        assert torch.equal(dx, torch.zeros_like(dx)), f"ada_layer_norm eps={eps}"


# --- the castings against the Hugging Face formulas ----------------------------------------------


@pytest.mark.parametrize("w_dtype", W_DTYPES)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_llama_casting_against_hf_llama(
    dtype: torch.dtype, d: int, w_dtype: str, backend: str
) -> None:
    """``casting="llama"`` vs LlamaRMSNorm / Qwen3RMSNorm (HF returns promote(w, x): compared in
    x's dtype, normlab's default output)."""
    x, w = _inputs(dtype, d, 1.0, _w_dtype(dtype, w_dtype), seed=d)
    expected = hf_llama(x, w, EPS).to(dtype)
    actual = NF.rms_norm(x, w, EPS, casting="llama", backend=backend)
    check_claim(actual, expected, backend, CASTING_ULPS["llama"], MAX_RATE)


@pytest.mark.parametrize("w_dtype", W_DTYPES)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_gemma_casting_against_hf_gemma3(
    dtype: torch.dtype, d: int, w_dtype: str, backend: str
) -> None:
    """``weight_offset=1, casting="gemma"`` vs Gemma3RMSNorm."""
    x, w = _inputs(dtype, d, 0.0, _w_dtype(dtype, w_dtype), seed=d + 1)
    expected = hf_gemma3(x, w, EPS)
    actual = NF.rms_norm(x, w, EPS, weight_offset=1.0, casting="gemma", backend=backend)
    check_claim(actual, expected, backend, CASTING_ULPS["gemma"], MAX_RATE)


@pytest.mark.parametrize("w_dtype", W_DTYPES)
@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
def test_gemma_casting_against_hf_olmo2(
    dtype: torch.dtype, d: int, w_dtype: str, backend: str
) -> None:
    """``casting="gemma"`` (no offset) vs Olmo2RMSNorm, which multiplies in float32."""
    x, w = _inputs(dtype, d, 1.0, _w_dtype(dtype, w_dtype), seed=d + 2)
    expected = hf_olmo2(x, w, EPS)
    assert expected.dtype == dtype
    actual = NF.rms_norm(x, w, EPS, casting="gemma", backend=backend)
    check_claim(actual, expected, backend, CASTING_ULPS["gemma"], MAX_RATE)


def test_the_bound_is_not_vacuous() -> None:
    """check_claim rejects what the claims exclude: two ulps in the ``gemma`` casting, one ulp on
    the reference backend, and more than 1 of 1000 elements off by one ulp."""
    x, w = _inputs(torch.float16, 64, 1.0, torch.float16, seed=7)
    y = hf_olmo2(x, w, EPS)
    up = torch.nextafter(y, torch.full_like(y, float("inf")))
    two = y.clone()
    two[0, 0] = torch.nextafter(up[0, 0], torch.tensor(float("inf"), dtype=y.dtype))
    assert int(ulp_distance(two, y).max()) == 2
    with pytest.raises(AssertionError, match="ulps away"):
        check_claim(two, y, "cpp", CASTING_ULPS["gemma"], MAX_RATE)
    one = y.clone()
    one[0, 0] = up[0, 0]
    check_claim(one, y, "cpp", CASTING_ULPS["gemma"], MAX_RATE)
    with pytest.raises(AssertionError, match="torch backend"):
        check_claim(one, y, "torch", CASTING_ULPS["gemma"], MAX_RATE)
    many = y.clone()
    many[:, :1] = up[:, :1]  # 1 of 64 elements
    with pytest.raises(AssertionError, match="per million"):
        check_claim(many, y, "cpp", CASTING_ULPS["gemma"], MAX_RATE)
    neg = torch.tensor([-0.0, 0.0, -1.0], dtype=torch.float16)
    assert ulp_distance(neg, torch.tensor([0.0, -0.0, -1.0], dtype=torch.float16)).tolist() == [
        0,
        0,
        0,
    ]


def test_hf_classes_match_the_written_formulas() -> None:
    """The formulas above are the Hugging Face modules' forward passes, bit for bit."""
    pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    d = 4099
    for dtype in HALF:
        for w_dtype in (dtype, torch.float32):
            x, w = _inputs(dtype, d, 1.0, w_dtype, seed=11)
            cases: list[tuple[nn.Module, Callable, torch.Tensor]] = [
                (LlamaRMSNorm(d, eps=EPS), hf_llama, w),
                (Qwen3RMSNorm(d, eps=EPS), hf_llama, w),
                (Olmo2RMSNorm(d, eps=EPS), hf_olmo2, w),
                (Gemma3RMSNorm(d, eps=EPS), hf_gemma3, w - 1.0),
            ]
            for module, formula, weight in cases:
                module = module.to(w_dtype)
                with torch.no_grad():
                    module.weight.copy_(weight)
                    got = module(x)
                expected = formula(x, module.weight.detach(), EPS)
                assert got.dtype == expected.dtype, type(module).__name__
                assert torch.equal(got, expected), (type(module).__name__, dtype, w_dtype)
                assert torch.equal(
                    expected.to(dtype),
                    NF.rms_norm(
                        x,
                        module.weight.detach(),
                        EPS,
                        weight_offset=1.0 if formula is hf_gemma3 else 0.0,
                        casting="llama" if formula is hf_llama else "gemma",
                        backend="torch",
                    ),
                ), (type(module).__name__, dtype, w_dtype)


# --- eps=None, casting="gemma" against torch.nn.RMSNorm ------------------------------------------


@pytest.mark.parametrize("d", DIMS)
@pytest.mark.parametrize("dtype", ALL, ids=ALL_IDS)
def test_rms_norm_module_against_torch_nn_rms_norm(
    dtype: torch.dtype, d: int, backend: str
) -> None:
    """``RMSNorm(d, eps=None, casting="gemma")`` with torch.nn.RMSNorm's state dict: bit for bit
    on ``torch``; within NN_RMSNORM_ULPS elsewhere (16-bit: in ≤ 1 of 1000 elements)."""
    g = torch.Generator().manual_seed(d + 3)
    x = (3 * torch.randn(_rows(d), d, generator=g, dtype=torch.float64)).to(dtype)
    ref = nn.RMSNorm(d, dtype=dtype)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.2 * torch.randn(d, generator=g))
    mine = normlab.RMSNorm(d, eps=None, casting="gemma", dtype=dtype)
    mine.load_state_dict(ref.state_dict())
    previous = get_default_backend()
    set_default_backend(backend)
    try:
        with torch.no_grad():
            actual = mine(x)
    finally:
        set_default_backend(previous)
    with torch.no_grad():
        expected = ref(x)
    rate = MAX_RATE if dtype in HALF else 1.0  # float32 / float64: most elements may differ
    check_claim(actual, expected, backend, NN_RMSNORM_ULPS[dtype], rate)
