"""``normlab explain``: a learner's view of LayerNorm and RMSNorm on one vector."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from normlab.cli.app import app
from normlab.cli.errors import exit_status_help
from normlab.explain import Explanation, explain_vector

EXPLAIN_HELP = (
    "Show μ, σ², m, RMS and the LayerNorm and RMSNorm x̂ of one vector, side by side."
    "\n\n" + exit_status_help(ok="when shown", usage="for a value or an option it does not take")
)
"""The help of ``normlab explain``: one line per paragraph (Typer rewraps each)."""


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _effect(unchanged: bool, flipped: bool) -> str:
    return "unchanged" if unchanged else ("sign flipped" if flipped else "changed")


def _render(e: Explanation, console: Console) -> None:
    stats = Table(title=f"Statistics of x = {_fmt(e.x)}  (ε = {e.eps:g})")
    stats.add_column("statistic")
    stats.add_column("formula")
    stats.add_column("value", justify="right")
    stats.add_row("μ", "mean(x)", f"{e.mean:.6g}")
    stats.add_row("σ²", "mean((x − μ)²), biased", f"{e.variance:.6g}")
    stats.add_row("m", "mean(x²)", f"{e.mean_square:.6g}")
    stats.add_row("RMS", "sqrt(m)", f"{e.rms:.6g}")
    console.print(stats)

    hats = Table(
        title="Normalised vectors x̂",
        caption="LayerNorm x̂ = (x − μ)·rsqrt(σ² + ε);  RMSNorm x̂ = x·rsqrt(m + ε)",
    )
    hats.add_column("i", justify="right")
    hats.add_column("x", justify="right")
    hats.add_column("LayerNorm x̂", justify="right")
    hats.add_column("RMSNorm x̂", justify="right")
    for i, (xi, li, ri) in enumerate(zip(e.x, e.layer_norm_hat, e.rms_norm_hat, strict=True)):
        hats.add_row(str(i), f"{xi:.6g}", f"{li:.6f}", f"{ri:.6f}")
    hats.add_section()
    hats.add_row("", "mean(x̂)", f"{e.layer_norm_hat_mean:.6f}", f"{e.rms_norm_hat_mean:.6f}")
    hats.add_row(
        "", "mean(x̂²)", f"{e.layer_norm_hat_mean_square:.6f}", f"{e.rms_norm_hat_mean_square:.6f}"
    )
    console.print(hats)

    inv = Table(title="Invariances: what a transform of x does to x̂")
    inv.add_column("transform")
    inv.add_column("LayerNorm x̂")
    inv.add_column("RMSNorm x̂")
    for t in e.transforms:
        ln_word = _effect(t.layer_norm_unchanged, t.layer_norm_flipped)
        rms_word = _effect(t.rms_norm_unchanged, t.rms_norm_flipped)
        inv.add_row(
            t.name, f"{ln_word} {_fmt(t.layer_norm_hat)}", f"{rms_word} {_fmt(t.rms_norm_hat)}"
        )
    console.print(inv)
    console.print(
        "LayerNorm centres then scales: x̂ has mean 0 and variance ≈ 1, unchanged by adding a "
        "constant.\nRMSNorm only scales: mean(x̂²) ≈ 1, unchanged by c > 0, sign-flipped by "
        "c < 0, changed by a shift."
    )


# ignore_unknown_options: a negative number such as -1 is a value of x, not an unknown option.
@app.command(help=EXPLAIN_HELP, context_settings={"ignore_unknown_options": True})
def explain(
    values: Annotated[list[float], typer.Argument(help="The vector x, e.g. 1 2 3 4.")],
    eps: Annotated[float, typer.Option(help="ε, added inside the square root.")] = 1e-5,
    scale: Annotated[float, typer.Option(help="c in the x → c·x invariance check.")] = 3.0,
    shift: Annotated[float, typer.Option(help="a in the x → x + a invariance check.")] = 1.0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON instead of tables (a statistic beyond float64's range, such as σ² "
            "of 1e200 -1e200, as null).",
        ),
    ] = False,
) -> None:
    """``normlab explain`` (help: :data:`EXPLAIN_HELP`)."""
    # computed exactly, then rounded (normlab.explain): any finite x gives the right x̂
    try:
        e = explain_vector(values, eps=eps, scale=scale, shift=shift)
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(str(err)) from err
    if as_json:
        typer.echo(e.to_json())
    else:
        _render(e, Console())
