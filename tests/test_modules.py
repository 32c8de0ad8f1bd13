"""The nn modules: drop-in compatibility with torch.nn, the conditional norms' conventions, and
what every module must survive (autocast, torch.compile, deepcopy, pickle, .to(dtype)); plus
the explicit modulation reorderings between π0.5 and DiT."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import normlab
from module_helpers import randomise, seeded
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
