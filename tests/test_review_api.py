"""Review fixes of the public API: backend registration and availability, argument order of
the conditional norms, errors that name the argument, flags that must be bools, ``eps=None``
in the RMS family, DyT's output dtype, the audit's gain detection, factories and testbeds."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import normlab
import normlab.functional as NF
from normlab import audit, kernels
from normlab.cli import app
from normlab.cli.audit_targets import load_model, load_norm
from normlab.kernels import (
    BACKEND_FUNCTIONS,
    BackendUnavailableError,
    backend_available,
    backend_unavailable_reason,
    backends_for,
    reference,
)
from normlab.layers import DynamicTanh

D, C = 16, 8


def _reference_like(**extra: object) -> SimpleNamespace:
    """A valid backend object: the reference functions, plus ``extra`` attributes."""
    return SimpleNamespace(**{f: getattr(reference, f) for f in BACKEND_FUNCTIONS}, **extra)


@pytest.fixture
def registry_restored() -> Iterator[None]:
    """Put the backend registry back as it was after the test."""
    backends, devices = dict(kernels._BACKENDS), dict(kernels._DEVICES)
    yield
    kernels._BACKENDS.clear()
    kernels._BACKENDS.update(backends)
    kernels._DEVICES.clear()
    kernels._DEVICES.update(devices)


# ----------------------------------------------------------------------------------------------
# 1. a backend asked for by name that cannot run raises; "auto" skips it
# ----------------------------------------------------------------------------------------------
def test_an_unavailable_backend_asked_for_by_name_raises_with_the_reason(
    registry_restored: None,
) -> None:
    fake = _reference_like(available=lambda: False, unavailable_reason=lambda: "no fake chip")
    normlab.register_backend("fake_unavailable", fake, devices=("meta",))
    x = torch.randn(2, D)
    assert not backend_available("fake_unavailable")
    assert backend_unavailable_reason("fake_unavailable") == "no fake chip"
    assert backend_unavailable_reason("auto") is None and backend_available("torch")
    assert "fake_unavailable" in backends_for("meta")
    assert "fake_unavailable" not in backends_for("meta", available_only=True)
    with pytest.raises(BackendUnavailableError) as info:
        NF.rms_norm(x, backend="fake_unavailable")
    msg = str(info.value)
    assert msg.startswith("backend: 'fake_unavailable'") and "no fake chip" in msg
    assert isinstance(info.value, normlab.BackendUnavailableError)
    assert "backend='auto'" in msg and "backend='torch'" in msg
    kernels.set_default_backend("fake_unavailable")
    try:
        with pytest.raises(BackendUnavailableError, match="NORMLAB_BACKEND or set_default_backend"):
            NF.layer_norm(x)
    finally:
        kernels.set_default_backend("auto")


def test_an_available_backend_with_an_availability_check_runs(registry_restored: None) -> None:
    normlab.register_backend("fake_ok", _reference_like(available=lambda: True), devices=("cpu",))
    x = torch.randn(2, D)
    torch.testing.assert_close(NF.rms_norm(x, backend="fake_ok"), NF.rms_norm(x, backend="torch"))


def test_cpp_availability_is_consistent() -> None:
    from normlab.kernels import cpu

    reason = backend_unavailable_reason("cpp")
    assert (reason is None) == cpu.available() == backend_available("cpp")
    assert (reason is None) == ("cpp" in backends_for("cpu", available_only=True))


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
# 4. register_backend validates the object and refuses to replace a name by accident
# ----------------------------------------------------------------------------------------------
def test_register_backend_refuses_an_object_without_the_backend_functions(
    registry_restored: None,
) -> None:
    x = torch.randn(2, D)
    before = NF.rms_norm(x, backend="torch")
    with pytest.raises(TypeError, match=r"^impl: .*lacks .*rms_norm.*expected"):
        normlab.register_backend("torch", object())
    partial = SimpleNamespace(rms_norm=reference.rms_norm)
    with pytest.raises(TypeError, match=r"impl: .*layer_norm") as info:
        normlab.register_backend("partial", partial)
    assert "function(s) layer_norm, add_rms_norm, add_layer_norm," in str(info.value)
    with pytest.raises(TypeError, match=r"^impl: its 'available' attribute"):
        normlab.register_backend("bad_available", _reference_like(available=True))
    torch.testing.assert_close(NF.rms_norm(x, backend="torch"), before)  # still the reference


def test_register_backend_replaces_a_name_only_with_overwrite(registry_restored: None) -> None:
    impl = _reference_like()
    with pytest.raises(
        ValueError, match=r"^name: backend 'torch' is already registered.*overwrite"
    ):
        normlab.register_backend("torch", impl)
    assert kernels._BACKENDS["torch"] is reference
    normlab.register_backend("mine", impl, devices=("cpu",))
    normlab.register_backend("mine", impl, devices=("cpu", "cuda"))  # the same object: fine
    assert "mine" in backends_for("cuda")
    with pytest.raises(ValueError, match=r"^name: backend 'mine'"):
        normlab.register_backend("mine", _reference_like())
    other = _reference_like()
    normlab.register_backend("mine", other, overwrite=True)
    assert kernels._BACKENDS["mine"] is other


@pytest.mark.parametrize(
    ("kwargs", "exc", "start"),
    [
        ({"devices": "cpu"}, TypeError, "devices:"),
        ({"devices": ()}, TypeError, "devices:"),
        ({"devices": ("cpu", "")}, ValueError, "devices:"),
        ({"overwrite": "yes"}, TypeError, "overwrite:"),
    ],
)
def test_register_backend_checks_its_other_arguments(
    registry_restored: None, kwargs: dict, exc: type[Exception], start: str
) -> None:
    with pytest.raises(exc, match=f"^{start}.*expected"):
        normlab.register_backend("checked", _reference_like(), **kwargs)
    assert "checked" not in kernels._BACKENDS


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


def test_audit_norm_says_what_the_norm_may_be() -> None:
    with pytest.raises(TypeError, match=r"^f: expected the norm to probe: a torch.nn.Module"):
        audit.audit_norm(3, 64)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^weight: expected the norm's gain"):
        audit.audit_norm(nn.RMSNorm(64), 64, weight=(1.0,) * 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^dim: expected an even integer"):
        audit.audit_norm(nn.RMSNorm(64), "64")  # type: ignore[arg-type]


def test_audit_norm_with_the_wrong_dim_names_it() -> None:
    with pytest.raises(ValueError, match=r"^dim: 32 does not match the module's normalized_shape"):
        audit.audit_norm(nn.RMSNorm(64), 32)

    def fixed_size(x: torch.Tensor) -> torch.Tensor:  # no normalized_shape to read
        return nn.functional.rms_norm(x, (64,))

    with pytest.raises(ValueError, match=r"^f: 'norm' failed on the first probe.*dim=32"):
        audit.audit_norm(fixed_size, 32)


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


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, src: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(src), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_a_factory_taking_dim_is_a_norm_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _write_module(
        tmp_path,
        monkeypatch,
        "review_api_factories",
        """
        import torch

        def make(dim):
            return torch.nn.RMSNorm(dim, eps=1e-6)

        def make_fn(dim):
            return lambda x: torch.nn.functional.layer_norm(x, (dim,))

        def broken(x, y, z):
            return x
        """,
    )
    fn, weight = load_norm(f"{mod}:make", 64)
    assert isinstance(fn, nn.RMSNorm) and weight is fn.weight
    fn2, weight2 = load_norm(f"{mod}:make_fn", 64)
    assert weight2 is None and fn2(torch.randn(2, 64)).shape == (2, 64)
    with pytest.raises(
        ValueError, match=r"^target: .*broken is a callable, but.*factory fn\(dim\)"
    ):
        load_norm(f"{mod}:broken", 64)
    result = CliRunner().invoke(app, ["audit", "norm", f"{mod}:make", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["normalizes"] and data["gain_form"] == "w"


# ----------------------------------------------------------------------------------------------
# 6. flags are bools
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["no", 1, 0, None])
def test_residual_in_fp32_must_be_a_bool(value: object) -> None:
    x = torch.randn(2, D).bfloat16()
    for fn in (NF.add_rms_norm, NF.add_layer_norm):
        with pytest.raises(TypeError, match=r"^residual_in_fp32: expected a bool"):
            fn(x, x, residual_in_fp32=value)  # type: ignore[operator]
    for fn in (NF.add_rms_norm, NF.add_layer_norm):
        assert fn(x, x, residual_in_fp32=True)[1].dtype == torch.float32
        assert fn(x, x, residual_in_fp32=False)[1].dtype == torch.bfloat16


def test_other_flags_must_be_bools() -> None:
    with pytest.raises(TypeError, match=r"^gate: expected a bool"):
        normlab.dit_to_pi05(nn.Linear(4, 3 * D), gate="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^overwrite: expected a bool"):
        normlab.register_norm("layernorm", normlab.LayerNorm, overwrite="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^conditional: expected a bool"):
        normlab.register_norm("review_flag", normlab.LayerNorm, conditional=1)  # type: ignore[arg-type]
    assert "review_flag" not in normlab.available_norms()


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


def test_dyt_from_the_registry_keeps_bf16_like_layernorm() -> None:
    import normlab.models  # registers "dyt"

    x = torch.randn(2, 8).bfloat16()
    for kind in ("dyt", "layernorm", "rmsnorm"):
        assert normlab.make_norm(kind, 8)(x).dtype == torch.bfloat16, kind


# ----------------------------------------------------------------------------------------------
# 9. audit_norm finds a module's own gain, as the CLI does
# ----------------------------------------------------------------------------------------------
def test_audit_norm_finds_the_modules_weight() -> None:
    m = nn.RMSNorm(64)
    found = audit.audit_norm(m, 64)
    given = audit.audit_norm(m, 64, weight=m.weight)
    assert found.gain_form == given.gain_form == "w"
    assert found.casting == given.casting
    gemma = normlab.RMSNorm(64, weight_offset=1.0, casting="gemma")
    assert audit.audit_norm(gemma, 64).gain_form == "1 + w"
    ln = audit.audit_norm(nn.LayerNorm(64), 64)
    assert ln.statistic == "variance (biased, D)" and ln.gain_form == "w"
    assert audit.audit_norm(nn.RMSNorm(64, elementwise_affine=False), 64).gain_form == (
        "no gain parameter exposed"
    )


def test_audit_norm_and_cli_agree_on_the_gain() -> None:
    result = CliRunner().invoke(app, ["audit", "norm", "torch.nn:RMSNorm", "--json"])
    assert result.exit_code == 0, result.output
    cli = json.loads(result.output)
    api = audit.audit_norm(nn.RMSNorm(64), 64, target="torch.nn:RMSNorm").to_dict()
    assert cli["gain_form"] == api["gain_form"] == "w"
    assert cli["statistic"] == api["statistic"]


# ----------------------------------------------------------------------------------------------
# 10. the audit's testbeds are compare's default testbeds
# ----------------------------------------------------------------------------------------------
def test_audit_testbeds_are_the_compare_defaults() -> None:
    from normlab.data.shapes import SHAPE_CLASSES
    from normlab.experiment.config import DiTSettings, ModelSettings, ShapesSettings

    gpt, (tokens,) = load_model("gpt", "layernorm", "pre")
    settings = ModelSettings()
    assert len(gpt.blocks) == settings.n_layers
    assert gpt.config.d_model == settings.d_model and gpt.config.context == settings.context
    assert tokens.shape == (2, settings.context)
    assert sum(p.numel() for p in gpt.parameters()) == 214_144  # compare's, with layernorm
    dit, inputs = load_model("dit", "adaln_zero", "pre")
    shapes = ShapesSettings()
    want = DiTSettings().dit_config(
        shapes.in_channels, shapes.seq_len, len(SHAPE_CLASSES), "adarms"
    )
    assert len(dit.blocks) == want.n_layers and dit.config.d_model == want.d_model
    assert inputs[0].shape == (2, want.seq_len, want.in_channels)
    result = audit.audit_model(dit, *inputs)
    assert result.norms and all(s.returns_gate or s.role == "final" for s in result.norms)
