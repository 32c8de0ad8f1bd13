"""Read runs logged as plain tables: CSV files and JSON Lines files.

Two layouts, told apart by their columns (CSV: the header; JSON Lines: each line's keys):

- **long**, one logged value per row: ``run``, ``step``, ``metric``, ``value``;
- **wide**, one step per row: ``run``, ``step``, and one column per metric (an empty cell, a
  missing key or ``null``: not logged at that step). Any column set other than the long one is
  wide.

``step`` is an integer; values are numbers (CSV cells as Python's ``float`` reads them, so
``nan`` and ``inf`` are numbers too; a JSON number, or the strings ``NaN``, ``Infinity``,
``-Infinity``). ``run`` names the run; without a ``run`` column every row of a file belongs to
one run named by the file: its path relative to PATH without the suffix (``version_0/metrics``
for ``PATH/version_0/metrics.csv``), or the file's name without the suffix when PATH is the file.
PATH is one file, or a folder: every ``*.csv`` (``*.jsonl``) under it. A run spread over several
files is one run; a step logged twice keeps the value read last. Tables record no run status, so
every run counts as ended.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normlab.trackers.tracked import TrackedRun, TrackerImportError, series_from_points

__all__ = ["LONG_COLUMNS", "RUN_COLUMN", "STEP_COLUMN", "read_csv", "read_jsonl"]

RUN_COLUMN = "run"
STEP_COLUMN = "step"
LONG_COLUMNS = ("metric", "value")
"""With :data:`RUN_COLUMN` and :data:`STEP_COLUMN`, the columns of the long layout."""
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Row = tuple[str, int, dict[str, float]]
"""(run, step, {metric: value}) of one row."""


def _files(path: Path, suffix: str) -> list[tuple[Path, str]]:
    """(file, the run name it gives when it has no run column) for ``path``."""
    if path.is_file():
        return [(path, path.stem)]
    found = []
    for folder, dirs, files in os.walk(path, followlinks=False):
        dirs.sort()
        for name in files:
            if name.endswith(suffix):
                file = Path(folder) / name
                found.append((file, file.relative_to(path).with_suffix("").as_posix()))
    return sorted(found)


def _where(file: Path, line: int) -> str:
    return f"{str(file)!r}, line {line}"


def _step(raw: Any, file: Path, line: int) -> int:
    text = raw.strip() if isinstance(raw, str) else raw
    try:
        value = float(text) if not isinstance(text, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise TrackerImportError(
            f"--import: {_where(file, line)}: {STEP_COLUMN} is {raw!r}; expected an integer step"
        )
    return int(value)


def _csv_value(cell: str, column: str, file: Path, line: int) -> float | None:
    if not cell.strip():
        return None
    try:
        return float(cell)
    except ValueError:
        raise TrackerImportError(
            f"--import: {_where(file, line)}: column {column!r} holds {cell!r}; expected a "
            "number or an empty cell"
        ) from None


def _json_value(raw: Any, key: str, file: Path, line: int) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw in _NON_FINITE:
        return _NON_FINITE[raw]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise TrackerImportError(
            f"--import: {_where(file, line)}: {key!r} is {raw!r}; expected a number, null, or "
            "one of 'NaN', 'Infinity', '-Infinity'"
        )
    return float(raw)


def _is_long(columns: set[str]) -> bool:
    return columns - {RUN_COLUMN, STEP_COLUMN} == set(LONG_COLUMNS)


def _row(
    fields: dict[str, Any], named: str, file: Path, line: int, value_of: Any
) -> tuple[str, int, dict[str, float]]:
    """One row as (run, step, {metric: value}); ``value_of(raw, column, file, line)`` reads a
    value."""
    if STEP_COLUMN not in fields:
        raise TrackerImportError(
            f"--import: {_where(file, line)}: no {STEP_COLUMN!r} column; expected {RUN_COLUMN}, "
            f"{STEP_COLUMN} and metrics (or {RUN_COLUMN}, {STEP_COLUMN}, "
            f"{', '.join(LONG_COLUMNS)})"
        )
    run = fields.get(RUN_COLUMN, named)
    run = str(run).strip() if run is not None else ""
    if not run:
        raise TrackerImportError(
            f"--import: {_where(file, line)}: the {RUN_COLUMN} column is empty; expected the "
            "run's name"
        )
    step = _step(fields[STEP_COLUMN], file, line)
    if _is_long(set(fields)):
        metric = str(fields["metric"] or "").strip()
        if not metric:
            raise TrackerImportError(
                f"--import: {_where(file, line)}: the metric column is empty; expected the "
                "metric's name"
            )
        value = value_of(fields["value"], metric, file, line)
        return run, step, {} if value is None else {metric: value}
    values = {}
    for key, raw in fields.items():
        if key in (RUN_COLUMN, STEP_COLUMN) or key is None:
            continue
        value = value_of(raw, key, file, line)
        if value is not None:
            values[str(key)] = value
    return run, step, values


def _csv_rows(file: Path, named: str) -> Iterator[Row]:
    with open(file, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        for fields in reader:
            if None in fields:  # more cells than the header has columns
                raise TrackerImportError(
                    f"--import: {_where(file, reader.line_num)}: more cells than the header "
                    "has columns"
                )
            yield _row(fields, named, file, reader.line_num, _csv_value)


def _jsonl_rows(file: Path, named: str) -> Iterator[Row]:
    with open(file, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as err:
                raise TrackerImportError(
                    f"--import: {_where(file, number)}: not valid JSON ({err.msg}); expected one "
                    "JSON object per line"
                ) from None
            if not isinstance(fields, dict):
                raise TrackerImportError(
                    f"--import: {_where(file, number)}: a JSON {type(fields).__name__}; expected "
                    "one JSON object per line"
                )
            yield _row(fields, named, file, number, _json_value)


def _read(path: Path, suffix: str, rows: Any) -> list[TrackedRun]:
    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    try:
        for file, named in _files(path, suffix):
            for run, step, values in rows(file, named):
                series = points.setdefault(run, {})
                for metric, value in values.items():
                    series.setdefault(metric, []).append((step, value))
    except UnicodeDecodeError as err:
        raise TrackerImportError(
            f"--import: a file under {str(path)!r} is not UTF-8 ({err.reason}); expected UTF-8 text"
        ) from None
    return [
        TrackedRun(name=run, series={m: series_from_points(p) for m, p in sorted(series.items())})
        for run, series in sorted(points.items())
    ]


def read_csv(path: Path) -> list[TrackedRun]:
    """The runs of the CSV file ``path``, or of every ``*.csv`` under the folder ``path``."""
    return _read(path, ".csv", _csv_rows)


def read_jsonl(path: Path) -> list[TrackedRun]:
    """The runs of the JSON Lines file ``path``, or of every ``*.jsonl`` under the folder."""
    return _read(path, ".jsonl", _jsonl_rows)
