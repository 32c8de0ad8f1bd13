"""Read W&B run folders (``wandb/offline-run-*/``) with W&B's own reader.

W&B keeps a run in a transaction log, ``run-<id>.wandb`` (protobuf records in LevelDB's log
framing). From wandb 0.31 its Python SDK no longer carries a reader for that file; the reader is
wandb's own core binary (``wandb.util.get_core_path()``), which ``wandb leet inspect --json
FILE`` runs to print every record as one JSON object per line. This module runs that core
command directly, with the arguments ``wandb leet inspect`` gives it for an offline read
(``leet inspect --json --no-observability --run-file FILE WANDB_DIR``: nothing leaves the
machine), once per run, and reads its records:

- ``run``: the run's name (``display_name``; its id when it has none) and its config;
- ``config``: later config updates (``run.config.update``);
- ``history``: one logged step (``step.num``): every numeric value whose key does not start
  with ``_`` (W&B's own ``_step``, ``_runtime``, ``_timestamp``); nested keys come as W&B
  flattens them (``val.loss``); W&B writes non-finite numbers as the strings ``NaN``,
  ``Infinity`` and ``-Infinity``;
- ``exit``: the exit code (non-zero: the run failed; no exit record: it has not ended).

wandb's reader reads a log that is cut mid-record (a run killed while writing, or still
running) or holds a record that fails its checksum up to the damage, exits 0 and says so on its
standard error ("an incomplete .wandb file", "skipped corrupt data"): that line makes the run's
:class:`~normlab.trackers.tracked.Damage`, with the last step read before it. A log it cannot
read at all (not a ``.wandb`` file) refuses the import, naming the file.

PATH is a ``.wandb`` file, a run folder, or any folder: every ``run-*.wandb`` under it (W&B's
``latest-run`` link is not followed). The config's values are fields for ``--arm-from`` /
``--seed-from`` rules (``config:KEY``, nested keys joined with ``.``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from normlab.trackers.tracked import (
    ENDED,
    EXTRA,
    FAILED,
    RUNNING,
    Damage,
    TrackedRun,
    TrackerImportError,
    number,
    require,
    series_from_points,
)

__all__ = ["read_wandb", "wandb_logs"]

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_ENV = {"WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false", "WANDB_SILENT": "true"}
"""W&B kept offline, without its own error reports, while it reads."""
_TIMEOUT_S = 300.0
_DAMAGE_WORDS = ("incomplete", "corrupt")
"""Words of the line wandb's reader prints on its standard error when a log is cut or damaged."""


def wandb_logs(path: Path) -> list[Path]:
    """The ``run-*.wandb`` files of ``path`` (the file itself when it is one), sorted; links to
    folders are not followed (W&B's ``latest-run`` would count a run twice)."""
    if path.is_file():
        return [path]
    found = []
    for folder, dirs, files in os.walk(path, followlinks=False):
        dirs.sort()
        found += [Path(folder) / f for f in files if f.startswith("run-") and f.endswith(".wandb")]
    return sorted(found)


def _core() -> str:
    """The path of wandb's core binary; :class:`TrackerImportError` naming ``--import`` when
    wandb or its core is missing."""
    util = require("wandb.util", "wandb")
    try:
        return str(util.get_core_path())
    except Exception as err:  # WandbCoreNotAvailableError, or an older wandb without a core
        raise TrackerImportError(
            f"--import: wandb's core binary, which reads .wandb files, is not available ({err}); "
            f'expected wandb 0.31 or newer: pip install "normlab[{EXTRA}]"'
        ) from None


def _records(core: str, log: Path, cwd: str) -> tuple[list[dict[str, Any]], str | None]:
    """The records of one ``.wandb`` file as wandb's core prints them, and the line in which
    it says the file is cut or damaged (None when it read the file whole)."""
    command = [
        core, "leet", "inspect", "--json", "--no-observability",
        "--run-file", str(log), str(log.parent.parent),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            cwd=cwd,
            env={**os.environ, **_ENV},
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise TrackerImportError(
            f"--import: wandb took over {_TIMEOUT_S:g} s to read {str(log)!r}; expected a "
            "readable .wandb file"
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        last = said[-1] if said else f"exit status {done.returncode}"
        raise TrackerImportError(
            f"--import: wandb could not read {str(log)!r} ({last}); expected a .wandb file and "
            "wandb 0.31 or newer (its core prints a run's records: wandb leet inspect --json)"
        )
    records = []
    for line in done.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            records.append(json.loads(line))
    said = [line.strip() for line in done.stderr.splitlines()]
    damaged = [line for line in said if any(w in line.lower() for w in _DAMAGE_WORDS)]
    return records, damaged[0] if damaged else None


def _flat(prefix: str, value: Any, into: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), inner, into)
    elif not prefix.startswith("_"):
        into[prefix] = value if isinstance(value, str) else json.dumps(value)


def _value(raw: Any) -> float | None:
    if isinstance(raw, str):
        return _NON_FINITE.get(raw)
    return number(raw)


def _run(log: Path, records: list[dict[str, Any]], damaged: str | None = None) -> TrackedRun:
    """The run of one ``.wandb`` file from its records; ``damaged``: wandb's line saying the
    file is cut or damaged (the run's :class:`Damage`)."""
    name, config, status, note = None, {}, RUNNING, "its W&B log has no exit record"
    points: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        kind = record.get("type")
        body = record.get(kind) if isinstance(kind, str) else None
        if not isinstance(body, dict):
            continue
        if kind == "run":
            name = body.get("display_name") or body.get("run_id")
            _flat("", (body.get("config") or {}).get("update") or {}, config)
        elif kind == "config":
            _flat("", body.get("update") or {}, config)
        elif kind == "history":
            item = body.get("item") or {}
            step = (body.get("step") or {}).get("num", item.get("_step", 0))
            for key, raw in item.items():
                value = _value(raw)
                if not key.startswith("_") and value is not None:
                    points.setdefault(key, []).append((int(step), value))
        elif kind == "exit":
            code = int(body.get("exit_code", 0))
            status, note = (ENDED, "") if code == 0 else (FAILED, f"W&B recorded exit code {code}")
    damage = None
    if damaged is not None:
        steps = [step for p in points.values() for step, _ in p]
        said = damaged.split(": ", 1)[-1] if damaged.startswith("wandb") else damaged
        damage = Damage(
            str(log), f"is cut short or damaged (wandb: {said})", max(steps, default=None)
        )
    return TrackedRun(
        name=str(name or log.stem.removeprefix("run-")),
        series={key: series_from_points(p) for key, p in sorted(points.items())},
        fields={f"config:{k}": v for k, v in config.items()},
        status=status,
        status_note=note,
        damage=damage,
    )


def read_wandb(path: Path) -> list[TrackedRun]:
    """The runs of the W&B run folders under ``path`` (or of the one ``.wandb`` file), sorted by
    name."""
    logs = wandb_logs(path)
    if not logs:
        return []
    core = _core()
    with tempfile.TemporaryDirectory(prefix="normlab-wandb-") as cwd:  # wandb writes nothing here
        runs = [_run(log, *_records(core, log, cwd)) for log in logs]
    return sorted(runs, key=lambda r: r.name)
