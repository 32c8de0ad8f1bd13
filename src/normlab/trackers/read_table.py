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

A file whose last line has no line end was cut while it was written (every logger ends each row
with one): its last row may hold a number cut short (``0.8123`` read as ``0.81``), so it is
never read. The run it belongs to (the file's run, or the row's ``run`` when that cell was
written whole) gets the :class:`~normlab.trackers.tracked.Damage`, with the last step of its
rows before the cut; a cut row whose run cannot be told refuses the import.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from normlab.trackers.tracked import (
    Damage,
    TrackedRun,
    TrackerImportError,
    damaged_source_error,
    ends_mid_line,
    series_from_points,
)

__all__ = ["LONG_COLUMNS", "RUN_COLUMN", "STEP_COLUMN", "read_csv", "read_jsonl"]

RUN_COLUMN = "run"
STEP_COLUMN = "step"
LONG_COLUMNS = ("metric", "value")
"""With :data:`RUN_COLUMN` and :data:`STEP_COLUMN`, the columns of the long layout."""
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

Row = tuple[str, int, dict[str, float]]
"""(run, step, {metric: value}) of one row."""
_SPACE = re.compile(r"\s*")
T = TypeVar("T")


@dataclass(frozen=True)
class Cut:
    """The last line of a file, cut while it was written: its number and the run it belongs to
    (None when that cannot be told)."""

    line: int
    run: str | None


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


def _with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each of ``items`` with whether it is the last."""
    iterator = iter(items)
    try:
        item = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield item, False
        item = following
    yield item, True


def _csv_cut_run(fields: dict[str, Any] | None, columns: list[str], named: str) -> str | None:
    """The run of a CSV row cut short: the file's when it has no run column, the row's when a
    cell after its run cell was begun (so the run cell is whole); None when the row or its run
    cell is not whole (or the cut fell in the header)."""
    if fields is None or None in fields:
        return None
    if RUN_COLUMN not in columns:
        return named
    run = fields.get(RUN_COLUMN)
    later = columns[columns.index(RUN_COLUMN) + 1 :]
    if not isinstance(run, str) or all(fields.get(c) is None for c in later):
        return None
    return run.strip() or None


def _csv_rows(file: Path, named: str) -> Iterator[Row | Cut]:
    cut = ends_mid_line(file)
    with open(file, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        numbered = ((fields, reader.line_num) for fields in reader)
        last: tuple[dict[str, Any], int] | None = None
        for (fields, line), is_last in _with_last(numbered):
            if is_last and cut:
                last = (fields, line)
                break
            if None in fields:  # more cells than the header has columns
                raise TrackerImportError(
                    f"--import: {_where(file, line)}: more cells than the header has columns"
                )
            yield _row(fields, named, file, line, _csv_value)
        if cut:
            run = _csv_cut_run(last[0] if last else None, list(reader.fieldnames or []), named)
            yield Cut(last[1] if last else 1, run)


def _json_run(text: str) -> str | None:
    """The ``run`` of a JSON object cut short, when its pair was written whole before the cut
    (something follows its value), else None."""
    decoder = json.JSONDecoder()
    i = _SPACE.match(text).end()
    if not text.startswith("{", i):
        return None
    i += 1
    while True:
        try:
            key, i = decoder.raw_decode(text, _SPACE.match(text, i).end())
            i = _SPACE.match(text, i).end()
            if not text.startswith(":", i):
                return None
            value, i = decoder.raw_decode(text, _SPACE.match(text, i + 1).end())
        except ValueError:
            return None
        i = _SPACE.match(text, i).end()
        if key == RUN_COLUMN and i < len(text):
            whole = str(value).strip() if isinstance(value, str | int) else ""
            return whole or None
        if not text.startswith(",", i):
            return None
        i += 1


def _jsonl_rows(file: Path, named: str) -> Iterator[Row | Cut]:
    cut, any_run = ends_mid_line(file), False
    with open(file, encoding="utf-8") as f:
        for (number, text), is_last in _with_last(enumerate(f, start=1)):
            if not text.strip():
                continue
            try:
                fields = json.loads(text)
            except json.JSONDecodeError as err:
                if is_last and cut:  # its run: the one it names whole, or the file's
                    maybe_run = any_run or f'"{RUN_COLUMN}"' in text
                    yield Cut(number, _json_run(text) if maybe_run else named)
                    return
                raise TrackerImportError(
                    f"--import: {_where(file, number)}: not valid JSON ({err.msg}); expected one "
                    "JSON object per line"
                ) from None
            if not isinstance(fields, dict):
                raise TrackerImportError(
                    f"--import: {_where(file, number)}: a JSON {type(fields).__name__}; expected "
                    "one JSON object per line"
                )
            any_run = any_run or RUN_COLUMN in fields
            yield _row(fields, named, file, number, _json_value)


def _read(path: Path, suffix: str, rows: Any) -> list[TrackedRun]:
    points: dict[str, dict[str, list[tuple[int, float]]]] = {}
    damage: dict[str, Damage] = {}
    try:
        for file, named in _files(path, suffix):
            last: dict[str, int] = {}  # the last step of each run read from this file
            for item in rows(file, named):
                if isinstance(item, Cut):
                    _cut(file, item, last, damage)
                    continue
                run, step, values = item
                last[run] = max(step, last.get(run, step))
                series = points.setdefault(run, {})
                for metric, value in values.items():
                    series.setdefault(metric, []).append((step, value))
    except UnicodeDecodeError as err:
        raise TrackerImportError(
            f"--import: a file under {str(path)!r} is not UTF-8 ({err.reason}); expected UTF-8 text"
        ) from None
    return [
        TrackedRun(
            name=run,
            series={m: series_from_points(p) for m, p in sorted(points.get(run, {}).items())},
            damage=damage.get(run),
        )
        for run in sorted(points.keys() | damage.keys())
    ]


def _cut(file: Path, cut: Cut, last: dict[str, int], damage: dict[str, Damage]) -> None:
    """Record the cut last line of ``file`` as its run's damage; refuse the import when its
    run cannot be told."""
    problem = (
        f"ends mid-line: its last line, line {cut.line}, has no line end (cut while it was written)"
    )
    if cut.run is None:
        read = max(last.values(), default=None)
        raise damaged_source_error(
            Damage(str(file), problem, read), "the run of that line cannot be told"
        )
    damage.setdefault(cut.run, Damage(str(file), problem, last.get(cut.run)))


def read_csv(path: Path) -> list[TrackedRun]:
    """The runs of the CSV file ``path``, or of every ``*.csv`` under the folder ``path``."""
    return _read(path, ".csv", _csv_rows)


def read_jsonl(path: Path) -> list[TrackedRun]:
    """The runs of the JSON Lines file ``path``, or of every ``*.jsonl`` under the folder."""
    return _read(path, ".jsonl", _jsonl_rows)
