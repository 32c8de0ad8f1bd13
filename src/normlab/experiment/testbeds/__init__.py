"""The testbeds: what differs between a GPT, a DiT and a user's model, behind one interface
(:class:`~normlab.experiment.testbeds.base.Testbed`) that the grid and the training loop share.

One module per testbed (:mod:`~normlab.experiment.testbeds.gpt`,
:mod:`~normlab.experiment.testbeds.dit`, :mod:`~normlab.experiment.testbeds.lm`), each
registered here in :data:`TESTBEDS` under the experiment config's ``testbed`` name (the names
that :data:`normlab.run_format.TESTBED_FORMATS` declares). A testbed's module holds both halves
of it: its part of the experiment config (``config``, a
:class:`~normlab.experiment.testbeds.base.TestbedConfig`: sections, defaults, rules), which
:mod:`normlab.experiment.config` builds the config from, and its runs' data, model and loss.
A run config without ``testbed`` is a GPT run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from normlab.experiment.testbeds.base import (
    Testbed,
    TestbedConfig,
    check_data_fits,
    check_fingerprint,
    data_seed,
    init_seed,
)
from normlab.experiment.testbeds.dit import DiTTestbed
from normlab.experiment.testbeds.gpt import GPTTestbed, warm_up_gpt
from normlab.experiment.testbeds.lm import LMTestbed
from normlab.run_format import DEFAULT_TESTBED

__all__ = [
    "QUALITY_FIELDS",
    "TESTBEDS",
    "Testbed",
    "TestbedConfig",
    "build_model",
    "check_data_fits",
    "check_fingerprint",
    "data_seed",
    "init_seed",
    "make_testbed",
    "quality_fields",
    "testbed_class",
    "testbed_of",
    "warm_up_gpt",
]

TESTBEDS: dict[str, type[Testbed]] = {
    GPTTestbed.name: GPTTestbed,
    DiTTestbed.name: DiTTestbed,
    LMTestbed.name: LMTestbed,
}
"""The testbeds by the experiment config's ``testbed`` name: one line per testbed."""

QUALITY_FIELDS: dict[str, tuple[str, ...]] = {n: t.quality_fields for n, t in TESTBEDS.items()}
"""The validation fields of a run's summary, per testbed."""


def testbed_of(spec: dict[str, Any]) -> str:
    """The testbed of a resolved run config (``gpt`` when it names none)."""
    testbed = spec.get("testbed", DEFAULT_TESTBED)
    if testbed not in TESTBEDS:
        raise ValueError(f"testbed: expected one of {', '.join(TESTBEDS)}, got {testbed!r}")
    return testbed


def testbed_class(spec: dict[str, Any]) -> type[Testbed]:
    """The :class:`Testbed` class of a resolved run config."""
    return TESTBEDS[testbed_of(spec)]


def quality_fields(spec: dict[str, Any]) -> tuple[str, ...]:
    """The validation fields a summary of this run holds (its testbed's ``quality_fields``)."""
    return testbed_class(spec).quality_fields


def build_model(spec: dict[str, Any], seed: int) -> nn.Module:
    """The arm's model with the paired initialisation for ``seed`` (a run's :func:`init_seed`);
    ``spec`` is a resolved run config (its testbed's sections, ``norm``, ``placement``)."""
    return testbed_class(spec).build_model(spec, seed)


def make_testbed(spec: dict[str, Any], run_dir: Path) -> Testbed:
    """The :class:`Testbed` of the run config ``spec`` for the run folder ``run_dir`` (its data
    checked against the fingerprint in ``spec``, its model built with the paired
    initialisation)."""
    return testbed_class(spec)(spec, run_dir)
