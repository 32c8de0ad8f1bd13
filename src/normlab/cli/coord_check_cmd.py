"""``normlab coord-check``: μP's coordinate check on the GPT testbed, as a table and a figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from normlab._io import write_bytes_atomic, write_json_atomic
from normlab.cli.app import app
from normlab.cli.errors import (
    EXIT_FAILED,
    EXIT_REFUSED,
    EXIT_USAGE,
    check_utf8_path,
    exit_status_help,
    fail,
)
from normlab.models.config import GPTConfig
from normlab.models.coord_check import FLAT_SLOPE, CoordCheck, coord_check

LADDER_KEY = "d_model"
JSON_FILE = "coord_check.json"
PNG_FILE = "coord_check.png"
MAX_TABLE_STEPS = 10
COORD_CHECK_HELP = (
    "Train the GPT testbed a few Adam steps at each width (same seeds, same batches) and show "
    "how the size of every layer's activations (mean |x|) scales with the width: a table of "
    "the log-log slopes and a figure.\n\n"
    + exit_status_help(
        ok=f"when done (for mup: flat, every layer's slope of log size against log width within "
        f"±{FLAT_SLOPE:g} after the first step, the logits allowed to shrink)",
        refused="when --out is not a folder or its path is not UTF-8 (nothing is written)",
        usage="for a bad option (nothing is written)",
        failed="when mup is asked and the sizes are not flat",
        interrupted="when interrupted (Ctrl-C)",
    )
)


class OptionError(ValueError):
    """A bad option value; the message starts with the option's name."""


def parse_ladder(text: str) -> list[int]:
    """``"d_model=32,64,128"`` → [32, 64, 128]: at least two distinct integer widths of the one
    key the coordinate check scales (μP here is width-wise). Raises :class:`OptionError`."""
    key, sep, values = text.partition("=")
    if not sep:
        raise OptionError(
            f"--ladder: expected {LADDER_KEY}=v1,v2,… (e.g. d_model=32,64,128), got {text!r}"
        )
    if key.strip() != LADDER_KEY:
        raise OptionError(
            f"--ladder: the coordinate check scales the width only; expected the key "
            f"{LADDER_KEY}, got {key.strip()!r}"
        )
    items = [v.strip() for v in values.split(",") if v.strip()]
    widths = []
    for item in items:
        try:
            widths.append(int(item))
        except ValueError:
            raise OptionError(
                f"--ladder: {LADDER_KEY} values must be integers, got {item!r}"
            ) from None
    if len(set(widths)) != len(widths):
        raise OptionError(f"--ladder: each width once, got {widths}")
    if len(widths) < 2:
        raise OptionError(
            f"--ladder: expected at least two widths (a slope needs two rungs), got {widths}"
        )
    return sorted(widths)


def rung_settings(
    widths: list[int],
    parametrization: str,
    base_d_model: int | None,
    n_layers: int,
    n_heads: int,
) -> GPTConfig:
    """The settings of the smallest rung, after checking that every rung is a valid model;
    ``base_d_model`` defaults to the smallest width. Raises :class:`OptionError`."""
    base = widths[0] if base_d_model is None else base_d_model
    built = []
    for width in widths:
        try:
            built.append(
                GPTConfig(
                    d_model=width,
                    n_layers=n_layers,
                    n_heads=n_heads,
                    parametrization=parametrization,
                    base_d_model=base,
                )
            )
        except ValueError as err:
            message = " ".join(str(err).split())
            if message.startswith("base_d_model"):
                raise OptionError(f"--{message.replace('_', '-', 2)}") from None
            raise OptionError(f"--ladder: {LADDER_KEY}={width}: {message}") from None
    return built[0]


def _shown_steps(steps: int) -> list[int]:
    """0-based steps shown as columns: all, or about :data:`MAX_TABLE_STEPS` evenly spaced and
    the last."""
    if steps <= MAX_TABLE_STEPS:
        return list(range(steps))
    stride = -(-steps // MAX_TABLE_STEPS)
    return sorted({*range(0, steps, stride), steps - 1})


def _tables(result: CoordCheck) -> tuple[Table, Table]:
    """The slopes per layer and step, and the sizes per layer and width at the last step."""
    steps = _shown_steps(result.steps)
    slopes = Table(
        title=f"Slope of log mean|x| vs log d_model ({result.parametrization}), by step",
        caption=f"flat: every |slope| after step 1 ≤ {result.threshold:g} (step 1: init); "
        "the logits may shrink",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    slopes.add_column("layer")
    for t in steps:
        slopes.add_column(f"{t + 1}", justify="right")
    for layer in result.layers:
        row = result.slopes[layer]
        cells = []
        for t in steps:
            bad = result.judged(layer, t) and abs(row[t]) > result.threshold
            cells.append(f"[red]{row[t]:+.2f}[/]" if bad else f"{row[t]:+.2f}")
        slopes.add_row(layer, *cells)
    sizes = Table(
        title=f"mean |x| at step {result.steps}, by d_model",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    sizes.add_column("layer")
    for width in result.widths:
        sizes.add_column(str(width), justify="right")
    for layer in result.layers:
        sizes.add_row(layer, *(f"{v:.3g}" for v in result.sizes[layer][-1]))
    return slopes, sizes


@app.command("coord-check", help=COORD_CHECK_HELP)
def coord_check_command(
    ladder: Annotated[
        str, typer.Option(help="The widths, as d_model=v1,v2,… (at least two), e.g. d_model=32,64.")
    ],
    parametrization: Annotated[
        Literal["mup", "sp"], typer.Option(help="mup (maximal update) or sp (standard).")
    ] = "mup",
    steps: Annotated[
        int, typer.Option(min=2, help="Adam steps; sizes are recorded at each (1 = init).")
    ] = 10,
    lr: Annotated[float, typer.Option(help="Adam learning rate (> 0).")] = 1e-2,
    batch_size: Annotated[int, typer.Option(min=1, help="Windows of 64 bytes per step.")] = 8,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds averaged (0, 1, …).")] = 2,
    base_d_model: Annotated[
        int | None, typer.Option(help="mup's base width (default: the smallest width).")
    ] = None,
    n_layers: Annotated[int, typer.Option(min=1, help="Transformer blocks.")] = 4,
    n_heads: Annotated[int, typer.Option(min=1, help="Attention heads (divide each width).")] = 4,
    out: Annotated[Path, typer.Option(help=f"Folder for {JSON_FILE} and {PNG_FILE}.")] = Path(
        "coord-check"
    ),
) -> None:
    """``normlab coord-check`` (help: :data:`COORD_CHECK_HELP`)."""
    console = Console()
    try:
        widths = parse_ladder(ladder)
        if not 0 < lr < math.inf:
            raise OptionError(f"--lr: expected a positive finite rate, got {lr!r}")
        settings = rung_settings(widths, parametrization, base_d_model, n_layers, n_heads)
    except ValueError as err:
        raise fail("coord-check", err, EXIT_USAGE) from None
    try:  # a well-formed --out that cannot be used
        check_utf8_path(out, "--out")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out: {str(out)!r} exists and is not a folder; expected a folder")
    except ValueError as err:
        raise fail("coord-check", err, EXIT_REFUSED) from None
    result = coord_check(
        settings, widths, steps=steps, lr=lr, batch_size=batch_size, seeds=range(seeds)
    )
    data = result.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / JSON_FILE, data)
    from normlab.report.coord_check import plot_coord_check

    write_bytes_atomic(out / PNG_FILE, plot_coord_check(data))
    for table in _tables(result):
        console.print(table)
    layer, step, slope = result.worst
    word = "flat" if result.flat else "not flat"
    console.print(
        f"{parametrization}: {word}: the largest |slope| after step 1 is {slope:+.2f} "
        f"({layer}, step {step}); flat means within ±{FLAT_SLOPE:g} (the logits may shrink)",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"wrote {out / JSON_FILE} and {out / PNG_FILE}", highlight=False, soft_wrap=True)
    if parametrization == "mup" and not result.flat:
        raise typer.Exit(EXIT_FAILED)
