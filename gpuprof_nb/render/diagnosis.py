"""The Diagnosis section: the verdict, the findings with their evidence and fixes, the
one-off costs, what could not be judged."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.evidence import evidence_rows
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.results.diagnosis import Diagnosis, Finding


def _finding_text(n: int, f: Finding) -> str:
    table = text_table(("evidence", "value"), evidence_rows(f.evidence), right=(False, True))
    fix = "\n".join("    " + line for line in f.fix.splitlines())
    return (
        f"{n}. [{f.severity}] {f.title}  ({f.kind})\n"
        + "\n".join("   " + line for line in table.splitlines())
        + f"\n   fix:\n{fix}"
    )


def _finding_html(f: Finding) -> str:
    table = html_table(("evidence", "value"), evidence_rows(f.evidence), numeric=(False, True))
    return (
        f'<div class="finding" data-kind="{esc(f.kind)}">'
        f'<p><span class="sev-{esc(f.severity)}">{esc(f.severity.upper())}</span> '
        f"<b>{esc_inline(f.title)}</b> <code>{esc(f.kind)}</code></p>"
        f"{table}<p>Fix:</p><pre>{esc(f.fix)}</pre></div>"
    )


def diagnosis_section(diagnosis: Diagnosis) -> Section:
    """Return the Diagnosis section: verdict, findings (severity, title, evidence, fix),
    then what could not be judged."""
    text_parts = [diagnosis.verdict or "No verdict."]
    html_parts = [f"<p><b>{esc_inline(diagnosis.verdict or 'No verdict.')}</b></p>"]
    if not diagnosis.findings:
        text_parts.append("No findings.")
        html_parts.append(note("No findings."))
    for n, f in enumerate(diagnosis.findings, start=1):
        text_parts.append(_finding_text(n, f))
        html_parts.append(_finding_html(f))
    if diagnosis.one_off:
        head = "One-off costs (the first run only; not in the steady state above):"
        text_parts.append(head)
        html_parts.append(f"<p>{esc(head)}</p>")
    for n, f in enumerate(diagnosis.one_off, start=len(diagnosis.findings) + 1):
        text_parts.append(_finding_text(n, f))
        html_parts.append(_finding_html(f))
    if diagnosis.not_judged:
        text_parts.append("Not judged:\n" + "\n".join(f"  - {x}" for x in diagnosis.not_judged))
        html_parts.append(
            "<p>Not judged:</p><ul>"
            + "".join(f"<li>{esc(x)}</li>" for x in diagnosis.not_judged)
            + "</ul>"
        )
    for x in diagnosis.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section("Diagnosis", "\n\n".join(text_parts), "".join(html_parts))


@report_of.register
def _diagnosis(diagnosis: Diagnosis) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb diagnosis", [diagnosis_section(diagnosis)]
