"""The memory report's sections (Findings, Timeline, At peak, Leaks, Segments) as text and
HTML with the same digits, and the stacked timeline plot: one chart description
(`memory_chart`) drawn as the report's inline SVG (`memory_svg`) and as a matplotlib Figure
(`plot_memory_timeline`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.evidence import evidence_rows
from gpuprof_nb.render.fit import categories_section, category_line, category_svg, fit_section
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct
from gpuprof_nb.results.memory import MemoryTimeline, SiteBytes
from gpuprof_nb.results.report import MemoryReport

CPU_NOTE = (
    "CPU fallback: no CUDA device, so this report is rebuilt from torch.profiler's "
    "memory events on the CPU (categories from PyTorch's memory profiler where it "
    "assigns them), not from the CUDA caching allocator."
)


def memory_title(report: MemoryReport) -> str:
    where = (
        "CPU (profiler fallback)"
        if report.snapshot.source == "cpu-profiler"
        else f"cuda:{report.device}"
    )
    return f"Memory on {where}: peak {fmt_bytes(report.peak_bytes)}"


def _x(value: float | None, unit: str) -> str:
    if value is None:
        return "before recording"
    return f"{fmt_num(round(value, 3))} ms" if unit == "ms" else f"entry {int(value):,}"


def _notes(report: MemoryReport) -> list[str]:
    out = []
    if report.snapshot.source == "cpu-profiler":
        out.append(CPU_NOTE)
    out.extend(report.snapshot.notes)
    out.extend(report.timeline.notes)
    return out


def findings_section(report: MemoryReport) -> Section:
    """Return the Findings section: the OOM (if any) first, then each finding's evidence
    and fix, then notes on how the numbers were obtained."""
    text: list[str] = []
    html: list[str] = []
    for msg in _notes(report):
        text.append(f"Note: {msg}")
        html.append(note(f"Note: {msg}"))
    if report.oom_message:
        text.append(f"The cell raised: {report.oom_message}")
        html.append(f"<p><b>The cell raised:</b> <code>{esc(report.oom_message)}</code></p>")
    if not report.findings:
        text.append("No findings.")
        html.append(note("No findings."))
    for n, f in enumerate(report.findings, start=1):
        rows = evidence_rows(f.evidence)
        table = text_table(("evidence", "value"), rows, right=(False, True))
        text.append(
            f"{n}. [{f.severity}] {f.title}  ({f.kind})\n"
            + "\n".join("   " + line for line in table.splitlines())
            + f"\n   fix: {f.fix}"
        )
        html.append(
            f'<div class="finding" data-kind="{esc(f.kind)}"><p>'
            f'<span class="sev-{esc(f.severity)}">{esc(f.severity.upper())}</span> '
            f"<b>{esc_inline(f.title)}</b> <code>{esc(f.kind)}</code></p>"
            + html_table(("evidence", "value"), rows, numeric=(False, True))
            + f"<p>Fix: {esc(f.fix)}</p></div>"
        )
    return Section("Findings", "\n\n".join(text), "".join(html))


# matplotlib's tab10 colours; the last two rows of site_bytes ("(other sites)",
# "(allocated before recording)") are greys.
TAB10 = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
PEAK_COLOUR = "#c62828"
_MEM_W, _MEM_PLOT_H = 900, 300
_MEM_LEFT = 70
_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _site_colours(n: int) -> list[str]:
    return [TAB10[i % 10] for i in range(max(n - 2, 0))] + ["#bbbbbb", "#777777"][-n:]


def memory_chart(timeline: MemoryTimeline) -> plot.Chart:
    """Return the memory timeline as one chart description: active bytes stacked by
    allocation site over time (step curves, as the allocator sees them; one stacked bar
    when there is a single sample), reserved bytes as a dashed line, the peak marked and
    labelled; each site's area, the reserved line and the peak have hover tips."""
    x = np.asarray(timeline.sample_x, dtype=float)
    ys = np.asarray(timeline.site_bytes, dtype=float).reshape(len(timeline.site_labels), -1)
    labels = timeline.site_labels
    reserved = timeline.reserved_bytes
    has_reserved = reserved is not None and len(reserved) == len(timeline.x) and len(x) > 1
    totals = ys.sum(axis=0) if ys.size else np.zeros(len(x))
    y_top = (
        max(
            float(timeline.peak_bytes),
            float(totals.max()) if totals.size else 0.0,
            float(np.max(reserved))
            if has_reserved and reserved is not None and len(reserved)
            else 0.0,
        )
        * 1.08
        or 1.0
    )
    single = len(x) <= 1
    x_lo, x_hi = (float(x[0]), float(x[-1])) if len(x) else (0.0, 1.0)
    if single or x_hi <= x_lo:
        x_lo, x_hi = x_lo - 0.5, x_lo + 0.5
    colours = _site_colours(len(labels))
    drawn = [k for k in range(len(labels)) if ys.size and ys[k].any()]
    marks: list[plot.Mark] = []
    if single:
        marks.append(_site_bar(ys, labels, colours, drawn, x_lo, x_hi))
    else:
        marks.append(_site_stack(x, ys, labels, colours, totals))
        if has_reserved and reserved is not None:
            marks.append(_reserved_line(timeline, reserved))
    peak_x = float(timeline.peak_x) if not single else (x_lo + x_hi) / 2
    marks.extend(_peak_marks(timeline, peak_x))
    legend = [
        plot.LegendEntry(labels[k] if len(labels[k]) <= 70 else labels[k][:67] + "...", colours[k])
        for k in drawn
    ]
    if has_reserved:
        legend.append(plot.LegendEntry("reserved", plot.INK, "dash"))
    return plot.Chart(
        title="Active memory by allocation site",
        description="active memory by allocation site over time",
        x=plot.Axis(
            x_lo,
            x_hi,
            "time (ms)" if timeline.time_unit == "ms" else "history entry",
            ticks=() if single else plot.linear_ticks(x_lo, x_hi, target=10),
        ),
        y=_bytes_axis(y_top),
        marks=tuple(marks),
        legend=tuple(legend),
        width=_MEM_W,
        plot_height=_MEM_PLOT_H,
        left=_MEM_LEFT,
    )


def _bytes_axis(y_top: float) -> plot.Axis:
    """The y axis from 0 to `y_top` bytes (the top 8% above the data), ticked in the
    largest binary unit the data reaches."""
    scale, unit = next((v, u) for v, u in _UNITS if y_top / 1.08 >= v or v == 1)
    y_ticks = tuple(
        plot.Tick(v * scale, f"{svg.tick_label(v)} {unit}")
        for v in svg.nice_ticks(0.0, y_top / scale, target=6)
    )
    return plot.Axis(0.0, y_top, "active memory", ticks=y_ticks)


def _site_bar(
    ys: np.ndarray,
    labels: Sequence[str],
    colours: Sequence[str],
    drawn: Sequence[int],
    x_lo: float,
    x_hi: float,
) -> plot.Mark:
    """One sample: the sites' bytes as one stacked bar (the `drawn` sites, bottom up)."""
    base = 0.0
    x0, x1, y0, y1, fills, tips = [], [], [], [], [], []
    for k in drawn:
        v = float(ys[k, 0])
        x0.append(x_lo + 0.25)
        x1.append(x_hi - 0.25)
        y0.append(base)
        y1.append(base + v)
        fills.append(colours[k])
        tips.append(f"{labels[k]}\n{fmt_bytes(v)}")
        base += v
    return plot.Rects(x0, x1, y0, y1, fills, tips=tips, item_cls="gp-site")


def _site_stack(
    x: np.ndarray,
    ys: np.ndarray,
    labels: Sequence[str],
    colours: Sequence[str],
    totals: np.ndarray,
) -> plot.Mark:
    """The sites' bytes stacked over time, each layer's tip with its bytes at the peak
    sample (where `totals` is highest) and its largest."""
    peak_sample = int(np.argmax(totals)) if totals.size else 0
    return plot.Stack(
        x,
        tuple(
            plot.Layer(
                ys[k],
                colours[k],
                labels[k],
                f"{labels[k]}\nat the peak: {fmt_bytes(float(ys[k, peak_sample]))}; "
                f"largest: {fmt_bytes(float(ys[k].max()))}",
            )
            for k in range(len(labels))
        ),
        cls="gp-site",
    )


def _reserved_line(timeline: MemoryTimeline, reserved: np.ndarray) -> plot.Mark:
    """Reserved bytes per entry as a dashed step line."""
    return plot.Line(
        np.asarray(timeline.x, dtype=float),
        np.asarray(reserved, dtype=float),
        dash="5 3",
        step=True,
        tip=f"reserved by the caching allocator; peak {fmt_bytes(timeline.reserved_peak_bytes)}",
        cls="gp-reserved",
    )


def _peak_marks(timeline: MemoryTimeline, peak_x: float) -> list[plot.Mark]:
    """The peak: a rule across the plot at its bytes, a triangle at `peak_x` with a tip,
    and a label placed where it overlaps nothing."""
    peak = float(timeline.peak_bytes)
    label = f"peak {fmt_bytes(timeline.peak_bytes)}"
    return [
        plot.Rule("y", peak, colour=PEAK_COLOUR, width=0.8),
        plot.Dots(
            [peak_x],
            [peak],
            [5.0],
            [PEAK_COLOUR],
            tips=[f"{label} at {_x(timeline.peak_x, timeline.time_unit)}"],
            opacity=1.0,
            shape="triangle",
            cls="gp-peak",
        ),
        plot.Text(
            peak_x,
            peak,
            label,
            colour=PEAK_COLOUR,
            dx=6,
            dy=-5,
            avoid=(
                (peak_x, -6, -5, "end"),
                (peak_x, 6, 13, "start"),
                (peak_x, -6, 13, "end"),
            ),
        ),
    ]


def memory_svg(timeline: MemoryTimeline) -> str:
    """Return the memory chart (`memory_chart`) as an inline SVG string. Samples closer than
    a pixel are thinned to the largest one per pixel. The root's data-x / data-y attributes
    give the axes' ranges (x in the timeline's unit, y in bytes) and data-plot-box the plot
    area."""
    return plot.chart_svg(memory_chart(timeline))


def plot_memory_timeline(timeline: MemoryTimeline, ax: Any = None) -> Any:
    """Return a matplotlib Figure of the memory chart (`memory_chart`): active memory
    stacked by allocation site over time, reserved memory as a dashed line, the peak
    marked. Drawn into `ax` when given."""
    return chart_figure(memory_chart(timeline), ax)


def timeline_section(report: MemoryReport, with_plot: bool = True) -> Section:
    """Return the Timeline section: the plot (SVG) and the numbers behind it."""
    tl = report.timeline
    rows = [
        ("peak active", fmt_bytes(tl.peak_bytes)),
        ("at", _x(tl.peak_x, tl.time_unit)),
        ("active at start", fmt_bytes(tl.start_bytes)),
        ("active at end", fmt_bytes(tl.end_bytes)),
        ("peak reserved", fmt_bytes(tl.reserved_peak_bytes)),
        ("history entries", fmt_num(tl.n_events)),
    ]
    if tl.window is not None:
        lo, hi = tl.window
        rows.append(
            (
                "window",
                f"{'' if lo is None else fmt_num(lo)}:"
                f"{'' if hi is None else fmt_num(hi)} "
                f"({'ms' if tl.time_unit == 'ms' else 'entries'})",
            )
        )
    text = text_table(("", "value"), rows, right=(False, True))
    html = html_table(("", "value"), rows, numeric=(False, True))
    if with_plot:
        plot = svg.plot_html(memory_svg(tl))
        if report.by_category is not None:
            # The peak by category, as a bar beside the timeline (render/fit.py).
            plot = (
                '<div style="display:flex;flex-wrap:wrap;align-items:flex-start">'
                f"{plot}{svg.plot_html(category_svg(report.by_category))}</div>"
            )
            text += "\n" + category_line(report.by_category)
        html = plot + html
        text += "\n(plot in the HTML view)"
    return Section("Timeline", text, html)


def _site_rows(rows: Sequence[SiteBytes], share_label: bool = True) -> list[tuple[str, ...]]:
    return [
        (
            r.site.label,
            fmt_bytes(r.bytes),
            fmt_pct(r.share) if share_label else "",
            fmt_num(r.blocks),
            fmt_bytes(r.largest_block_bytes),
            r.category or "",
        )
        for r in rows
    ]


_SITE_HEADERS = ("site", "bytes", "share", "blocks", "largest block", "category")
_SITE_NUMERIC = (False, True, True, True, True, False)


def _site_table(rows: Sequence[SiteBytes]) -> tuple[str, str]:
    r = _site_rows(rows)
    return (
        text_table(_SITE_HEADERS, r, right=_SITE_NUMERIC),
        html_table(_SITE_HEADERS, r, numeric=_SITE_NUMERIC, name_cols=(0,)),
    )


def at_peak_section(report: MemoryReport) -> Section:
    """Return the At peak section: live bytes per site at the peak and the largest blocks."""
    p = report.at_peak
    head = f"Live at the peak ({fmt_bytes(p.peak_bytes)} at {_x(p.peak_x, p.time_unit)}):"
    t_sites, h_sites = _site_table(p.sites)
    block_rows = [
        (hex(b.address), fmt_bytes(b.size), b.site.label, _x(b.allocated_x, p.time_unit))
        for b in p.largest_blocks[:10]
    ]
    headers = ("address", "size", "site", "allocated at")
    text = "\n".join(
        [
            head,
            t_sites,
            "",
            "Largest blocks:",
            text_table(headers, block_rows, right=(False, True, False, False)),
        ]
    )
    html = f"<p>{esc(head)}</p>{h_sites}<p>Largest blocks:</p>" + html_table(
        headers, block_rows, numeric=(False, True, False, False), name_cols=(2,)
    )
    return Section("At peak", text, html)


def leaks_section(report: MemoryReport) -> Section:
    """Return the Leaks section: growth across steps (when repeats are known) and what the
    cell left allocated, by site."""
    lk = report.leaks
    text: list[str] = []
    html: list[str] = []
    if lk.growth_bytes_per_step is not None:
        steps = [(str(i + 1), fmt_bytes(b)) for i, b in enumerate(lk.step_end_bytes)]
        line = (
            f"Across {len(lk.step_end_bytes)} steps memory changes by "
            f"{fmt_bytes(lk.growth_bytes_per_step)} per step (active at each step's end):"
        )
        text += [line, text_table(("step", "active at end"), steps, right=(False, True))]
        html += [
            f"<p>{esc(line)}</p>",
            html_table(("step", "active at end"), steps, numeric=(False, True)),
        ]
        if lk.growing_sites:
            rows = [(r.site.label, fmt_bytes(r.bytes), fmt_num(r.blocks)) for r in lk.growing_sites]
            hdr = ("growing site", "per step", "blocks left")
            text += [
                "Sites whose memory grows every step:",
                text_table(hdr, rows, right=(False, True, True)),
            ]
            html += [
                "<p>Sites whose memory grows every step:</p>",
                html_table(hdr, rows, numeric=(False, True, True), name_cols=(0,)),
            ]
    else:
        msg = "Growth across steps: run with --repeat N (N >= 2) to measure it."
        text.append(msg)
        html.append(note(msg))
    line = f"Left allocated when the cell ended: {fmt_bytes(lk.left_bytes)}"
    t_sites, h_sites = _site_table(lk.left_sites)
    text += [line, t_sites]
    html += [f"<p>{esc(line)}</p>", h_sites]
    return Section("Leaks", "\n".join(text), "".join(html))


def segments_section(report: MemoryReport) -> Section:
    """Return the Segments section: reserved vs allocated, free pieces, fragmentation."""
    s = report.segments
    rows = [
        ("segments", fmt_num(s.n_segments)),
        ("reserved", fmt_bytes(s.reserved_bytes)),
        ("allocated", fmt_bytes(s.allocated_bytes)),
        ("active (incl. awaiting free)", fmt_bytes(s.active_bytes)),
        ("free inside segments", fmt_bytes(s.free_bytes)),
        ("largest free block", fmt_bytes(s.largest_free_block_bytes)),
        ("free blocks", fmt_num(s.n_free_blocks)),
        ("fragmentation (1 - largest free / free)", fmt_pct(s.fragmentation_ratio)),
    ]
    seg_rows = [
        (
            hex(r.address),
            r.segment_type,
            fmt_bytes(r.total_bytes),
            fmt_bytes(r.active_bytes),
            fmt_bytes(r.largest_free_bytes),
        )
        for r in s.largest_segments[:10]
    ]
    hdr = ("segment", "type", "size", "active", "largest free")
    num = (False, False, True, True, True)
    text = (
        text_table(("", "value"), rows, right=(False, True))
        + "\n\n"
        + text_table(hdr, seg_rows, right=num)
    )
    html = html_table(("", "value"), rows, numeric=(False, True)) + html_table(
        hdr, seg_rows, numeric=num
    )
    if report.snapshot.source == "cpu-profiler":
        msg = "On the CPU there is no caching allocator: segments are the span of live blocks."
        text += "\n" + msg
        html += note(msg)
    return Section("Segments", text, html)


def memory_sections(report: MemoryReport, with_plot: bool = True) -> list[Section]:
    """Return the report's sections in tab order."""
    sections = [
        findings_section(report),
        timeline_section(report, with_plot),
        at_peak_section(report),
        leaks_section(report),
        segments_section(report),
    ]
    # Will it fit (render/fit.py): only where the snapshot tells tensors apart.
    if report.by_category is not None:
        sections.insert(2, categories_section(report))
    if report.fit is not None and (report.fit.method == "two runs" or report.budget_bytes):
        sections.insert(3, fit_section(report))
    return sections


@report_of.register
def _memory_report(report: MemoryReport) -> tuple[str, Sequence[Section]]:
    return memory_title(report), memory_sections(report)
