"""The report (a compare's, or a size ladder's) as one self-contained HTML file: inline CSS,
plots embedded as base64 PNG, no external resource of any kind (no fonts, scripts or links to
fetch; a ladder's page links its rungs' own reports, beside it in the folder)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

from normlab.analysis.wording import tone
from normlab.report.content import Link, Plot, ReportContent, Section, Table
from normlab.report.ladder_content import BOX_LABEL, LadderContent

__all__ = ["render_html", "render_ladder_html"]

_BOX_TITLE = {
    "switch": "Recommendation",
    "keep": "Recommendation",
    "either": "Recommendation",
    "undecided": "No verdict yet",
}

_CSS = """
:root { --ink: #1f2328; --muted: #59636e; --rule: #d8dee4; --soft: #f6f8fa;
  --good: #1a7f37; --good-bg: #dafbe1; --bad: #b42318; --bad-bg: #fee4e2;
  --open: #8a5300; --open-bg: #fff1d6; --neutral: #3d4a57; --neutral-bg: #e8edf2; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: var(--ink);
  font: 16px/1.55 -apple-system, BlinkMacSystemFont, "Segoe UI", "Helvetica Neue", Arial,
  "Noto Sans", "DejaVu Sans", sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 36px 28px 64px; }
h1 { font-size: 2.0em; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 1.35em; margin: 44px 0 12px; padding-bottom: 6px;
  border-bottom: 1px solid var(--rule); }
h3 { font-size: 1.08em; margin: 26px 0 8px; }
p { margin: 8px 0; }
.subtitle { color: var(--muted); margin: 0 0 22px; font-size: 0.95em; }
nav { font-size: 0.9em; color: var(--muted); margin-bottom: 20px; }
nav a { color: var(--muted); margin-right: 14px; text-decoration: none;
  border-bottom: 1px dotted var(--muted); }
.verdict { border-radius: 10px; padding: 20px 24px; margin: 8px 0 18px;
  border: 1px solid; border-left-width: 8px; }
.verdict .label { text-transform: uppercase; letter-spacing: 0.08em; font-size: 0.78em;
  font-weight: 700; margin-bottom: 4px; }
.verdict .headline { font-size: 1.45em; font-weight: 700; line-height: 1.3; margin: 0 0 10px; }
.verdict ul { margin: 6px 0 0; padding-left: 20px; }
.verdict li { margin: 4px 0; }
.status-switch { background: #eefbf1; border-color: #9bd8a9; color: #0f3d1e; }
.status-switch .label { color: var(--good); }
.status-keep, .status-either { background: #eef4fb; border-color: #a8c5e6; color: #12304f; }
.status-keep .label, .status-either .label { color: #1f5fa8; }
.status-undecided { background: #fff8e8; border-color: #f0c36d; color: #4a3000; }
.status-undecided .label { color: var(--open); }
.table-wrap { overflow-x: auto; margin: 10px 0 6px; }
table { border-collapse: collapse; font-size: 0.86em; width: 100%;
  font-variant-numeric: tabular-nums; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--rule); vertical-align: top; }
th { text-align: left; font-weight: 600; color: var(--muted); background: var(--soft);
  border-bottom: 2px solid var(--rule); vertical-align: bottom; }
td.r, th.r { text-align: right; }
td.r, td:first-child { white-space: nowrap; }
tbody tr:hover td { background: #fafbfc; }
tr.group-start td { border-top: 2px solid var(--rule); }
tr.diverged td { background: #fff5f4; }
tr.crashed td { background: #fdeceb; }
tr.unfinished td { color: var(--muted); background: #f7f7f7; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; font-size: 0.92em;
  font-weight: 600; line-height: 1.4; }
.b-good { color: var(--good); background: var(--good-bg); }
.b-bad { color: var(--bad); background: var(--bad-bg); }
.b-open { color: var(--open); background: var(--open-bg); }
.b-neutral { color: var(--neutral); background: var(--neutral-bg); }
figure { margin: 18px 0 26px; }
figure img { display: block; width: 100%; height: auto; border: 1px solid var(--rule);
  border-radius: 6px; }
figcaption { color: var(--muted); font-size: 0.88em; margin-top: 6px; }
.kv { display: grid; grid-template-columns: repeat(auto-fill, minmax(330px, 1fr));
  gap: 0 28px; margin: 10px 0; font-size: 0.86em; }
.kv div { display: flex; justify-content: space-between; gap: 12px; padding: 5px 2px;
  border-bottom: 1px solid var(--rule); }
.kv code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  color: var(--muted); }
.kv span { text-align: right; word-break: break-all; }
.env td:first-child { color: var(--muted); width: 16em; }
.env td:last-child { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  word-break: break-all; }
.env th { display: none; }
.note { color: var(--muted); font-size: 0.9em; }
ul.method li { margin: 6px 0; }
footer { margin-top: 48px; color: var(--muted); font-size: 0.82em; }
"""


_LADDER_CSS = """
.status-good { background: #eefbf1; border-color: #9bd8a9; color: #0f3d1e; }
.status-good .label { color: var(--good); }
.status-bad { background: #fdf1f0; border-color: #f0a8a0; color: #4d1410; }
.status-bad .label { color: var(--bad); }
.status-neutral { background: #eef4fb; border-color: #a8c5e6; color: #12304f; }
.status-neutral .label { color: #1f5fa8; }
.status-open { background: #fff8e8; border-color: #f0c36d; color: #4a3000; }
.status-open .label { color: var(--open); }
ul.links { list-style: none; padding: 0; margin: 12px 0; display: flex; flex-wrap: wrap;
  gap: 6px 26px; }
td .badge { white-space: nowrap; }
"""
"""What a ladder's page adds to the compare report's styles: its box coloured by the tone of
the words at the target (:func:`normlab.analysis.wording.tone`), and its list of links."""


def _badge(text: str) -> str:
    word = text.strip().lower()
    if not word or word == "—":
        return escape(text)
    return f'<span class="badge b-{tone(word)}">{escape(text)}</span>'


def _table(t: Table, css_class: str = "") -> str:
    if not t.rows:
        return '<p class="note">(none)</p>'
    head = "".join(
        f'<th class="r">{escape(c)}</th>' if a == "right" else f"<th>{escape(c)}</th>"
        for c, a in zip(t.columns, t.align, strict=True)
    )
    body = []
    for i, row in enumerate(t.rows):
        cls = t.row_class[i] if i < len(t.row_class) and t.row_class[i] else ""
        cells = []
        for j, (cell, a) in enumerate(zip(row, t.align, strict=True)):
            inner = _badge(cell) if j in t.badges else escape(cell)
            cells.append(f'<td class="r">{inner}</td>' if a == "right" else f"<td>{inner}</td>")
        tr = f'<tr class="{cls}">' if cls else "<tr>"
        body.append(tr + "".join(cells) + "</tr>")
    wrap = f'<div class="table-wrap {css_class}">' if css_class else '<div class="table-wrap">'
    return (
        f"{wrap}<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


def _key_values(t: Table) -> str:
    """A two-column table of settings as a compact multi-column grid."""
    if not t.rows:
        return '<p class="note">(none recorded)</p>'
    items = "".join(
        f"<div><code>{escape(k)}</code><span>{escape(v)}</span></div>" for k, v in t.rows
    )
    return f'<div class="kv">{items}</div>'


def _figure(p: Plot) -> str:
    data = base64.b64encode(p.png).decode("ascii")
    return (
        f'<figure id="plot-{escape(p.name)}"><img alt="{escape(p.title)}" '
        f'src="data:image/png;base64,{data}"><figcaption><strong>{escape(p.title)}.</strong> '
        f"{escape(p.caption)}</figcaption></figure>"
    )


def _section(s: Section) -> list[str]:
    parts = [f'<h2 id="{escape(s.anchor)}">{escape(s.title)}</h2>']
    parts.extend(f"<p>{escape(p)}</p>" for p in s.paragraphs)
    for caption, table in s.settings:
        if caption:
            parts.append(f"<h3>{escape(caption)}</h3>")
        parts.append(_key_values(table))
    for caption, table in s.tables:
        if caption:
            parts.append(f"<h3>{escape(caption)}</h3>")
        parts.append(_table(table))
    if s.links:
        items = "".join(
            f'<li><a href="{escape(Link.href(link.html))}">{escape(link.text)}</a></li>'
            for link in s.links
        )
        parts.append(f'<ul class="links">{items}</ul>')
    parts.extend(_figure(p) for p in s.plots)
    return parts


def render_html(c: ReportContent) -> str:
    """Lay out ``c`` as one self-contained HTML page: the head and navigation, the verdict,
    what was compared, the curves and sections, all metrics, the runs, the environment and the
    method, one element or block per line."""
    parts = [
        *_page_head(c),
        *_verdict(c),
        *_setup(c),
        *_curves(c),
        '<h2 id="metrics">All metrics</h2>',
        _table(c.stats_table),
        *_runs(c),
        '<h2 id="environment">Environment</h2>',
        _table(c.environment, "env"),
        *_method(c),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"


_COMPARE_NAV = (
    ("verdict", "Verdict"),
    ("setup", "What was compared"),
    ("curves", "Curves"),
    ("metrics", "All metrics"),
    ("runs", "Runs"),
    ("environment", "Environment"),
    ("method", "Method"),
)


def _page_head(c: ReportContent) -> list[str]:
    """The document's head (title, inline CSS), the page title and subtitle, the navigation."""
    return _head(c.title, "normlab compare", c.subtitle, _COMPARE_NAV, _CSS)


def _head(
    title: str, kind: str, subtitle: str, nav: Sequence[tuple[str, str]], css: str
) -> list[str]:
    """The document's head (``title — kind``, the inline ``css``), the page title and
    ``subtitle``, and the navigation: one link per (anchor, text) of ``nav``."""
    links = "".join(f'<a href="#{escape(anchor)}">{escape(text)}</a>' for anchor, text in nav)
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)} — {escape(kind)}</title>",
        f"<style>{css}</style></head><body><main>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="subtitle">{escape(subtitle)}</p>',
        f"<nav>{links}</nav>",
    ]


def _verdict(c: ReportContent) -> list[str]:
    """The verdict box (headline, each arm's decision), its table, its notes and its figure."""
    label = _BOX_TITLE.get(c.status, "Recommendation")
    parts = _verdict_box(c.status, label, c.headline, c.arm_details, c.verdict_table, None)
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in c.verdict_notes)
    if c.verdict_plot is not None:
        parts.append(_figure(c.verdict_plot))
    return parts


def _verdict_box(
    status: str,
    label: str,
    headline: str,
    arm_details: Sequence[tuple[str, str, str]],
    table: Table,
    plot: Plot | None,
) -> list[str]:
    """The box titled ``label`` (CSS class ``status-<status>``) with the ``headline`` and one
    line per (arm, badge word, text), then its ``table`` and its ``plot``."""
    parts = [
        f'<section id="verdict" class="verdict status-{escape(status)}">',
        f'<div class="label">{escape(label)}</div>',
        f'<p class="headline">{escape(headline)}</p><ul>',
    ]
    for arm, decision, text in arm_details:
        parts.append(f"<li><strong>{escape(arm)}</strong> {_badge(decision)} {escape(text)}</li>")
    parts.append("</ul></section>")
    parts.append(_table(table))
    if plot is not None:
        parts.append(_figure(plot))
    return parts


def _setup(c: ReportContent) -> list[str]:
    """What was compared: the training budget, what varied, the settings held fixed, the
    parameters per arm."""
    parts = ['<h2 id="setup">What was compared</h2>']
    if c.budget:
        parts.append(f"<p><strong>Training budget:</strong> {escape(c.budget)}</p>")
    if c.varied:
        varied = "; ".join(f"<strong>{escape(k)}</strong> = {escape(v)}" for k, v in c.varied)
        parts.append(f"<p>Varied: {varied}. Everything below was held fixed.</p>")
    parts.append(_key_values(c.fixed))
    parts.append("<h3>Parameters per arm</h3>")
    parts.append(_table(c.params))
    return parts


def _curves(c: ReportContent) -> list[str]:
    """The training curves and final numbers, then the extra sections."""
    parts = ['<h2 id="curves">Training curves and final numbers</h2>']
    if c.curves_note:
        parts.append(f'<p class="note">{escape(c.curves_note)}</p>')
    parts.extend(_figure(p) for p in c.plots)
    for section in c.sections:
        parts.extend(_section(section))
    return parts


def _runs(c: ReportContent) -> list[str]:
    """The runs' table, after the runs left out of the statistics and why."""
    parts = ['<h2 id="runs">Runs</h2>']
    if c.excluded:
        parts.append(
            '<p class="note">Excluded from the statistics: '
            + "; ".join(escape(e) for e in c.excluded)
            + ".</p>"
        )
    parts.append(_table(c.runs_table))
    return parts


def _method(c: ReportContent) -> list[str]:
    """The method's paragraphs as a list, and the footer."""
    return _method_list(c.method, "compare folder")


def _method_list(lines: Sequence[str], folder: str) -> list[str]:
    """The method's ``lines`` as a list, and the footer naming the kind of ``folder`` read."""
    return [
        '<h2 id="method">Method</h2><ul class="method">',
        *(f"<li>{escape(line)}</li>" for line in lines),
        "</ul>",
        f"<footer>Built by <code>normlab report</code> from the files in the {escape(folder)}; "
        "rebuild it at any time without retraining.</footer>",
    ]


def render_ladder_html(c: LadderContent) -> str:
    """Lay out the ladder's report ``c`` as one self-contained HTML page, with the compare
    report's styles: the head and navigation, the box with the prediction's table and figure,
    the sections, the method."""
    nav = [("verdict", "Prediction"), *((s.anchor, s.title) for s in c.sections)]
    parts = [
        *_head(
            c.title,
            "normlab compare --ladder",
            c.subtitle,
            [*nav, ("method", "Method")],
            _CSS + _LADDER_CSS,
        ),
        *_verdict_box(
            c.status, BOX_LABEL, c.headline, c.arm_details, c.verdict_table, c.verdict_plot
        ),
        *(part for section in c.sections for part in _section(section)),
        *_method_list(c.method, "ladder folder"),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"
