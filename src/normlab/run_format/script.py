"""What passes between ``normlab compare --script`` and the user's script (:mod:`normlab.track`).

compare runs the script once per (arm, seed) with the placeholders of its command filled in
(:data:`PLACEHOLDERS`) and with the same values in the environment (:data:`ENV`), so that
``normlab.track.init()`` finds them without parsing the script's arguments. The script writes the
run folder's usual files (``metrics.jsonl``, ``summary.json``) and, when it calls
``Run.fingerprint``, :data:`FINGERPRINT_FILE`; compare keeps its output in :data:`SCRIPT_LOG_FILE`.
"""

from __future__ import annotations

import shlex
import string

__all__ = [
    "ENV",
    "FINGERPRINT_FILE",
    "PLACEHOLDERS",
    "RUN_DIR_ENV",
    "SCRIPT_LOG_FILE",
    "SEED_ENV",
    "check_script_command",
    "script_argv",
]

RUN_DIR_ENV = "NORMLAB_RUN_DIR"
"""The run folder the script writes to."""
SEED_ENV = "NORMLAB_SEED"
"""The run's seed (an integer)."""
ENV: dict[str, str] = {
    "norm": "NORMLAB_NORM",
    "placement": "NORMLAB_PLACEMENT",
    "precision": "NORMLAB_PRECISION",
    "seed": SEED_ENV,
    "run_dir": RUN_DIR_ENV,
}
"""{placeholder: environment variable} that compare sets for every run of a script."""
PLACEHOLDERS: tuple[str, ...] = tuple(ENV)
"""The placeholders of a ``--script`` command: ``{norm}``, ``{placement}``, ``{precision}`` (the
grid's factors), ``{seed}`` and ``{run_dir}``."""

FINGERPRINT_FILE = "fingerprint.json"
"""In a script's run folder: ``{"parameters": {name: digest}, "batch": digest}``, the initial
parameters outside the norm modules and the first batch (``Run.fingerprint``)."""
SCRIPT_LOG_FILE = "script.log"
"""In a script's run folder: what the script wrote to standard output and standard error."""


def _fields(arg: str) -> list[tuple[str, str | None]]:
    """(literal text, placeholder or None) pieces of one argument; ``{{`` and ``}}`` are
    literal braces. ``ValueError`` naming ``script`` for a malformed or unknown placeholder."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as err:
        raise ValueError(
            f"script: cannot read the placeholders of {arg!r} ({err}); write a literal brace "
            "as {{ or }}"
        ) from None
    pieces: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (name not in PLACEHOLDERS or spec or conversion):
            shown = "{" + name + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise ValueError(
                f"script: unknown placeholder {shown} in {arg!r}; expected "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} "
                "(a literal brace is {{ or }})"
            )
        pieces.append((literal, name))
    return pieces


def check_script_command(command: str) -> list[str]:
    """Check a ``--script`` command and return its arguments before substitution. Raises
    ``ValueError`` naming ``script`` when it is empty, its quotes do not close, or it has an
    unknown placeholder."""
    try:
        args = shlex.split(command)
    except ValueError as err:
        raise ValueError(f"script: cannot split {command!r} into arguments: {err}") from None
    if not args:
        raise ValueError("script: expected a command, e.g. 'python train.py --norm {norm}'")
    for arg in args:
        _fields(arg)
    return args


def script_argv(command: str, values: dict[str, str]) -> list[str]:
    """The argument list of one run: ``shlex.split(command)``, then in each argument every
    placeholder replaced by its value from ``values`` (the values are never split or parsed
    again)."""
    return [
        "".join(literal + (values[name] if name is not None else "") for literal, name in pieces)
        for pieces in (_fields(arg) for arg in check_script_command(command))
    ]
