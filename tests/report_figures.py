"""Compare reports whose figures are drawn but not rendered, for tests about what else a report
holds.

Rendering a figure to PNG (:func:`normlab.report.plots.figure_png`) is most of the time a report
takes to build. :func:`skip_rendering` makes a compare report (:func:`normlab.report.build_report`,
its health section included) still build every figure from the runs' data, but write
:data:`PNG_SIGNATURE` in place of each PNG. The figures as pixels are the subject of
tests/compare/test_figures.py and test_report.py; a ladder's own plot is not affected.
"""

from __future__ import annotations

import pytest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
"""The first eight bytes of every PNG file; all that a skipped rendering writes."""


def skip_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test, compare reports write :data:`PNG_SIGNATURE` for each figure."""
    import normlab.report.build
    import normlab.report.sections

    for module in (normlab.report.build, normlab.report.sections):
        monkeypatch.setattr(module, "figure_png", lambda fig: PNG_SIGNATURE)
