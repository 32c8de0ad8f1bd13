"""benchmarks/structure.py measures what it says: body lines, the layers of DESIGN §2, climbs
of a walk, origins and relays of a word, file chains across processes, and its probes."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("structure", ROOT / "benchmarks/structure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


st = load_tool()


def _functions(source: str) -> dict[str, int]:
    return {name: st.body_lines(node) for name, node in st._qualified(ast.parse(source))}


def test_body_lines_leave_out_signature_decorators_and_docstring() -> None:
    source = '''
@decorator
def f(
    a,
    b,
):
    """Doc
    string."""
    x = 1

    # a comment
    return x


class C:
    def m(self):
        def inner():
            return 1
        return inner


def only_doc():
    """Nothing else."""
'''
    assert _functions(source) == {"f": 4, "C.m": 3, "C.m.inner": 1, "only_doc": 0}


def test_long_functions_skip_kernels_and_list_the_longest_first(tmp_path: Path) -> None:
    src = tmp_path / "normlab"
    (src / "kernels").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (src / "a.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    (src / "b.py").write_text(f"def longer():\n{body}\n    y = 0\n")
    (src / "kernels" / "k.py").write_text(f"def kernel():\n{body}\n")
    found = st.long_functions(src)
    assert [(f.path, f.name, f.body) for f in found] == [
        ("normlab/b.py", "longer", 62),
        ("normlab/a.py", "long", 61),
    ]
    assert st.long_functions(src, limit=61) == found[:1]


def test_layers_come_from_design_and_climbs_go_up_them() -> None:
    order = st.design_order()
    assert order[:2] == ["normlab", "normlab.cli"] and "normlab.run_format" in order
    rank = {p: i for i, p in enumerate(order)}
    assert st.package_of("normlab.experiment.execution.ladder", order) == (
        "normlab.experiment.execution"
    )
    assert st.is_climb(
        "normlab.run_format.folder", "normlab.experiment.execution.runner", rank, order
    )
    assert not st.is_climb("normlab.cli.compare_cmd", "normlab.run_format.folder", rank, order)
    assert not st.is_climb("normlab.analysis.stats", "normlab.analysis.wording", rank, order)
    assert st.is_climb("normlab.cli.errors", st.COMMAND_MODULE, rank, order)  # same layer
    assert not st.is_climb(st.COMMAND_MODULE, st.COMMAND_MODULE, rank, order)


def test_a_walk_counts_rooms_steps_and_climbs() -> None:
    walk = st.Walk(st.design_order())
    modules = [
        None,
        "normlab.cli.compare_cmd",
        "normlab.experiment.execution.ladder",
        "normlab.run_format.folder",
        "normlab.experiment.execution.ladder",
        "normlab.cli.compare_cmd",
        "normlab.cli.errors",
        "normlab.cli.compare_cmd",
    ]
    for before, after in itertools.pairwise(modules):
        walk.step(before, after)
    s = walk.summary()
    assert s["rooms_entered"] == 4 and s["steps"] == 7
    assert s["climbs"] == 3 and s["climbs_into_command"] == 2 and s["climb_pairs"] == 3
    assert s["climbs_by_package"] == {"normlab.cli": 2, "normlab.experiment.execution": 1}
    assert s["climbs_into_command_from"] == {
        "normlab.experiment.execution.ladder": 1,
        "normlab.cli.errors": 1,
    }


def _decide(x: float) -> str:
    return "equivalent" if abs(x) < 1 else "worse"


def _relay(x: float) -> dict:
    return {"quality": _decide(x)}


def _show(word: str) -> str:
    return word.upper().lower()


def test_the_profiler_tells_where_a_word_is_decided_from_where_it_is_passed() -> None:
    for f in (_decide, _relay, _show):  # as if they were normlab's
        f.__globals__["__name__"] = "normlab.analysis.fake"
    walk = st.Walk(st.design_order(), word="equivalent")
    sys.setprofile(walk.profile)
    try:
        _show(_relay(0.5)["quality"])
        _relay(5.0)
    finally:
        sys.setprofile(None)
        _decide.__globals__["__name__"] = __name__
    assert list(walk.origins) == ["normlab.analysis.fake:_decide"]
    assert list(walk.relays) == ["normlab.analysis.fake:_relay", "normlab.analysis.fake:_show"]
    assert st._holds({"a": "equivalent"}, "equivalent") and not st._holds(["x"], "equivalent")


def test_file_chains_follow_the_process_that_started_a_run() -> None:
    frame = {"module": "normlab.a", "function": "f", "line": 1}
    records = [
        {"event": "start", "pid": 1, "child": 2, "args": "python w.py", "time": 0,
         "stack": [{**frame, "file": "normlab/cli/x.py"}, {**frame, "file": "normlab/e/r.py"}]},
        {"event": "write", "pid": 2, "time": 1, "path": "runs/a/summary.json",
         "stack": [{**frame, "file": "normlab/e/w.py"}, {**frame, "file": "normlab/e/w.py"},
                   {**frame, "file": "normlab/r/f.py"}, {**frame, "file": "normlab/e/w.py"}]},
    ]  # fmt: skip
    chain = st.file_chain(st.full_stack(records[1], records))
    assert chain == [
        "normlab/cli/x.py",
        "normlab/e/r.py",
        "[process]",
        "normlab/e/w.py",
        "normlab/r/f.py",
        "normlab/e/w.py",
    ]
    assert st._hops(st.full_stack(records[1], records)) == {"chain": chain, "files": 4, "hops": 5}
    writes = [
        {"module": "normlab.experiment.execution.worker", "function": "serve"},
        {"module": "normlab.run_format.folder", "function": "write_summary"},
        {"module": "normlab._io", "function": "_atomic"},
    ]
    assert st._writer(writes) == "normlab.experiment.execution.worker:serve"


def test_the_probes_record_in_a_child_process_started_with_them(tmp_path: Path) -> None:
    """A child Python started inside :func:`probed` records its own summary.json write, and
    the parent records that it started it; outside the block nothing is probed."""
    trace = tmp_path / "trace"
    code = (
        "import os, pathlib; p = pathlib.Path(os.environ['OUT']); "
        "(p / 'x.tmp').write_text('{}'); os.replace(p / 'x.tmp', p / 'summary.json')"
    )
    popen_init, replace = subprocess.Popen.__init__, os.replace
    with st.probed(trace):
        env = {**os.environ, "OUT": str(tmp_path)}
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
    records = st.read_records(trace)
    assert [r["event"] for r in records] == ["start", "write"]
    start, write = records
    assert start["pid"] == os.getpid() and start["child"] == write["pid"]
    assert write["path"] == str(tmp_path / "summary.json")
    assert subprocess.Popen.__init__ is popen_init and os.replace is replace  # restored
    assert st.TRACE_ENV not in os.environ
    os.replace(tmp_path / "summary.json", tmp_path / "summary2.json")
    assert len(st.read_records(trace)) == 2


@pytest.mark.parametrize("part", ["functions"])
def test_the_command_prints_its_measure(part: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert st.main(["--only", part]) == 0
    out = capsys.readouterr().out
    assert f"more than {st.MAX_BODY} body lines outside kernels/" in out
