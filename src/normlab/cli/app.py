"""The ``normlab`` Typer application; each subcommand lives in its own module."""

from typing import Annotated

import typer

from normlab.cli.errors import OneLineErrors

app = typer.Typer(
    name="normlab",
    cls=OneLineErrors,  # every usage error: one line on standard error
    help="Normalization layers done right: explain, compare, bench and audit norms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    """Print ``normlab <version>`` and exit 0 when ``--version`` is given."""
    if value:
        from normlab._version import __version__

        typer.echo(f"normlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print normlab's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """normlab: exact norms, fused kernels, controlled comparisons and audits."""
