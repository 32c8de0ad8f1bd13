"""The run format is defined once, and the package's arrows point down (docs/DESIGN.md §2).

The layering rules are checked on the source: every ``import`` and ``from … import`` of every
module under ``src/normlab``, those inside functions included (lazy imports), relative imports
resolved.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest

import normlab
import normlab.analysis
import normlab.report
import normlab.run_format as RF
from normlab.data import cache, shapes
from normlab.experiment import testbeds
from normlab.experiment.config import validate_config
from normlab.experiment.execution import grid
from normlab.report.runs_csv import DIT_RUN_COLUMNS, RUN_COLUMNS

PACKAGE = Path(normlab.__file__).resolve().parent
DOCS = Path(__file__).resolve().parents[2] / "docs" / "run-format.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(source: str, name: str, is_package: bool = False) -> set[str]:
    """Every module that the module ``name`` (with the text ``source``) imports, anywhere in
    its body, as absolute dotted names (for ``from a import b`` both ``a`` and ``a.b``, since
    ``b`` may be a module)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, set[str]]:
    """{module: what it imports} for every module of ``package`` (a dotted name)."""
    root = PACKAGE.parent.joinpath(*package.split("."))
    files = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    return {
        _module_name(p): _imports(
            p.read_text(encoding="utf-8"), _module_name(p), p.stem == "__init__"
        )
        for p in files
    }


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _violations(modules: dict[str, set[str]], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in modules.items()
        for name in names
        if any(_inside(name, f) for f in forbidden)
    )


def test_the_import_scan_sees_lazy_and_relative_imports() -> None:
    source = (
        "import json\n"
        "def f():\n"
        "    from normlab.experiment import runner\n"
        "    from ..experiment import tasks\n"
        "    import normlab.experiment.lock\n"
    )
    found = _imports(source, "normlab.report.probe")
    assert _violations({"p": found}, ("normlab.experiment",)) == [
        "p imports normlab.experiment",
        "p imports normlab.experiment.lock",
        "p imports normlab.experiment.runner",
        "p imports normlab.experiment.tasks",
    ]
    assert _imports("from . import fields\n", "normlab.run_format", is_package=True) == {
        "normlab.run_format",
        "normlab.run_format.fields",
    }


@pytest.mark.parametrize("package", ["normlab.analysis", "normlab.report"])
def test_analysis_and_report_do_not_import_the_experiment(package: str) -> None:
    assert _modules(package), package
    assert _violations(_modules(package), ("normlab.experiment",)) == []


def test_the_experiment_does_not_import_analysis_or_report() -> None:
    """Training writes the folder; the CLI then hands it to the analysis and the report."""
    modules = _modules("normlab.experiment")
    assert _violations(modules, ("normlab.analysis", "normlab.report")) == []


def test_the_run_format_imports_nothing_else_of_normlab() -> None:
    """Only the folder's reader and writer uses something else: the atomic writes."""
    modules = _modules("normlab.run_format")
    assert set(modules) >= {
        "normlab.run_format",
        "normlab.run_format.files",
        "normlab.run_format.fields",
        "normlab.run_format.folder",
        "normlab.run_format.testbeds",
    }
    outside = sorted(
        f"{module} imports {name}"
        for module, names in modules.items()
        for name in names
        if _inside(name, "normlab") and not _inside(name, "normlab.run_format")
    )
    allowed = ("normlab.run_format.folder imports normlab._io",)
    assert [line for line in outside if not line.startswith(allowed)] == []


def test_one_module_names_the_files_of_a_run_folder() -> None:
    """Outside the run format, no module spells a run folder's file names: every one reads and
    writes them through :mod:`normlab.run_format.folder`."""
    names = (
        "RUN_FILE",
        "SUMMARY_FILE",
        "METRICS_FILE",
        "SAMPLES_FILE",
        "REFERENCE_FILE",
        "SEQUENTIAL_FILE",
        "COMMAND_FILE",
    )
    src = Path(__file__).resolve().parents[2] / "src" / "normlab"
    found = sorted(
        f"{path.relative_to(src)} uses {name}"
        for path in src.rglob("*.py")
        if "run_format" not in path.relative_to(src).parts
        for name in names
        if re.search(rf"\b{name}\b", path.read_text(encoding="utf-8"))
    )
    assert found == []


# ---- one definition ----------------------------------------------------------------------------


def test_the_summary_fields_are_documented_in_order() -> None:
    """docs/run-format.md's table of a run's summary.json names every field the format
    declares, the optional ones after the rest, and no undeclared one, in the declared
    order."""
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("## A run's `summary.json`", 1)[1].split("\n## ", 1)[0]
    documented = list(
        dict.fromkeys(
            name
            for line in table.splitlines()
            if line.startswith("| `")
            for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
        )
    )
    formats = RF.TESTBED_FORMATS.values()
    declared = list(
        dict.fromkeys(f for t in formats for f in (*t.summary_fields, *t.optional_fields))
    )
    assert set(documented) == set(declared)
    for testbed in formats:
        order = [documented.index(f) for f in (*testbed.summary_fields, *testbed.optional_fields)]
        assert order == sorted(order), testbed.name


def test_summaries_columns_and_metrics_derive_from_the_declarations() -> None:
    for testbed in RF.TESTBED_FORMATS.values():
        names = testbed.summary_fields
        assert len(set(names)) == len(names), testbed.name
        assert names[: len(RF.HEAD_FIELDS)] == tuple(f.name for f in RF.HEAD_FIELDS)
        compared = [f.name for f in testbed.fields if f.compare is not None]
        assert sorted(m.name for m in testbed.metrics) == sorted(compared)
        groups = [testbed.field(m.name).compare.group for m in testbed.metrics]  # type: ignore[union-attr]
        assert groups == sorted(groups, key=RF.GROUPS.index)  # grouped, in GROUPS order
        for m in testbed.metrics:  # every compared field can be printed, its unit resolved
            assert testbed.field(m.name).display is not None, m.name
            assert "{" not in m.unit, m.name
        assert testbed.quality in compared and testbed.best in compared
        assert {name for name, _ in testbed.run_columns} <= set(names)
    assert (*RF.GPT.summary_fields, "error") == RUN_COLUMNS
    assert (*RF.DIT.summary_fields, "error") == DIT_RUN_COLUMNS
    assert set(RF.POSTTRAIN_FIELDS) <= set(RF.GPT.summary_fields)
    assert RF.GPT.metric("final_train_loss").unit == "nats per byte"
    assert RF.GPT.metric("final_train_loss").margin_factor == pytest.approx(math.log(2.0))
    assert RF.DIT.metric("final_train_loss").unit == "MSE"
    assert RF.DIT.metric("ptq_w8a8_delta").unit == "MSE"
    assert RF.GPT.metric("ptq_w8a8_delta").unit == "bits per byte"
    assert RF.GPT.metric("saved_activation_bytes").scale == "ratio"
    assert RF.GPT.metric("n_loss_spikes").statuses == RF.DONE_STATUSES


def test_copies_elsewhere_agree_with_the_run_format() -> None:
    """Names still spelled out outside the run format (the testbeds of the experiment) must
    agree with it."""
    for name, testbed in RF.TESTBED_FORMATS.items():
        assert testbeds.QUALITY_FIELDS[name] == testbed.validation_fields
    assert (cache.INFO_FILE, cache.TOKENS_FILE) == (RF.DATA_INFO_FILE, RF.TOKENS_FILE)
    assert shapes._INFO_FILE == RF.DATA_INFO_FILE
    assert grid.run_id("rmsnorm-pre", 3) == RF.run_id("rmsnorm-pre", 3) == "rmsnorm-pre__s3"
    for name, testbed in RF.TESTBED_FORMATS.items():  # the config's default margins
        needs = {"lm": {"lm": {"model": "hf:llama"}}}.get(name, {})  # lm has no default model
        assert validate_config({"testbed": name, **needs}).margin() == testbed.margin_default


def test_run_ids_round_trip() -> None:
    assert RF.parse_run_id(RF.run_id("a__b-pre", -2)) == ("a__b-pre", -2)
    assert RF.parse_run_id("notes") is None
    assert RF.run_dir("OUT", "x__s0") == Path("OUT") / "runs" / "x__s0"
    assert RF.plot_path("grad_norm") == "plots/grad_norm.png"


def test_display_formats() -> None:
    mib = RF.GPT.display("peak_memory_bytes")
    assert mib.format(3 * 2**20) == "3.0 MiB" and mib.format(3 * 2**20, unit=False) == "3.0"
    assert mib.format(None) == "—" and mib.format(math.inf) == "— MiB"
    assert RF.GPT.display("tokens_per_s").format(1234.6) == "1235"
    assert RF.DIT.display("wall_s").format(1.234) == "1.23 s"


def test_unknown_testbeds_and_fields_are_named() -> None:
    assert RF.testbed_format(None) is RF.GPT
    names = r"\['dit', 'gpt', 'lm'\]"
    with pytest.raises(ValueError, match=rf"testbed must be one of {names}, got 'vit'"):
        RF.testbed_format("vit")
    with pytest.raises(ValueError, match="metric must be one of"):
        RF.GPT.metric("final_val_loss")  # in a GPT summary, but not compared
    with pytest.raises(ValueError, match="group: expected one of"):
        RF.Comparison("x", "s", "speed")
