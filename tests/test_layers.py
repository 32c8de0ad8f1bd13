"""docs/DESIGN.md §2 lists normlab's packages top to bottom; every import of a module of
``src/normlab`` (at module level or inside a function) points to a package below its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "normlab"


def design_order() -> list[str]:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text[text.index("## 2.") : text.index("## 3.")]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block is not None, "DESIGN §2 has no code block"
    return [line.split()[0] for line in block.group(1).splitlines() if line.startswith("normlab")]


def module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports_of(path: Path) -> set[str]:
    name, is_package = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base) + (f".{node.module}" if node.module else "")
            else:
                target = node.module or ""
            if target == "normlab":  # from normlab import functional → normlab.functional
                found.update(f"normlab.{a.name}" for a in node.names)
            else:
                found.add(target)
    return {t for t in found if t == "normlab" or t.startswith("normlab.")}


def layer_of(module: str, order: list[str]) -> str:
    matches = [p for p in order if module == p or module.startswith(p + ".")]
    assert matches, f"{module} belongs to no package listed in DESIGN §2"
    return max(matches, key=len)


def test_design_lists_every_package() -> None:
    order = design_order()
    assert len(order) == len(set(order))
    listed = {p.removeprefix("normlab.") for p in order}
    present = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    missing = present - listed - {"__init__", "__main__"}
    assert not missing, f"packages missing from DESIGN §2: {sorted(missing)}"


def test_every_import_points_down() -> None:
    order = design_order()
    rank = {p: i for i, p in enumerate(order)}
    upward = []
    for path in sorted(SRC.rglob("*.py")):
        source = layer_of(module_name(path)[0], order)
        for target in imports_of(path):
            layer = layer_of(target, order)
            if layer != source and rank[layer] < rank[source]:
                upward.append(f"{path.relative_to(ROOT)} ({source}) imports {target} ({layer})")
    assert not upward, "imports that point up DESIGN §2:\n" + "\n".join(upward)


def test_the_check_can_fail() -> None:
    order = design_order()
    assert layer_of("normlab.kernels.cpu._build", order) == "normlab.kernels"
    rank = {p: i for i, p in enumerate(order)}
    assert rank["normlab.report"] < rank["normlab.analysis"] < rank["normlab.run_format"]
    assert rank[layer_of("normlab.experiment.execution.runner", order)] < rank["normlab.models"]


def test_design_lists_every_part_of_the_experiment() -> None:
    """normlab.experiment is split by job: each of its sub-packages is listed in DESIGN §2 (so
    the order of those jobs is enforced like the packages'), and it has no loose module."""
    listed = {p for p in design_order() if p.startswith("normlab.experiment.")}
    experiment = SRC / "experiment"
    parts = {f"normlab.experiment.{p.name}" for p in experiment.iterdir() if p.is_dir()}
    parts = {p for p in parts if (experiment / p.rsplit(".", 1)[1] / "__init__.py").is_file()}
    loose = sorted(
        p.name for p in experiment.iterdir() if p.suffix == ".py" and p.stem != "__init__"
    )
    assert loose == ["config.py"], f"modules outside the sub-packages: {loose}"
    assert parts | {"normlab.experiment.config"} == listed


def module_graph() -> dict[str, set[str]]:
    """Every module of normlab → the normlab modules it imports (lazy imports included; an
    import of a name from a package counts as an import of the package's module when there is
    one by that name)."""
    modules = {module_name(p)[0]: p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set(imports_of(path))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.update(f"{node.module}.{a.name}" for a in node.names)
        targets = set()
        for target in found:
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between the modules of normlab (a package's __init__ and the modules it
    re-exports aside: the package is their public face), lazy imports included."""
    graph = module_graph()
    for name in graph:  # a package's own __init__ re-exporting its modules is not a cycle
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert cycles(graph) == []


def test_the_cycle_check_can_fail() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
