"""``runs.csv``: one row per run, the fields of each run's ``summary.json``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from normlab.analysis.runs import RunResult

__all__ = ["RUN_COLUMNS", "runs_csv_text"]

RUN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "arm",
    "seed",
    "norm",
    "placement",
    "status",
    "diverged_at",
    "steps",
    "tokens",
    "n_params",
    "n_norm_params",
    "final_val_loss",
    "final_val_bpb",
    "best_val_bpb",
    "final_train_loss",
    "tokens_per_s",
    "peak_memory_bytes",
    "peak_memory_kind",
    "target_val_loss",
    "time_to_target_s",
    "tokens_to_target",
    "n_loss_spikes",
    "n_grad_spikes",
    "n_clipped",
    "wall_s",
    "device",
    "torch_version",
    "threads",
    "data_fingerprint",
    "error",
)
"""The documented summary fields (docs/run-format.md), in that order; any other field a run
writes follows in alphabetical order. ``traceback`` is left out (it is in the run's own
summary.json); runs without a summary get status ``unfinished``."""

_OMITTED = {"traceback"}


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def runs_csv_text(runs: list[RunResult]) -> str:
    """The CSV text (header + one row per run, ordered as given)."""
    extra = sorted({k for r in runs for k in r.summary} - set(RUN_COLUMNS) - _OMITTED)
    columns = [*RUN_COLUMNS, *extra]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in runs:
        row = dict(r.summary)
        row.update({"run_id": r.run_id, "arm": r.arm, "seed": r.seed, "status": r.status})
        writer.writerow([_cell(row.get(c)) for c in columns])
    return buf.getvalue()
