"""One table of exit statuses (:data:`normlab.cli.errors.EXIT_STATUSES`) for every command.

Every refusal of every command below exits with the status the table gives its kind (``usage``:
what was written cannot be taken; ``refused``: it was written well but what it names cannot be
used), each command's ``--help`` names its statuses with the table's numbers and names, and the
README's table is the table.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.errors import EXIT_STATUSES

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "compare" / "fixtures" / "compare_run"
"""A compare folder of normlab's own runs."""
CODE = {status.name: status.code for status in EXIT_STATUSES}
NAME = {status.code: status.name for status in EXIT_STATUSES}

FACTORY = """
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, make_norm, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 16)
        self.norm = make_norm(16)
        self.head = nn.Linear(16, vocab_size)

    def forward(self, tokens):
        return self.head(self.norm(self.embed(tokens)))


def make(make_norm, vocab_size):
    return TinyLM(make_norm, vocab_size)
"""
"""A ``--model package.module:factory`` module (a factory has no config for μP to scale)."""
DEFECT = """
import torch
from torch import nn


class EpsOutside(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (self.weight * xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + 1e-2)).to(x.dtype)
"""
"""A norm with ε outside the root: ``audit norm`` finds a defect."""
LLAMA = (
    "hidden_size=32,num_hidden_layers=1,num_attention_heads=4,num_key_value_heads=2,"
    "intermediate_size=88,max_position_embeddings=32"
)
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


class Place:
    """The files and folders a case's arguments name (``{name}`` in its template), made on
    demand in the test's own folder."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def __getitem__(self, name: str) -> str:
        made = getattr(self, f"_{name}", None)
        return made() if made is not None else str(self.tmp / name)  # a path, not made

    def _tmp(self) -> str:
        return str(self.tmp)

    def _a_file(self) -> str:
        path = self.tmp / "a_file"
        path.write_text("keep me", encoding="utf-8")
        return str(path)

    def _corpus(self) -> str:
        path = self.tmp / "corpus.txt"
        path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(400)))
        return str(path)

    def _damaged_compare(self) -> str:
        """A copy of a compare folder whose first run's summary.json was cut short."""
        out = self.tmp / "damaged"
        shutil.copytree(FIXTURE, out)
        summary = sorted((out / "runs").glob("*/summary.json"))[0]
        summary.write_bytes(summary.read_bytes()[:50])
        return str(out)

    def _damaged_experiment(self) -> str:
        """A folder whose experiment.json was cut short."""
        out = self.tmp / "cut"
        out.mkdir()
        (out / "experiment.json").write_text('{"arms": ["a"', encoding="utf-8")
        return str(out)

    def _foreign(self) -> str:
        """A folder of someone else's files."""
        out = self.tmp / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("mine", encoding="utf-8")
        return str(out)

    def _factory(self) -> str:
        (self.tmp / "exit_factory.py").write_text(FACTORY, encoding="utf-8")
        return "exit_factory:make"

    def _defect(self) -> str:
        (self.tmp / "exit_defect.py").write_text(DEFECT, encoding="utf-8")
        return "exit_defect:EpsOutside"

    def _csv(self, cut: bool = False) -> str:
        """A table of runs ln_s0, rms_s0, ln_s1 (val_loss at steps 1 and 2)."""
        lines = ["run,step,metric,value"] + [
            f"{run},{step},val_loss,{1.0 / step}"
            for run in ("ln_s0", "rms_s0", "ln_s1")
            for step in (1, 2)
        ]
        path = self.tmp / "runs.csv"
        path.write_text("\n".join(lines) + "\n" + ("rms_" if cut else ""), encoding="utf-8")
        return f"csv:{path}"

    def _csv_cut(self) -> str:
        """The table with a last line cut inside its run's name."""
        return self._csv(cut=True)

    def _hf_config(self) -> str:
        pytest.importorskip("transformers")
        config = self.tmp / "c.yaml"
        lm = {"base_hidden_size": 24, "context": 16}  # the base width the heads cannot make
        config.write_text(json.dumps({"lm": lm, "data": {"max_bytes": 20000}}))
        return str(config)


EXPANDS = {
    "TINY": ["--steps", "2", "--warmup", "0", "--seeds", "1", "--threads", "1"],
    "RULES": ["--arm-from", r"^(.+)_s\d+$", "--seed-from", r"_s(\d+)$"],
    "BENCH": ["--quick", "--ops", "rms", "--dtypes", "fp32", "--modes", "fwd", "--rows", "64"],
    "LLAMA": ["--model", "hf:llama", "--model-set", LLAMA],
}
"""Words of a template that stand for several arguments."""
IMPORT = "report --import {csv} RULES --metric val_loss --out {imported}"


def argv(template: str, place: Place) -> list[str]:
    """The arguments of a case's template: split at spaces, ``{name}`` made by ``place``."""
    out: list[str] = []
    for word in template.split():
        out += EXPANDS.get(word) or [word.format_map(place)]
    return out


def case(status: str, what: str, template: str, *marks: pytest.MarkDecorator) -> Any:
    """A refusal: the status name the table gives it, what it is (its id, starting with the
    command) and the template of its arguments."""
    return pytest.param(status, what, template, id=what, marks=marks)


CASES: list[Any] = [
    # ---- compare
    case("usage", "compare --seeds x", "compare --seeds x"),
    case("usage", "compare invalid config", "compare --lr -1 --out {o}"),
    case("usage", "compare unknown norm", "compare --norms rmsnorm,x --out {o}"),
    case("usage", "compare --run with other flags", "compare --run r0 --seeds 2 --out {o}"),
    case("usage", "compare --target-params alone", "compare --target-params 1000 --out {o}"),
    case("usage", "compare a --script option alone", "compare --metric val_loss --out {o}"),
    case("usage", "compare mup on dit", "compare --testbed dit --parametrization mup --out {o}"),
    case("usage", "compare a malformed --device", "compare --device cuda:abc --out {o}"),
    case(
        "usage",
        "compare mup for a factory",
        "compare --model {factory} --parametrization mup --data {corpus} TINY --out {o}",
    ),
    case(
        "usage",
        "compare a factory that cannot be imported",
        "compare --model no_such_module_x:make --data {corpus} TINY --out {o}",
    ),
    case(
        "usage",
        "compare mup at a base width the heads cannot make",
        "compare --config {hf_config} LLAMA --parametrization mup --data {corpus} TINY "
        "--device cpu --out {o}",
        pytest.mark.slow,
    ),
    case("refused", "compare --out is a file", "compare --out {a_file}"),
    case("refused", "compare --data missing", "compare --data {no_data} --out {o}"),
    case("refused", "compare --out holds other files", "compare --out {foreign}"),
    case(
        "refused",
        "compare --out holds a damaged experiment.json",
        "compare --data {corpus} TINY --out {damaged_experiment}",
    ),
    case(
        "refused",
        "compare --run a run whose summary is damaged",
        "compare --out {damaged_compare} --run layernorm-pre__s0",
    ),
    case(
        "refused",
        "compare an hf: folder that is not there",
        "compare --model hf:{no_model} --data {corpus} TINY --out {o}",
    ),
    case("refused", "compare --device cuda", "compare --device cuda --out {o}", NO_CUDA),
    # ---- report
    case("usage", "report no OUT", "report"),
    case("usage", "report an --import option alone", "report {o} --arm-from x"),
    case("usage", "report OUT and --import", f"{IMPORT} {{o}}"),
    case("usage", "report --import without --metric", "report --import {csv} RULES --out {o}"),
    case("usage", "report --import unknown kind", IMPORT.replace("{csv}", "parquet:x")),
    case("usage", "report --import no path", IMPORT.replace("{csv}", "csv:")),
    case("usage", "report --arm-from does not compile", f"{IMPORT} --arm-from ^("),
    case("usage", "report --arm-from reads a field csv lacks", f"{IMPORT} --arm-from param:norm"),
    case("usage", "report --margin 0", f"{IMPORT} --margin 0"),
    case("refused", "report OUT missing", "report {missing}"),
    case("refused", "report OUT not a compare folder", "report {tmp}"),
    case("refused", "report a damaged run summary", "report {damaged_compare}"),
    case("refused", "report a damaged experiment.json", "report {damaged_experiment}"),
    case("refused", "report --import PATH missing", IMPORT.replace("{csv}", "csv:{no_table}")),
    case("refused", "report --import no runs", IMPORT.replace("{csv}", "jsonl:{tmp}")),
    case("refused", "report --import cut, its run unknown", IMPORT.replace("{csv}", "{csv_cut}")),
    case("refused", "report --import rules match no run", f"{IMPORT} --arm-from ^(x.*)_s"),
    case("refused", "report --import one arm", f"{IMPORT} --arm-from ^(ln)_s"),
    case("refused", "report --import metric not logged", f"{IMPORT} --metric acc"),
    case("refused", "report --import baseline not an arm", f"{IMPORT} --baseline gn"),
    case("refused", "report --import --out a file", f"{IMPORT} --out {{a_file}}"),
    # ---- bench
    case("usage", "bench --dims 0", "bench --dims 0 --out {o}"),
    case("usage", "bench --device tpu", "bench --device tpu --out {o}"),
    case("usage", "bench unknown peer", "bench --peers foo --out {o}"),
    case("refused", "bench --out is a file", "bench BENCH --out {a_file}"),
    case("refused", "bench --device cuda", "bench BENCH --device cuda --out {o}", NO_CUDA),
    case("refused", "bench sizes beyond memory", f"bench BENCH --rows {2**40} --out {{o}}"),
    case("failed", "bench no row measured", "bench BENCH --peers liger --out {o}", NO_CUDA),
    # ---- audit
    case("usage", "audit norm unknown target", "audit norm nope"),
    case("usage", "audit norm odd --dim", "audit norm rmsnorm --dim 7"),
    case("usage", "audit norm a module not there", "audit norm no_such_module_x:Norm"),
    case("usage", "audit model unknown --norm", "audit model --norm foo"),
    case("usage", "audit model unknown target", "audit model nope"),
    case("usage", "audit model bad --model-set", "audit model hf:llama --model-set hidden_size=x"),
    case("refused", "audit norm probes beyond memory", f"audit norm rmsnorm --dim {2**40}"),
    case("refused", "audit model an hf: folder not there", "audit model hf:{no_model}"),
    case("failed", "audit norm a defect", "audit norm {defect}"),
    # ---- coord-check
    case("usage", "coord-check one width", "coord-check --ladder d_model=32 --out {o}"),
    case("usage", "coord-check --lr 0", "coord-check --ladder d_model=32,64 --lr 0 --out {o}"),
    case(
        "refused", "coord-check --out a file", "coord-check --ladder d_model=32,64 --out {a_file}"
    ),
    # ---- explain, and the command group
    case("usage", "explain --eps -1", "explain 1 2 --eps -1"),
    case("usage", "explain not a number", "explain 1 x"),
    case("usage", "an unknown option", "--no-such-option"),
]
"""Every refusal of every command, and the failures that need no training."""


@pytest.mark.parametrize(("status", "what", "template"), CASES)
def test_every_refusal_exits_as_the_table_says(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    status: str,
    what: str,
    template: str,
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = argv(template, Place(tmp_path))
    result = CliRunner().invoke(app, args, env={"COLUMNS": "1000", "NO_COLOR": "1"})
    assert not isinstance(result.exception, (AssertionError, TypeError)), result.exception
    assert result.exit_code == CODE[status], (
        f"{what}: exit {result.exit_code} ({NAME.get(result.exit_code, '?')}), expected "
        f"{CODE[status]} ({status}): {result.output}"
    )
    if status in ("usage", "refused"):
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and ": error: " in lines[0], result.stderr
        assert "Traceback" not in result.output


HELPS = {
    "compare": ["compare"],
    "report": ["report"],
    "bench": ["bench"],
    "audit norm": ["audit", "norm"],
    "audit model": ["audit", "model"],
    "coord-check": ["coord-check"],
    "explain": ["explain"],
}
"""Each command and its arguments before ``--help``."""


def _help_statuses(command: list[str]) -> dict[int, str]:
    """{status: name} as the command's ``--help`` names them ("N (name) when …")."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    paragraph = text.partition("Exit status: ")[2]
    assert paragraph, f"normlab {' '.join(command)} --help says no exit status"
    return {int(code): name for code, name in re.findall(r"(\d+) \((\w+)\) ", paragraph)}


@pytest.mark.parametrize("command", list(HELPS), ids=list(HELPS))
def test_every_commands_help_names_its_statuses_as_the_table_does(command: str) -> None:
    shown = _help_statuses(HELPS[command])
    assert 0 in shown and 2 in shown, shown
    for code, name in shown.items():
        assert NAME.get(code) == name, (command, code, name)
    for param in CASES:  # every status a refusal of the command exits with is in its help
        status, what = param.values[:2]
        if what.startswith(f"{command} "):
            assert CODE[status] in shown, (command, what, shown)


def test_the_readme_table_is_the_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.partition("## Exit statuses")[2].partition("\n## ")[0]
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+?) \|$", section, flags=re.MULTILINE)
    table = [(s.code, s.name, s.meaning) for s in EXIT_STATUSES]
    assert [(int(code), name, meaning) for code, name, meaning in rows] == table
