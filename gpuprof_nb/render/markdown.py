"""Results as Markdown for a pull-request comment or a CI job summary (`report.to_markdown()`):
the headline numbers as a table, the verdict of a comparison, the findings, and the whole
text report (the notebook's text/plain) folded under a <details> block."""

from __future__ import annotations

import re

from gpuprof_nb.render.display import text as text_of
from gpuprof_nb.render.records import headline
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.compare import Comparison
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.distributed import RunReport
from gpuprof_nb.results.report import MemoryReport, ProfileReport

# Rows of a comparison's Changes table in the Markdown (the full text has them all).
MARKDOWN_CHANGES = 5

_TITLES = (
    (ProfileReport, "gpuprof_nb profile"),
    (MemoryReport, "gpuprof_nb memory report"),
    (RunReport, "gpuprof_nb distributed run"),
    (Comparison, "gpuprof_nb before and after"),
)


def cell(text: str) -> str:
    """Return `text` safe inside a Markdown table cell: no pipe, markup or line break."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("|", "\\|").replace("\n", " ")
    return re.sub(r"([`*_\[\]])", r"\\\1", text)


def scalar(name: str, value: float) -> str:
    """Format a headline scalar by the unit its name ends in."""
    if name.endswith("_us"):
        return fmt_us(value)
    if name.endswith("_bytes") or name.endswith("_bytes_per_step"):
        return fmt_bytes(value)
    if name.endswith("_fraction"):
        return fmt_pct(value)
    if name.endswith("_ratio") or "_ratio_" in name:
        return f"{fmt_num(value)}x"
    return fmt_num(value)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _findings(findings: tuple[Finding, ...]) -> list[str]:
    """Each finding as a list item: its title, then its whole fix (prose wrapped among code
    lines, so kept as written) in a fenced block inside the item."""
    lines = []
    for f in findings:
        lines.append(
            f"- **{cell(f.title)}** ({f.kind}, {f.severity}, {fmt_pct(f.share)} of the time)"
        )
        fix = f.fix.strip()
        if fix:
            fence = _fence(fix)
            lines += ["", f"  {fence}text"]
            lines += [f"  {line}".rstrip() for line in fix.splitlines()]
            lines += [f"  {fence}", ""]
    return lines


def _comparison_lines(c: Comparison) -> list[str]:
    from gpuprof_nb.render.compare import change_rows, verdict_words

    lines = [f"**{cell(verdict_words(c))}**", ""]
    rows = change_rows(c.changes[:MARKDOWN_CHANGES])
    if rows:
        lines += [
            "| what changed most | category | before | after | change |",
            "|---|---|--:|--:|--:|",
        ]
        lines += [f"| {' | '.join(cell(v) for v in row[:5])} |" for row in rows]
        lines.append("")
    if c.findings_new:
        lines += ["New findings:", *_findings(c.findings_new), ""]
    if c.findings_resolved:
        lines += ["Resolved:", *_findings(c.findings_resolved), ""]
    return lines


def markdown(obj: object) -> str:
    """Return a result as Markdown (module docstring)."""
    title = next((t for kind, t in _TITLES if isinstance(obj, kind)), None)
    if title is None:
        raise TypeError(f"gpuprof_nb has no Markdown for a {type(obj).__name__}")
    lines = [f"### {title}", ""]
    if isinstance(obj, Comparison):
        lines += _comparison_lines(obj)
    scalars = headline(obj)
    if scalars:
        lines += ["| headline | value |", "|---|--:|"]
        lines += [f"| `{k}` | {scalar(k, v)} |" for k, v in scalars.items()]
        lines.append("")
    if isinstance(obj, (ProfileReport, RunReport)):
        diagnosis = obj.diagnosis
        if diagnosis is not None:
            if diagnosis.verdict:
                lines += [cell(diagnosis.verdict), ""]
            lines += _findings(diagnosis.findings)
            lines.append("")
    elif isinstance(obj, MemoryReport):
        lines += [*_findings(obj.findings), ""]
    text = text_of(obj)
    fence = _fence(text)
    lines += [
        "<details><summary>Full report</summary>",
        "",
        f"{fence}text",
        text,
        fence,
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)
