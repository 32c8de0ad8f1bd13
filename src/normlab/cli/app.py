"""The ``normlab`` Typer application; each subcommand lives in its own module."""

import typer

app = typer.Typer(
    name="normlab",
    help="Normalization layers done right: explain, compare, bench and audit norms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """normlab: exact norms, fused kernels, controlled comparisons and audits."""
