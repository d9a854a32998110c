"""The Annotations section: every record_function range as a tree (names indented by depth),
with host time, device time launched inside, calls, and the device-side ranges' span and
kernels. Text and HTML show the same strings."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.annotations import AnnotationTable

HEADERS = (
    "annotation",
    "calls",
    "host time",
    "device time launched",
    "kernels",
    "GPU range calls",
    "GPU span",
    "GPU kernels",
    "GPU kernel time",
    "% of device time",
)
NUMERIC = (False,) + (True,) * (len(HEADERS) - 1)
_INDENT = "  "


def annotation_rows(table: AnnotationTable) -> list[tuple[str, ...]]:
    """Return the table's rows formatted, names indented two spaces per level; the share is
    of all device time, by the larger of the two device-side measures of the row."""
    rows: list[tuple[str, ...]] = []
    for r in table.rows:
        device = max(r.device_us, r.gpu_kernel_us)
        share = device / table.device_us if table.device_us > 0 else 0.0
        rows.append(
            (
                _INDENT * r.depth + r.name,
                fmt_num(r.calls),
                fmt_us(r.host_us),
                fmt_us(r.device_us),
                fmt_num(r.kernels),
                fmt_num(r.gpu_calls),
                fmt_us(r.gpu_span_us) if r.gpu_calls else "",
                fmt_num(r.gpu_kernels) if r.gpu_calls else "",
                fmt_us(r.gpu_kernel_us) if r.gpu_calls else "",
                fmt_pct(share),
            )
        )
    return rows


def _columns(table: AnnotationTable) -> Sequence[int]:
    """All columns, less the GPU ranges' when the trace has none."""
    if table.gpu_ranges:
        return range(len(HEADERS))
    return (0, 1, 2, 3, 4, 9)


def annotations_section(table: AnnotationTable) -> Section:
    """Return the Annotations section (a note instead of a table when the trace has no
    record_function ranges)."""
    if not table.rows:
        text = (
            "No record_function ranges in this trace. Wrap parts of your code in "
            "`with torch.profiler.record_function('name'):` to see their time here."
        )
        return Section("Annotations", text, note(text))
    cols = _columns(table)
    rows = [tuple(row[i] for i in cols) for row in annotation_rows(table)]
    headers = [HEADERS[i] for i in cols]
    numeric = [NUMERIC[i] for i in cols]
    caption = (
        f"{fmt_num(table.ranges)} host ranges (user_annotation) and "
        f"{fmt_num(table.gpu_ranges)} device ranges (gpu_user_annotation), nested where "
        "they nest; device time launched = kernels whose launch call ran inside the range "
        "(nested ranges included); GPU span/kernels = the device-side ranges and the "
        "kernels they overlap on their stream"
    )
    # HTML folds leading spaces: the names' indentation becomes no-break spaces there.
    html_rows = [(_html_indent(row[0]),) + row[1:] for row in rows]
    parts_text = [caption, text_table(headers, rows, right=numeric)]
    parts_html = [note(caption), html_table(headers, html_rows, numeric=numeric, name_cols=(0,))]
    if table.rows_left_out:
        more = (
            f"{fmt_num(table.rows_left_out)} smaller rows not shown (their time is in the "
            "rows above them)"
        )
        parts_text.append(more)
        parts_html.append(note(more))
    for n in table.notes:
        parts_text.append(f"Note: {n}")
        parts_html.append(note(f"Note: {n}"))
    return Section("Annotations", "\n".join(parts_text), "".join(parts_html))


def _html_indent(name: str) -> str:
    stripped = name.lstrip(" ")
    return "\u00a0" * (len(name) - len(stripped)) + stripped


@report_of.register
def _annotation_table(table: AnnotationTable) -> tuple[str, Sequence[Section]]:
    return "Annotations", [annotations_section(table)]
