"""A ladder's report.md and report.html, from a real three-rung ladder trained on tiny models:
the same sections and tables in both, their numbers against summary.json's ``ladder`` record
and each rung's own summary.json, links that reach every rung's report, images that decode, the
tokens-per-parameter column when the record has it, and the swatches of the ladder's legends.
In a browser: scripts/report_screenshot.py (docs/reports.md)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from in_process import InProcessWorker
from normlab.analysis.power import forecast_range
from normlab.cli import app
from normlab.experiment.execution import executors
from normlab.report.ladder_report import write_ladder_report
from normlab.run_format import (
    ANALYSIS_FILE,
    LADDER_KEY,
    REPORT_HTML_FILE,
    REPORT_MD_FILE,
)
from normlab.run_format import folder as run_folder
from report_figures import skip_rendering

RUNGS = ("d_model=8", "d_model=16", "d_model=32")
TINY = {
    "threads": 1,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "context": 8},
    "train": {"batch_size": 2, "eval_interval": 2, "eval_windows": 2, "warmup": 1},
    "data": {"max_bytes": 300_000},
}
SECTIONS = [
    "The rungs",
    "The fit",
    "What was held fixed and what changed per rung",
    "Method",
]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-rung ladder (d_model 8, 16, 32; 2 seeds of 2 steps), trained in this process,
    its rungs' reports built without rendering their figures, the ladder's report in full."""
    root = tmp_path_factory.mktemp("ladder_report")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(300)))
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executors, "WorkerProcess", InProcessWorker)
        skip_rendering(mp)
        result = CliRunner().invoke(
            app,
            [
                "compare", "--config", str(config), "--ladder", "d_model=8,16,32",
                "--seeds", "2", "--steps", "2", "--data", str(corpus), "--out", str(out),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


class _Page(HTMLParser):
    """The parts of a report.html a reader sees: the h2 titles, each table (rows of cell
    texts, the header first) with the h2 it follows, the settings of each grid of name and
    value (as a table headed "setting", "value"), the images and the links."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.images: list[tuple[str, str]] = []
        self.links: list[tuple[str, str]] = []
        self._text: list[str] | None = None
        self._row: list[str] | None = None
        self._href: str | None = None
        self._kv = 0  # the depth of divs inside a grid of settings (0: outside one)
        self.feed(text)

    def _texts(self, tag: str) -> bool:
        """Whether ``tag``'s text is collected: headings, cells, links, a grid's names and
        values."""
        return tag in ("h2", "td", "th", "a") or (self._kv > 0 and tag in ("code", "span"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if self._texts(tag):
            self._text = []
        if tag == "div" and (self._kv or a.get("class") == "kv"):
            if not self._kv:
                self.tables.append((self.h2[-1] if self.h2 else "", [["setting", "value"]]))
            self._kv += 1
        elif tag == "a":
            self._href = a.get("href")
        elif tag == "table":
            self.tables.append((self.h2[-1] if self.h2 else "", []))
        elif tag == "tr":
            self._row = []
        elif tag == "img":
            self.images.append((a.get("alt") or "", a.get("src") or ""))

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._text or []).strip()
        collected = self._texts(tag)
        if tag == "div" and self._kv:
            self._kv -= 1
        elif self._kv and tag == "code":
            self.tables[-1][1].append([text])
        elif self._kv and tag == "span":
            self.tables[-1][1][-1].append(text)
        elif tag == "h2":
            self.h2.append(text)
        elif tag in ("td", "th") and self._row is not None:
            self._row.append(text)
        elif tag == "tr" and self._row is not None:
            self.tables[-1][1].append(self._row)
            self._row = None
        elif tag == "a" and self._href is not None:
            self.links.append((self._href, text))
            self._href = None
        if collected:
            self._text = None


def _md_tables(text: str) -> list[tuple[str, list[list[str]]]]:
    """Each Markdown table (rows of cell texts, the header first, the rule left out) with the
    ## title it follows."""
    tables: list[tuple[str, list[list[str]]]] = []
    title, inside = "", False
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not inside:
                tables.append((title, []))
                inside = True
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                tables[-1][1].append(cells)
        else:
            inside = False
    return tables


def _number(text: str) -> float:
    return float(text.replace("\u2212", "-").replace(",", ""))


def _interval(text: str) -> tuple[float, float, float]:
    """ "+0.0005 [−0.0396, +0.0407]" → (mean, low, high)."""
    m = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", text)
    assert m is not None, text
    mean, low, high = (_number(g) for g in m.groups())
    return mean, low, high


def _table(tables: list[tuple[str, list[list[str]]]], title: str, first: str) -> list[dict]:
    """The rows, as {column: cell}, of the table under ``title`` whose first column is
    ``first``."""
    for under, rows in tables:
        if under == title and rows and rows[0][0] == first:
            return [dict(zip(rows[0], row, strict=True)) for row in rows[1:]]
    raise AssertionError(f"no table {first!r} under {title!r}")


def _read(out: Path) -> tuple[dict, _Page, str]:
    summary = json.loads((out / ANALYSIS_FILE).read_text())
    page = _Page((out / REPORT_HTML_FILE).read_text(encoding="utf-8"))
    return summary, page, (out / REPORT_MD_FILE).read_text(encoding="utf-8")


def test_both_reports_have_the_same_sections_and_tables(ladder: Path) -> None:
    summary, page, md = _read(ladder)
    assert page.h2 == SECTIONS
    assert re.findall(r"^## (.+)$", md, re.M) == SECTIONS
    assert [rows for _, rows in page.tables] == [rows for _, rows in _md_tables(md)]
    rec = summary[LADDER_KEY]["arms"]["rmsnorm-pre"]
    for text in (md, (ladder / REPORT_HTML_FILE).read_text(encoding="utf-8")):
        assert rec["prediction"]["sentence"] in text  # the box: the answer in words
        assert rec["target"]["words"] in text  # how far it extrapolates
        assert rec["fit"]["model"] in text


def test_the_rung_table_agrees_with_the_ladder_record_and_each_rung(ladder: Path) -> None:
    summary, page, _ = _read(ladder)
    ladder_rec = summary[LADDER_KEY]
    rows = _table(page.tables, "The rungs", "arm")
    expected = [(arm, r) for arm, rec in ladder_rec["arms"].items() for r in rec["rungs"]]
    assert [(row["arm"], row["rung"]) for row in rows] == [(a, r["setting"]) for a, r in expected]
    for row, (arm, r) in zip(rows, expected, strict=True):
        assert _number(row["parameters"]) == round(r["n_params"])
        # fixed steps: each rung's tokens over its baseline arm's parameters
        assert r["tokens_per_param"] == pytest.approx(r["tokens"] / r["n_params"], rel=1e-12)
        assert _number(row["tokens per parameter"]) == pytest.approx(
            r["tokens_per_param"], rel=5e-3
        )
        assert int(row["paired seeds"]) == r["n"] == 2
        diff = next(v for k, v in row.items() if k.startswith("Δ"))
        assert _interval(diff) == pytest.approx((r["mean"], r["low"], r["high"]), abs=5e-5)
        assert _number(row["paired sd"]) == pytest.approx(r["sd"], abs=5e-5)
        own = run_folder.read_analysis(ladder / r["setting"])["verdicts"][arm]
        assert row["verdict at the rung"] == own["quality"]
        assert row["seeds needed"] == forecast_range(own["seeds_needed"], own["seeds_needed_high"])


def test_the_prediction_and_fit_tables_agree_with_the_record(ladder: Path) -> None:
    summary, page, _ = _read(ladder)
    rec = summary[LADDER_KEY]["arms"]["rmsnorm-pre"]
    (pred,) = _table(page.tables, "", "arm − layernorm-pre")
    p = rec["prediction"]
    assert pred["arm − layernorm-pre"] == "rmsnorm-pre"
    assert _number(pred["predicted Δ"].removesuffix(" bpb")) == pytest.approx(
        p["single"]["estimate"], abs=5e-5
    )
    k = p["mean_of_seeds"]["seeds"]
    for column, key in (("one training", "single"), (f"mean of {k} seeds", "mean_of_seeds")):
        cell = next(v for name, v in pred.items() if name.startswith(column))
        low, high = (_number(v) for v in cell.strip("[]").split(", "))
        assert (low, high) == pytest.approx((p[key]["low"], p[key]["high"]), abs=5e-5)
    assert pred["verdict"] == p["word"]
    (fit,) = _table(page.tables, "The fit", "arm − layernorm-pre")
    f = rec["fit"]
    a, a_se = fit["a ± se"].split(" ± ")
    b, b_se = fit["b ± se (per tenfold N)"].split(" ± ")
    assert [_number(v) for v in (a, a_se, b, b_se)] == pytest.approx(
        [f["a"], f["a_se"], f["b"], f["b_se"]], abs=5e-5
    )
    assert fit["lack of fit"] == f"p = {f['lack_of_fit_p']:.3f}"


def test_links_reach_every_rungs_report_and_images_decode(ladder: Path) -> None:
    _, page, md = _read(ladder)
    html = (ladder / REPORT_HTML_FILE).read_text(encoding="utf-8")
    anchors = [href for href, _ in page.links if href.startswith("#")]
    assert len(anchors) == len(SECTIONS) + 1  # the navigation: the box, then each section
    assert all(f'id="{a[1:]}"' in html for a in anchors)
    html_links = [unquote(href) for href, _ in page.links if not href.startswith("#")]
    assert html_links == [f"{rung}/{REPORT_HTML_FILE}" for rung in RUNGS]
    md_links = [unquote(h) for h in re.findall(r"(?<!!)\[[^\]]*\]\(([^)]+)\)", md)]
    assert md_links == [f"{rung}/{REPORT_MD_FILE}" for rung in RUNGS]
    for link in html_links + md_links:
        assert (ladder / link).is_file(), link
    alts = [alt for alt, _ in page.images]
    assert alts == ["The difference against model size, extrapolated to the target",
                    "Each arm against model size"]  # fmt: skip
    for alt, src in page.images:
        assert src.startswith("data:image/png;base64,"), alt
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        image.load()
        assert image.width > 300 and image.height > 200, alt
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        Image.open(ladder / target).load()  # the Markdown's images are the PNG files


def test_tokens_per_parameter_is_a_column_when_the_record_has_it(
    ladder: Path, tmp_path: Path
) -> None:
    """The report is built from the files: a record whose rungs carry ``tokens_per_param``
    shows it, in both formats."""
    out = tmp_path / "copy"
    shutil.copytree(ladder, out)
    summary = json.loads((out / ANALYSIS_FILE).read_text())
    for rec in summary[LADDER_KEY]["arms"].values():
        for j, r in enumerate(rec["rungs"]):
            r["tokens_per_param"] = 20.0 * (j + 1)
    (out / ANALYSIS_FILE).write_text(json.dumps(summary))
    write_ladder_report(out)
    _, page, md = _read(out)
    rows = _table(page.tables, "The rungs", "arm")
    assert [_number(row["tokens per parameter"]) for row in rows] == [20.0, 40.0, 60.0]
    assert _table(_md_tables(md), "The rungs", "arm") == rows


def test_a_summary_without_a_ladder_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / ANALYSIS_FILE).write_text(json.dumps({"arms": {}}))
    with pytest.raises(ValueError, match=r"summary\.json holds no 'ladder' record"):
        write_ladder_report(tmp_path)


@pytest.mark.parametrize("name", [ANALYSIS_FILE, "experiment.json"])
def test_a_damaged_rung_file_is_refused_naming_it(ladder: Path, tmp_path: Path, name: str) -> None:
    """A rung is never drawn from a file that cannot be read: the report names the file."""
    out = tmp_path / "copy"
    shutil.copytree(ladder, out)
    (out / "d_model=16" / name).write_text('{"cut in half": ')
    with pytest.raises(ValueError, match=re.escape(str(out / "d_model=16" / name))):
        write_ladder_report(out)
