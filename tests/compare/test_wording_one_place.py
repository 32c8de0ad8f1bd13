"""Every word a comparison ends in is decided in one module, normlab.analysis.wording: no other
module of src/normlab produces one (returns it, assigns it, passes it on, stores it as a
value), whether as a string literal or as one of wording's word constants. Other modules may
read a word — compare against it, look it up by it — and write sentences around it."""

from __future__ import annotations

import ast
from pathlib import Path

from normlab.analysis import wording
from normlab.run_format import CRASHED, DIVERGED, FINISHED, UNFINISHED

SRC = Path(__file__).resolve().parents[2] / "src" / "normlab"
ONE_PLACE = SRC / "analysis" / "wording.py"
RUN_STATUSES = {FINISHED, DIVERGED, CRASHED, UNFINISHED}
WORDS = (set(wording.WORD_TONES) - RUN_STATUSES) | {wording.EXCLUDES_ZERO, wording.INCLUDES_ZERO}
"""Every word of a comparison, decision, recommendation, badge or prediction (a run's status
is the run's own, decided when it ends)."""
TONES = {"GOOD", "BAD", "OPEN", "NEUTRAL"}
WORD_CONSTANTS = {
    name
    for name, value in vars(wording).items()
    if name.isupper() and name not in TONES and isinstance(value, str) and value in WORDS
} | {"BETTER_WORSE", "DECIDED"}
"""wording's names of the words (a tone's name, such as OPEN, names no word)."""
OTHER_DOMAINS = {
    ("cli/audit_cmd.py", "not determined"): "the audit's reading of whether a module normalises",
    ("trackers/exporting.py", "failed"): "the export record's runs whose export failed",
    ("cli/errors.py", "failed"): "the exit status of a command whose answer is a failure",
    ("trackers/tracked.py", "failed"): "a tracker's status of a run that failed or was killed",
}
"""The same strings in other domains, which are not words of a comparison."""


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _reads(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` (a word) is only read where it stands: a docstring or bare expression,
    part of a sentence (an f-string), compared against (alone or in a tuple, list or set), a
    mapping's key, or a subscript's index."""
    parent = parents.get(node)
    if isinstance(parent, ast.Expr):
        return True
    up = parent
    while up is not None:
        if isinstance(up, ast.JoinedStr):
            return True
        up = parents.get(up)
    holder = parents.get(parent) if isinstance(parent, (ast.Tuple, ast.List, ast.Set)) else parent
    if isinstance(holder, ast.Compare):
        return True
    if isinstance(parent, ast.Dict) and node in parent.keys:
        return True
    return isinstance(parent, ast.Subscript) and parent.slice is node


def _imported_words(tree: ast.AST) -> set[str]:
    """The local names of wording's word constants imported into a module."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "normlab.analysis.wording"
        for alias in node.names
        if alias.name in WORD_CONSTANTS
    }


def words_produced(source: str, name: str) -> list[str]:
    """``name:line: word`` for every word that ``source`` produces instead of reading."""
    tree = ast.parse(source)
    parents = _parents(tree)
    constants = _imported_words(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value
            if word not in WORDS or (name, word) in OTHER_DOMAINS:
                continue
        elif isinstance(node, ast.Name) and node.id in constants:
            word = node.id
        else:
            continue
        if not _reads(node, parents):
            found.append(f"{name}:{node.lineno}: {word!r}")
    return found


def test_no_other_module_decides_a_word() -> None:
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if path != ONE_PLACE
        for hit in words_produced(
            path.read_text(encoding="utf-8"), path.relative_to(SRC).as_posix()
        )
    ]
    assert not found, (
        "words produced outside normlab.analysis.wording (decide them there):\n" + "\n".join(found)
    )


def test_wording_produces_the_words() -> None:
    """The check reads wording itself as producing words: it is where they are decided."""
    produced = words_produced(ONE_PLACE.read_text(encoding="utf-8"), "wording.py")
    words = {hit.split(": ", 1)[1].strip("'") for hit in produced}
    assert {"better", "worse", "equivalent", "unclear size", "switch", "similar"} <= words


def test_the_check_can_fail() -> None:
    source = "\n".join(
        [
            "from normlab.analysis.wording import BETTER, UNDECIDED, judge",
            "def decide(x, v):",
            '    """A docstring may say better."""',
            '    if v.verdict == "better" or v.decision in (UNDECIDED, "keep"):',
            '        return f"{x} is better"',
            '    names = {"switch": "Recommendation"}',
            '    word = "worse" if x else BETTER',
            "    return judge(x, 'm', lower_is_better=True).word or UNDECIDED",
        ]
    )
    assert words_produced(source, "m.py") == [
        "m.py:7: 'worse'",
        "m.py:7: 'BETTER'",
        "m.py:8: 'UNDECIDED'",
    ]
