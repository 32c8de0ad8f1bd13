"""The report as Markdown (a compare's, or a size ladder's): the same content as the HTML,
plots linked from ``plots/``, other reports linked by their report.md."""

from __future__ import annotations

import re
from collections.abc import Sequence

from normlab.report.content import Link, Plot, ReportContent, Section, Table
from normlab.report.ladder_content import BOX_LABEL, LadderContent

__all__ = ["render_ladder_markdown", "render_markdown"]

_STATUS_WORD = {
    "switch": "Recommendation",
    "keep": "Recommendation",
    "either": "Recommendation",
    "undecided": "No verdict yet",
}


def _text(text: str) -> str:
    """``text`` as literal Markdown: a ``<`` that would open an HTML tag or comment becomes
    ``&lt;`` and the ``](`` that closes a link's text is escaped, so text that came from a run
    (an error message, an arm or file name) can become neither HTML nor a link or an image
    (``p < 0.05`` stays as it is)."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text).replace("](", "\\](")


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> str:
    if not t.rows:
        return "_(none)_\n"
    head = "| " + " | ".join(_cell(c) or " " for c in t.columns) + " |"
    rule = "|" + "|".join("---:" if a == "right" else ":---" for a in t.align) + "|"
    body = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join([head, rule, *body]) + "\n"


def _plot(p: Plot) -> str:
    return f"![{_text(p.title)}]({p.relpath})\n\n*{_text(p.caption)}*\n"


def _section(s: Section) -> list[str]:
    out = [f"## {_text(s.title)}\n", *(f"{_text(p)}\n" for p in s.paragraphs)]
    for caption, table in [*s.settings, *s.tables]:
        out.append(f"**{_text(caption)}**\n" if caption else "")
        out.append(_table(table))
    if s.links:
        out.append("\n".join(f"- [{_text(link.text)}]({Link.href(link.md)})" for link in s.links))
        out.append("")
    out.extend(_plot(p) for p in s.plots)
    return out


def render_markdown(c: ReportContent) -> str:
    """Lay out ``c`` as a Markdown document."""
    label = _STATUS_WORD.get(c.status, "Recommendation")
    out = _top(c.title, c.subtitle, label, c.headline, c.arm_details)
    out.append(_table(c.verdict_table))
    out.extend(f"_{_text(note)}_\n" for note in c.verdict_notes)
    if c.verdict_plot is not None:
        out.append(_plot(c.verdict_plot))
    out.append("## What was compared\n")
    if c.budget:
        out.append(f"**Training budget:** {_text(c.budget)}\n")
    if c.varied:
        out.append(
            "**Varied:** " + "; ".join(f"{_text(k)} = {_text(v)}" for k, v in c.varied) + ". "
            "Everything else was held fixed:\n"
        )
    out.append(_table(c.fixed))
    out.append("### Parameters per arm\n")
    out.append(_table(c.params))
    out.append("## Training curves and final numbers\n")
    if c.curves_note:
        out.append(f"_{_text(c.curves_note)}_\n")
    out.extend(_plot(p) for p in c.plots)
    for section in c.sections:
        out.extend(_section(section))
    out.append("## All metrics\n")
    out.append(_table(c.stats_table))
    out.append("## Runs\n")
    if c.excluded:
        out.append("Excluded from the statistics: " + "; ".join(map(_text, c.excluded)) + ".\n")
    out.append(_table(c.runs_table))
    out.append("## Environment\n")
    out.append(_table(c.environment))
    out.append("## Method\n")
    out.extend(f"- {_text(line)}" for line in c.method)
    return "\n".join(out).rstrip() + "\n"


def _top(
    title: str,
    subtitle: str,
    label: str,
    headline: str,
    arm_details: Sequence[tuple[str, str, str]],
) -> list[str]:
    """The title, the subtitle and the box: ``label`` and the ``headline``, then one line per
    (arm, word, text)."""
    out = [f"# {_text(title)}\n", f"{_text(subtitle)}\n"]
    out.append(f"> **{_text(label)}: {_text(headline)}**\n>")
    for arm, decision, text in arm_details:
        out.append(f"> - **{_text(arm)}** ({_text(decision)}): {_text(text)}")
    out.append("")
    return out


def render_ladder_markdown(c: LadderContent) -> str:
    """Lay out the ladder's report ``c`` as a Markdown document: the box, the prediction's
    table and figure, the sections, the method."""
    out = _top(c.title, c.subtitle, BOX_LABEL, c.headline, c.arm_details)
    out.append(_table(c.verdict_table))
    if c.verdict_plot is not None:
        out.append(_plot(c.verdict_plot))
    for section in c.sections:
        out.extend(_section(section))
    out.append("## Method\n")
    out.extend(f"- {_text(line)}" for line in c.method)
    return "\n".join(out).rstrip() + "\n"
