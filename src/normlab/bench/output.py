"""Benchmark output: a rich table on the terminal; CSV, JSON and a PNG chart on disk.

The three files are written as one set (:func:`write_outputs`): each is first written in full
to a hidden staging file (atomically, :mod:`normlab._io`), and only once all are staged are they
renamed into place; a chart that cannot be drawn removes an older ``bench.png`` rather than
leaving it beside new figures. A run that measured nothing replaces no earlier results.
Columns (CSV and the JSON ``rows``):

==================  ===========================================================================
op, dim, rows       the op (rms, layer, add_rms, ada_rms) and the [rows, dim] problem
dtype, mode         input dtype; ``fwd`` or ``fwd+bwd``
peer                the implementation (see :mod:`normlab.bench.peers`)
status, note        ``ok``, ``skipped`` (not available here, note says why) or ``error``
median_ms, min_ms   over the repetitions; one repetition is one forward (or forward + backward)
model_bytes         the minimum bytes the op moves (:mod:`normlab.bench.bytes_model`)
gbps                model_bytes / median time
copy_gbps           median bandwidth of the copies paired with the repetitions
frac_copy           median over repetitions of (achieved GB/s) / (paired copy GB/s)
frac_copy_best      (model bytes / fastest repetition) / (copy bytes / fastest copy): on a
                    shared machine, where noise only adds time, the least disturbed figure
speedup_vs_torch    torch's median time / this median time (same op, D, dtype, mode)
max_err             max |output − float64 reference| over sampled rows: y for ``fwd``, dx for
                    ``fwd+bwd``
reps                repetitions timed
==================  ===========================================================================
"""

from __future__ import annotations

import csv
import io
import math
import os
import platform
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from normlab._io import json_text, write_bytes_atomic
from normlab.bench.runner import COLUMNS, Result, Row

TARGETS = {"fwd": 0.85, "fwd+bwd": 0.75}  # fraction of copy bandwidth the fast path aims at


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}g}" if abs(value) < 1e-2 and value != 0 else f"{value:.{digits}f}"
    return str(value)


def render_table(result: Result, console: Console | None = None) -> None:
    """Print the rows grouped by op, dtype, D and mode."""
    console = console or Console()
    copy = _fmt(result.copy_gbps, 1)
    table = Table(
        title=f"normlab bench — {result.config.device}, copy ≈ {copy} GB/s",
        caption="frac copy: achieved / copy bandwidth in the same run (median of paired reps; "
        "best: fastest rep over fastest copy); "
        f"targets {TARGETS['fwd']} fwd, {TARGETS['fwd+bwd']} fwd+bwd",
    )
    for name, justify in (
        ("op", "left"),
        ("dtype", "left"),
        ("D", "right"),
        ("mode", "left"),
        ("peer", "left"),
        ("ms", "right"),
        ("GB/s", "right"),
        ("frac copy", "right"),
        ("best", "right"),
        ("× torch", "right"),
        ("max err", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    previous = None
    for r in result.rows:
        key = (r.op, r.dtype, r.dim, r.mode)
        if previous is not None and key != previous:
            table.add_section()
        previous = key
        if r.status != "ok":
            table.add_row(r.op, r.dtype, str(r.dim), r.mode, r.peer, r.status, *[""] * 5)
            continue
        frac = _fmt(r.frac_copy, 2)
        if r.peer.startswith("normlab") and r.frac_copy is not None:
            style = "green" if r.frac_copy >= TARGETS[r.mode] else "yellow"
            frac = f"[{style}]{frac}[/{style}]"
        table.add_row(
            r.op,
            r.dtype,
            str(r.dim),
            r.mode,
            r.peer,
            _fmt(r.median_ms, 2),
            _fmt(r.gbps, 1),
            frac,
            _fmt(r.frac_copy_best, 2),
            _fmt(r.speedup_vs_torch, 2),
            _fmt(r.max_err, 2),
        )
    console.print(table)


def csv_text(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in r.as_dict().items()})
    return buf.getvalue()


def metadata(result: Result, command: str | None = None) -> dict[str, Any]:
    """Where and how the figures were taken."""
    from normlab.bench.allocator import missing_settings

    cfg = result.config
    meta: dict[str, Any] = {
        "command": command,
        "device": cfg.device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "threads": torch.get_num_threads(),
        "llc_bytes": result.llc_bytes,
        "llc_multiple": cfg.llc_multiple,
        "copy_gbps_median": result.copy_gbps,
        "reps": cfg.reps,
        "seconds": result.seconds,
        "malloc_settings_missing": sorted(missing_settings()),
    }
    if cfg.device.startswith("cuda") and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return meta


def plot_png(result: Result) -> bytes | None:
    """Bars of the fraction of copy bandwidth: a panel per mode and dtype, a group per op and D.

    ``None`` when no row has a measured fraction (every peer skipped or failed): no chart.
    """
    rows = [r for r in result.rows if r.status == "ok" and r.frac_copy is not None]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r.mode, r.dtype) for r in rows))
    peers = list(dict.fromkeys(r.peer for r in rows))
    groups = list(dict.fromkeys((r.op, r.dim) for r in rows))
    width_in = min(24.0, max(8.0, 0.18 * len(groups) * max(1, len(peers))))
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 3.2 * len(panels)), squeeze=False)
    width = 0.8 / max(1, len(peers))
    for ax, (mode, dtype) in zip(axes[:, 0], panels, strict=True):
        for i, peer in enumerate(peers):
            values = {
                (r.op, r.dim): r.frac_copy
                for r in rows
                if r.mode == mode and r.dtype == dtype and r.peer == peer
            }
            xs = [g + (i - (len(peers) - 1) / 2) * width for g in range(len(groups))]
            ax.bar(xs, [values.get(g, 0.0) for g in groups], width, label=peer)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(TARGETS.get(mode, 1.0), color="tab:red", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{o}\nD={n}" for o, n in groups], fontsize=7)
        ax.set_ylabel("fraction of copy BW")
        ax.set_title(f"{dtype} {mode} (dashed: target {TARGETS.get(mode, 1.0)})", fontsize=9)
        ax.legend(fontsize=7, ncol=max(1, min(6, len(peers))))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


OUTPUT_NAMES = {"csv": "bench.csv", "json": "bench.json", "png": "bench.png"}


def measured(result: Result) -> bool:
    """Whether any row of ``result`` has a measurement (status ``ok``)."""
    return any(r.status == "ok" for r in result.rows)


def check_out_contents(out: Path) -> None:
    """Raise ``ValueError`` naming ``out`` if the existing folder ``out`` holds anything but the
    files a bench writes (:data:`OUTPUT_NAMES`, and their temporary names while being written):
    a bench never writes into someone else's folder (a source tree, a home folder)."""
    if not out.is_dir():
        return
    ours = set(OUTPUT_NAMES.values())
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if p.name not in ours
        and not any(p.name.startswith(f".{name}.") and p.name.endswith(".tmp") for name in ours)
    )
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise ValueError(
            f"out: {str(out)!r} is not empty and is not a bench folder: it holds {shown}{more}; "
            "expected --out to name a new or empty folder, or the folder of an earlier bench"
        )


def check_out_dir(out: str | os.PathLike[str]) -> Path:
    """Create ``out`` (a folder) if needed and make sure files can be written in it.

    Run before any measurement, so a bad ``--out`` costs nothing. Raises ``ValueError`` naming
    ``out`` when it is a file, holds files a bench did not write (:func:`check_out_contents`),
    cannot be created or is not writable.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {str(out)!r} exists and is not a folder; expected a folder path")
    check_out_contents(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".bench-write-test.{os.getpid()}.{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ValueError(
            f"out: cannot write into {str(out)!r} ({reason}); expected a writable folder path"
        ) from None
    return out


@dataclass
class Written:
    """What :func:`write_outputs` wrote: the paths by kind, and why a file is missing."""

    paths: dict[str, Path]
    notes: list[str] = field(default_factory=list)


def _json_text(result: Result, command: str | None) -> str:
    payload = {
        "meta": metadata(result, command),
        "columns": list(COLUMNS),
        "rows": [r.as_dict() for r in result.rows],
    }
    return json_text(payload)


def _chart(result: Result) -> tuple[bytes | None, str]:
    """The PNG, or None and why: a chart that fails to draw must not lose the figures."""
    try:
        png = plot_png(result)
    except Exception as err:  # matplotlib missing or failing: keep the CSV and JSON
        return None, f"drawing failed ({type(err).__name__}: {err})"[:300]
    if png is None:
        return None, "no row has a measured result (every peer skipped or failed)"
    return png, ""


def _stage(out: Path, files: dict[str, bytes]) -> dict[str, Path]:
    """Write each file in full to a hidden staging name in ``out``; returns kind → staged path."""
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    staged: dict[str, Path] = {}
    try:
        for kind, data in files.items():
            path = out / f".{OUTPUT_NAMES[kind]}.{token}.staged"
            staged[kind] = write_bytes_atomic(path, data)
    except BaseException:
        for path in staged.values():
            path.unlink(missing_ok=True)
        raise
    return staged


def write_outputs(result: Result, out: Path, command: str | None = None) -> Written:
    """Write bench.csv, bench.json and bench.png into ``out`` as one consistent set.

    Everything is rendered first, then staged, then renamed into place: an error while
    rendering or staging leaves the folder as it was, and each rename is atomic (a failure
    between two renames, which only the file system can cause, would leave a mixed set). With
    no chart to draw an older bench.png is removed. A run that measured nothing (every row
    skipped or failed) never replaces earlier results: when ``out`` already holds any of the
    three files, nothing is written and the note says so.
    """
    out = check_out_dir(out)
    notes: list[str] = []
    if not measured(result):
        earlier = [name for name in OUTPUT_NAMES.values() if (out / name).exists()]
        if earlier:
            return Written(
                paths={},
                notes=[
                    "nothing was measured (every row skipped or failed), so the earlier "
                    f"{', '.join(earlier)} in {str(out)!r} were left as they were"
                ],
            )
    files = {
        "csv": csv_text(result.rows).encode("utf-8"),
        "json": _json_text(result, command).encode("utf-8"),
    }
    png, why_no_chart = _chart(result)
    if png is None:
        notes.append(f"no chart: {why_no_chart}")
    else:
        files["png"] = png
    staged = _stage(out, files)
    paths = {kind: out / OUTPUT_NAMES[kind] for kind in staged}
    try:
        for kind, path in staged.items():
            os.replace(path, paths[kind])
    finally:
        for path in staged.values():  # left over only if a rename failed
            path.unlink(missing_ok=True)
    if png is None:
        (out / OUTPUT_NAMES["png"]).unlink(missing_ok=True)
    return Written(paths=paths, notes=notes)
