"""``runs.csv``: one row per run, the fields of each run's ``summary.json``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from normlab.analysis.runs import RunResult
from normlab.experiment.posttrain import POSTTRAIN_FIELDS

__all__ = ["DIT_RUN_COLUMNS", "RUN_COLUMNS", "run_columns", "runs_csv_text"]

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
    "saved_activation_bytes",
    *POSTTRAIN_FIELDS,
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

DIT_RUN_COLUMNS: tuple[str, ...] = tuple(
    c
    for name in RUN_COLUMNS
    for c in (
        ("final_val_loss", "best_val_loss", "final_sample_sw2", "sample_cfg_scale")
        if name == "final_val_loss"
        else (() if name in ("final_val_bpb", "best_val_bpb") else (name,))
    )
)
"""A DiT run's summary fields: its validation fields (``final_val_loss``, ``best_val_loss``,
the flow-matching MSE, ``final_sample_sw2`` and ``sample_cfg_scale``, the guidance scale of its
samples) instead of the GPT's three."""

_OMITTED = {"traceback"}


def run_columns(testbed: str = "gpt") -> tuple[str, ...]:
    """The documented summary fields of a run of ``testbed``, in order."""
    return DIT_RUN_COLUMNS if testbed == "dit" else RUN_COLUMNS


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def runs_csv_text(runs: list[RunResult], testbed: str = "gpt") -> str:
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
