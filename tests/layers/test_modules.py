"""The nn modules: drop-in compatibility with torch.nn, the conditional norms' conventions, and
what every module must survive (autocast, torch.compile, deepcopy, pickle, .to(dtype)); plus
the explicit modulation reorderings between π0.5 and DiT."""

from __future__ import annotations

import copy
import inspect
import pickle
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import normlab
import normlab.functional as NF
from module_helpers import randomise, seeded
from normlab.layers import DynamicTanh
from normlab.modulation import dit_to_pi05, pi05_to_dit, reorder_chunks, reorder_linear

D, C = 16, 8


def rms_hat64(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)


def ln_hat64(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    xc = x - x.mean(-1, keepdim=True)
    return xc / torch.sqrt(xc.square().mean(-1, keepdim=True) + eps)


# --- LayerNorm: a drop-in for torch.nn.LayerNorm -----------------------------------------------

LN_CONFIGS = [
    {},
    {"bias": False},
    {"elementwise_affine": False},
    {"elementwise_affine": False, "bias": False},
    {"eps": 1e-3},
]


@pytest.mark.parametrize("shape_arg", [D, (D,), [D], torch.Size([D])], ids=type)
@pytest.mark.parametrize("kw", LN_CONFIGS, ids=str)
def test_layernorm_is_a_drop_in(kw: dict, shape_arg: object) -> None:
    theirs = randomise(nn.LayerNorm(shape_arg, **kw))
    ours = normlab.LayerNorm(shape_arg, **kw)
    assert ours.normalized_shape == theirs.normalized_shape
    assert ours.eps == theirs.eps and ours.elementwise_affine == theirs.elementwise_affine
    assert (ours.bias is None) == (theirs.bias is None)
    assert (ours.weight is None) == (theirs.weight is None)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert ours.state_dict().keys() == theirs.state_dict().keys()

    ours.load_state_dict(theirs.state_dict())
    x = seeded(2, 3, D)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    back = nn.LayerNorm(shape_arg, **kw)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
def test_layernorm_matches_torch_in_other_dtypes(dtype: torch.dtype) -> None:
    theirs = randomise(nn.LayerNorm(D)).to(dtype)
    ours = normlab.LayerNorm(D, dtype=dtype)
    assert ours.weight.dtype == dtype
    ours.load_state_dict(theirs.state_dict())
    x = seeded(4, D, dtype=dtype)
    tol = 1e-12 if dtype == torch.float64 else 2**-6
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)


# --- RMSNorm: loads torch.nn.RMSNorm's and HF's state dicts ------------------------------------


@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_is_a_drop_in_for_torch_rmsnorm(affine: bool) -> None:
    theirs = randomise(nn.RMSNorm(D, eps=1e-6, elementwise_affine=affine))
    ours = normlab.RMSNorm(D, elementwise_affine=affine)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert ours.normalized_shape == theirs.normalized_shape
    ours.load_state_dict(theirs.state_dict())
    x = seeded(2, 3, D)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
    back = nn.RMSNorm(D, eps=1e-6, elementwise_affine=affine)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back(x), theirs(x))


def test_rmsnorm_gain_starts_at_one_in_both_forms() -> None:
    llama = normlab.RMSNorm(D)
    gemma = normlab.RMSNorm(D, weight_offset=1.0, casting="gemma")
    assert torch.equal(llama.weight, torch.ones(D))
    assert torch.equal(gemma.weight, torch.zeros(D))
    x = seeded(3, D)
    torch.testing.assert_close(llama(x), gemma(x))
    torch.testing.assert_close(gemma(x).double(), rms_hat64(x, 1e-6), rtol=1e-6, atol=1e-6)


# --- conditional norms --------------------------------------------------------------------------


@pytest.mark.parametrize("cond_shape", [(2, C), (2, 3, C)], ids=["per_sequence", "per_token"])
def test_adarms_at_init_is_unit_gain_rmsnorm_with_a_closed_gate(cond_shape: tuple) -> None:
    ada = normlab.AdaRMSNorm(D, C)
    assert torch.count_nonzero(ada.modulation.weight) == 0
    assert torch.count_nonzero(ada.modulation.bias) == 0
    assert [n for n, _ in ada.named_parameters()] == ["modulation.weight", "modulation.bias"]
    x = seeded(2, 3, D)
    y, gate = ada(x, seeded(*cond_shape, seed=2))
    torch.testing.assert_close(y.double(), rms_hat64(x, 1e-6), rtol=1e-6, atol=1e-6)
    assert torch.equal(gate, torch.zeros_like(gate))
    assert gate.shape == ((2, 1, D) if len(cond_shape) == 2 else (2, 3, D))


@pytest.mark.parametrize("cond_shape", [(2, C), (2, 3, C)], ids=["per_sequence", "per_token"])
@pytest.mark.parametrize("gate", [True, False])
def test_adarms_splits_scale_shift_gate_in_that_order(gate: bool, cond_shape: tuple) -> None:
    ada = randomise(normlab.AdaRMSNorm(D, C, eps=1e-5, gate=gate))
    assert ada.modulation.out_features == (3 if gate else 2) * D
    x, c = seeded(2, 3, D), seeded(*cond_shape, seed=3)
    y, g = ada(x, c)
    mod = c.double() @ ada.modulation.weight.double().T + ada.modulation.bias.double()
    if mod.dim() == 2:
        mod = mod[:, None, :]
    s, t = mod[..., :D], mod[..., D : 2 * D]
    torch.testing.assert_close(y.double(), rms_hat64(x, 1e-5) * (1 + s) + t, rtol=1e-5, atol=1e-5)
    if gate:
        torch.testing.assert_close(g.double(), mod[..., 2 * D :], rtol=1e-5, atol=1e-5)
    else:
        assert g is None


@pytest.mark.parametrize("cond_shape", [(2, C), (2, 3, C)], ids=["per_sequence", "per_token"])
def test_adaln_zero_follows_dit(cond_shape: tuple) -> None:
    """DiT: shift, scale, gate = Linear(SiLU(c)).chunk(3); y = LN(x)·(1 + scale) + shift, with a
    LayerNorm without affine and ε = 1e-6."""
    ada = normlab.AdaLayerNormZero(D, C)
    x, c = seeded(2, 3, D), seeded(*cond_shape, seed=4)
    y0, g0 = ada(x, c)
    torch.testing.assert_close(y0.double(), ln_hat64(x, 1e-6), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(g0) == 0

    randomise(ada)
    y, g = ada(x, c)
    shift, scale, gate = nn.Linear.forward(ada.modulation, TF.silu(c)).chunk(3, dim=-1)
    if c.dim() == 2:
        shift, scale, gate = shift[:, None], scale[:, None], gate[:, None]
    dit_norm = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
    torch.testing.assert_close(y, dit_norm(x) * (1 + scale) + shift, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g, gate)


def test_adaln_zero_without_gate_is_dits_final_layer() -> None:
    """DiT's final layer: shift, scale = Linear(SiLU(c)).chunk(2), no gate (2·D outputs)."""
    ada = normlab.AdaLayerNormZero(D, C, gate=False)
    assert ada.modulation.out_features == 2 * D
    randomise(ada)
    x, c = seeded(2, 3, D), seeded(2, C, seed=4)
    y, g = ada(x, c)
    assert g is None
    shift, scale = nn.Linear.forward(ada.modulation, TF.silu(c)).chunk(2, dim=-1)
    dit_norm = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
    expected = dit_norm(x) * (1 + scale[:, None]) + shift[:, None]
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


# --- what every module must survive ------------------------------------------------------------

MODULES: dict[str, Callable[[], nn.Module]] = {
    "layernorm": lambda: normlab.LayerNorm(D),
    "layernorm_nobias": lambda: normlab.LayerNorm(D, bias=False),
    "rmsnorm": lambda: normlab.RMSNorm(D),
    "rmsnorm_gemma": lambda: normlab.RMSNorm(D, weight_offset=1.0, casting="gemma"),
    "rmsnorm_fp32": lambda: normlab.RMSNorm(D, casting="fp32"),
    "adarms": lambda: normlab.AdaRMSNorm(D, C),
    "adarms_nogate": lambda: normlab.AdaRMSNorm(D, C, gate=False),
    "adaln_zero": lambda: normlab.AdaLayerNormZero(D, C),
    "adaln_zero_nogate": lambda: normlab.AdaLayerNormZero(D, C, gate=False),
}
CONDITIONAL = {"adarms", "adarms_nogate", "adaln_zero", "adaln_zero_nogate"}


def run(name: str, module: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The module's main output (y) on fixed inputs."""
    x = seeded(2, 3, D, dtype=dtype)
    if name in CONDITIONAL:
        return module(x, seeded(2, C, seed=5, dtype=dtype))[0]
    return module(x)


def outputs(name: str, module: nn.Module) -> list[torch.Tensor]:
    x = seeded(2, 3, D)
    out = module(x, seeded(2, C, seed=5)) if name in CONDITIONAL else module(x)
    return [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]


EXTRA_REPR = {
    "layernorm": ["(16,)", "eps=1e-05", "elementwise_affine=True", "bias=True"],
    "layernorm_nobias": ["(16,)", "bias=False"],
    "rmsnorm": ["(16,)", "eps=1e-06", "weight_offset=0.0", "casting='llama'"],
    "rmsnorm_gemma": ["weight_offset=1.0", "casting='gemma'"],
    "rmsnorm_fp32": ["casting='fp32'", "elementwise_affine=True"],
    "adarms": ["16", "cond_dim=8", "eps=1e-06", "gate=True"],
    "adarms_nogate": ["gate=False"],
    "adaln_zero": ["16", "cond_dim=8", "eps=1e-06", "gate=True"],
    "adaln_zero_nogate": ["gate=False"],
}


@pytest.mark.parametrize("name", list(MODULES))
def test_extra_repr(name: str) -> None:
    text = repr(MODULES[name]())
    for part in EXTRA_REPR[name]:
        assert part in text, f"{part!r} not in {text!r}"


@pytest.mark.parametrize("name", list(MODULES))
def test_reset_parameters_restores_the_initial_values(name: str) -> None:
    fresh = MODULES[name]()
    module = randomise(MODULES[name]())
    assert any(
        not torch.equal(p, q) for p, q in zip(module.parameters(), fresh.parameters(), strict=True)
    )
    module.reset_parameters()
    for (n, p), q in zip(module.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("name", list(MODULES))
def test_autocast_bf16_on_cpu(name: str) -> None:
    """Under CPU autocast, float32 input keeps float32 output (Linears run in bf16); bf16 input
    gives bf16 output (float32 for ``casting="fp32"``); both within bf16 accuracy of the float32
    result."""
    module = randomise(MODULES[name]())
    want = run(name, module)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(name, module)
        got_bf16 = run(name, module, torch.bfloat16)
    assert got.dtype == torch.float32
    assert got_bf16.dtype == (torch.float32 if name == "rmsnorm_fp32" else torch.bfloat16)
    for y in (got, got_bf16):
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y.float(), want, rtol=2**-5, atol=2**-5)


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "rmsnorm_gemma", "adarms", "adaln_zero"])
def test_torch_compile_fullgraph(name: str) -> None:
    """fullgraph=True fails on any graph break; the compiled module computes the same."""
    module = randomise(MODULES[name]())
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for got, want in zip(outputs(name, compiled), outputs(name, module), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(MODULES))
def test_deepcopy(name: str) -> None:
    module = randomise(MODULES[name]())
    twin = copy.deepcopy(module)
    assert repr(twin) == repr(module)
    for a, b in zip(outputs(name, twin), outputs(name, module), strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
    assert all(
        not torch.equal(p, q) for p, q in zip(twin.parameters(), module.parameters(), strict=True)
    )


@pytest.mark.parametrize("name", list(MODULES))
def test_pickle(name: str) -> None:
    module = randomise(MODULES[name]())
    twin = pickle.loads(pickle.dumps(module))
    assert type(twin) is type(module) and repr(twin) == repr(module)
    for a, b in zip(outputs(name, twin), outputs(name, module), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
@pytest.mark.parametrize("name", list(MODULES))
def test_to_dtype(name: str, dtype: torch.dtype) -> None:
    module = randomise(MODULES[name]())
    want = run(name, module).double()
    module = module.to(dtype)
    assert all(p.dtype == dtype for p in module.parameters())
    y = run(name, module, dtype)
    assert y.dtype == (
        torch.float32 if name == "rmsnorm_fp32" and dtype != torch.float64 else dtype
    )
    tol = 1e-5 if dtype == torch.float64 else 2**-5
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(MODULES))
def test_state_dict_round_trip(name: str) -> None:
    module = randomise(MODULES[name]())
    other = MODULES[name]()
    other.load_state_dict(module.state_dict())
    for a, b in zip(outputs(name, other), outputs(name, module), strict=True):
        assert torch.equal(a, b)


# --- modulation orders: π0.5 (scale, shift, gate) and DiT (shift, scale, gate) -----------------


def test_reorder_chunks_round_trip_and_errors() -> None:
    t = torch.arange(12.0).reshape(6, 2)
    moved = reorder_chunks(t, ("a", "b", "c"), ("c", "a", "b"))
    assert torch.equal(moved, torch.cat([t[4:], t[:2], t[2:4]]))
    assert torch.equal(reorder_chunks(moved, ("c", "a", "b"), ("a", "b", "c")), t)
    with pytest.raises(ValueError, match="dst"):
        reorder_chunks(t, ("a", "b", "c"), ("a", "b", "d"))
    with pytest.raises(ValueError, match="src"):
        reorder_chunks(t, ("a", "a", "b"), ("a", "b", "a"))
    with pytest.raises(ValueError, match="multiple"):
        reorder_chunks(t, ("a", "b", "c", "d"), ("d", "c", "b", "a"))


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("dim", [3, 4, 6])
def test_dit_pi05_round_trip_is_identity(gate: bool, dim: int) -> None:
    """dim 3 and 6 make 2·D divisible by 3: the chunk count must come from ``gate``."""
    chunks = 3 if gate else 2
    lin = randomise(nn.Linear(C, chunks * dim))
    there = dit_to_pi05(lin, gate=gate)
    back = pi05_to_dit(there, gate=gate)
    assert torch.equal(back.weight, lin.weight) and torch.equal(back.bias, lin.bias)
    c = seeded(5, C)
    dit = lin(c).chunk(chunks, dim=-1)
    pi = there(c).chunk(chunks, dim=-1)
    assert torch.equal(pi[0], dit[1]) and torch.equal(pi[1], dit[0])  # scale, shift swapped
    if gate:
        assert torch.equal(pi[2], dit[2])
    assert not torch.equal(there.weight, lin.weight)  # a real permutation, on a copy


def test_chunk_count_must_fit() -> None:
    with pytest.raises(ValueError, match="gate=False"):
        dit_to_pi05(nn.Linear(C, 2 * 4))
    with pytest.raises(ValueError, match="multiple of 2"):
        pi05_to_dit(nn.Linear(C, 7), gate=False)
    with pytest.raises(TypeError, match="linear"):
        reorder_linear(nn.Conv1d(1, 1, 1), ("a",), ("a",))


def test_adaln_zero_linear_converted_drives_adarms() -> None:
    """An AdaLayerNormZero's Linear, converted, gives the same modulation in π0.5's order; an
    AdaRMSNorm that takes it (fed SiLU(c), since AdaRMSNorm applies no SiLU) then uses DiT's
    scale and shift on its RMS x̂, and returns DiT's gate."""
    adaln = randomise(normlab.AdaLayerNormZero(D, C))
    ada = normlab.AdaRMSNorm(D, C)
    ada.modulation.load_state_dict(dit_to_pi05(adaln.modulation).state_dict())
    x, c = seeded(2, 3, D), seeded(2, C, seed=6)
    shift, scale, gate = adaln.modulation(TF.silu(c)).chunk(3, dim=-1)
    s2, t2, g2 = ada.modulation(TF.silu(c)).chunk(3, dim=-1)
    assert torch.equal(s2, scale) and torch.equal(t2, shift) and torch.equal(g2, gate)
    y, g = ada(x, TF.silu(c))
    want = rms_hat64(x, 1e-6) * (1 + scale.double()[:, None]) + shift.double()[:, None]
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    _, g_dit = adaln(x, c)
    assert torch.equal(g, g_dit)


# ----------------------------------------------------------------------------------------------
# Drop-in for torch: casting, constructors, compile/export, autocast, strides, empty batches
# ----------------------------------------------------------------------------------------------
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
DROPIN_MODULES: dict[str, Callable[..., nn.Module]] = {
    "layernorm": lambda **kw: normlab.LayerNorm(D, **kw),
    "rmsnorm": lambda **kw: normlab.RMSNorm(D, **kw),
    "rmsnorm_gemma": lambda **kw: normlab.RMSNorm(D, weight_offset=1.0, casting="gemma", **kw),
    "adarms": lambda **kw: normlab.AdaRMSNorm(D, C, **kw),
    "adaln_zero": lambda **kw: normlab.AdaLayerNormZero(D, C, **kw),
}


@pytest.mark.parametrize("order", ["modules", "apply"])
@pytest.mark.parametrize("name", list(DROPIN_MODULES))
def test_meta_init_then_reset_parameters_in_any_order(name: str, order: str) -> None:
    """The deferred-init recipe: build on meta, to_empty, then reset_parameters on every
    submodule. ``model.modules()`` visits the parent before its children (FSDP's
    materialisation does too), so the modulation Linear's own reset must also zero it."""
    fresh = DROPIN_MODULES[name]()
    module = DROPIN_MODULES[name](device="meta")
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
    module = DROPIN_MODULES[name]()
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


@pytest.mark.parametrize("name", list(DROPIN_MODULES))
def test_torch_compile_fullgraph_dynamic(name: str) -> None:
    """dynamic=True makes the batch (and the floats eps, weight_offset) symbolic: the argument
    checks must trace without a graph break."""
    module = randomise(DROPIN_MODULES[name]())
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


@pytest.mark.parametrize("name", list(DROPIN_MODULES))
def test_torch_export_with_a_dynamic_batch(name: str) -> None:
    module = randomise(DROPIN_MODULES[name]())
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
    y, gate = DROPIN_MODULES[name]()(torch.zeros(0, 3, D), torch.zeros(cond_shape))
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
    module = randomise(DROPIN_MODULES[name]())
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
        _, gate = DROPIN_MODULES[name]()(x, c)
        assert torch.count_nonzero(gate) == 0
        assert torch.equal(NF.gated_residual(x, seeded(*x.shape, seed=8), gate), x)


# ----------------------------------------------------------------------------------------------
# Found in review of the public API
# ----------------------------------------------------------------------------------------------
# ----------------------------------------------------------------------------------------------
# 3. AdaRMSNorm and AdaLayerNormZero take their positional arguments in the same order
# ----------------------------------------------------------------------------------------------
def test_conditional_norms_share_their_positional_order() -> None:
    def params(cls: type) -> list[str]:
        return list(inspect.signature(cls).parameters)

    assert params(normlab.AdaRMSNorm) == params(normlab.AdaLayerNormZero)
    assert params(normlab.AdaLayerNormZero) == ["dim", "cond_dim", "eps", "gate", "device", "dtype"]
    for cls in (normlab.AdaRMSNorm, normlab.AdaLayerNormZero):
        m = cls(D, C, 1e-5, False, "cpu", torch.float64)
        assert m.eps == 1e-5 and m.gate is False
        assert m.modulation.weight.dtype == torch.float64
        assert m.modulation.out_features == 2 * D


# ----------------------------------------------------------------------------------------------
# 5. errors that name the argument
# ----------------------------------------------------------------------------------------------
def test_reorder_chunks_names_the_bad_argument() -> None:
    t = torch.arange(6.0)
    with pytest.raises(TypeError, match=r"^t: expected a torch.Tensor, got list"):
        normlab.reorder_chunks([1, 2, 3], ("a", "b", "c"), ("c", "b", "a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^src: expected a list or tuple of chunk names"):
        normlab.reorder_chunks(t, "abc", "cba")
    with pytest.raises(TypeError, match=r"^dst: expected a list or tuple of chunk names"):
        normlab.reorder_chunks(t, ("a", "b"), "ba")
    with pytest.raises(ValueError, match=r"^dim: 3 is not an axis of t \(shape \(6,\)\); expected"):
        normlab.reorder_chunks(t, ("a", "b"), ("b", "a"), dim=3)
    with pytest.raises(TypeError, match=r"^dim: expected an int"):
        normlab.reorder_chunks(t, ("a", "b"), ("b", "a"), dim=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^t: got a 0-d tensor"):
        normlab.reorder_chunks(torch.tensor(1.0), ("a",), ("a",))
    moved = normlab.reorder_chunks(t, ["a", "b"], ["b", "a"], dim=-1)  # lists, a negative dim
    assert moved.tolist() == [3.0, 4.0, 5.0, 0.0, 1.0, 2.0]


# ----------------------------------------------------------------------------------------------
# 7. eps=None: the RMS family (AdaRMS included) takes it; the LayerNorm family says why not
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_eps_none_in_the_adarms_family_is_the_machine_epsilon(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x, o = (torch.randn(2, 3, D, generator=gen).to(dtype) for _ in range(2))
    s, t, g = (0.1 * torch.randn(2, D, generator=gen).to(dtype) for _ in range(3))
    eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    torch.testing.assert_close(NF.ada_rms_norm(x, s, t, None), NF.ada_rms_norm(x, s, t, eps))
    got = NF.gated_add_ada_rms_norm(x, o, g, s, t, None)
    want = NF.gated_add_ada_rms_norm(x, o, g, s, t, eps)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    module = normlab.AdaRMSNorm(D, C, eps=None).to(dtype)
    assert module.eps is None and "eps=None" in repr(module)
    y, _ = module(x, torch.randn(2, C, generator=gen).to(dtype))
    torch.testing.assert_close(y, NF.ada_rms_norm(x, torch.zeros(2, D), None, eps).to(dtype))


def test_eps_none_is_refused_by_the_layer_norm_family_with_the_reason() -> None:
    x, s = torch.randn(2, D), torch.zeros(2, D)
    calls = [
        lambda: NF.ada_layer_norm(x, s, None, None),
        lambda: NF.layer_norm(x, eps=None),
        lambda: NF.add_layer_norm(x, x, eps=None),
        lambda: normlab.AdaLayerNormZero(D, C, eps=None),
        lambda: normlab.LayerNorm(D, eps=None),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"^eps: got NoneType None; expected a float > 0") as e:
            call()
        assert "RMSNorm family only" in str(e.value)


# ----------------------------------------------------------------------------------------------
# 8. DyT keeps x's dtype, as the norms do
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_dyt_returns_x_dtype(dtype: torch.dtype, param_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    dyt = DynamicTanh(8, alpha_init=0.7).to(param_dtype)
    with torch.no_grad():
        dyt.weight.copy_(torch.randn(8, generator=gen))
        dyt.bias.copy_(torch.randn(8, generator=gen))
    x = torch.randn(3, 8, generator=gen).to(dtype).requires_grad_()
    y = dyt(x)
    assert y.dtype == dtype
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    p = {k: v.detach().to(sd) for k, v in dyt.named_parameters()}
    want = torch.tanh(p["alpha"] * x.detach().to(sd)) * p["weight"] + p["bias"]
    torch.testing.assert_close(y, want.to(dtype))
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert all(q.grad is not None and q.grad.dtype == param_dtype for q in dyt.parameters())
