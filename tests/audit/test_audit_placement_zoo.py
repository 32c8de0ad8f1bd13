"""A zoo of norms that differ in one choice each, for ``normlab.audit``: where ε sits (added to
the variance, in the root, or to the standard deviation, outside it) and how large it is,
centred or not, statistics in float32 or rounded to bfloat16, gain w or 1 + w, x̂ rounded to
the input dtype before the gain or after it.

Each member must be described as it is, and must draw no finding that is an artefact of another
finding: a finding that rests on the ε placement, the centring, the gain form or the statistic
is computed for what the audit found, or withheld. Outside the root, ε = 1 once read as
"statistics rounded to bfloat16 or otherwise imprecise" (the gain, read off a bfloat16 output at
|x| = 1024, lost ε's shrink of x̂ there), and ε = 0.01 widened the gain's tolerance as if the
rows' scales drifted.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
from torch import nn

from normlab.audit import NormAudit, audit_norm
from normlab.audit.gain import gain_tolerance


class Choice(NamedTuple):
    eps: float
    where: str  # "variance": x̂ = x·rsqrt(m + ε); "std": x̂ = x / (sqrt(m) + ε)
    centred: bool
    stats: str  # "fp32", or "bf16": the statistic m rounded to bfloat16
    gain: str  # "w" or "1 + w"
    cast: str  # "before": x̂ rounded to the input dtype, then times the gain; "after": one rounding

    @property
    def label(self) -> str:
        return (
            f"eps={self.eps:g}-{self.where}-{'centred' if self.centred else 'uncentred'}-"
            f"{self.stats}-g={self.gain}-cast-{self.cast}"
        )


class Configured(nn.Module):
    """The norm a :class:`Choice` describes: statistics taken in float32 from the input."""

    def __init__(self, d: int, choice: Choice) -> None:
        super().__init__()
        self.choice = choice
        start = torch.zeros(d) if choice.gain == "1 + w" else torch.ones(d)
        self.weight = nn.Parameter(start)
        self.eps = choice.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.choice
        xf = x.float()
        if c.centred:
            xf = xf - xf.mean(-1, keepdim=True)
        m = xf.pow(2).mean(-1, keepdim=True)
        if c.stats == "bf16":
            m = m.bfloat16().float()
        hat = xf * torch.rsqrt(m + c.eps) if c.where == "variance" else xf / (m.sqrt() + c.eps)
        gain = self.weight.float() + (1.0 if c.gain == "1 + w" else 0.0)
        if c.cast == "before":
            return (gain * hat.to(x.dtype).float()).to(x.dtype)
        return (gain * hat).to(x.dtype)


GAIN_CAST = list(itertools.product(("w", "1 + w"), ("before", "after")))
ZOO = [
    Choice(eps, where, centred, stats, *GAIN_CAST[i % len(GAIN_CAST)])
    for i, (eps, where, centred, stats) in enumerate(
        itertools.product((1e-5, 1e-2, 1.0), ("variance", "std"), (False, True), ("fp32", "bf16"))
    )
]
# every gain form and rounding order with the case first reported (ε = 0.01 outside the root)
ZOO += [Choice(1e-2, "std", False, "fp32", g, cast) for g, cast in GAIN_CAST]
ZOO = list(dict.fromkeys(ZOO))

_AUDITS: dict[Choice, NormAudit] = {}


def _audit(choice: Choice, dim: int = 64) -> NormAudit:
    if choice not in _AUDITS:
        _AUDITS[choice] = audit_norm(Configured(dim, choice), dim)
    return _AUDITS[choice]


def _report(a: NormAudit) -> str:
    return "\n".join(f.line() for f in a.findings)


def _expected_defects(c: Choice) -> set[str]:
    out = set()
    if c.where == "std":
        out.add("ε outside the root")
    if c.stats == "bf16":
        out.add("bfloat16-rounded statistic")
    return out


@pytest.mark.parametrize("choice", ZOO, ids=[c.label for c in ZOO])
def test_each_member_is_described_as_it_is(choice: Choice) -> None:
    a = _audit(choice)
    report = _report(a)
    assert a.normalizes, report
    assert a.centering == choice.centred, report
    assert a.statistic.startswith("variance" if choice.centred else "mean square"), a.statistic
    want = "inside the root" if choice.where == "variance" else "outside the root"
    assert a.eps_placement.startswith(want), report
    assert a.eps == pytest.approx(choice.eps, rel=0.05), report
    assert a.gain_form == choice.gain, report
    bf16 = a.stats_precision["bfloat16"]
    if choice.stats == "bf16":
        assert "statistics rounded to bfloat16 (" in bf16, bf16
    else:
        assert "float32 or better" in bf16, bf16
    if not choice.centred and choice.stats == "fp32":  # the casting probe: mean square only
        recipe = "llama" if choice.cast == "before" else "gemma"
        assert a.casting is not None and a.casting.startswith(recipe), report


@pytest.mark.parametrize("choice", ZOO, ids=[c.label for c in ZOO])
def test_no_member_draws_an_artefact_of_another_finding(choice: Choice) -> None:
    a = _audit(choice)
    report = _report(a)
    diagnoses = {f.diagnosis for f in a.defects}
    assert diagnoses == _expected_defects(choice), report
    assert not any("imprecise" in f.message for f in a.findings), report
    assert not any(f.withheld for f in a.findings), report
    if choice.stats == "fp32":
        # rows' scales do not drift at a scale where ε is negligible wherever it sits: the gain
        # is held to its own tolerance, not one widened for imprecise statistics
        gain = next(f for f in a.findings if f.probe == "gain")
        assert gain.tolerance == pytest.approx(gain_tolerance(torch.float32)), report
        assert not any(n.startswith("not a normalizer") for n in a.notes)


@pytest.mark.parametrize("eps", [1e-2, 0.3, 1.0])
@pytest.mark.parametrize("dim", [64, 1024])
def test_eps_outside_the_root_of_any_size_is_not_imprecise(eps: float, dim: int) -> None:
    """The case first reported, over ε and D: float32 statistics, ε added to the std."""
    a = _audit(Choice(eps, "std", False, "fp32", "w", "before"), dim)
    report = _report(a)
    assert {f.diagnosis for f in a.defects} == {"ε outside the root"}, report
    assert "float32 or better" in a.stats_precision["bfloat16"], report
    assert a.eps == pytest.approx(eps, rel=0.05)


def test_casting_is_judged_with_eps_where_it_was_found() -> None:
    """ε outside the root no longer withholds the casting probe: it is computed for that
    placement, and a wrong recipe is still told from the right one."""
    before = _audit(Choice(1e-2, "std", False, "fp32", "w", "before"))
    after = _audit(Choice(1e-2, "std", False, "fp32", "w", "after"))
    assert before.casting is not None and before.casting.startswith("llama")
    assert after.casting is not None and after.casting.startswith("gemma")
