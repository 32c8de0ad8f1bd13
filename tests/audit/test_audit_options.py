"""``normlab audit``: errors name the argument at fault; large ε; the names compare accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import normlab
from normlab.audit import audit_norm
from normlab.audit.probe import _why_not_normalizing
from normlab.cli import app
from normlab.cli.audit_targets import load_norm
from normlab.layers import DynamicTanh

D = 64


def _flat(text: str) -> str:
    """CLI output with rich's box characters and line wrapping removed."""
    for ch in "│╭╮╰╯─":
        text = text.replace(ch, " ")
    return " ".join(text.split())


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["audit", *args])
    return result.exit_code, _flat(result.output)


# ----------------------------------------------------------------------------------------------
# errors name the option at fault
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "param"),
    [
        (["norm", "rmsnorm", "--dim", "0"], "--dim"),
        (["norm", "rmsnorm", "--dim", "7"], "--dim"),
        (["norm", "torch.nn:LayerNorm", "--dim", "-4"], "--dim"),
        (["model", "--norm", "foo"], "--norm"),
        (["model", "--norm", "adarms"], "--norm"),
        (["model", "--placement", "middle"], "--placement"),
        (["norm", "no_such_norm"], "TARGET"),
        (["model", "no_such_module:factory"], "TARGET"),
        (["model", "no_such_module:factory", "--norm", "foo"], "--norm"),  # testbeds only
        (["model", "dit", "--norm", "rmsnorm"], "--norm"),  # the DiT's norms are conditional
        (["model", "dit", "--norm", "foo"], "--norm"),
        (["model", "dit", "--placement", "sandwich"], "--placement"),  # pre only
        (["model", "no_such_module:factory", "--placement", "pre"], "--placement"),
    ],
)
def test_error_names_the_argument_at_fault(args: list[str], param: str) -> None:
    code, text = _invoke(*args)
    assert code == 2, text
    assert f"Invalid value for {param}:" in text
    assert "Traceback" not in text


def test_load_norm_checks_dim_first() -> None:
    with pytest.raises(ValueError, match=r"^dim: expected an even integer >= 4"):
        load_norm("rmsnorm", 0)


# ----------------------------------------------------------------------------------------------
# a real normaliser with a large ε is one; non-normalisers are not
# ----------------------------------------------------------------------------------------------
def _rms(eps: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    return f


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 1e-1])
def test_rms_formula_with_any_eps_normalises(eps: float) -> None:
    a = audit_norm(_rms(eps), D)
    assert a.normalizes, a.notes
    assert a.statistic == "mean square" and not a.centering
    assert a.eps == pytest.approx(eps, rel=1e-3)
    assert a.eps_placement.startswith("inside the root")


@pytest.mark.parametrize("eps", [1e-6, 1e-2, 1e-1])
def test_rmsnorm_and_layernorm_modules_with_any_eps(eps: float) -> None:
    m = normlab.RMSNorm(D, eps=eps)
    a = audit_norm(m, D, weight=m.weight)
    assert a.normalizes and a.gain_form == "w"
    assert a.eps == pytest.approx(eps, rel=1e-3)
    assert "float32 or better" in a.stats_precision["bfloat16"]  # ε is not mistaken for rounding
    assert a.casting is not None and a.casting.startswith("llama")
    ln = nn.LayerNorm(D, eps=eps)
    b = audit_norm(ln, D, weight=ln.weight)
    assert b.normalizes and b.centering and b.statistic == "variance (biased, D)"
    assert b.eps == pytest.approx(eps, rel=1e-3)


@pytest.mark.parametrize(
    "target",
    [nn.Identity(), nn.Linear(D, D), DynamicTanh(D), DynamicTanh(D, alpha_init=1e4)],
    ids=["identity", "linear", "dyt", "dyt-saturated"],
)
def test_non_normalizers_are_not_called_normalizers(target: nn.Module) -> None:
    a = audit_norm(target, D)
    assert not a.normalizes
    assert a.statistic.startswith("none") and a.notes[0].startswith("not a normalizer")


def _cast_to_params(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The module behind a wrapper that casts x to its parameters' dtype, as in a 16-bit model."""
    dtype = next(module.parameters()).dtype
    return lambda x: module(x.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("wrapped", [False, True], ids=["module", "casting-wrapper"])
def test_16_bit_norms_are_recognised(kind: str, dtype: torch.dtype, wrapped: bool) -> None:
    """A 16-bit module is probed with the input dtype it accepts, and the invariance probes
    allow for 16-bit rounding; the statistic fit runs in float64 (x² of the large probe
    overflows float16)."""
    module = (nn.LayerNorm(D) if kind == "layernorm" else nn.RMSNorm(D, eps=1e-6)).to(dtype)
    a = audit_norm(_cast_to_params(module) if wrapped else module, D, weight=module.weight)
    assert a.normalizes, a.notes
    assert a.centering == (kind == "layernorm")
    assert a.statistic.startswith("variance" if kind == "layernorm" else "mean square")
    assert a.eps_placement.startswith("inside") and a.gain_form == "w"


@pytest.mark.parametrize("dim", [2, 3])
def test_probes_need_four_columns(dim: int) -> None:
    """At D = 2 every centred row is a multiple of [1, −1]: softmax would pass as a norm."""
    with pytest.raises(ValueError, match="dim"):
        audit_norm(lambda x: torch.softmax(x, -1), dim)


def test_eps_without_a_root_is_not_a_normalizer() -> None:
    a = audit_norm(lambda x: x / (x.pow(2).mean(-1, keepdim=True) + 1e-5), D)
    assert not a.normalizes and "scale" in a.statistic


def test_a_shape_that_changes_with_scale_is_not_normalising() -> None:
    """Scale-invariant at large inputs only, with a different shape at the probe's scale."""

    def f(x: torch.Tensor) -> torch.Tensor:
        m = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(m) + 0.1 * (x - x.mean(-1, keepdim=True)) * torch.exp(-m / 10)

    x = torch.randn(16, D, dtype=torch.float64) * 2 + 0.5
    big = x * 50
    zero = torch.zeros(D, dtype=torch.float64)
    why = _why_not_normalizing(f, x, f(x), big, f(big), zero)
    assert why is not None and "shape" in why[0]


# ----------------------------------------------------------------------------------------------
# the norm names of compare
# ----------------------------------------------------------------------------------------------
def test_dyt_is_audited_as_not_normalising() -> None:
    code, text = _invoke("norm", "dyt")
    assert code == 0, text
    assert "normalises no" in text and "element-wise" in text
    result = CliRunner().invoke(app, ["audit", "norm", "dyt", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["normalizes"] is False


def test_none_is_rejected_with_the_reason() -> None:
    code, text = _invoke("norm", "none")
    assert code == 2
    assert "Invalid value for TARGET:" in text and "nothing to audit" in text
    assert "dyt" in text and "rmsnorm" in text


def test_unknown_norm_lists_dyt_among_the_registered_kinds() -> None:
    code, text = _invoke("norm", "no_such_norm")
    assert code == 2 and "dyt" in text and "layernorm" in text


def test_dyt_resolves_in_a_fresh_interpreter() -> None:
    """``audit norm dyt`` must not depend on something else having imported normlab.models."""
    code = (
        "from normlab.cli.audit_targets import load_norm\n"
        "fn, weight = load_norm('dyt', 8)\n"
        "print(type(fn).__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DynamicTanh"


def test_a_model_too_large_is_refused_with_the_machines_exit_status() -> None:
    """A model no machine holds is a refusal about the machine (exit 1, as compare gives), not a
    misspelt option (2); a size below 1 stays a usage error."""
    big = "hidden_size=65536,num_hidden_layers=96,intermediate_size=262144"
    code, output = _invoke("model", "hf:llama", "--model-set", big)
    assert code == 1, output
    assert "needs about" in _flat(output) and "Traceback" not in output
    code, output = _invoke("model", "hf:llama", "--model-set", "hidden_size=-3")
    assert code == 2 and "hidden_size=-3: expected an integer >= 1" in _flat(output), output
