"""``normlab audit``: what a norm implementation computes, and where a model's norms sit.

``audit norm TARGET``: a registered kind or ``package.module:Name``. ``audit model TARGET``:
``gpt`` (the GPT testbed; ``--norm`` an unconditional kind or ``none``, ``--placement`` pre, post
or sandwich), ``dit`` (the small DiT for flow matching; ``--norm`` a conditional kind,
``adaln_zero`` or ``adarms``; pre placement only), ``hf:<folder or model_type>`` (a transformers
causal LM from its config, ``--model-set`` overrides; ``--norm`` an unconditional kind puts it
in every norm slot, as ``compare --model`` does; default: the model's own norms) or
``package.module:factory`` returning ``(model, example_inputs)``.

Exit statuses (:data:`normlab.cli.errors.EXIT_STATUSES`): ``audit norm`` exits 0 when the
verdict is ``ok`` or ``note`` and :data:`~normlab.cli.errors.EXIT_FAILED` (3) when it is
``defect`` (so that a CI job can fail on it); both commands exit 2 when TARGET or an option is
refused as written, and 1 when what they name cannot be used (a model folder that is not there,
probes or a model too large for the machine's memory). ``audit model`` places norms and judges
none.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from normlab._resources import DoesNotFitError, check_fits_memory
from normlab.audit import NormAudit, audit_model, audit_norm
from normlab.audit.findings import DEFECT, figure
from normlab.cli.app import app
from normlab.cli.audit_targets import (
    DEFAULT_NORMS,
    TESTBEDS,
    check_dim,
    check_testbed_options,
    is_source_target,
    load_model,
    load_norm,
    source_model,
)
from normlab.cli.errors import EXIT_FAILED, EXIT_REFUSED, exit_status_help, fail, is_usage_error
from normlab.patching import replace_norms

if TYPE_CHECKING:
    from torch import nn

    from normlab.audit.model import ModelAudit


def _bad_parameter(err: Exception, params: dict[str, str]) -> typer.BadParameter:
    """A library error ``"name: message"`` as a CLI error naming the argument at fault.

    ``params`` maps the names an error may start with to their command-line spelling; any other
    error is about the target (TARGET).
    """
    name, sep, message = str(err).partition(": ")
    if sep and name in params:
        return typer.BadParameter(message, param_hint=params[name])
    if sep and name == "target":
        return typer.BadParameter(message, param_hint="TARGET")
    return typer.BadParameter(str(err), param_hint="TARGET")


audit_app = typer.Typer(help="Probe a norm or a model as a black box.", no_args_is_help=True)
app.add_typer(audit_app, name="audit")


AUDIT_BYTES_PER_DIM = 256 * 8 * 4
"""Memory of the probes per unit of D: their largest batch is 256 rows, held in float64 in a
few copies (see :mod:`normlab.audit.probe`)."""

AUDIT_NORM_HELP = (
    "Say what a norm computes: centring, statistic, ε and where it sits, gain form, precision."
    "\n\n"
    "Prints the verdict, then defects and notes with their error and tolerance, then the table."
    "\n\n"
    + exit_status_help(
        ok="when the verdict is ok or note",
        refused="when the probes at --dim do not fit in the machine's memory",
        usage="when TARGET or an option is refused",
        failed="when the verdict is defect",
    )
)
"""The help of ``normlab audit norm``: one line per paragraph (Typer rewraps each)."""
AUDIT_MODEL_HELP = (
    "Find a model's norms: where each sits (pre/post/sandwich, final) and its conditioning."
    "\n\n"
    + exit_status_help(
        ok="when the norms are placed",
        refused="when an hf: folder cannot be read or the model does not fit in the machine's "
        "memory",
        usage="when TARGET or an option is refused",
    )
)
"""The help of ``normlab audit model``."""


@audit_app.command("norm", help=AUDIT_NORM_HELP)
def audit_norm_cmd(
    target: Annotated[
        str,
        typer.Argument(
            help="A registered kind (rmsnorm, layernorm, dyt, …) or 'package.module:Name'."
        ),
    ],
    dim: Annotated[int, typer.Option(help="Vector size D used by the probes (even).")] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """``normlab audit norm`` (help: :data:`AUDIT_NORM_HELP`)."""
    try:
        check_dim(dim)
    except ValueError as err:
        raise _bad_parameter(err, {"dim": "--dim"}) from None
    try:
        check_fits_memory(
            AUDIT_BYTES_PER_DIM * dim,
            f"--dim: the probes at D = {dim:,}",
            "use a smaller --dim",
        )
    except DoesNotFitError as err:  # the machine's limit, not the option's spelling
        raise fail("audit norm", err, EXIT_REFUSED) from None
    try:
        fn, weight = load_norm(target, dim)
        result = audit_norm(fn, dim, target=target, weight=weight)
    except (TypeError, ValueError) as err:
        raise _bad_parameter(err, {}) from err
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        _show_norm(result, target, dim)
    if result.severity == DEFECT:
        raise typer.Exit(EXIT_FAILED)


def _show_norm(result: NormAudit, target: str, dim: int) -> None:
    """Print a norm audit: the verdict, defects and notes, the table, then what passed."""
    console = Console()
    for line in _verdict_lines(result):
        typer.echo(line)
    console.print(_norm_table(result, target, dim))
    for finding in result.findings:  # what passed, with the tolerance each was held to
        if finding.severity == "ok":
            typer.echo(finding.line())
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def _verdict_lines(result: NormAudit) -> list[str]:
    """The verdict, then every defect and note (defects first), one line each."""
    counts = {s: sum(f.severity == s for f in result.findings) for s in ("defect", "note")}
    parts = [f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n]
    head = f"verdict: {result.severity}" + (f" ({', '.join(parts)})" if parts else "")
    return [head] + [f.line() for f in result.findings if f.severity != "ok"]


def _norm_table(result: NormAudit, target: str, dim: int) -> Table:
    table = Table(title=f"What {target} computes (D = {dim})", show_header=False)
    table.add_column("property", style="bold")
    table.add_column("finding")
    if result.normalizes:
        normalises = "yes"
    elif result.statistic.startswith("withheld"):
        normalises = "not determined"
    else:
        normalises = "no"
    eps = "not detected" if result.eps is None else f"{result.eps:.3g}"
    rows = [
        ("normalises", normalises),
        ("centring (subtracts the mean)", "yes" if result.centering else "no"),
        ("statistic", result.statistic),
        ("ε", eps),
        ("ε placement", result.eps_placement),
        ("gain", result.gain_form),
        ("bias / shift", "yes" if result.has_bias else "none detected (zero)"),
        *[(f"precision ({k})", v) for k, v in result.stats_precision.items()],
    ]
    if result.casting:
        rows.append(("16-bit casting", result.casting))
    if result.max_rel_error is not None:
        stat = next((f for f in result.findings if f.probe == "statistic"), None)
        tol = f" (tolerance {figure(stat.tolerance)})" if stat and stat.tolerance else ""
        fit = f"relative error {figure(result.max_rel_error)}{tol}"
        rows.append(("fit of the statistic", fit))
    if result.tolerance is not None:
        works = result.working_dtype or result.probe_dtype
        rows.append(
            (
                "probes",
                f"{result.probe_dtype} input, outputs carry {works} precision: output "
                f"tolerance {figure(result.tolerance)} (2u + 4·eps32·sqrt(D))",
            )
        )
    for k, v in rows:
        table.add_row(k, v)
    return table


@audit_app.command("model", help=AUDIT_MODEL_HELP)
def audit_model_cmd(
    target: Annotated[
        str,
        typer.Argument(
            help="'gpt' (normlab's GPT testbed), 'dit' (its small DiT for flow matching), "
            "'hf:<folder or model_type>' (a transformers causal LM from its config) or "
            "'package.module:factory' returning (model, example_inputs)."
        ),
    ] = "gpt",
    norm: Annotated[
        str | None,
        typer.Option(
            help="Norm kind of the testbed: for gpt an unconditional kind (layernorm, rmsnorm, "
            "dyt, none, …; default layernorm), for dit a conditional kind (adaln_zero, adarms; "
            "default adaln_zero).",
            show_default=False,
        ),
    ] = None,
    placement: Annotated[
        str | None,
        typer.Option(
            help="Placement of the testbed: for gpt pre, post or sandwich; dit is pre only. "
            "Default pre.",
            show_default=False,
        ),
    ] = None,
    model_set: Annotated[
        str | None,
        typer.Option(
            "--model-set",
            help="hf: targets: comma list of key=value config overrides (e.g. "
            "hidden_size=128,num_hidden_layers=2).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    replaceable: Annotated[
        bool,
        typer.Option(
            "--replaceable",
            help="Also say which normlab layer reproduces each norm (normlab.replace_norms "
            "with dry_run: verified on random input, nothing changed).",
        ),
    ] = False,
) -> None:
    """``normlab audit model`` (help: :data:`AUDIT_MODEL_HELP`)."""
    if is_source_target(target):
        if placement is not None:
            raise typer.BadParameter(
                f"{target} keeps its own norm placement; leave it out", param_hint="--placement"
            )
        try:
            model, inputs = source_model(target, model_set, norm)
            result = audit_model(model, *inputs)
        except DoesNotFitError as err:  # the machine's limit, not the option's spelling: exit 1
            raise fail("audit model", err, EXIT_REFUSED) from None
        except (TypeError, ValueError) as err:
            flags = {"--model": "TARGET", "--model-set": "--model-set", "norm": "--norm"}
            if not is_usage_error(err) and str(err).startswith("--model: "):
                # not a name that names no model: a folder that cannot be read
                message = f"TARGET: {str(err).removeprefix('--model: ')}"
                raise fail("audit model", message, EXIT_REFUSED) from None
            raise _bad_parameter(err, flags) from err
        _show_model(target, model, result, as_json, replaceable)
        return
    if model_set is not None:
        raise typer.BadParameter(
            f"applies to hf: targets only, not to {target!r}; leave it out",
            param_hint="--model-set",
        )
    if target not in TESTBEDS:
        for value, flag in ((norm, "--norm"), (placement, "--placement")):
            if value is not None:
                raise typer.BadParameter(
                    f"applies to the testbeds ({', '.join(TESTBEDS)}) only, not to {target!r}; "
                    "leave it out",
                    param_hint=flag,
                )
    norm, placement = norm or DEFAULT_NORMS.get(target, "layernorm"), placement or "pre"
    if target in TESTBEDS:
        try:
            check_testbed_options(norm, placement, target)
        except (TypeError, ValueError) as err:
            raise _bad_parameter(err, {"norm": "--norm", "placement": "--placement"}) from None
    try:
        model, inputs = load_model(target, norm, placement)
        result = audit_model(model, *inputs)
    except (TypeError, ValueError) as err:
        raise _bad_parameter(err, {}) from err
    _show_model(target, model, result, as_json, replaceable)


def _show_model(
    target: str, model: nn.Module, result: ModelAudit, as_json: bool, replaceable: bool
) -> None:
    """Print a model audit's result as a table (or JSON), with the normlab replacement of each
    norm when ``replaceable``."""
    swaps = replace_norms(model, dry_run=True) if replaceable else []
    by_name = {name: r for r in swaps for name in r.names}
    if as_json:
        out = result.to_dict()
        if replaceable:
            out["replacements"] = [asdict(r) for r in swaps]
        typer.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    # a Text title: no markup or emoji codes (``hf:llama`` would show a llama)
    table = Table(title=Text(f"Norms of {target}: placement {result.placement}"))
    columns = ["module", "class", "block", "role", "condition", "params"]
    for col in columns + (["normlab replacement"] if replaceable else []):
        table.add_column(col, justify="right" if col == "params" else "left")
    for s in result.norms:
        condition = "-" if s.conditioning == "none" else s.conditioning
        if s.returns_gate:
            condition += ", gate"
        row = [s.name, s.cls, s.block or "-", s.role, condition, str(s.n_params)]
        if replaceable:
            swap = by_name.get(s.name)
            row.append("-" if swap is None else swap.replacement or f"none: {swap.reason}")
        table.add_row(*row)
    console = Console()
    console.print(table)
    share = result.n_norm_params / max(result.n_params, 1)
    console.print(
        f"{len(result.norms)} norms, {result.n_norm_params} of {result.n_params} parameters "
        f"({share:.2%}); blocks: {', '.join(f'{b}={p}' for b, p in result.blocks.items())}"
    )
    for note in result.notes:
        console.print(f"note: {note}")
