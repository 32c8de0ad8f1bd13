"""The report of ``normlab compare``, rebuilt from the output folder alone.

:func:`build_report` reads the folder, runs :mod:`normlab.analysis`, and writes summary.json,
runs.csv, report.md, a self-contained report.html and plots/*.png.
"""

from normlab.report.build import build_report

__all__ = ["build_report"]
