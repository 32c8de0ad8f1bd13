"""Findings of a norm audit: what a probe found, how sure, and how bad.

Each :class:`Finding` names its probe, a severity (``defect``: a bug of a class the math
contract forbids, ``note``: unusual or undetermined, ``ok``: as the contract says), the measured
error and the tolerance it was held to. A finding that rests on an earlier one that did not hold
(precision and casting need a fitted statistic, casting needs ε) is *withheld*: a note that says
why, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

OK, NOTE, DEFECT = "ok", "note", "defect"
SEVERITIES = (DEFECT, NOTE, OK)  # worst first


def figure(x: float) -> str:
    """A measured error or a tolerance as printed: two significant digits (``7.5e-07``).

    An error at the level of rounding differs from CPU to CPU (the order of a float32 sum, FMA,
    vector width) by a factor of 2 or so; more digits would state a precision it does not have.
    """
    return f"{x:.1e}"


@dataclass
class Finding:
    """One probe's result."""

    probe: str
    severity: str
    message: str
    diagnosis: str | None = None  # the named bug class of a defect ("wrong axis", …)
    error: float | None = None
    tolerance: float | None = None
    withheld: bool = False

    def line(self) -> str:
        """``severity  probe: message (error e, tolerance t)`` on one line (:func:`figure`)."""
        numbers = []
        if self.error is not None:
            numbers.append(f"error {figure(self.error)}")
        if self.tolerance is not None:
            numbers.append(f"tolerance {figure(self.tolerance)}")
        tail = f" ({', '.join(numbers)})" if numbers else ""
        name = f"[{self.diagnosis}] " if self.diagnosis else ""
        return f"{self.severity:<6}  {self.probe}: {name}{self.message}{tail}"


def withheld(probe: str, reason: str) -> Finding:
    """A note that ``probe`` did not run, and why."""
    return Finding(probe, NOTE, f"withheld: {reason}", withheld=True)


def ordered(findings: list[Finding]) -> list[Finding]:
    """Defects first, then notes, then ok (stable within a severity)."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def worst(findings: list[Finding]) -> str:
    """The worst severity among ``findings`` (``ok`` when there are none)."""
    return next((s for s in SEVERITIES if any(f.severity == s for f in findings)), OK)
