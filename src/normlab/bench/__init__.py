"""Kernel benchmarks and the bandwidth roofline (``normlab bench``).

Modules: :mod:`~normlab.bench.bytes_model` (minimum bytes each op moves),
:mod:`~normlab.bench.timing` (copy-paired repetitions, medians),
:mod:`~normlab.bench.peers` (the implementations compared and the float64 error check),
:mod:`~normlab.bench.runner` (the grid), :mod:`~normlab.bench.output` (table, CSV, JSON, PNG),
:mod:`~normlab.bench.allocator` (the glibc malloc setting that large CPU timings need).
"""

from normlab.bench.bytes_model import MODES, OPS, copy_bytes, min_bytes, traffic
from normlab.bench.runner import COLUMNS, DIMS, Config, Result, Row, run

__all__ = [
    "COLUMNS",
    "DIMS",
    "MODES",
    "OPS",
    "Config",
    "Result",
    "Row",
    "copy_bytes",
    "min_bytes",
    "run",
    "traffic",
]
