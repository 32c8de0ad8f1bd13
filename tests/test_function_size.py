"""No function of ``src/normlab`` outside ``kernels/`` has a body longer than 60 lines.

A body is measured from the first statement after the docstring to the last line of the last
statement: the signature, the docstring and blank lines or comments after the last statement
do not count; nested functions count in their parent's body and are measured on their own too.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "normlab"
MAX_BODY_LINES = 60
EXEMPT = ("kernels",)  # packages of src/normlab whose functions are not measured


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the last statement
    (0 for a function whose body is its docstring alone)."""
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    end = body[-1].end_lineno
    assert end is not None
    return end - body[0].lineno + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, body lines) of each function in ``source`` whose body is
    longer than ``limit`` lines, in the order they appear."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                n = body_lines(child)
                if n > limit:
                    found.append((name, child.lineno, n))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def measured_files() -> list[Path]:
    return [
        p for p in sorted(SRC.rglob("*.py")) if not set(p.relative_to(SRC).parts[:-1]) & set(EXEMPT)
    ]


EXAMPLE = textwrap.dedent(
    '''
    def documented(x):
        """A docstring
        of three lines,
        not counted."""
        y = x + 1

        # a comment between statements counts
        return (
            y
        )
        # a comment after the last statement does not


    class Holder:
        def method(self):
            if self:
                pass
            def inner():
                return 1
            return inner


    def docstring_only():
        """Nothing else."""
    '''
)


def test_body_lines_counts_a_known_example() -> None:
    tree = ast.parse(EXAMPLE)
    functions = {
        n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert body_lines(functions["documented"]) == 6  # y = … through the closing parenthesis
    assert body_lines(functions["method"]) == 5
    assert body_lines(functions["inner"]) == 1
    assert body_lines(functions["docstring_only"]) == 0
    assert long_functions(EXAMPLE, limit=4) == [("documented", 2, 6), ("Holder.method", 16, 5)]
    assert long_functions(EXAMPLE, limit=6) == []


def test_the_measured_files_leave_out_only_the_kernels() -> None:
    files = measured_files()
    assert SRC / "audit" / "probe.py" in files
    assert not any("kernels" in p.relative_to(SRC).parts for p in files)
    assert any((SRC / "kernels").rglob("*.py"))


def test_no_function_body_is_longer_than_60_lines() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for p in measured_files()
        for name, line, n in long_functions(p.read_text(encoding="utf-8"))
    ]
    assert offenders == [], (
        f"function bodies longer than {MAX_BODY_LINES} lines (split them into pieces with one "
        "job each):\n" + "\n".join(offenders)
    )
