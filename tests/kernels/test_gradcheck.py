"""torch.autograd.gradcheck and gradgradcheck in float64 for every function (on every CPU
backend) and module, and the zero-init facts of gated conditional norms."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck
from torch.func import functional_call

import normlab
import normlab.functional as NF

B, T, D, C = 2, 3, 5, 4


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 17 * len(shape) + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


FUNCTIONS: dict[str, tuple[Callable[..., object], Callable[[], tuple[torch.Tensor, ...]]]] = {
    # name: (call(backend, *inputs), inputs())
    "layer_norm": (
        lambda b, x, w, bias: NF.layer_norm(x, w, bias, backend=b),
        lambda: (rand(B, T, D), rand(D), rand(D, seed=1)),
    ),
    "rms_norm_llama": (
        lambda b, x, w: NF.rms_norm(x, w, backend=b),
        lambda: (rand(B, T, D), rand(D)),
    ),
    "rms_norm_gemma": (
        lambda b, x, w: NF.rms_norm(x, w, 1e-6, 1.0, "gemma", backend=b),
        lambda: (rand(B, T, D), rand(D)),
    ),
    "rms_norm_fp32": (
        lambda b, x, w: NF.rms_norm(x, w, casting="fp32", backend=b),
        lambda: (rand(B, T, D), rand(D)),
    ),
    "add_rms_norm": (
        lambda b, x, r, w: NF.add_rms_norm(x, r, w, residual_in_fp32=True, backend=b),
        lambda: (rand(B, T, D), rand(B, T, D, seed=1), rand(D)),
    ),
    "add_layer_norm": (
        lambda b, x, r, w, bias: NF.add_layer_norm(x, r, w, bias, backend=b),
        lambda: (rand(B, T, D), rand(B, T, D, seed=1), rand(D), rand(D, seed=2)),
    ),
    "ada_rms_norm_per_sequence": (
        lambda b, x, s, t: NF.ada_rms_norm(x, s, t, backend=b),
        lambda: (rand(B, T, D), rand(B, D), rand(B, D, seed=1)),
    ),
    "ada_rms_norm_per_token": (
        lambda b, x, s, t: NF.ada_rms_norm(x, s, t, backend=b),
        lambda: (rand(B, T, D), rand(B, T, D, seed=1), rand(B, T, D, seed=2)),
    ),
    "ada_layer_norm": (
        lambda b, x, s, t: NF.ada_layer_norm(x, s, t, backend=b),
        lambda: (rand(B, T, D), rand(B, 1, D), rand(B, 1, D, seed=1)),
    ),
    "gated_residual": (
        lambda b, h, o, g: NF.gated_residual(h, o, g, backend=b),
        lambda: (rand(B, T, D), rand(B, T, D, seed=1), rand(B, D)),
    ),
    "gated_add_ada_rms_norm": (
        lambda b, h, o, g, s, t: NF.gated_add_ada_rms_norm(h, o, g, s, t, backend=b),
        lambda: (
            rand(B, T, D),
            rand(B, T, D, seed=1),
            rand(B, D),
            rand(B, D, seed=1),
            rand(B, D, seed=2),
        ),
    ),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function_gradcheck(name: str, backend: str) -> None:
    call, make = FUNCTIONS[name]
    assert gradcheck(lambda *t: call(backend, *t), make())


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function_gradgradcheck(name: str, backend: str) -> None:
    """Second derivatives (gradient penalties, Hessian-vector products): with
    ``create_graph=True`` the fast backends build the gradient as a graph, μ and rstd
    included, instead of returning their fused backward's plain tensors."""
    call, make = FUNCTIONS[name]
    assert gradgradcheck(lambda *t: call(backend, *t), make())


def test_gradient_penalty_matches_the_reference_on_every_backend(backend: str) -> None:
    """A loss with a gradient penalty, through a module's default backend and each named one."""
    x0 = rand(B, T, D)
    w0 = rand(D, seed=1)

    def penalised_grads(b: str) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = x0.detach().clone().requires_grad_(), w0.detach().clone().requires_grad_()
        y = NF.rms_norm(x, w, backend=b)
        (gx,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
        assert gx.requires_grad
        return torch.autograd.grad(y.sum() + gx.square().sum(), (x, w))

    for got, want in zip(penalised_grads(backend), penalised_grads("torch"), strict=True):
        torch.testing.assert_close(got, want)


def randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random float64 parameters, so that no gradient is trivially zero."""
    g = torch.Generator().manual_seed(seed)
    module = module.double()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return module


def module_gradcheck(module: nn.Module, *args: torch.Tensor) -> None:
    """gradcheck with respect to the inputs and every parameter of ``module``."""
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def f(*tensors: torch.Tensor):
        inputs, ps = tensors[: len(args)], tensors[len(args) :]
        out = functional_call(module, dict(zip(names, ps, strict=True)), inputs)
        return tuple(o for o in out if o is not None) if isinstance(out, tuple) else out

    assert gradcheck(f, (*args, *params))


@pytest.mark.parametrize(
    "make",
    [
        lambda: normlab.LayerNorm(D),
        lambda: normlab.LayerNorm(D, bias=False),
        lambda: normlab.RMSNorm(D),
        lambda: normlab.RMSNorm(D, weight_offset=1.0, casting="gemma"),
    ],
    ids=["layernorm", "layernorm_nobias", "rmsnorm", "rmsnorm_gemma"],
)
def test_plain_module_gradcheck(make: Callable[[], nn.Module]) -> None:
    module_gradcheck(randomise(make()), rand(B, T, D))


@pytest.mark.parametrize("cond_shape", [(B, C), (B, T, C)], ids=["per_sequence", "per_token"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: normlab.AdaRMSNorm(D, C),
        lambda: normlab.AdaRMSNorm(D, C, gate=False),
        lambda: normlab.AdaLayerNormZero(D, C),
    ],
    ids=["adarms", "adarms_nogate", "adaln_zero"],
)
def test_conditional_module_gradcheck(
    make: Callable[[], nn.Module], cond_shape: tuple[int, ...]
) -> None:
    """Gradients with respect to x, cond and the modulation Linear's weight and bias."""
    module_gradcheck(randomise(make()), rand(B, T, D), rand(*cond_shape, seed=3))


@pytest.mark.parametrize("kind", ["adarms", "adaln_zero"])
def test_closed_gate_at_zero_init(kind: str) -> None:
    """At step 0 the gate is 0: h' = h + g ⊙ F(y) = h. The gate's own gradient is F(y) ⊙ ∂L/∂h'
    (nonzero), while F and the scale / shift rows get no gradient through the closed gate.
    One SGD step opens the gate, and from then on F learns."""
    torch.manual_seed(0)
    norm = normlab.make_norm(kind, D, cond_dim=C)
    sublayer = nn.Linear(D, D)
    h, cond = torch.randn(B, T, D), torch.randn(B, C)
    target = torch.randn(B, T, D)

    def step() -> torch.Tensor:
        y, gate = norm(h, cond)
        h_new = NF.gated_residual(h, sublayer(y), gate)
        loss = (h_new - target).square().sum()
        norm.zero_grad()
        sublayer.zero_grad()
        loss.backward()
        return h_new

    h_new = step()
    assert torch.equal(h_new, h)
    w_grad = norm.modulation.weight.grad
    gate_rows = slice(2 * D, 3 * D)  # gate is the third chunk in both orders
    assert w_grad[gate_rows].abs().sum() > 0
    assert norm.modulation.bias.grad[gate_rows].abs().sum() > 0
    assert torch.count_nonzero(w_grad[: 2 * D]) == 0
    assert torch.count_nonzero(sublayer.weight.grad) == 0
    assert torch.count_nonzero(sublayer.bias.grad) == 0

    with torch.no_grad():
        for p in (*norm.parameters(), *sublayer.parameters()):
            p -= 0.1 * p.grad
    step()
    assert sublayer.weight.grad.abs().sum() > 0
