"""Bad input: a ValueError / TypeError that names the argument, what it got and what it expects;
and a NaN in one token stays in that token."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import normlab
import normlab.functional as NF
from normlab.layers import DynamicTanh

D = 8


def expect_error(exc: type[Exception], fn: Callable[[], object], *parts: str) -> str:
    """``fn()`` raises ``exc`` whose message contains every one of ``parts`` and "expected"."""
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for part in (*parts, "expected"):
        assert part in msg, f"{part!r} missing from the message: {msg!r}"
    return msg


def x_(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


# Every function, called on an input x (first argument) with everything else valid.
CALLS: dict[str, Callable[[torch.Tensor], object]] = {
    "layer_norm": lambda x: NF.layer_norm(x, torch.ones(x.shape[-1]), torch.zeros(x.shape[-1])),
    "rms_norm": lambda x: NF.rms_norm(x, torch.ones(x.shape[-1])),
    "add_rms_norm": lambda x: NF.add_rms_norm(x, torch.zeros(x.shape), torch.ones(x.shape[-1])),
    "add_layer_norm": lambda x: NF.add_layer_norm(x, torch.zeros(x.shape)),
    "ada_rms_norm": lambda x: NF.ada_rms_norm(x, torch.zeros(x.shape), torch.zeros(x.shape)),
    "ada_layer_norm": lambda x: NF.ada_layer_norm(x, torch.zeros(x.shape), torch.zeros(x.shape)),
    "gated_residual": lambda x: NF.gated_residual(x, torch.ones(x.shape), torch.ones(x.shape)),
    "gated_add_ada_rms_norm": lambda x: NF.gated_add_ada_rms_norm(
        x, torch.ones(x.shape), torch.ones(x.shape), torch.zeros(x.shape)
    ),
}
X_NAME = {"gated_residual": "h", "gated_add_ada_rms_norm": "h"}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
@pytest.mark.parametrize("name", list(CALLS))
def test_integer_or_bool_x(name: str, dtype: torch.dtype) -> None:
    x = torch.ones(2, D, dtype=dtype)
    expect_error(TypeError, lambda: CALLS[name](x), X_NAME.get(name, "x"), str(dtype))


@pytest.mark.parametrize("name", list(CALLS))
def test_empty_last_dimension(name: str) -> None:
    expect_error(ValueError, lambda: CALLS[name](torch.ones(2, 0)), X_NAME.get(name, "x"), "0")


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("x", lambda v, t: NF.layer_norm(v)),
        ("x", lambda v, t: NF.rms_norm(v)),
        ("x", lambda v, t: NF.add_rms_norm(v, t)),
        ("residual", lambda v, t: NF.add_layer_norm(t, v)),
        ("scale", lambda v, t: NF.ada_rms_norm(t, v)),
        ("shift", lambda v, t: NF.ada_layer_norm(t, t, v)),
        ("gate", lambda v, t: NF.gated_residual(t, t, v)),
        ("out", lambda v, t: NF.gated_add_ada_rms_norm(t, v, t, t)),
        ("weight", lambda v, t: NF.rms_norm(t, v)),
    ],
)
def test_not_a_tensor(name: str, call: Callable[..., object]) -> None:
    expect_error(TypeError, lambda: call([1.0, 2.0], torch.ones(2)), name, "list")


@pytest.mark.parametrize(
    "call",
    [
        lambda x, w: NF.layer_norm(x, w),
        lambda x, w: NF.layer_norm(x, None, w),
        lambda x, w: NF.rms_norm(x, w),
        lambda x, w: NF.add_rms_norm(x, None, w),
        lambda x, w: NF.add_layer_norm(x, None, w),
    ],
    ids=["layer_norm_weight", "layer_norm_bias", "rms_norm", "add_rms_norm", "add_layer_norm"],
)
def test_last_dimension_differs_from_weight(call: Callable[..., object]) -> None:
    msg = expect_error(ValueError, lambda: call(x_(2, 3, D), torch.ones(D + 1)), f"({D + 1},)")
    assert "weight" in msg or "bias" in msg
    assert f"({D},)" in msg


@pytest.mark.parametrize("shape", [(D, 1), (1, D), (2, D)])
def test_weight_not_one_dimensional(shape: tuple[int, ...]) -> None:
    expect_error(ValueError, lambda: NF.rms_norm(x_(2, D), torch.ones(shape)), "weight")


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "ada_rms_norm", "add_rms_norm"])
def test_eps_must_be_finite_and_positive(name: str, eps: float) -> None:
    calls = {
        "layer_norm": lambda: NF.layer_norm(x_(2, D), eps=eps),
        "rms_norm": lambda: NF.rms_norm(x_(2, D), eps=eps),
        "ada_rms_norm": lambda: NF.ada_rms_norm(x_(2, D), x_(2, D), eps=eps),
        "add_rms_norm": lambda: NF.add_rms_norm(x_(2, D), None, eps=eps),
    }
    expect_error(ValueError, calls[name], "eps", repr(eps))


@pytest.mark.parametrize("eps", ["1e-5", torch.tensor(1e-5), None, True])
def test_eps_must_be_a_number(eps: object) -> None:
    """The RMS family (rms_norm, AdaRMS) takes eps=None as torch's RMSNorm does (see
    test_dropin_review and test_review_api); the LayerNorm family does not."""
    if eps is not None:
        expect_error(TypeError, lambda: NF.rms_norm(x_(2, D), eps=eps), "eps", type(eps).__name__)
        expect_error(
            TypeError, lambda: normlab.AdaRMSNorm(D, 4, eps=eps), "eps", type(eps).__name__
        )
    expect_error(TypeError, lambda: NF.layer_norm(x_(2, D), eps=eps), "eps", type(eps).__name__)


@pytest.mark.parametrize("eps", [np.float32(1e-5), np.float64(1e-5), np.int64(1), 1])
def test_eps_accepts_numpy_and_python_reals(eps: object) -> None:
    x = x_(2, D)
    torch.testing.assert_close(NF.rms_norm(x, eps=eps), NF.rms_norm(x, eps=float(eps)))
    assert normlab.RMSNorm(D, eps=eps).eps == float(eps)


@pytest.mark.parametrize("casting", ["bf16", "LLAMA", "", None])
def test_unknown_casting_mode(casting: object) -> None:
    for call in (
        lambda: NF.rms_norm(x_(2, D), casting=casting),
        lambda: NF.add_rms_norm(x_(2, D), None, casting=casting),
        lambda: normlab.RMSNorm(D, casting=casting),
    ):
        expect_error(ValueError, call, "casting", repr(casting), "llama", "gemma", "fp32")


@pytest.mark.parametrize("offset", [float("nan"), float("inf")])
def test_weight_offset_must_be_finite(offset: float) -> None:
    expect_error(ValueError, lambda: NF.rms_norm(x_(2, D), weight_offset=offset), "weight_offset")


@pytest.mark.parametrize("out_dtype", [torch.int32, "float32", torch.bool])
def test_out_dtype_must_be_floating(out_dtype: object) -> None:
    expect_error(TypeError, lambda: NF.layer_norm(x_(2, D), out_dtype=out_dtype), "out_dtype")


@pytest.mark.parametrize(
    "shape",
    [(2, D + 1), (3, D), (2, 3, D + 1), (2, 4, D), (5, 2, 3, D), (D + 1,)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("arg", ["scale", "shift", "gate"])
def test_modulation_shapes_that_do_not_broadcast(arg: str, shape: tuple[int, ...]) -> None:
    x = x_(2, 3, D)
    good = torch.zeros(2, D)
    bad = torch.zeros(shape)
    kw = {"scale": good, "shift": good, "gate": good, arg: bad}
    calls = [
        lambda: NF.gated_add_ada_rms_norm(x, x, kw["gate"], kw["scale"], kw["shift"]),
    ]
    if arg != "gate":
        calls.append(lambda: NF.ada_rms_norm(x, kw["scale"], kw["shift"]))
        calls.append(lambda: NF.ada_layer_norm(x, kw["scale"], kw["shift"]))
    else:
        calls.append(lambda: NF.gated_residual(x, x, kw["gate"]))
    for call in calls:
        expect_error(ValueError, call, arg, str(tuple(shape)), str(tuple(x.shape)))


def test_residual_and_branch_shapes() -> None:
    x = x_(2, 3, D)
    expect_error(ValueError, lambda: NF.add_rms_norm(x, x_(2, 1, D)), "residual", "(2, 1, 8)")
    expect_error(ValueError, lambda: NF.add_layer_norm(x, x_(3, D)), "residual", "(3, 8)")
    expect_error(ValueError, lambda: NF.gated_residual(x, x_(2, D), x_(2, D)), "out", "(2, 8)")
    expect_error(
        TypeError, lambda: NF.add_rms_norm(x, torch.ones(2, 3, D, dtype=torch.int64)), "residual"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda x, p: NF.layer_norm(x, p),
        lambda x, p: NF.layer_norm(x, None, p),
        lambda x, p: NF.rms_norm(x, p),
        lambda x, p: NF.add_rms_norm(x, None, p),
    ],
    ids=["layer_norm_weight", "layer_norm_bias", "rms_norm", "add_rms_norm"],
)
def test_parameter_on_another_device(call: Callable[..., object]) -> None:
    msg = expect_error(ValueError, lambda: call(x_(2, D), torch.ones(D, device="meta")), "meta")
    assert "cpu" in msg and ("weight" in msg or "bias" in msg)


def test_modulation_and_residual_on_another_device() -> None:
    x, meta = x_(2, D), torch.zeros(2, D, device="meta")
    expect_error(ValueError, lambda: NF.ada_rms_norm(x, meta), "scale", "meta", "cpu")
    expect_error(ValueError, lambda: NF.ada_rms_norm(x, x, meta), "shift", "meta", "cpu")
    expect_error(ValueError, lambda: NF.gated_residual(x, x, meta), "gate", "meta", "cpu")
    expect_error(ValueError, lambda: NF.add_rms_norm(x, meta), "residual", "meta", "cpu")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_parameter_of_another_dtype_family(dtype: torch.dtype) -> None:
    w = torch.ones(D, dtype=dtype)
    expect_error(TypeError, lambda: NF.rms_norm(x_(2, D), w), "weight", str(dtype))
    expect_error(TypeError, lambda: NF.layer_norm(x_(2, D), None, w), "bias", str(dtype))
    expect_error(TypeError, lambda: NF.ada_rms_norm(x_(2, D), w), "scale", str(dtype))


def test_unknown_backend() -> None:
    expect_error(ValueError, lambda: NF.rms_norm(x_(2, D), backend="nope"), "backend", "'nope'")


# --- modules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: normlab.LayerNorm(D),
        lambda: normlab.LayerNorm(D, elementwise_affine=False),
        lambda: normlab.RMSNorm(D),
        lambda: normlab.RMSNorm(D, elementwise_affine=False),
    ],
    ids=["layernorm", "layernorm_no_affine", "rmsnorm", "rmsnorm_no_affine"],
)
def test_module_rejects_another_last_dimension(make: Callable[[], torch.nn.Module]) -> None:
    """Like torch.nn.LayerNorm, also when the module has no weight to compare with."""
    expect_error(ValueError, lambda: make()(x_(2, D + 1)), f"{D + 1}", f"{D}")


@pytest.mark.parametrize("cls", [normlab.AdaRMSNorm, normlab.AdaLayerNormZero])
def test_conditional_module_shapes(cls: type[torch.nn.Module]) -> None:
    norm, x = cls(D, 4), x_(2, 3, D)
    expect_error(ValueError, lambda: norm(x, x_(2, 5)), "cond", "(2, 5)", "4")
    expect_error(ValueError, lambda: norm(x, x_(3, 4)), "cond", "(3, 4)", "(2, 3, 8)")
    expect_error(ValueError, lambda: norm(x, x_(2, 4, 4)), "cond", "(2, 4, 4)")
    expect_error(ValueError, lambda: norm(x_(2, 3, D + 1), x_(2, 4)), "x", f"{D + 1}")
    expect_error(TypeError, lambda: norm(x, torch.ones(2, 4, dtype=torch.int64)), "cond")
    cond16 = x_(2, 4).bfloat16()
    expect_error(TypeError, lambda: norm(x, cond16), "cond", "torch.bfloat16", "torch.float32")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast picks the Linear's dtypes
        y, _ = norm(x, cond16)
    assert y.shape == x.shape
    expect_error(ValueError, lambda: norm(x, torch.ones(2, 4, device="meta")), "cond", "meta")


@pytest.mark.parametrize(
    "make",
    [
        lambda v: normlab.LayerNorm(v),
        lambda v: normlab.RMSNorm(v),
        lambda v: normlab.AdaRMSNorm(v, 4),
        lambda v: normlab.AdaLayerNormZero(v, 4),
        lambda v: normlab.AdaRMSNorm(8, v),
    ],
    ids=["layernorm", "rmsnorm", "adarms", "adaln_zero", "adarms_cond_dim"],
)
@pytest.mark.parametrize("value", [0, -3])
def test_module_sizes_must_be_positive(make: Callable[[int], object], value: int) -> None:
    expect_error(ValueError, lambda: make(value), str(value))


def test_module_size_must_be_an_int() -> None:
    expect_error(TypeError, lambda: normlab.RMSNorm(8.0), "float")
    expect_error(TypeError, lambda: normlab.LayerNorm(True), "bool")
    expect_error(ValueError, lambda: normlab.LayerNorm(()), "normalized_shape", "()")
    expect_error(TypeError, lambda: normlab.RMSNorm((4, 8.0)), "normalized_shape", "8.0")
    expect_error(ValueError, lambda: DynamicTanh((4, 8)), "normalized_shape", "(4, 8)")
    expect_error(ValueError, lambda: normlab.RMSNorm(8, eps=0.0), "eps", "0.0")


# --- a NaN stays in its token -------------------------------------------------------------------

NAN_CALLS: dict[str, Callable[[torch.Tensor, str], torch.Tensor]] = {
    "layer_norm": lambda x, b: NF.layer_norm(x, torch.ones(D), torch.zeros(D), backend=b),
    "rms_norm": lambda x, b: NF.rms_norm(x, torch.ones(D), backend=b),
    "rms_norm_gemma": lambda x, b: NF.rms_norm(x, torch.zeros(D), 1e-6, 1.0, "gemma", backend=b),
    "add_rms_norm": lambda x, b: NF.add_rms_norm(x, torch.ones_like(x), backend=b)[0],
    "add_layer_norm": lambda x, b: NF.add_layer_norm(x, torch.ones_like(x), backend=b)[0],
    "ada_rms_norm": lambda x, b: NF.ada_rms_norm(x, torch.ones(2, D), torch.ones(2, D), backend=b),
    "ada_layer_norm": lambda x, b: NF.ada_layer_norm(x, torch.ones(2, 3, D), backend=b),
    "gated_residual": lambda x, b: NF.gated_residual(x, x, torch.ones(2, D), backend=b),
    "gated_add_ada_rms_norm": lambda x, b: NF.gated_add_ada_rms_norm(
        x, x, torch.ones(2, D), torch.ones(2, D), backend=b
    )[0],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(NAN_CALLS))
def test_nan_stays_in_its_token(name: str, dtype: torch.dtype, backend: str) -> None:
    x = torch.randn(2, 3, D).to(dtype)
    x[1, 2, 5] = float("nan")
    x.requires_grad_()
    y = NAN_CALLS[name](x, backend)
    others = torch.ones(2, 3, dtype=torch.bool)
    others[1, 2] = False
    assert torch.isfinite(y[others]).all()
    assert torch.isnan(y[1, 2]).any()
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.isfinite(g[others]).all()


# ----------------------------------------------------------------------------------------------
# Found in review of the public API
# ----------------------------------------------------------------------------------------------
D16 = 16


def test_torch_style_layer_norm_call_gets_a_hint() -> None:
    x, w, b = torch.randn(2, 64), torch.ones(64), torch.zeros(64)
    for shape in ((64,), [64], 64, torch.Size([64])):
        with pytest.raises(TypeError) as info:
            NF.layer_norm(x, shape, w, b)  # type: ignore[arg-type]
        msg = str(info.value)
        assert msg.startswith("weight: expected a torch.Tensor or None")
        assert "normalized_shape" in msg and "last dimension" in msg
        assert "normlab.functional.layer_norm(x, weight, bias, eps)" in msg
    with pytest.raises(TypeError) as info:
        NF.rms_norm(x, "w")  # type: ignore[arg-type]
    assert "normalized_shape" not in str(info.value)  # only for shape-like values


# ----------------------------------------------------------------------------------------------
# 6. flags are bools
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["no", 1, 0, None])
def test_residual_in_fp32_must_be_a_bool(value: object) -> None:
    x = torch.randn(2, D16).bfloat16()
    for fn in (NF.add_rms_norm, NF.add_layer_norm):
        with pytest.raises(TypeError, match=r"^residual_in_fp32: expected a bool"):
            fn(x, x, residual_in_fp32=value)  # type: ignore[operator]
    for fn in (NF.add_rms_norm, NF.add_layer_norm):
        assert fn(x, x, residual_in_fp32=True)[1].dtype == torch.float32
        assert fn(x, x, residual_in_fp32=False)[1].dtype == torch.bfloat16
