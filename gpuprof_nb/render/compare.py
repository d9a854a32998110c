"""The sections of a before/after comparison: Verdict, Changes (a diverging bar chart and
the table), Idle breakdown and Findings; text and HTML with the same numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
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
_CHANGES_W = 900
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
    before, after = comparison.median_step_us
    per = {"step": "median per step", "run": "median per run", "window": "profiled window"}[
        comparison.per
    ]
    rows = [
        ("", comparison.before_label, comparison.after_label),
        (per, fmt_us(before), fmt_us(after)),
    ]
    v: Verdict | None = comparison.verdict
    if v is not None:
        label = "profiled steps" if comparison.samples_from == "profiled steps" else "timed samples"
        rows.append((label, fmt_num(v.before_samples), fmt_num(v.after_samples)))
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
            _signed(r.delta_us),
            fmt_num(r.calls_before),
            fmt_num(r.calls_after),
            r.replaced_by,
        )
        for r in rows
    ]


def _signed(us: float) -> str:
    """A change in time as the table writes it: '+1.2 ms', '-340 us', '0 us'."""
    return ("+" if us > 0 else "") + fmt_us(us)


def changes_chart(rows: Sequence[ChangeRow]) -> plot.Chart:
    """Return the changes as a diverging bar chart description: one bar per row (the
    MAX_CHANGE_BARS largest) from a zero line, right (red) where after takes longer, left
    (green) where it takes less, every bar at least 2 px wide and labelled with its change
    (so small ones read too); hover a bar or a name for the numbers."""
    rows = list(rows[:MAX_CHANGE_BARS])
    biggest = max((abs(r.delta_us) for r in rows), default=1.0) or 1.0
    tips, names = [], []
    for r in rows:
        tips.append(
            f"{r.name} ({r.category})\nbefore {fmt_us(r.before_us)}, after "
            f"{fmt_us(r.after_us)}, change {_signed(r.delta_us)}"
            + (f"\nreplaced by {r.replaced_by}" if r.replaced_by else "")
        )
        names.append(r.name if len(r.name) <= 46 else r.name[:43] + "...")
    n_rows = len(rows)
    y_axis = plot.Axis(
        -0.6,
        n_rows - 0.4,
        ticks=tuple(
            plot.Tick(float(i), name, tip)
            for i, (name, tip) in enumerate(zip(names, tips, strict=True))
        ),
        grid=False,
        reverse=True,
    )
    # Room beyond the longest bar on each side for its value label (px, as the SVG lays it
    # out), and a little on a side without bars so the zero line stands clear of the frame.
    box = plot.plot_box(
        plot.Chart("", "", plot.Axis(0.0, 1.0), y_axis, width=_CHANGES_W, plot_height=10)
    )
    width = box.right - box.left

    def room(side: list[ChangeRow]) -> float:
        return max((svg.text_width(_signed(r.delta_us), 10) for r in side), default=0.0) + 12

    low = min(min((r.delta_us for r in rows), default=0.0), 0.0)
    high = max(max((r.delta_us for r in rows), default=0.0), 0.0)
    pad_lo = max(room([r for r in rows if r.delta_us < 0]), 0.05 * width)
    pad_hi = max(room([r for r in rows if r.delta_us >= 0]), 0.05 * width)
    span = (high - low or biggest) / max(1 - (pad_lo + pad_hi) / width, 0.2)
    lo, hi = low - pad_lo / width * span, high + pad_hi / width * span
    ticks = [plot.Tick(v, "0" if v == 0 else _signed(v)) for v in svg.nice_ticks(lo, hi, target=6)]
    marks: list[plot.Mark] = [
        plot.Rects(
            [0.0] * n_rows,
            [r.delta_us for r in rows],
            [i - 0.36 for i in range(n_rows)],
            [i + 0.36 for i in range(n_rows)],
            [SLOWER_COLOUR if r.delta_us > 0 else FASTER_COLOUR for r in rows],
            tips=tips,
            min_px=2.0,
            cls="gp-changes",
        ),
        plot.Rule("x", 0.0, opacity=0.6, tip="no change"),
    ]
    for i, r in enumerate(rows):
        right = r.delta_us >= 0
        marks.append(
            plot.Text(
                r.delta_us,
                float(i),
                _signed(r.delta_us),
                anchor="start" if right else "end",
                dx=5 if right else -5,
                dy=3.5,
            )
        )
    legend = []
    if any(r.delta_us > 0 for r in rows):
        legend.append(plot.LegendEntry("slower after", SLOWER_COLOUR))
    if any(r.delta_us < 0 for r in rows):
        legend.append(plot.LegendEntry("faster after", FASTER_COLOUR))
    return plot.Chart(
        title="Change in time (after - before)",
        description="change in time per row, after minus before",
        x=plot.Axis(lo, hi, "change in time (after - before)", ticks=tuple(ticks)),
        y=y_axis,
        marks=tuple(marks),
        legend=tuple(legend),
        width=_CHANGES_W,
        plot_height=22 * max(n_rows, 1),
    )


def changes_svg(rows: Sequence[ChangeRow]) -> str:
    """Return the diverging bar chart of the changes (`changes_chart`) as inline SVG."""
    return plot.chart_svg(changes_chart(rows))


def plot_changes(comparison: Comparison, ax: Any = None) -> Any:
    """Return a matplotlib Figure of the comparison's Changes chart (`changes_chart`),
    drawn into `ax` when given."""
    return chart_figure(changes_chart(comparison.changes), ax)


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
