"""The study: what one ``normlab compare`` does, above the grids it trains.

A :class:`~normlab.study.spec.StudySpec` (the grid config, the output folder and the transforms,
each with its own small spec: :class:`~normlab.study.spec.LadderSpec`,
:class:`~normlab.study.spec.SweepSpec`, :class:`~normlab.study.spec.RoundsSpec`, and ``--plan``)
is run by :class:`~normlab.study.study.Study`: :mod:`~normlab.study.loader` makes the configs
from a YAML file and the flags, :mod:`~normlab.study.grid` is the one way to a grid (normlab's
own runs or a ``--script``), and one module per transform makes plans from plans
(:mod:`~normlab.study.ladder` with :mod:`~normlab.study.rungs`, :mod:`~normlab.study.sweep`,
:mod:`~normlab.study.rounds`, :mod:`~normlab.study.plan`). How a study stops short is
:mod:`~normlab.study.errors`; the command line turns it into an exit status.
"""

from __future__ import annotations

from normlab.study.errors import Invalid, NoResult, Refused, Stopped, StudyError
from normlab.study.spec import LadderSpec, RoundsSpec, StudySpec, SweepSpec
from normlab.study.study import Study

__all__ = [
    "Invalid",
    "LadderSpec",
    "NoResult",
    "Refused",
    "RoundsSpec",
    "Stopped",
    "Study",
    "StudyError",
    "StudySpec",
    "SweepSpec",
]
