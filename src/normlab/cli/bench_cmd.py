"""``normlab bench``: norm kernels against their peers, as a fraction of copy bandwidth."""

from __future__ import annotations

import os
import shlex
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console

from normlab._resources import available_memory, check_fits, format_bytes
from normlab.bench import allocator
from normlab.bench.bytes_model import MODES, OPS
from normlab.bench.output import check_out_dir, measured, render_table, write_outputs
from normlab.bench.peers import known_peers
from normlab.bench.runner import (
    DIMS,
    LLC_MULTIPLE,
    MAX_LLC_MULTIPLE,
    Config,
    Result,
    Row,
    cache_bytes,
    check_device_available,
    rows_for,
    run,
)
from normlab.cli.app import app
from normlab.cli.errors import EXIT_FAILED, EXIT_REFUSED, exit_status_help, fail

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
QUICK_DIMS = (4096,)
QUICK_REPS = 3
QUICK_PEERS = ("torch", "normlab:auto")


def _split(text: str | None, name: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    if text is None:
        return []
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise typer.BadParameter(f"expected a comma-separated list, got {text!r}", param_hint=name)
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise typer.BadParameter(
                f"unknown {', '.join(bad)}; expected some of {', '.join(allowed)}",
                param_hint=name,
            )
    return items


def _dims(text: str | None) -> list[int]:
    dims = []
    for item in _split(text, "--dims"):
        if not item.isdigit() or int(item) < 1:
            raise typer.BadParameter(
                f"expected positive integers, got {item!r}", param_hint="--dims"
            )
        dims.append(int(item))
    return dims


def _bad_parameter(err: ValueError) -> typer.BadParameter:
    """A library error ``"field: message"`` as a CLI error naming the option ``--field``."""
    field, sep, message = str(err).partition(": ")
    if sep and field.isidentifier():
        return typer.BadParameter(message, param_hint=f"--{field.replace('_', '-')}")
    return typer.BadParameter(str(err))


def _refused(err: ValueError) -> typer.Exit:
    """A well-formed option the machine or the folder cannot serve (a CUDA device that is not
    there, sizes beyond its memory, an ``--out`` that cannot be written): exit 1, the message's
    ``field:`` (``dims/rows:``) spelled as the options."""
    field, sep, message = str(err).partition(": ")
    names = field.split("/")
    if sep and all(name.isidentifier() for name in names):
        options = "/".join(f"--{name.replace('_', '-')}" for name in names)
        return fail("bench", f"{options}: {message}", EXIT_REFUSED)
    return fail("bench", err, EXIT_REFUSED)


def _positive(value: int | None, name: str) -> None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"expected an integer >= 1, got {value}", param_hint=name)


def _busy_warning() -> str | None:
    """A note when other processes already load the CPUs (CPU figures then scatter)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load < 0.5 * cores:
        return None
    return (
        f"load average {load:.1f} on {cores} cores: other processes compete for the CPUs, so "
        "figures will scatter (copy-paired ratios and medians damp it; a quiet machine is best)"
    )


def _default_dtypes(device: str) -> list[str]:
    return ["fp32", "bf16", "fp16"] if device.startswith("cuda") else ["fp32", "bf16"]


def _config(
    ops: str | None,
    dims: str | None,
    dtypes: str | None,
    modes: str | None,
    peers: str | None,
    device: str,
    quick: bool,
    reps: int | None,
    rows: int | None,
    llc_multiple: float,
) -> Config:
    """The run's :class:`Config` from the options; errors name the option at fault."""
    dtype_names = _split(dtypes, "--dtypes", tuple(_DTYPES)) or _default_dtypes(device)
    peer_names = _split(peers, "--peers", tuple(known_peers()))
    try:
        return Config(
            ops=_split(ops, "--ops", OPS) or list(OPS),
            dims=_dims(dims) or list(QUICK_DIMS if quick else DIMS),
            dtypes=list(dict.fromkeys(_DTYPES[d] for d in dtype_names)),
            modes=_split(modes, "--modes", MODES) or list(MODES),
            peers=peer_names or (list(QUICK_PEERS) if quick else None),
            device=device,
            reps=reps or (QUICK_REPS if quick else 10),
            rows=rows,
            llc_multiple=llc_multiple,
            budget_s=2.0 if quick else 20.0,
            min_reps=1 if quick else 3,
        )
    except ValueError as err:
        raise _bad_parameter(err) from None


BENCH_COPIES = 8
"""Tensors of one problem's size a measurement holds at once (input, output, gradients, the
peers' copies), for :func:`check_bench_memory`."""


def check_bench_memory(config: Config) -> None:
    """Raise ``ValueError`` naming ``--dims``/``--rows`` if the largest problem (rows × D values
    of the widest dtype, :data:`BENCH_COPIES` times) cannot fit in the device's memory."""
    device = check_device_available(config.device)
    if device.type == "cuda":
        available = torch.cuda.get_device_properties(device).total_memory
    else:
        available = available_memory()
    llc = cache_bytes(device)
    for dim in config.dims:
        for dtype in config.dtypes:
            rows = config.rows or rows_for(dim, dtype, llc, config.llc_multiple)
            needed = BENCH_COPIES * rows * dim * dtype.itemsize
            check_fits(
                needed,
                available,
                f"dims/rows: a problem of {rows:,} rows × D = {dim:,} ({dtype}, "
                f"{format_bytes(rows * dim * dtype.itemsize)} per tensor)",
                f"on {device}",
                "use a smaller --dims or --rows",
            )


BENCH_HELP = (
    "Time norms against PyTorch and other kernels, as a fraction of copy bandwidth."
    "\n\n"
    + exit_status_help(
        ok="when rows were measured",
        refused="when the device is not there, the sizes do not fit in its memory, or --out "
        "cannot be written (nothing is measured)",
        usage="for a bad option (nothing is measured)",
        failed="when no row was measured (every peer skipped or failed; the files say why)",
        interrupted="when interrupted (Ctrl-C)",
    )
)
"""The help of ``normlab bench``: one line per paragraph (Typer rewraps each)."""


@app.command(help=BENCH_HELP)
def bench(
    ops: Annotated[
        str | None, typer.Option(help=f"Ops, comma-separated: {', '.join(OPS)}.")
    ] = None,
    dims: Annotated[
        str | None,
        typer.Option(help="Feature sizes D, comma-separated (default 768,2048,4096,8192)."),
    ] = None,
    dtypes: Annotated[
        str | None, typer.Option(help="fp32, bf16, fp16 (default fp32,bf16; fp16 too on GPU).")
    ] = None,
    modes: Annotated[str | None, typer.Option(help="fwd, fwd+bwd (default both).")] = None,
    peers: Annotated[
        str | None,
        typer.Option(
            "--peers",
            "--backends",
            help="Peers, comma-separated: torch, eager, torch.compile, normlab:auto, "
            "normlab:<backend>, liger, flash_attn, apex, transformer_engine, quack "
            "(default: all available).",
        ),
    ] = None,
    reps: Annotated[
        int | None, typer.Option(help="Timed repetitions per row (default 10).")
    ] = None,
    out: Annotated[Path, typer.Option(help="Folder for bench.csv, bench.json, bench.png.")] = Path(
        "bench-out"
    ),
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = "cpu",
    quick: Annotated[
        bool,
        typer.Option(help=f"D={QUICK_DIMS[0]}, {QUICK_REPS} reps, peers torch and normlab:auto."),
    ] = False,
    rows: Annotated[
        int | None,
        typer.Option(help="Rows per problem (default: sized to 4x the last-level cache)."),
    ] = None,
    llc_multiple: Annotated[
        float,
        typer.Option(
            help="Problem size as a multiple of the last-level cache "
            f"(> 0, at most {MAX_LLC_MULTIPLE:g})."
        ),
    ] = LLC_MULTIPLE,
    threads: Annotated[
        int | None, typer.Option(help="torch.set_num_threads (default: torch's).")
    ] = None,
    allocator_mode: Annotated[
        str,
        typer.Option(
            "--allocator",
            help="When glibc malloc lacks the MALLOC_* settings: reexec (restart with them), "
            "warn, or ignore.",
        ),
    ] = "reexec",
) -> None:
    """``normlab bench`` (help: :data:`BENCH_HELP`)."""
    config = _checked_config(
        ops,
        dims,
        dtypes,
        modes,
        peers,
        device,
        quick,
        reps,
        rows,
        llc_multiple,
        threads,
        out,
        allocator_mode,
    )  # every option checked here, before any measurement (or restart)
    console = Console()
    if not console.is_terminal:  # a log file gets the whole table, not an 80-column squeeze
        console = Console(width=160)
    # warnings go to standard error, one line each, so a script can keep the results apart
    _prepare_machine(Console(stderr=True, soft_wrap=True), config, device, allocator_mode, threads)
    result = run(config, progress=partial(_print_row, console))
    render_table(result, console)
    _write_results(console, result, out)


def _checked_config(
    ops: str | None,
    dims: str | None,
    dtypes: str | None,
    modes: str | None,
    peers: str | None,
    device: str,
    quick: bool,
    reps: int | None,
    rows: int | None,
    llc_multiple: float,
    threads: int | None,
    out: Path,
    allocator_mode: str,
) -> Config:
    """The bench's config from its options, each checked (device, memory and --out included):
    ``typer.BadParameter`` naming the option at the first that is wrong as written (exit 2),
    then exit 1 (:func:`_refused`) when the machine or ``--out`` cannot serve it."""
    if allocator_mode not in ("reexec", "warn", "ignore"):
        raise typer.BadParameter(
            f"expected reexec, warn or ignore, got {allocator_mode!r}", param_hint="--allocator"
        )
    _positive(threads, "--threads")
    _positive(reps, "--reps")
    _positive(rows, "--rows")
    config = _config(ops, dims, dtypes, modes, peers, device, quick, reps, rows, llc_multiple)
    try:  # well formed (checked above); can this machine and --out serve it?
        check_device_available(device)
        check_bench_memory(config)
        check_out_dir(out)
    except ValueError as err:
        raise _refused(err) from None
    return config


def _prepare_machine(
    console: Console, config: Config, device: str, allocator_mode: str, threads: int | None
) -> None:
    """Before timing: restart with the allocator settings (or warn without them), warn about
    too few repetitions and a busy machine, and set torch's threads."""
    if not device.startswith("cuda") and allocator_mode != "ignore":
        message = allocator.warning_text()
        if message and allocator_mode == "reexec" and allocator.can_reexec():
            console.print(f"[yellow]restarting with {allocator.settings_line()}[/yellow]")
            allocator.reexec_with_settings()
        if message:
            console.print(f"[yellow]warning:[/yellow] {message}")
    if config.reps < 3:
        console.print(
            f"[yellow]warning:[/yellow] --reps {config.reps}: with fewer than 3 repetitions the "
            "median fraction of copy rests on one or two paired ratios and can disagree widely "
            "with the GB/s and copy columns; use 3 or more"
        )
    busy = _busy_warning()
    if busy:
        console.print(f"[yellow]warning:[/yellow] {busy}")
    if threads is not None:
        torch.set_num_threads(threads)


def _print_row(console: Console, row: Row) -> None:
    """One measured row as it comes: its fraction of copy and time, or why it has none."""
    detail = (
        f"{row.frac_copy:.2f} of copy, {row.median_ms:.2f} ms"
        if row.status == "ok" and row.frac_copy is not None
        else f"{row.status} {row.note}"
    )
    console.print(
        f"  {row.op:<8} {row.dtype:<9} D={row.dim:<5} {row.mode:<8} {row.peer:<22} {detail}",
        highlight=False,
    )


def _write_results(console: Console, result: Result, out: Path) -> None:
    """Write the result's files into ``out``; exit :data:`EXIT_FAILED` when no row was
    measured."""
    command = shlex.join(["normlab", *sys.argv[1:]])
    written = write_outputs(result, out, command=command)
    if written.paths:
        console.print("wrote " + ", ".join(str(p) for p in written.paths.values()))
    for note in written.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if not measured(result):
        raise fail(
            "bench",
            "no row was measured: every peer was skipped or failed (the status column says why)",
            EXIT_FAILED,
        )
