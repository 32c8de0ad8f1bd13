"""``runs.csv``: one row per run, the fields of each run's ``summary.json``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from normlab.analysis.runs import RunResult
from normlab.run_format import CRASH_FIELDS, DEFAULT_TESTBED, testbed_format

__all__ = ["DIT_RUN_COLUMNS", "RUN_COLUMNS", "run_columns", "runs_csv_text"]

_OMITTED = {"traceback"}
"""Left out of runs.csv: it stays in the run's own summary.json."""


def run_columns(testbed: str = DEFAULT_TESTBED) -> tuple[str, ...]:
    """The documented summary fields of a run of ``testbed``, in summary.json's order
    (:attr:`normlab.run_format.TestbedFormat.summary_fields`), then the error of a crashed
    run."""
    extra = tuple(f for f in CRASH_FIELDS if f not in _OMITTED)
    return (*testbed_format(testbed).summary_fields, *extra)


RUN_COLUMNS: tuple[str, ...] = run_columns("gpt")
"""The documented summary fields of a GPT run (docs/run-format.md), in that order; any other
field a run writes follows in alphabetical order. ``traceback`` is left out (it is in the run's
own summary.json); runs without a summary get status ``unfinished``."""

DIT_RUN_COLUMNS: tuple[str, ...] = run_columns("dit")
"""A DiT run's summary fields: its validation fields (``final_val_loss``, ``best_val_loss``,
the flow-matching MSE, ``final_sample_sw2`` and ``sample_cfg_scale``, the guidance scale of its
samples) instead of the GPT's three."""


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def runs_csv_text(runs: list[RunResult], testbed: str = DEFAULT_TESTBED) -> str:
    """The CSV text (header + one row per run, ordered as given), with the columns of
    ``testbed``'s summaries (:func:`run_columns`) first."""
    documented = run_columns(testbed)
    extra = sorted({k for r in runs for k in r.summary} - set(documented) - _OMITTED)
    columns = [*documented, *extra]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in runs:
        row = dict(r.summary)
        row.update({"run_id": r.run_id, "arm": r.arm, "seed": r.seed, "status": r.status})
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()
