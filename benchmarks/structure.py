"""How the code of normlab is laid out, measured on the current tree: long functions, the walk
of a command through its modules, and the files one opens to answer three questions.

    python benchmarks/structure.py                     # everything (trains a few tiny runs)
    python benchmarks/structure.py --only functions    # the static part alone, in seconds
    python benchmarks/structure.py --json out.json     # also the numbers as JSON

**Long functions.** Every ``def`` of ``src/normlab`` outside ``kernels/`` (methods and nested
functions included), parsed with :mod:`ast`. Its *body lines* run from the first statement
after the docstring to the function's last line (``end_lineno``), blank and comment lines
included; the signature, the decorators and the docstring are not counted. Listed when more
than :data:`MAX_BODY` (60).

**Walks.** A command is run in this process, as ``normlab …`` would run it
(:func:`normlab.cli.main` with its arguments), under a profiler (:func:`sys.setprofile`) on
the main thread: the grid's process, its workers aside. Each Python call and return moves
control from one frame to another; the *current module* is the module of the innermost frame
that belongs to normlab (a call into torch or typer keeps the module that made it; the
execution of a module's top-level code on import is not counted). The *walk* is the sequence of
current modules, consecutive repeats merged. Reported:

- *rooms entered*: the number of distinct normlab modules in the walk;
- *steps*: the length of the walk;
- *climbs back up*: the steps from a module B to a module A where A's package lies higher in
  docs/DESIGN.md §2 than B's (the list top to bottom; a module belongs to the longest package
  of the list that prefixes its name), or where A is ``normlab.cli.compare_cmd`` and B another
  module: control coming back up (a return, or a callback called from below) after having gone
  down. Given as a total, per destination package, and as the distinct (B → A) pairs;
- *climbs into the command*: those whose A is ``normlab.cli.compare_cmd``.

The walks: ``compare --ladder d_model=16,32 --seeds 2 --steps 5 --warmup 1 --no-report`` (a
warm-up shorter than the 5 steps) and ``compare --script "<examples/own_loop/plain_loop.py …>
--steps 3" --norms layernorm,rmsnorm --seeds 2 --metric val_loss --steps 3``.

**Hops.** The chain of normlab files one must open to follow a question's answer: the call
stack (outermost first) at the moment the answer happens, each file once per consecutive run
of frames, and across processes the stack that started the process first. Measured:

- *where is summary.json written for a plain local run*: ``compare --seeds 1 --steps 3
  --warmup 1 --no-report``; every process the run starts loads
  :file:`structure_probe/sitecustomize.py` (``PYTHONPATH``), which records the stack when a
  file named ``summary.json`` is put in place (``os.replace`` / ``os.rename``, how normlab
  writes files atomically) and when a process is started (``subprocess.Popen``), in every
  process;
- *where is "equivalent" decided*: ``normlab report`` on a copy of
  ``tests/compare/fixtures/compare_run`` (whose quality verdict is equivalent); the profiler
  notes each normlab function that returns the word (the string, or a tuple, list, dict or
  object holding it one level deep): an *origin* when no callee returned it to the function
  and none of its arguments holds it (the word is decided there), a *relay* otherwise (it is
  passed along, rewritten or decided again from what it was handed);
- *how --ladder reaches a run*: the stack when the ladder walk starts its first run (the first
  process whose arguments name a folder under the command's ``--out``).

This module imports only the standard library at its top: the probes it installs in worker
processes run before those import normlab.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "normlab"
MAX_BODY = 60
"""A function with more body lines than this is listed."""
COMMAND_MODULE = "normlab.cli.compare_cmd"
"""The command's module: control coming back into it counts as a climb from anywhere."""
TRACE_ENV = "NORMLAB_STRUCTURE_TRACE"
"""Set to a folder: every Python started with :data:`PROBE_DIR` on its path records there."""
PROBE_DIR = Path(__file__).resolve().parent / "structure_probe"
SUMMARY_NAME = "summary.json"
WORD = "equivalent"
FIXTURE = ROOT / "tests" / "compare" / "fixtures" / "compare_run"
PLAIN_LOOP = ROOT / "examples" / "own_loop" / "plain_loop.py"


# ---- long functions --------------------------------------------------------------------------


@dataclass(frozen=True)
class LongFunction:
    """A function of more than :data:`MAX_BODY` body lines: where it is and how long."""

    path: str
    line: int
    name: str
    body: int


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines from the first statement after the docstring to the function's last line."""
    body = node.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    assert node.end_lineno is not None
    return node.end_lineno - body[0].lineno + 1


def _qualified(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of ``tree`` with its dotted name (``Class.method``, ``outer.inner``)."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, Any]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def long_functions(src: Path = SRC, limit: int = MAX_BODY) -> list[LongFunction]:
    """The functions of ``src`` outside ``kernels/`` with more than ``limit`` body lines,
    longest first."""
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent)
        if rel.parts[1] == "kernels":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, node in _qualified(tree):
            n = body_lines(node)
            if n > limit:
                found.append(LongFunction(str(rel), node.lineno, name, n))
    return sorted(found, key=lambda f: (-f.body, f.path, f.line))


# ---- the layers of DESIGN §2 -----------------------------------------------------------------


def design_order(root: Path = ROOT) -> list[str]:
    """The packages of docs/DESIGN.md §2, top to bottom."""
    text = (root / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text[text.index("## 2.") : text.index("## 3.")]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    if block is None:
        raise ValueError("docs/DESIGN.md §2 has no code block listing the packages")
    return [line.split()[0] for line in block.group(1).splitlines() if line.startswith("normlab")]


def package_of(module: str, order: Sequence[str]) -> str:
    """The longest package of ``order`` that is ``module`` or prefixes it."""
    matches = [p for p in order if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else module


def is_climb(before: str, after: str, rank: dict[str, int], order: Sequence[str]) -> bool:
    """Whether the walk's step ``before`` → ``after`` climbs back up (module docstring)."""
    if after == COMMAND_MODULE:
        return before != after
    up, down = package_of(after, order), package_of(before, order)
    return rank.get(up, len(rank)) < rank.get(down, len(rank))


# ---- stacks and probes -----------------------------------------------------------------------


def _is_normlab(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__", "")
    return isinstance(name, str) and (name == "normlab" or name.startswith("normlab."))


def normlab_stack(frame: FrameType | None) -> list[dict[str, Any]]:
    """The normlab frames from ``frame`` outwards, outermost first: module, function, file
    (relative to ``src``), line."""
    out = []
    while frame is not None:
        if _is_normlab(frame):
            code = frame.f_code
            path = Path(code.co_filename)
            rel = (
                str(path.relative_to(SRC.parent)) if path.is_relative_to(SRC.parent) else str(path)
            )
            out.append(
                {
                    "module": frame.f_globals["__name__"],
                    "function": getattr(code, "co_qualname", code.co_name),
                    "file": rel,
                    "line": frame.f_lineno,
                }
            )
        frame = frame.f_back
    return out[::-1]


def _record(folder: str, record: dict[str, Any]) -> None:
    """Append ``record`` (with this process's pid and parent's) to ``folder/<pid>.jsonl``."""
    record = {"pid": os.getpid(), "ppid": os.getppid(), "time": time.time(), **record}
    with contextlib.suppress(OSError), open(Path(folder) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def install_probes(folder: str) -> None:
    """Record, in ``folder``, the stack at each ``subprocess.Popen`` (with the child's pid)
    and at each ``os.replace`` / ``os.rename`` onto a file named ``summary.json``; the calls
    themselves are unchanged."""
    popen_init = subprocess.Popen.__init__

    def started(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
        popen_init(self, *args, **kwargs)
        argv = args[0] if args else kwargs.get("args")
        shown = " ".join(map(str, argv))[:2000] if isinstance(argv, list | tuple) else str(argv)
        stack = normlab_stack(sys._getframe(1))
        _record(folder, {"event": "start", "child": self.pid, "args": shown, "stack": stack})

    subprocess.Popen.__init__ = started  # type: ignore[method-assign]
    for name in ("replace", "rename"):
        original = getattr(os, name)

        def moved(src: Any, dst: Any, *args: Any, _original: Callable = original, **kw: Any) -> Any:
            result = _original(src, dst, *args, **kw)
            if Path(os.fsdecode(dst)).name == SUMMARY_NAME:
                stack = normlab_stack(sys._getframe(1))
                _record(folder, {"event": "write", "path": os.fsdecode(dst), "stack": stack})
            return result

        setattr(os, name, moved)


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every record of every process under ``folder``, in time order."""
    records = []
    for path in sorted(folder.glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(records, key=lambda r: r["time"])


def full_stack(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> list[dict]:
    """``record``'s stack prefixed with the stack that started its process (recursively)."""
    starts = {r["child"]: r for r in records if r["event"] == "start"}
    stack, pid, seen = list(record["stack"]), record["pid"], set()
    while pid in starts and pid not in seen:
        seen.add(pid)
        parent = starts[pid]
        stack = [*parent["stack"], {"process": parent["args"]}, *stack]
        pid = parent["pid"]
    return stack


def file_chain(stack: Sequence[dict[str, Any]]) -> list[str]:
    """The files of a stack, outermost first, each once per consecutive run of its frames
    (a process boundary shown as ``[process]``)."""
    chain: list[str] = []
    for frame in stack:
        name = "[process]" if "process" in frame else frame["file"]
        if not chain or chain[-1] != name:
            chain.append(name)
    return chain


# ---- the walk --------------------------------------------------------------------------------


@dataclass
class Walk:
    """What the profiler saw of one command (see the module docstring)."""

    order: list[str]
    steps: int = 0
    rooms: set[str] = field(default_factory=set)
    climbs: Counter = field(default_factory=Counter)
    word: str | None = None
    origins: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    relays: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rank = {p: i for i, p in enumerate(self.order)}
        self._stack: list[str | None] = []
        self._handed: list[bool] = []

    def step(self, before: str | None, after: str | None) -> None:
        """Control moved from the module ``before`` to ``after`` (None: outside normlab)."""
        if after is None or after == before:
            return
        self.steps += 1
        self.rooms.add(after)
        if before is not None and is_climb(before, after, self._rank, self.order):
            self.climbs[(before, after)] += 1

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        """The :func:`sys.setprofile` hook: keep the current module and step the walk; with
        :attr:`word`, note each normlab function that returns it (:meth:`_returned`)."""
        if event == "call":
            before = self._stack[-1] if self._stack else None
            here = before
            if frame.f_code.co_name != "<module>" and _is_normlab(frame):
                here = frame.f_globals["__name__"]
            self._stack.append(here)
            self._handed.append(False)
            self.step(before, here)
        elif event == "return" and self._stack:
            left = self._stack.pop()
            handed = self._handed.pop()
            if self.word is not None and _holds(arg, self.word):
                self._returned(frame, handed)
            self.step(left, self._stack[-1] if self._stack else None)

    def _returned(self, frame: FrameType, handed: bool) -> None:
        """``frame`` returns :attr:`word`: a normlab function (not a comprehension, lambda or
        module body, whose enclosing function counts) is noted as its *origin* when no callee
        returned the word to it and none of its arguments holds it, else as a *relay*; its
        caller is marked as handed the word."""
        if self._handed:
            self._handed[-1] = True
        if frame.f_code.co_name.startswith("<") or not _is_normlab(frame):
            return  # a module's body, a comprehension or a lambda: its function relays it
        code = frame.f_code
        key = f"{frame.f_globals['__name__']}:{getattr(code, 'co_qualname', code.co_name)}"
        n_args = code.co_argcount + code.co_kwonlyargcount
        given = any(
            _holds(frame.f_locals.get(name), self.word) for name in code.co_varnames[:n_args]
        )
        kind = "relays" if handed or given else "origins"
        getattr(self, kind).setdefault(key, normlab_stack(frame))

    def summary(self) -> dict[str, Any]:
        """The walk's numbers: rooms, steps, climbs (total, into the command, per destination
        package, distinct pairs)."""
        into: Counter = Counter()
        for (_, after), n in self.climbs.items():
            into[package_of(after, self.order)] += n
        return {
            "rooms_entered": len(self.rooms),
            "steps": self.steps,
            "climbs": sum(self.climbs.values()),
            "climbs_into_command": sum(
                n for (_, a), n in self.climbs.items() if a == COMMAND_MODULE
            ),
            "climb_pairs": len(self.climbs),
            "climbs_into_command_from": {
                b: n for (b, a), n in self.climbs.most_common() if a == COMMAND_MODULE
            },
            "climbs_by_package": dict(into.most_common()),
            "rooms": sorted(self.rooms),
        }


def _holds(value: Any, word: str) -> bool:
    """``value`` is ``word``, or a tuple, list, dict or object with an item, value or field
    that is (one level deep)."""
    if isinstance(value, str):
        return value == word
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, tuple | list):
        items = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    else:
        fields = getattr(value, "__dict__", None)
        items = fields.values() if isinstance(fields, dict) else ()
    return any(isinstance(v, str) and v == word for v in items)


def run_normlab(args: Sequence[str], walk: Walk | None = None) -> int:
    """``normlab ARGS`` in this process (:func:`normlab.cli.main`), under ``walk``'s profiler
    on this thread when given; the exit status."""
    from normlab.cli import main

    saved = sys.argv
    sys.argv = ["normlab", *args]
    if walk is not None:
        sys.setprofile(walk.profile)
    try:
        main()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.setprofile(None)
        sys.argv = saved
    return 0


@contextlib.contextmanager
def probed(folder: Path) -> Iterator[None]:
    """Within the block, this process and every Python it starts record into ``folder``
    (:func:`install_probes`; children load :data:`PROBE_DIR`'s sitecustomize)."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in (TRACE_ENV, "PYTHONPATH")}
    os.environ[TRACE_ENV] = str(folder)
    paths = [str(PROBE_DIR), str(PROBE_DIR.parent)]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        paths + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
    )
    popen_init, replace, rename = subprocess.Popen.__init__, os.replace, os.rename
    install_probes(str(folder))
    try:
        yield
    finally:
        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
        os.replace, os.rename = replace, rename
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- the measurements ------------------------------------------------------------------------


def ladder_args(out: Path) -> list[str]:
    """The ladder walk's command (without ``normlab``)."""
    q = shlex.quote(str(out))
    ladder = "--ladder d_model=16,32 --seeds 2 --steps 5 --warmup 1"
    return shlex.split(f"compare {ladder} --no-report --out {q}")


def script_args(out: Path) -> list[str]:
    """The ``--script`` walk's command (without ``normlab``): the plain-loop example."""
    script = f"{sys.executable} {PLAIN_LOOP} --norm {{norm}} --seed {{seed}} --out {{run_dir}}"
    q = shlex.quote(str(out))
    rest = shlex.split(f"--norms layernorm,rmsnorm --seeds 2 --metric val_loss --steps 3 --out {q}")
    return ["compare", "--script", f"{script} --steps 3", *rest]


def _hops(stack: Sequence[dict[str, Any]]) -> dict[str, Any]:
    chain = file_chain(stack)
    files = [f for f in chain if f != "[process]"]
    return {"chain": chain, "files": len(set(files)), "hops": len(files)}


def measure_walk(args: Sequence[str], trace: Path) -> dict[str, Any]:
    """The walk of ``normlab ARGS`` and the files from the command to its first run: the first
    process this process starts whose arguments name a folder under the command's ``--out``
    (a run's worker; not, say, ``uname`` asked for the machine's name)."""
    walk = Walk(design_order())
    with probed(trace):
        status = run_normlab(args, walk)
    out = str(Path(args[list(args).index("--out") + 1]).resolve())
    records = read_records(trace)
    starts = [r for r in records if r["event"] == "start" and r["pid"] == os.getpid()]
    first = next((r for r in starts if out in r["args"]), None)
    return {
        "command": "normlab " + " ".join(args),
        "status": status,
        **walk.summary(),
        "first_run": None if first is None else {"args": first["args"], **_hops(first["stack"])},
    }


WRITING_LAYERS = ("normlab._io", "normlab.run_format")
"""The modules that put a file in place for whoever asks: a write's *writer* is the innermost
frame outside them."""


def _writer(stack: Sequence[dict[str, Any]]) -> str:
    """``module:function`` of the innermost frame of ``stack`` outside :data:`WRITING_LAYERS`."""
    for frame in reversed(stack):
        module = frame["module"]
        if not any(module == m or module.startswith(m + ".") for m in WRITING_LAYERS):
            return f"{module}:{frame['function']}"
    return "?"


def measure_summary_write(tmp: Path) -> dict[str, Any]:
    """Where a plain local run's summary.json is written: every write's full stack."""
    args = shlex.split("compare --seeds 1 --steps 3 --warmup 1 --no-report --out")
    args.append(str(tmp / "plain"))
    with probed(tmp / "trace_plain"):
        status = run_normlab(args)
    records = read_records(tmp / "trace_plain")
    writes = [r for r in records if r["event"] == "write" and "/runs/" in r["path"]]
    writers = sorted({_writer(w["stack"]) for w in writes})
    first = _hops(full_stack(writes[0], records)) if writes else None
    return {
        "command": "normlab " + " ".join(args),
        "status": status,
        "writes": len(writes),
        "writers": writers,
        "first": first,
    }


def measure_word(tmp: Path) -> dict[str, Any]:
    """Where the word ``equivalent`` is produced in ``normlab report`` of the fixture."""
    folder = tmp / "fixture"
    shutil.copytree(FIXTURE, folder)
    walk = Walk(design_order(), word=WORD)
    status = run_normlab(["report", str(folder)], walk)
    return {
        "command": f"normlab report <copy of {FIXTURE.relative_to(ROOT)}>",
        "status": status,
        "origins": {name: _hops(stack) for name, stack in walk.origins.items()},
        "relays": {name: _hops(stack) for name, stack in walk.relays.items()},
        "modules": sorted({n.split(":")[0] for n in (*walk.origins, *walk.relays)}),
    }


# ---- the report ------------------------------------------------------------------------------


def _chain_line(hops: dict[str, Any] | None) -> str:
    if hops is None:
        return "not seen"
    return f"{hops['files']} files, {hops['hops']} hops: " + " → ".join(hops["chain"])


def render(results: dict[str, Any]) -> list[str]:
    """The measurements as Markdown lines."""
    lines = []
    if "functions" in results:
        fns = results["functions"]
        lines += [
            f"Functions with more than {MAX_BODY} body lines outside kernels/: {len(fns)}",
            "",
        ]
        lines += [f"- {f['path']}:{f['line']} `{f['name']}`: {f['body']}" for f in fns] + [""]
    for key in ("ladder", "script"):
        if key not in results:
            continue
        w = results[key]
        by = ", ".join(f"{p} {n}" for p, n in w["climbs_by_package"].items())
        lines += [
            f"Walk of `{w['command']}` (exit {w['status']}): {w['rooms_entered']} rooms entered, "
            f"{w['steps']} steps, {w['climbs']} climbs back up ({w['climbs_into_command']} into "
            f"{COMMAND_MODULE}, from {len(w['climbs_into_command_from'])} modules; "
            f"{w['climb_pairs']} distinct pairs; by destination: {by}).",
            f"- first run started: {_chain_line(w['first_run'])}",
            "",
        ]
    if "summary" in results:
        s = results["summary"]
        lines += [
            f"Where is summary.json written for a plain local run (`{s['command']}`, exit "
            f"{s['status']}): {s['writes']} writes, by {', '.join(s['writers']) or 'nobody'} "
            f"(the innermost caller outside {' and '.join(WRITING_LAYERS)}).",
            f"- {_chain_line(s['first'])}",
            "",
        ]
    if "word" in results:
        w = results["word"]
        lines += [
            f'Where is "{WORD}" decided (`{w["command"]}`, exit {w["status"]}): produced by '
            f"{len(w['origins'])} function(s), then returned again by {len(w['relays'])} more; "
            f"{len(w['modules'])} modules in all ({', '.join(w['modules'])}).",
            *(f"- origin {name}: {_chain_line(h)}" for name, h in w["origins"].items()),
            *(f"- relay {name}: {_chain_line(h)}" for name, h in w["relays"].items()),
            "",
        ]
    return lines


PARTS = ("functions", "ladder", "script", "summary", "word")


def measure(parts: Sequence[str], tmp: Path) -> dict[str, Any]:
    """The chosen measurements, with ``tmp`` for the commands' folders."""
    results: dict[str, Any] = {}
    if "functions" in parts:
        results["functions"] = [vars(f) for f in long_functions()]
    if "ladder" in parts:
        results["ladder"] = measure_walk(ladder_args(tmp / "ladder"), tmp / "trace_ladder")
    if "script" in parts:
        results["script"] = measure_walk(script_args(tmp / "script"), tmp / "trace_script")
    if "summary" in parts:
        results["summary"] = measure_summary_write(tmp)
    if "word" in parts:
        results["word"] = measure_word(tmp)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the chosen parts (all by default) and print them as Markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    p.add_argument("--keep", type=Path, help="run the commands in this folder and keep it")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="structure-")))
        else:
            tmp = args.keep.resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        results = measure(args.only, tmp)
    text = "\n".join(render(results))
    print(text)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
