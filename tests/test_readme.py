"""The README works as written: its Python runs, every `normlab …` command it shows parses
against the real CLI, its pytest markers exist, and its tolerance table is the tests' own."""

from __future__ import annotations

import importlib.util
import itertools
import re
import shlex
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import typer

from normlab.cli.app import app  # importing normlab.cli registers every subcommand on it

try:  # recent typer vendors click as typer._click; older typer runs on click itself
    from typer._click.exceptions import (
        BadOptionUsage,
        BadParameter,
        ClickException,
        MissingParameter,
        NoSuchOption,
        UsageError,
    )
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import (  # type: ignore[assignment]
        BadOptionUsage,
        BadParameter,
        ClickException,
        MissingParameter,
        NoSuchOption,
        UsageError,
    )

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
README = ROOT / "README.md"
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def bash_lines(text: str) -> list[str]:
    """The command lines of every ```bash block, backslash continuations joined."""
    lines: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        lines.extend(line for line in block.replace("\\\n", " ").splitlines() if line.strip())
    return lines


def inline_commands(text: str) -> list[str]:
    """Inline code spans that are a `normlab …` command (`normlab compare --seeds 7 …`)."""
    return re.findall(r"`(normlab [^`\n]+)`", text)


def segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line: words split as the shell does, comments dropped,
    cut at ``&&``, ``||``, ``;``, ``|`` and ``&``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in SHELL_OPERATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def normlab_args(words: list[str]) -> list[str] | None:
    """The arguments after ``normlab`` (``time normlab …``, ``python -m normlab …``, a path
    ending in ``/normlab`` and leading ``VAR=value`` assignments included), or None when the
    simple command is not normlab."""
    while words and (words[0] == "time" or re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0])):
        words = words[1:]
    if words and Path(words[0]).name == "normlab":
        return words[1:]
    if (
        len(words) >= 3
        and Path(words[0]).name.startswith("python")
        and words[1:3] == ["-m", "normlab"]
    ):
        return words[3:]
    return None


def readme_normlab_commands(text: str) -> list[tuple[str, list[str], bool]]:
    """(line as written, arguments, whether inline) for every `normlab …` command the README
    shows: the lines of its ```bash blocks, then its inline code spans."""
    found = []
    for inline, lines in ((False, bash_lines(text)), (True, inline_commands(text))):
        for line in lines:
            for words in segments(line):
                args = normlab_args(words)
                if args is not None:
                    found.append((line, args, inline))
    return found


def is_group(command: object) -> bool:
    """A command with subcommands (typer's group: a click ``Group``, or typer's own vendored
    click ``Command`` with ``commands`` in recent typer)."""
    return isinstance(getattr(command, "commands", None), dict)


def parse(args: list[str], name_only: bool = False) -> tuple[tuple[str, ...], Any]:
    """Parse ``normlab ARGS`` with the real CLI's click parser, without running the command.

    Returns the subcommand path (``("audit", "norm")``) and the parsed click context (None when
    ``name_only`` and ARGS are just a command's name, as prose names `normlab audit`). Raises
    ``ClickException`` (unknown command or option, bad or missing value) as the CLI would.
    """
    command: Any = typer.main.get_command(app)
    ctx = command.context_class(command, info_name="normlab")
    path: list[str] = []
    args = list(args)
    while True:
        if not args and name_only and path:
            return tuple(path), None
        if not args or args[0].startswith("-"):
            raise UsageError(f"expected a subcommand of {' '.join(['normlab', *path])}")
        name, args = args[0], args[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            raise UsageError(f"no such command {name!r} in {' '.join(['normlab', *path])}")
        path.append(name)
        if not args and name_only:
            return tuple(path), None
        if not is_group(sub):
            return tuple(path), sub.make_context(name, args, parent=ctx, resilient_parsing=False)
        command, ctx = sub, sub.context_class(sub, info_name=name, parent=ctx)


def leaf_commands() -> set[tuple[str, ...]]:
    """Every runnable subcommand path of the CLI (``("compare",)``, ``("audit", "model")``, …)."""

    def walk(command: Any, path: tuple[str, ...]) -> set[tuple[str, ...]]:
        if not is_group(command):
            return {path}
        return set().union(*(walk(sub, (*path, n)) for n, sub in command.commands.items()))

    return walk(typer.main.get_command(app), ())


def test_readme_python_usage_runs(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no ```python block"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    assert "rmsnorm" in capsys.readouterr().out  # print(normlab.available_norms())


def test_readme_normlab_commands_parse_against_the_cli() -> None:
    commands = readme_normlab_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 10, commands
    shown: set[tuple[str, ...]] = set()
    for line, args, inline in commands:
        try:
            path, ctx = parse(args, name_only=inline)
        except ClickException as err:
            pytest.fail(f"README command {line!r} does not parse: {err.format_message()}")
        shown.add(path)
        config = ctx.params.get("config") if ctx is not None else None
        if config is not None:
            assert (ROOT / config).is_file(), f"README command {line!r}: no file {config}"
    missing = leaf_commands() - shown
    assert not missing, f"the README shows no command line for: {sorted(missing)}"


def test_the_main_command_activates_the_venv_before_normlab() -> None:
    first = bash_lines(README.read_text(encoding="utf-8"))[0]
    assert "bash scripts/setup.sh" in first and "source .venv/bin/activate" in first, first
    assert first.index("source .venv/bin/activate") < first.index("normlab compare"), first


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["compare", "--no-such-option"], NoSuchOption),
        (["compare", "--seeds"], BadOptionUsage),
        (["bench", "--reps", "many"], BadParameter),
        (["audit", "nrom"], UsageError),
        (["audit", "model", "gpt", "--placment", "pre"], NoSuchOption),
        (["audit"], UsageError),
        (["audit", "norm"], MissingParameter),
        (["explain", "1", "two"], BadParameter),
    ],
)
def test_the_command_check_rejects_what_the_cli_rejects(
    args: list[str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        parse(args)


def test_the_command_check_accepts_names_in_prose_only() -> None:
    assert parse(["audit"], name_only=True) == (("audit",), None)
    assert parse(["report"], name_only=True) == (("report",), None)
    with pytest.raises(MissingParameter):
        parse(["explain"])


def test_the_command_extraction_reads_shell_lines() -> None:
    text = (
        "```bash\nbash scripts/setup.sh && source .venv/bin/activate && normlab compare\n"
        "time normlab bench --quick \\\n    --out x   # a comment\n"
        "NORMLAB_BACKEND=torch python -m normlab explain 1 2\n.venv/bin/normlab report out\n```\n"
        "Then `normlab audit norm rmsnorm` and `normlab.functional`."
    )
    assert [args for _, args, _ in readme_normlab_commands(text)] == [
        ["compare"],
        ["bench", "--quick", "--out", "x"],
        ["explain", "1", "2"],
        ["report", "out"],
        ["audit", "norm", "rmsnorm"],
    ]


def test_readme_pytest_markers_are_registered() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = pyproject["tool"]["pytest"]["ini_options"]["markers"]
    registered = {m.split(":")[0].strip() for m in markers}
    used = set()
    for line in bash_lines(README.read_text(encoding="utf-8")):
        for words in segments(line):
            if "pytest" not in words:
                continue
            options = words[words.index("pytest") + 1 :]
            for flag, expr in itertools.pairwise(options):
                if flag == "-m":
                    used |= set(re.findall(r"\w+", expr)) - {"and", "or", "not"}
    assert used, "the README shows no `pytest -m MARKER` command"
    assert used <= registered, f"markers not in pyproject.toml: {sorted(used - registered)}"


def functional_matrix() -> ModuleType:
    """tests/…/test_functional_matrix.py, found wherever the test folders put it."""
    [path] = sorted((ROOT / "tests").rglob("test_functional_matrix.py"))
    spec = importlib.util.spec_from_file_location("_readme_functional_matrix", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_readme_tolerance_table_matches_the_tests() -> None:
    tol = functional_matrix().TOL
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Testing") :]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and isinstance(getattr(torch, cells[0], None), torch.dtype):
            rows[getattr(torch, cells[0])] = (float(cells[1].split()[0]), float(cells[2]))
    assert rows == tol


def test_readme_registry_row_names_every_registered_kind() -> None:
    """The API table's registry row lists the kinds ``import normlab`` registers, then those
    ``normlab.models`` adds (read in a fresh interpreter: tests register kinds of their own)."""
    import json
    import subprocess

    code = (
        "import json, normlab; own = normlab.available_norms(); import normlab.models; "
        "print(json.dumps([own, sorted(set(normlab.available_norms()) - set(own))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    own, added = json.loads(out.strip().splitlines()[-1])
    row = next(
        line for line in README.read_text(encoding="utf-8").splitlines() if "`make_norm(" in line
    )
    cell = row.split("|")[2]
    first, _, rest = cell.partition("(and ")
    assert "once `normlab.models` is imported" in rest, cell
    assert set(re.findall(r"`([a-z_0-9]+)`", first)) == set(own)
    assert set(re.findall(r"`([a-z_0-9]+)`", rest.split("once")[0])) == set(added)


def test_the_process_count_claim_is_what_holds() -> None:
    """N processes sum the gradient in another order and Adam lets that rounding grow (0.08 %
    of the final bpb after 60 steps of the default GPT, docs/scaling.md): the README promises
    the same distribution of results, not losses independent of the process count, and the
    scaling page gives the measured drift with the command that reproduces it."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    claim = (
        r"(loss|number|result)[^.;()]{0,40}(do not|don't|does not|never) depend"
        r" on the number of processes"
    )
    assert not re.search(claim, text, flags=re.IGNORECASE)
    assert "not the same numbers" in text and "docs/scaling.md" in text
    scaling = " ".join((ROOT / "docs" / "scaling.md").read_text(encoding="utf-8").split())
    assert "Not the same numbers, the same distribution." in scaling
    assert "--nproc-per-node $n" in scaling and "final val bpb" in scaling


README_MAX_LINES = 240
"""The README is the users' page: what normlab is, the two commands, usage, API, the CLI in
summary and links; the details live in docs/."""


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; expected at most {README_MAX_LINES} (move details "
        "into a page of docs/ and link it)"
    )


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped (letters,
    digits, ``-``, ``_`` and spaces kept), spaces as ``-``."""
    text = heading.strip().lower()
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


def markdown_links(text: str) -> list[str]:
    """The targets of the inline links ``[text](target)`` of a Markdown text."""
    return re.findall(r"\[[^\]\n]*\]\(([^)\s]+)\)", text)


def test_heading_anchor_is_githubs() -> None:
    assert heading_anchor("## 3. Data flow of `normlab compare`".lstrip("# ")) == (
        "3-data-flow-of-normlab-compare"
    )
    assert heading_anchor("normlab coord-check, normlab explain") == (
        "normlab-coord-check-normlab-explain"
    )
    assert markdown_links("see [a](docs/a.md#x) and [b](https://x.org) [c] (d)") == [
        "docs/a.md#x",
        "https://x.org",
    ]


def test_readme_links_reach_their_files_and_headings() -> None:
    """Every relative link of the README names a file of the checkout and, with ``#anchor``, a
    heading of that file (or of the README itself)."""
    text = README.read_text(encoding="utf-8")
    links = [t for t in markdown_links(text) if "://" not in t]
    assert any(t.startswith("docs/") for t in links), links
    for target in links:
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else README
        assert page.is_file(), f"README links to {target!r}: no file {path}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
            anchors = {heading_anchor(h) for h in headings}
            assert anchor in anchors, f"README links to {target!r}: no such heading in {page.name}"
