"""normlab's modules as drop-ins for torch.nn.LayerNorm / torch.nn.RMSNorm, checked against torch's
own modules: constructor signature and defaults (``eps=None``, multi-dimensional
``normalized_shape``, positional ``device`` / ``dtype``), meta-device initialisation, state
dicts, torch.compile with dynamic shapes, torch.export, autocast, odd strides and empty batches,
gradients (gain only, double backward); and the conditional norms' per-sequence broadcasting and
zero initialisation."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import normlab
import normlab.functional as NF
from module_helpers import randomise, seeded
from normlab.explain import explain_vector

D, C = 16, 8
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
FLOAT_IDS = ["float32", "bfloat16", "float16", "float64"]


def twins(kind: str, shape: object = D, **kw: object) -> tuple[nn.Module, nn.Module]:
    """(torch's module with random parameters, normlab's with the same state dict)."""
    theirs_cls = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}[kind]
    ours_cls = {"layernorm": normlab.LayerNorm, "rmsnorm": normlab.RMSNorm}[kind]
    extra = {"casting": "gemma"} if kind == "rmsnorm" else {}
    theirs = randomise(theirs_cls(shape, **kw))
    ours = ours_cls(shape, **kw, **extra)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


# --- RMSNorm: eps=None is torch's default ------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=FLOAT_IDS)
def test_rmsnorm_eps_none_matches_torch(dtype: torch.dtype) -> None:
    """torch.nn.RMSNorm's default eps=None is the machine epsilon of the dtype the statistics
    are computed in (float32 for 16-bit input); with x ~ 1e-4 that ε decides the output."""
    theirs = randomise(nn.RMSNorm(D)).to(dtype)
    ours = normlab.RMSNorm(D, eps=None, casting="gemma").to(dtype)
    ours.load_state_dict(theirs.state_dict())
    assert ours.eps is None and "eps=None" in repr(ours)
    x = seeded(3, 5, D, dtype=dtype) * 1e-4
    torch.testing.assert_close(ours(x), theirs(x))  # a wrong ε is off by ~0.5
    want = nn.functional.rms_norm(x, (D,), theirs.weight)
    torch.testing.assert_close(NF.rms_norm(x, theirs.weight, eps=None, casting="gemma"), want)
    y, _ = NF.add_rms_norm(x, None, theirs.weight, eps=None, casting="gemma")
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize(
    ("dtype", "w_dtype"),
    [
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
        (torch.float16, torch.float16),
    ],
    ids=["bf16_w32", "bf16_wbf16", "fp16_w32", "fp16_wfp16"],
)
def test_gemma_casting_rounds_like_torch_rmsnorm(dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    """torch.nn.RMSNorm meets x̂ and the gain in float32 and rounds once: ``casting="gemma"``.
    (A backend with its own reduction order may flip a rounding now and then.)"""
    theirs = randomise(nn.RMSNorm(64, eps=1e-6)).to(w_dtype)
    ours = normlab.RMSNorm(64, eps=1e-6, casting="gemma").to(w_dtype)
    ours.load_state_dict(theirs.state_dict())
    x = seeded(64, 64, dtype=dtype) * 3
    got, want = ours(x), theirs(x)
    assert got.dtype == want.dtype == dtype
    assert (got != want).float().mean() <= 0.01
    torch.testing.assert_close(got, want)


# --- constructor signatures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"), [(normlab.LayerNorm, nn.LayerNorm), (normlab.RMSNorm, nn.RMSNorm)]
)
def test_positional_parameters_are_torchs(ours: type, theirs: type) -> None:
    """torch's parameters, in torch's order, then normlab's own extras (keyword-only)."""
    want = list(inspect.signature(theirs).parameters)
    params = inspect.signature(ours).parameters
    assert list(params)[: len(want)] == want
    for name in list(params)[len(want) :]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_rmsnorm_positional_call_like_torch() -> None:
    norm = normlab.RMSNorm(D, 1e-5, False)
    assert norm.weight is None and norm.eps == 1e-5
    norm = normlab.RMSNorm(D, 1e-5, True, "cpu", torch.float64)
    assert norm.weight.dtype == torch.float64 and norm.weight.device.type == "cpu"
    assert normlab.RMSNorm(normalized_shape=D).normalized_shape == (D,)


def test_elementwise_affine_must_be_a_bool() -> None:
    """The pre-drop-in positional form RMSNorm(D, eps, weight_offset) must not silently turn
    into RMSNorm(D, eps, elementwise_affine): a float there is refused, naming the argument."""
    for make in (lambda: normlab.RMSNorm(D, 1e-6, 1.0), lambda: normlab.LayerNorm(D, 1e-5, 0.0)):
        with pytest.raises(TypeError, match=r"elementwise_affine.*expected a bool"):
            make()
    with pytest.raises(TypeError, match=r"bias.*expected a bool"):
        normlab.LayerNorm(D, bias=None)


def test_sizes_accept_numpy_integers_like_torch() -> None:
    assert normlab.LayerNorm(np.int64(D)).normalized_shape == nn.LayerNorm(D).normalized_shape
    assert normlab.RMSNorm((np.int32(D),)).normalized_shape == (D,)
    ada = normlab.AdaRMSNorm(np.int64(D), np.int64(C))
    assert (ada.dim, ada.cond_dim) == (D, C) and type(ada.dim) is int


# --- multi-dimensional normalized_shape ----------------------------------------------------------

MULTI_CONFIGS = [
    ("layernorm", {}),
    ("layernorm", {"bias": False}),
    ("layernorm", {"elementwise_affine": False}),
    ("rmsnorm", {"eps": 1e-6}),
    ("rmsnorm", {"eps": 1e-6, "elementwise_affine": False}),
]


@pytest.mark.parametrize("shape", [(4, 8), [2, 3, 4], torch.Size([5, 4])], ids=str)
@pytest.mark.parametrize(("kind", "kw"), MULTI_CONFIGS, ids=str)
def test_multidimensional_normalized_shape_matches_torch(
    kind: str, kw: dict, shape: object
) -> None:
    """Statistics over the trailing len(normalized_shape) dimensions, parameters of that shape."""
    theirs, ours = twins(kind, shape, **kw)
    assert ours.normalized_shape == theirs.normalized_shape == tuple(shape)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()
    }
    x = seeded(2, 3, *shape).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    dy = seeded(2, 3, *shape, seed=7)
    y, want = ours(x), theirs(x2)
    assert y.shape == x.shape
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    y.backward(dy)
    want.backward(dy)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    back = type(theirs)(shape, **kw)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x2), want)


def test_multidimensional_shape_errors_name_the_trailing_dimensions() -> None:
    norm = normlab.LayerNorm((4, 8))
    for bad in (seeded(2, 3, 8), seeded(8)):
        with pytest.raises(ValueError, match=r"normalized_shape.*\(4, 8\)") as info:
            norm(bad)
        assert "expected" in str(info.value) and str(tuple(bad.shape)) in str(info.value)
    with pytest.raises(ValueError, match="normalized_shape"):
        normlab.RMSNorm(())
    with pytest.raises(ValueError, match="normalized_shape"):
        normlab.LayerNorm((4, 0))


# --- meta device, state dicts ---------------------------------------------------------------------

MODULES: dict[str, Callable[..., nn.Module]] = {
    "layernorm": lambda **kw: normlab.LayerNorm(D, **kw),
    "rmsnorm": lambda **kw: normlab.RMSNorm(D, **kw),
    "rmsnorm_gemma": lambda **kw: normlab.RMSNorm(D, weight_offset=1.0, casting="gemma", **kw),
    "adarms": lambda **kw: normlab.AdaRMSNorm(D, C, **kw),
    "adaln_zero": lambda **kw: normlab.AdaLayerNormZero(D, C, **kw),
}


@pytest.mark.parametrize("order", ["modules", "apply"])
@pytest.mark.parametrize("name", list(MODULES))
def test_meta_init_then_reset_parameters_in_any_order(name: str, order: str) -> None:
    """The deferred-init recipe: build on meta, to_empty, then reset_parameters on every
    submodule. ``model.modules()`` visits the parent before its children (FSDP's
    materialisation does too), so the modulation Linear's own reset must also zero it."""
    fresh = MODULES[name]()
    module = MODULES[name](device="meta")
    assert all(p.is_meta for p in module.parameters())
    module.to_empty(device="cpu")
    if order == "modules":
        for m in module.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    else:
        module.apply(lambda m: m.reset_parameters() if hasattr(m, "reset_parameters") else None)
    for (n, p), q in zip(module.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("name", ["adarms", "adaln_zero"])
def test_modulation_is_still_a_linear_with_linear_keys(name: str) -> None:
    module = MODULES[name]()
    assert isinstance(module.modulation, nn.Linear)
    lin = randomise(nn.Linear(C, 3 * D))
    module.modulation.load_state_dict(lin.state_dict())
    assert list(module.state_dict()) == ["modulation.weight", "modulation.bias"]
    c = seeded(2, C)
    torch.testing.assert_close(module.modulation(c), lin(c))


# --- torch.compile with dynamic shapes, torch.export ---------------------------------------------


def call(name: str, module: nn.Module, batch: int, dtype: torch.dtype = torch.float32) -> object:
    x = seeded(batch, 3, D, dtype=dtype)
    if name in ("adarms", "adaln_zero"):
        return module(x, seeded(batch, C, seed=5, dtype=dtype))
    return module(x)


def as_list(out: object) -> list[torch.Tensor]:
    return [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]


@pytest.mark.parametrize("name", list(MODULES))
def test_torch_compile_fullgraph_dynamic(name: str) -> None:
    """dynamic=True makes the batch (and the floats eps, weight_offset) symbolic: the argument
    checks must trace without a graph break."""
    module = randomise(MODULES[name]())
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 5):
            got, want = call(name, compiled, batch), call(name, module, batch)
            for a, b in zip(as_list(got), as_list(want), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "variants",
    [
        [{"eps": 1e-6}, {"eps": 1e-5}, {"eps": 1e-3}],
        [{"weight_offset": 0.0}, {"weight_offset": 1.0, "casting": "gemma"}],
    ],
    ids=["eps", "weight_offset"],
)
def test_torch_compile_fullgraph_recompiles_for_another_float(variants: list[dict]) -> None:
    """Compiling a second RMSNorm whose eps (or offset) differs recompiles the same forward with
    that float made dynamic ("automatic dynamic"); fullgraph must still hold."""
    torch._dynamo.reset()
    x = seeded(2, 3, D)
    for kw in variants:
        module = randomise(normlab.RMSNorm(D, **kw))
        compiled = torch.compile(module, fullgraph=True)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [
        lambda: normlab.RMSNorm(D, eps=None),
        lambda: normlab.RMSNorm((4, 4), eps=None, casting="gemma"),
        lambda: normlab.LayerNorm((4, 4)),
    ],
    ids=["rmsnorm_eps_none", "rmsnorm_2d_shape", "layernorm_2d_shape"],
)
def test_torch_compile_fullgraph_new_constructor_forms(make: Callable[[], nn.Module]) -> None:
    module = randomise(make())
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    for dtype in (torch.float32, torch.bfloat16):
        x = seeded(3, 2, *module.normalized_shape, dtype=dtype) * 1e-3
        # bfloat16: Inductor may skip the LLaMA rounding of x̂, one ulp (default tolerance)
        tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
        torch.testing.assert_close(compiled(x), module(x), **tol)


@pytest.mark.parametrize("name", list(MODULES))
def test_torch_export_with_a_dynamic_batch(name: str) -> None:
    module = randomise(MODULES[name]())
    x = seeded(2, 3, D)
    args = (x, seeded(2, C, seed=5)) if name in ("adarms", "adaln_zero") else (x,)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, args, dynamic_shapes=tuple({0: batch} for _ in args))
    for b in (1, 4):
        new = tuple(seeded(b, *a.shape[1:], seed=9 + i) for i, a in enumerate(args))
        for got, want in zip(as_list(program.module()(*new)), as_list(module(*new)), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- autocast, odd layouts, empty batches ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cpu_autocast_dtype_matches_torch(kind: str, in_dtype: torch.dtype) -> None:
    theirs, ours = twins(kind, eps=1e-6)
    x = seeded(4, 3, D, dtype=in_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = theirs(x), ours(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7)


def strided_inputs() -> dict[str, torch.Tensor]:
    base = seeded(2, D, 5, 3)
    return {
        "transposed": seeded(2, D, 3).transpose(1, 2),
        "every_other": seeded(2, 3, 2 * D)[..., ::2],
        "channels_last": base.to(memory_format=torch.channels_last).permute(0, 2, 3, 1),
        "nchw_permuted": base.permute(0, 2, 3, 1),
        "expanded_rows": seeded(1, 1, D).expand(4, 3, D),
        "constant_rows": seeded(4, 3, 1).expand(4, 3, D),
    }


@pytest.mark.parametrize("layout", list(strided_inputs()))
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_non_contiguous_inputs_match_torch(kind: str, layout: str) -> None:
    theirs, ours = twins(kind, eps=1e-6)
    x = strided_inputs()[layout]
    x1 = x.detach().clone().requires_grad_() if layout.startswith("expanded") else x
    torch.testing.assert_close(ours(x1), theirs(x1), rtol=1e-5, atol=1e-5)
    dy = seeded(*x.shape, seed=3).transpose(-1, -2).contiguous().transpose(-1, -2)
    xa = x.detach().clone().requires_grad_()
    xb = x.detach().clone().requires_grad_()
    ours(xa).backward(dy)
    theirs(xb).backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    # constant rows: x − μ is 0 up to the rounding of μ, which ε / rsqrt magnify to ~1e-4
    atol = 1e-3 if layout == "constant_rows" else 1e-5
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("shape", [(0, D), (2, 0, D), (0, 3, D)], ids=str)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_empty_batch_matches_torch(kind: str, shape: tuple[int, ...]) -> None:
    theirs, ours = twins(kind, eps=1e-6)
    x = torch.zeros(shape, requires_grad=True)
    y = ours(x)
    assert y.shape == theirs(x).shape == shape
    y.sum().backward()
    assert x.grad.shape == shape
    assert torch.equal(ours.weight.grad, torch.zeros(D))


@pytest.mark.parametrize("cond_shape", [(0, C), (0, 3, C)], ids=["per_sequence", "per_token"])
@pytest.mark.parametrize("name", ["adarms", "adaln_zero"])
def test_conditional_norms_with_an_empty_batch(name: str, cond_shape: tuple[int, ...]) -> None:
    y, gate = MODULES[name]()(torch.zeros(0, 3, D), torch.zeros(cond_shape))
    assert y.shape == (0, 3, D) and gate.shape[0] == 0


# --- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_gain_gradient_without_input_gradient(kind: str) -> None:
    """x does not require grad (frozen embeddings): the gain and bias still get torch's
    gradients."""
    theirs, ours = twins(kind, eps=1e-6)
    x, dy = seeded(2, 3, D), seeded(2, 3, D, seed=2)
    assert not x.requires_grad
    ours(x).backward(dy)
    theirs(x).backward(dy)
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=n)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_double_backward_matches_torch(kind: str) -> None:
    theirs, ours = twins(kind, eps=1e-6)
    x = seeded(2, 3, D, dtype=torch.float64)
    ours, theirs = ours.double(), theirs.double()
    grads = []
    for m in (ours, theirs):
        xx = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(m(xx).pow(3).sum(), xx, create_graph=True)
        grads.append(torch.autograd.grad(gx.square().sum(), [xx, *m.parameters()]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


# --- conditional norms: per-sequence cond with more than one token axis -------------------------


def per_sample(m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return m.reshape(m.shape[0], *([1] * (x.dim() - 2)), m.shape[-1])


@pytest.mark.parametrize("x_shape", [(2, 5, 2, D), (2, 5, 3, D), (2, 2, 3, 2, D)], ids=str)
@pytest.mark.parametrize("name", ["adarms", "adaln_zero"])
def test_per_sequence_cond_applies_to_the_whole_sample(name: str, x_shape: tuple) -> None:
    """cond [B, C] is per sequence for any x [B, …, D]: sample b's scale, shift and gate apply to
    all of its tokens, never broadcast against another axis that happens to have size B."""
    module = randomise(MODULES[name]())
    x, c = seeded(*x_shape), seeded(2, C, seed=4)
    y, gate = module(x, c)
    if name == "adarms":
        scale, shift, g = module.modulation(c).chunk(3, dim=-1)
        hat = NF.rms_norm(x, eps=1e-6)
    else:
        shift, scale, g = module.modulation(nn.functional.silu(c)).chunk(3, dim=-1)
        hat = NF.layer_norm(x, eps=1e-6)
    want = hat * (1 + per_sample(scale, x)) + per_sample(shift, x)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(gate, per_sample(g, x))
    h = NF.gated_residual(x, y, gate)
    torch.testing.assert_close(h, x + per_sample(g, x) * y, rtol=1e-6, atol=1e-6)


def test_functional_per_sequence_modulation_with_two_token_axes() -> None:
    x = seeded(2, 5, 2, D)
    scale, shift, gate = seeded(2, D, seed=1), seeded(2, D, seed=2), seeded(2, D, seed=3)
    hat = NF.rms_norm(x, eps=1e-6)
    want = hat * (1 + per_sample(scale, x)) + per_sample(shift, x)
    torch.testing.assert_close(NF.ada_rms_norm(x, scale, shift), want, rtol=1e-5, atol=1e-5)
    h = NF.gated_residual(x, x, gate)
    torch.testing.assert_close(h, x + per_sample(gate, x) * x, rtol=1e-6, atol=1e-6)
    _, h2 = NF.gated_add_ada_rms_norm(x, x, gate, scale, shift)
    torch.testing.assert_close(h2, h)


@pytest.mark.parametrize("name", ["adarms", "adaln_zero"])
def test_zero_init_is_identity_with_a_closed_gate_at_any_rank(name: str) -> None:
    x = seeded(2, 5, 3, D)
    for c in (seeded(2, C), seeded(2, 5, 3, C)):
        _, gate = MODULES[name]()(x, c)
        assert torch.count_nonzero(gate) == 0
        assert torch.equal(NF.gated_residual(x, seeded(*x.shape, seed=8), gate), x)


# --- explain: errors name the argument ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "exc", "fragment"),
    [
        ({"values": ["a", 1.0]}, TypeError, "values"),
        ({"values": [[1.0, 2.0]]}, TypeError, "values"),
        ({"values": [1.0, 2.0], "scale": float("nan")}, ValueError, "scale"),
        ({"values": [1.0, 2.0], "shift": float("inf")}, ValueError, "shift"),
        ({"values": [1.0, 2.0], "scale": "3"}, TypeError, "scale"),
    ],
)
def test_explain_vector_errors_name_the_argument(kwargs: dict, exc: type, fragment: str) -> None:
    with pytest.raises(exc, match=fragment) as info:
        explain_vector(**kwargs)
    assert "expected" in str(info.value)


def test_explain_vector_accepts_any_iterable() -> None:
    assert explain_vector(iter([1.0, 2.0])).x == explain_vector((1.0, 2.0)).x == [1.0, 2.0]
