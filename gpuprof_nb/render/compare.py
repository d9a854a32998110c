"""The sections of a before/after comparison: Verdict, Changes (a diverging bar chart and
the table), Idle breakdown and Findings; text and HTML with the same numbers."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render import svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.timeline import CATEGORY_LABELS, HOST_CATEGORY_LABELS
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.compare import ChangeRow, Comparison, Verdict
from gpuprof_nb.results.diagnosis import Finding

# Rows in the Changes table and bars in its chart (most important first).
MAX_CHANGE_ROWS = 25
MAX_CHANGE_BARS = 15
FASTER_COLOUR = "#2e7d32"
SLOWER_COLOUR = "#c62828"


def verdict_words(comparison: Comparison) -> str:
    """Return the headline: which side is faster, by how much, and whether it is real."""
    v = comparison.verdict
    unit = {"step": "per step", "run": "per run", "window": "over the profiled window"}[
        comparison.per
    ]
    speedup = comparison.speedup
    if v is None:
        if speedup is None:
            return f"No times to compare {unit}. {comparison.verdict_note}".strip()
        return (
            f"After takes {fmt_num(1 / speedup)}x the time of before {unit} "
            f"({_speed(speedup)}); {comparison.verdict_note}"
        )
    interval = f"95% interval {fmt_num(v.ci_low)}x to {fmt_num(v.ci_high)}x"
    if v.kind == "no clear change":
        return (
            f"No clear change: after takes {fmt_num(v.ratio)}x the time of before {unit} "
            f"({interval}), inside the noise (changes under "
            f"{fmt_pct(v.noise_floor)} are not called)"
            + (f"; {comparison.verdict_note}" if comparison.verdict_note else "")
        )
    return (
        f"{'Faster' if v.kind == 'faster' else 'Slower'}: after takes {fmt_num(v.ratio)}x "
        f"the time of before {unit} ({_speed(v.speedup)}; {interval})"
    )


def _speed(speedup: float) -> str:
    if speedup >= 1:
        return f"{fmt_num(speedup)}x faster"
    return f"{fmt_num(1 / speedup)}x slower"


def _verdict_rows(comparison: Comparison) -> list[tuple[str, str, str]]:
    before, after = comparison.step_median_us
    per = {"step": "median per step", "run": "median per run", "window": "profiled window"}[
        comparison.per
    ]
    rows = [
        ("", comparison.before_label, comparison.after_label),
        (per, fmt_us(before), fmt_us(after)),
    ]
    v: Verdict | None = comparison.verdict
    if v is not None:
        rows.append(("timed samples", fmt_num(v.before_samples), fmt_num(v.after_samples)))
    peak_b, peak_a = comparison.memory_peak_bytes
    if peak_b is not None or peak_a is not None:
        rows.append(("memory peak (profiler events)", fmt_bytes(peak_b), fmt_bytes(peak_a)))
    return rows


def verdict_section(comparison: Comparison) -> Section:
    """Return the Verdict section: the headline, the medians, samples and memory peaks."""
    head = verdict_words(comparison)
    rows = _verdict_rows(comparison)
    text_parts = [head, text_table(rows[0], rows[1:], right=(False, True, True))]
    html_parts = [
        f"<p><b>{esc(head)}</b></p>",
        html_table(rows[0], rows[1:], numeric=(False, True, True)),
    ]
    for n in comparison.notes:
        text_parts.append(f"Note: {n}")
        html_parts.append(note(f"Note: {n}"))
    return Section("Verdict", "\n\n".join(text_parts), "".join(html_parts))


CHANGE_HEADERS = (
    "name",
    "category",
    "before",
    "after",
    "change",
    "calls before",
    "calls after",
    "replaced by",
)
CHANGE_NUMERIC = (False, False, True, True, True, True, True, False)


def change_rows(rows: Sequence[ChangeRow]) -> list[tuple[str, ...]]:
    """The Changes table as formatted rows (the same strings for text and HTML)."""
    return [
        (
            r.name,
            r.category,
            fmt_us(r.before_us),
            fmt_us(r.after_us),
            ("+" if r.delta_us > 0 else "") + fmt_us(r.delta_us),
            fmt_num(r.calls_before),
            fmt_num(r.calls_after),
            r.replaced_by,
        )
        for r in rows
    ]


def changes_svg(rows: Sequence[ChangeRow]) -> str:
    """Return a diverging bar chart of the changes: one bar per row from zero, right (red)
    where after takes longer, left (green) where it takes less; hover for the numbers."""
    rows = list(rows[:MAX_CHANGE_BARS])
    width, label_w, bar_h, gap, top = 900, 300, 16, 6, 26
    height = top + len(rows) * (bar_h + gap) + 24
    biggest = max((abs(r.delta_us) for r in rows), default=1.0) or 1.0
    x0 = label_w + (width - label_w - 20) / 2
    scale = svg.LinearScale(-biggest, biggest, label_w + 10, width - 10)
    parts = [
        svg.svg_open(width, height, "change in time per row, after minus before"),
        svg.text(
            width / 2,
            16,
            "Change in time (after - before)",
            size=12,
            anchor="middle",
            extra=' font-weight="600"',
        ),
        f'<path d="M{svg.num(x0)} {top - 4}V{height - 20}" stroke="currentColor" '
        'stroke-opacity="0.4"/>',
    ]
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        a, b = sorted((scale(0.0), scale(r.delta_us)))
        colour = SLOWER_COLOUR if r.delta_us > 0 else FASTER_COLOUR
        tip = (
            f"{r.name} ({r.category})\nbefore {fmt_us(r.before_us)}, after "
            f"{fmt_us(r.after_us)}, change {fmt_us(r.delta_us)}"
            + (f"\nreplaced by {r.replaced_by}" if r.replaced_by else "")
        )
        name = r.name if len(r.name) <= 46 else r.name[:43] + "..."
        parts.append(svg.text(label_w, y + bar_h - 4, name, size=11, anchor="end", tip=tip))
        parts.append(
            f'<rect x="{svg.num(a)}" y="{svg.num(y)}" width="{svg.num(max(b - a, 1))}" '
            f'height="{bar_h}" fill="{colour}">{svg.title(tip)}</rect>'
        )
    parts.append(svg.text(scale(-biggest), height - 6, f"-{fmt_us(biggest)}", size=10))
    parts.append(svg.text(scale(biggest), height - 6, f"+{fmt_us(biggest)}", size=10, anchor="end"))
    parts.append("</svg>")
    return "".join(parts)


def changes_section(comparison: Comparison) -> Section:
    """Return the Changes section: what changed most, per step (or run, or window)."""
    rows = comparison.changes
    if not rows:
        text = "No changes: both sides ran the same things for the same time."
        return Section("Changes", text, note(text))
    shown = rows[:MAX_CHANGE_ROWS]
    caption = (
        f"{fmt_num(len(rows))} things changed, {fmt_num(len(shown))} shown, largest "
        f"change in time {'per ' + comparison.per if comparison.per != 'window' else ''}"
        " first; op rows are host (CPU) time, kernel, memcpy and communication rows "
        "device time"
    )
    table = change_rows(shown)
    text = caption + "\n" + text_table(CHANGE_HEADERS, table, right=CHANGE_NUMERIC)
    html = (
        svg.plot_html(changes_svg(shown))
        + note(caption)
        + html_table(CHANGE_HEADERS, table, numeric=CHANGE_NUMERIC, name_cols=(0,))
    )
    return Section("Changes", text, html)


def idle_section(comparison: Comparison) -> Section:
    """Return the Idle breakdown section: each category before and after, and the change."""
    headers = ("category", comparison.before_label, comparison.after_label, "change")
    labels = HOST_CATEGORY_LABELS if comparison.idle_of == "host" else CATEGORY_LABELS
    rows = [
        (
            labels.get(d.category, d.category),
            fmt_us(d.before_us),
            fmt_us(d.after_us),
            ("+" if d.delta_us > 0 else "") + fmt_us(d.delta_us),
        )
        for d in comparison.idle
    ]
    if not rows:
        text = "No timeline on one side: no idle breakdown to compare."
        return Section("Idle breakdown", text, note(text))
    numeric = (False, True, True, True)
    return Section(
        "Idle breakdown",
        text_table(headers, rows, right=numeric),
        html_table(headers, rows, numeric=numeric),
    )


def _finding_lines(title: str, findings: Sequence[Finding]) -> tuple[str, str]:
    if not findings:
        return f"{title}: none", f"<p>{esc(title)}: none</p>"
    items = [f"[{f.severity}] {f.title} ({f.kind})" for f in findings]
    return (
        f"{title}:\n" + "\n".join(f"  - {i}" for i in items),
        f"<p>{esc(title)}:</p><ul>" + "".join(f"<li>{esc_inline(i)}</li>" for i in items) + "</ul>",
    )


def findings_section(comparison: Comparison) -> Section:
    """Return the Findings section: resolved, new and still there."""
    parts = [
        _finding_lines("Resolved (before only)", comparison.findings_resolved),
        _finding_lines("New (after only)", comparison.findings_new),
        _finding_lines("Still there (after's, found before too)", comparison.findings_still),
    ]
    return Section("Findings", "\n\n".join(p[0] for p in parts), "".join(p[1] for p in parts))


def comparison_sections(comparison: Comparison) -> list[Section]:
    return [
        verdict_section(comparison),
        changes_section(comparison),
        idle_section(comparison),
        findings_section(comparison),
    ]


@report_of.register
def _comparison(comparison: Comparison) -> tuple[str, Sequence[Section]]:
    return (
        f"gpuprof_nb comparison: {comparison.before_label} -> {comparison.after_label}",
        comparison_sections(comparison),
    )
