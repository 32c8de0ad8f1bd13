"""A zoo of norms for ``normlab.audit``: correct implementations draw no defect; deliberately
wrong ones, each reproducing one real bug class, draw the diagnosis that names it.

Each member is a module class built as ``Member(D)`` (its gain is the module's ``weight``) and
moved to the module dtype under test: "input dtype" here is the module's working dtype (a
bfloat16 module is what a bfloat16 model holds). The audit chooses its own probe dtypes. One
audit per member, D and dtype; the audits run once per test item.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import normlab
from normlab.audit import NormAudit, audit_norm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DIMS = (8, 64, 4096)


# ----------------------------------------------------------------------------------------------
# correct implementations (the Hugging Face formulas are written out: transformers is not
# installed)
# ----------------------------------------------------------------------------------------------
class LlamaRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm (Qwen2 and Mistral use the same)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Qwen3RMSNorm(LlamaRMSNorm):
    """transformers' Qwen3RMSNorm: the LLaMA formula (also its q/k norms)."""


class GemmaRMSNorm(nn.Module):
    """transformers' GemmaRMSNorm: gain 1 + w, x̂ and the gain meet in float32."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class Olmo2RMSNorm(nn.Module):
    """transformers' Olmo2RMSNorm: the weight multiplies the float32 x̂, one cast at the end."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class T5LayerNorm(nn.Module):
    """transformers' T5LayerNorm: an RMS norm (no centring, no bias)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class FunctionalLayerNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.linspace(-0.5, 0.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.bias.to(x.dtype))


class FunctionalRMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), eps=1e-6)


CORRECT: dict[str, tuple[Callable[[int], nn.Module], str]] = {
    "torch.nn.LayerNorm": (lambda d: nn.LayerNorm(d), "variance"),
    "torch.nn.RMSNorm": (lambda d: nn.RMSNorm(d, eps=1e-6), "mean square"),
    "torch.nn.RMSNorm(eps=None)": (lambda d: nn.RMSNorm(d), "mean square"),
    "F.layer_norm": (FunctionalLayerNorm, "variance"),
    "F.rms_norm": (FunctionalRMSNorm, "mean square"),
    "LlamaRMSNorm": (LlamaRMSNorm, "mean square"),
    "Qwen3RMSNorm": (Qwen3RMSNorm, "mean square"),
    "GemmaRMSNorm": (GemmaRMSNorm, "mean square"),
    "Olmo2RMSNorm": (Olmo2RMSNorm, "mean square"),
    "T5LayerNorm": (T5LayerNorm, "mean square"),
    "normlab.LayerNorm": (lambda d: normlab.LayerNorm(d), "variance"),
    **{
        f"normlab.RMSNorm({casting}, o={o:g})": (
            lambda d, c=casting, o=o: normlab.RMSNorm(d, weight_offset=o, casting=c),
            "mean square",
        )
        for casting in ("llama", "gemma", "fp32")
        for o in (0.0, 1.0)
    },
}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_norms_draw_no_defect(name: str, dim: int, dtype: str) -> None:
    build, statistic = CORRECT[name]
    module = build(dim).to(DTYPES[dtype])
    a = audit_norm(module, dim)
    assert a.defects == [], "\n".join(f.line() for f in a.findings)
    assert a.normalizes and a.statistic.startswith(statistic), a.statistic
    assert a.severity in ("ok", "note")


# ----------------------------------------------------------------------------------------------
# wrong implementations: one real bug class each
# ----------------------------------------------------------------------------------------------
class Wrong(nn.Module):
    """A norm with a weight and ε whose forward is ``formula(self, x)`` in float32."""

    formula: Callable[[Wrong, torch.Tensor], torch.Tensor]
    offset = 0.0
    keep_dtype = True  # the output in the input's dtype

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((d,), 1.0 - self.offset))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = type(self).formula(self, x.float())
        return y.to(x.dtype) if self.keep_dtype else y


def _ms(x: torch.Tensor, dim: int | tuple[int, ...] = -1) -> torch.Tensor:
    return x.pow(2).mean(dim, keepdim=True)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def _sum_bf16_accumulator(t: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Σ over the last dim with a bfloat16 running sum: chunks of 16 summed in float32, each
    added to the running sum in bfloat16 (a hand-written kernel's 16-bit accumulator)."""
    parts = t.reshape(*t.shape[:-1], -1, chunk).sum(-1).bfloat16()
    acc = torch.zeros_like(parts[..., :1])
    for i in range(parts.shape[-1]):
        acc = acc + parts[..., i : i + 1]
    return acc.float()


def _member(name: str, formula: Callable, **attrs: object) -> type[Wrong]:
    return type(name, (Wrong,), {"formula": formula, **attrs})


def _w(m: Wrong) -> torch.Tensor:
    return m.weight.float()


WRONG: list[tuple[str, type[nn.Module], str, tuple[int, ...], str]] = [
    # (id, class, the diagnosis it must draw, dims, module dtype)
    ("std without centring",
     _member("StdNoCentre", lambda m, x: _w(m) * x / (x.var(-1, unbiased=False, keepdim=True)
                                                      + m.eps).sqrt()),
     "std without centring", (64, 4096), "fp32"),
    ("statistic rounded to bfloat16",
     _member("StatBF16", lambda m, x: _w(m) * x * torch.rsqrt(_bf16(_ms(x)) + m.eps)),
     "bfloat16-rounded statistic", (8, 64, 4096), "fp32"),
    ("rsqrt rounded to bfloat16",
     _member("RsqrtBF16", lambda m, x: _w(m) * x * _bf16(torch.rsqrt(_ms(x) + m.eps))),
     "bfloat16-rounded statistic", (64,), "fp32"),
    ("std rounded to float16",
     _member("StdFP16", lambda m, x: _w(m) * x / (_ms(x) + m.eps).sqrt().half().float()),
     "16-bit statistic", (64,), "fp32"),
    ("statistic over the rows (batch)",
     _member("OverRows", lambda m, x: _w(m) * x * torch.rsqrt(_ms(x, 0) + m.eps)),
     "wrong axis (batch / rows)", (8, 64), "fp32"),
    ("layer norm over the rows (batch)",
     _member("LNOverRows", lambda m, x: _w(m) * (x - x.mean(0, keepdim=True))
             * torch.rsqrt(x.var(0, unbiased=False, keepdim=True) + m.eps)),
     "wrong axis", (64,), "fp32"),
    ("statistic over a middle dim (the sequence)",
     _member("OverSeq", lambda m, x: _w(m) * x * torch.rsqrt(_ms(x, 1) + m.eps)),
     "wrong axis (sequence / middle dim)", (64,), "fp32"),
    ("statistic over the whole tensor",
     _member("OverAll", lambda m, x: _w(m) * x * torch.rsqrt(x.pow(2).mean() + m.eps)),
     "wrong axis", (64,), "fp32"),
    ("ε outside the root (added to the std)",
     _member("EpsOutside", lambda m, x: _w(m) * x / (_ms(x).sqrt() + 1e-4)),
     "ε outside the root", (64, 4096), "fp32"),
    ("layer norm with ε added to the std",
     _member("LNEpsStd", lambda m, x: _w(m) * (x - x.mean(-1, keepdim=True))
             / (x.std(-1, unbiased=False, keepdim=True) + m.eps)),
     "ε outside the root", (64,), "fp32"),
    ("ε missing",
     _member("NoEps", lambda m, x: _w(m) * x * torch.rsqrt(_ms(x))),
     "ε missing", (64,), "fp32"),
    ("ε without a root",
     _member("EpsNoRoot", lambda m, x: _w(m) * x / (_ms(x) + m.eps)),
     "ε applied without a root", (64,), "fp32"),
    ("returns x * nan",
     _member("TimesNaN", lambda m, x: x * float("nan")),
     "non-finite output", (64,), "fp32"),
    ("unbiased variance",
     _member("Unbiased", lambda m, x: _w(m) * (x - x.mean(-1, keepdim=True))
             * torch.rsqrt(x.var(-1, unbiased=True, keepdim=True) + m.eps)),
     "unbiased variance", (8, 64, 4096), "fp32"),
    ("L2 norm instead of RMS",
     _member("L2", lambda m, x: _w(m) * x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + m.eps)),
     "L2 norm instead of RMS", (8, 64), "fp32"),
    ("gain applied before normalising",
     _member("PreGain", lambda m, x: (_w(m) * x) * torch.rsqrt(_ms(_w(m) * x) + m.eps)),
     "gain applied before normalising", (64,), "fp32"),
    ("layer norm with the gain applied first",
     _member("LNPreGain", lambda m, x: F.layer_norm(_w(m) * x, (x.shape[-1],), eps=m.eps)),
     "gain applied before normalising", (64,), "fp32"),
    ("gain rounded to bfloat16 first",
     _member("GainBF16", lambda m, x: _bf16(_w(m)) * x * torch.rsqrt(_ms(x) + m.eps)),
     "gain rounded to bfloat16", (64,), "fp32"),
    ("gain rounded to float16 first",
     _member("GainFP16", lambda m, x: _w(m).half().float() * x * torch.rsqrt(_ms(x) + m.eps)),
     "gain rounded to float16", (64,), "fp32"),
    ("1 + w added in bfloat16",
     _member("OnePlusWBF16",
             lambda m, x: (1 + m.weight.bfloat16()).float() * x * torch.rsqrt(_ms(x) + m.eps),
             offset=1.0),
     "1 + w added in bfloat16", (64,), "bf16"),
    ("centred numerator, uncentred statistic",
     _member("CentredMS", lambda m, x: _w(m) * (x - x.mean(-1, keepdim=True))
             * torch.rsqrt(_ms(x) + m.eps)),
     "centred numerator, uncentred statistic", (64,), "fp32"),
]  # fmt: skip


class StatsInInputDtype(nn.Module):
    """x² and its mean taken in the input dtype: overflows float16, rounds bfloat16."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight.to(x.dtype) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Accumulate16(nn.Module):
    """The mean square summed with a bfloat16 running sum, x̂ in float32."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        m = _sum_bf16_accumulator(xf.pow(2)) / x.shape[-1]
        return (self.weight.float() * xf * torch.rsqrt(m + 1e-6)).to(x.dtype)


class UnbiasedNoWeight(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(-1, keepdim=True)
        return xc * torch.rsqrt(x.var(-1, unbiased=True, keepdim=True) + 1e-5)


class L2NoWeight(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


class InPlace(nn.Module):
    """Normalises its input in place (the caller's activations are overwritten)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype))


WRONG += [
    ("gain applied twice",
     _member("GainTwice", lambda m, x: _w(m) * _w(m) * x * torch.rsqrt(_ms(x) + m.eps)),
     "gain applied twice", (64,), "fp32"),
    ("weight not applied",
     _member("NoWeight", lambda m, x: x * torch.rsqrt(_ms(x) + m.eps)),
     "weight not applied", (64,), "fp32"),
    ("input modified in place", InPlace, "input modified in place", (64,), "fp32"),
]  # fmt: skip

WRONG += [
    ("x² in float16 (float16 input)", StatsInInputDtype, "float16 overflow of x²", (64,), "fp32"),
    (
        "x² in bfloat16 (bfloat16 input)",
        StatsInInputDtype,
        "low-precision statistics",
        (8, 4096),
        "fp32",
    ),
    ("16-bit accumulation over a long row", Accumulate16, "16-bit accumulation", (4096,), "fp32"),
    ("unbiased variance, no weight", UnbiasedNoWeight, "unbiased variance", (64,), "fp32"),
    ("L2 norm, no weight", L2NoWeight, "L2 norm instead of RMS", (64,), "fp32"),
]

WRONG_CASES = [
    pytest.param(name, cls, diag, dim, dtype, id=f"{name}-D{dim}-{dtype}")
    for name, cls, diag, dims, dtype in WRONG
    for dim in dims
]


def _diagnoses(a: NormAudit) -> list[str]:
    return [f.diagnosis or "" for f in a.defects]


@pytest.mark.parametrize(("name", "cls", "diagnosis", "dim", "dtype"), WRONG_CASES)
def test_wrong_norms_draw_their_diagnosis(
    name: str, cls: type[nn.Module], diagnosis: str, dim: int, dtype: str
) -> None:
    module = cls(dim).to(DTYPES[dtype])
    a = audit_norm(module, dim)
    report = "\n".join(f.line() for f in a.findings)
    assert a.severity == "defect", report
    assert a.findings[0].severity == "defect"  # defects first
    assert any(diagnosis in d for d in _diagnoses(a)), report


def test_the_zoo_is_large_enough() -> None:
    assert len(WRONG) >= 25 and len(CORRECT) >= 10


# ----------------------------------------------------------------------------------------------
# the five cases the testers found, and what the audit must not claim about them
# ----------------------------------------------------------------------------------------------
def _audit(name: str, dim: int = 64) -> NormAudit:
    cls = next(c for n, c, *_ in WRONG if n == name)
    return audit_norm(cls(dim), dim)


def test_std_without_centring_is_not_called_mean_square() -> None:
    a = _audit("std without centring")
    assert a.statistic != "mean square" and "mean not subtracted" in a.statistic
    assert "rounded" not in a.stats_precision.get("bfloat16", "")
    assert not any("bfloat16" in d for d in _diagnoses(a))


def test_bf16_rounded_statistic_normalises() -> None:
    a = _audit("statistic rounded to bfloat16")
    assert a.normalizes and not any("not a normalizer" in n for n in a.notes)
    assert a.statistic == "mean square"
    assert "rounded to bfloat16" in a.stats_precision["bfloat16"]


def test_statistic_over_the_rows_is_not_element_wise() -> None:
    a = _audit("statistic over the rows (batch)")
    text = " ".join(f.message for f in a.findings) + a.statistic
    assert "element-wise" not in text and "DyT" not in text
    assert "rows" in text and not a.normalizes


def test_eps_outside_draws_no_false_bf16_claim() -> None:
    a = _audit("ε outside the root (added to the std)")
    assert a.eps_placement.startswith("outside the root")
    assert a.eps == pytest.approx(1e-4, rel=0.05)
    assert "float32 or better" in a.stats_precision["bfloat16"]


def test_nan_output_is_a_finding_and_stops_the_probes() -> None:
    a = _audit("returns x * nan")
    assert not a.normalizes and a.max_rel_error is None
    assert a.statistic.startswith("withheld") and "non-finite" in a.statistic
    assert "non-finite output" in _diagnoses(a)
    assert any(f.withheld for f in a.findings)


def test_dependent_findings_are_withheld_when_no_statistic_fits() -> None:
    """A statistic no candidate explains: the closest is named with its error, and precision
    and casting are withheld with the reason."""

    class MaxNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * x / (x.abs().amax(-1, keepdim=True) + 1e-6)

    a = audit_norm(MaxNorm(64), 64)
    assert a.normalizes and a.statistic.startswith("none fits: closest")
    assert a.stats_precision["bfloat16"].startswith("withheld: no candidate statistic fits")
    stat = next(f for f in a.findings if f.probe == "statistic")
    assert stat.error is not None and stat.tolerance is not None and stat.error > stat.tolerance


def test_every_finding_states_a_severity_and_tolerances_follow_the_dtype() -> None:
    a32 = audit_norm(nn.LayerNorm(64), 64)
    a16 = audit_norm(nn.LayerNorm(64).bfloat16(), 64)
    assert {f.severity for f in a32.findings} <= {"ok", "note", "defect"}
    assert a16.tolerance is not None and a32.tolerance is not None
    assert a16.tolerance > 1000 * a32.tolerance
    assert math.isclose(
        a32.tolerance, 2 * torch.finfo(torch.float32).eps + 4 * 1.1920929e-07 * 8, rel_tol=1e-3
    )


def test_cli_json_puts_severity_and_defects_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import sys
    import types

    from typer.testing import CliRunner

    from normlab.cli import app

    module = types.ModuleType("zoo_targets")
    module.Unbiased = next(c for n, c, *_ in WRONG if n == "unbiased variance")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "zoo_targets", module)
    result = CliRunner().invoke(app, ["audit", "norm", "zoo_targets:Unbiased", "--json"])
    assert result.exit_code == 3, result.output  # the verdict is defect
    data = json.loads(result.output)
    assert list(data)[:2] == ["severity", "findings"] and data["severity"] == "defect"
    severities = [f["severity"] for f in data["findings"]]
    assert severities == sorted(severities, key=["defect", "note", "ok"].index)
    assert data["findings"][0]["diagnosis"] == "unbiased variance"
    assert all(f["tolerance"] is not None for f in data["findings"] if f["error"] is not None)
    text = CliRunner().invoke(app, ["audit", "norm", "zoo_targets:Unbiased"]).output
    assert text.splitlines()[0].startswith("verdict: defect")
    assert text.splitlines()[1].startswith("defect  gain: [unbiased variance]")


PreGainRsqrtBF16 = _member(
    "PreGainRsqrtBF16",
    lambda m, x: (_w(m) * x) * _bf16(torch.rsqrt(_ms(_w(m) * x) + m.eps)),
)


def test_a_gain_applied_first_does_not_blur_the_precision_diagnosis() -> None:
    """Two defects at once: the gain before the norm and the rsqrt rounded to bfloat16. The
    precision probe runs with w = 1 (where both gain orders agree), so it names the rounding;
    through x ↦ f(x / w) its own rounding of x / w and w ⊙ (x / w) read as "no single
    rounding fits"."""
    a = audit_norm(PreGainRsqrtBF16(64), 64)
    assert "gain applied before normalising" in _diagnoses(a)
    assert "rsqrt(statistic) rounded to bfloat16" in a.stats_precision["bfloat16"]
    assert "no single rounding fits" not in a.stats_precision["bfloat16"]
    exact = audit_norm(_audit_class("gain applied before normalising")(64), 64)
    assert "rounded" not in exact.stats_precision["bfloat16"]


def _audit_class(name: str) -> type[nn.Module]:
    return next(c for n, c, *_ in WRONG if n == name)
