"""The memory report's sections (Findings, Timeline, At peak, Leaks, Segments) as text and
HTML with the same digits, and the stacked timeline plot: inline SVG in the report
(`memory_svg`), a matplotlib Figure from `plot_memory_timeline` (imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuprof_nb.render import svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.evidence import evidence_rows
from gpuprof_nb.render.fit import categories_section, category_line, category_svg, fit_section
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
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


def plot_memory_timeline(timeline: MemoryTimeline, ax: Any = None) -> Any:
    """Return a matplotlib Figure: active memory (MiB) stacked by allocation site over time,
    reserved memory as a line, the peak marked."""
    import matplotlib

    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(9, 3.6), dpi=96)
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    mib = 2.0**20
    x = timeline.sample_x
    colors = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]
    n = len(timeline.site_labels)
    palette = [colors[i % 10] for i in range(n - 2)] + ["#bbbbbb", "#777777"]
    ys = timeline.site_bytes / mib
    if len(x) > 1:
        ax.stackplot(
            x, ys, labels=timeline.site_labels, colors=palette, step="post", alpha=0.85, linewidth=0
        )
        if timeline.reserved_bytes is not None and len(timeline.reserved_bytes) == len(timeline.x):
            ax.plot(
                timeline.x,
                timeline.reserved_bytes / mib,
                color="black",
                linewidth=1,
                linestyle="--",
                label="reserved",
                drawstyle="steps-post",
            )
    else:
        bottom = 0.0
        for label, y, c in zip(timeline.site_labels, ys[:, 0], palette, strict=True):
            ax.bar([0], [y], bottom=bottom, color=c, label=label, width=0.5)
            bottom += float(y)
    ax.axhline(timeline.peak_bytes / mib, color="#c62828", linewidth=0.8)
    ax.plot([timeline.peak_x], [timeline.peak_bytes / mib], marker="v", color="#c62828")
    ax.annotate(
        f"peak {fmt_bytes(timeline.peak_bytes)}",
        (timeline.peak_x, timeline.peak_bytes / mib),
        textcoords="offset points",
        xytext=(4, 4),
        fontsize=8,
        color="#c62828",
    )
    ax.set_xlabel("time (ms)" if timeline.time_unit == "ms" else "history entry")
    ax.set_ylabel("MiB")
    ax.set_title("Active memory by allocation site")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


# matplotlib's tab10, so the SVG and plot_memory_timeline colour sites alike; the last two
# rows of site_bytes ("(other sites)", "(allocated before recording)") are greys.
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
_MEM_LEFT, _MEM_RIGHT, _MEM_TOP = 70, 14, 28
_UNITS = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _site_colours(n: int) -> list[str]:
    return [TAB10[i % 10] for i in range(max(n - 2, 0))] + ["#bbbbbb", "#777777"][-n:]


def _column_maxima(px: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return the indices to draw: per whole-pixel column, the sample with the largest
    value (so no peak is lost), plus the first and the last sample."""
    cols = np.floor(px).astype(np.int64)
    # Sort by column, then by value descending: the first of each column is its maximum.
    order = np.lexsort((-values, cols))
    first = np.ones(len(order), dtype=bool)
    first[1:] = cols[order][1:] != cols[order][:-1]
    keep = np.union1d(order[first], [0, len(px) - 1])
    return keep


def memory_svg(timeline: MemoryTimeline) -> str:
    """Return the memory timeline as an inline SVG string: active bytes stacked by
    allocation site over time (step curves, as the allocator sees them), reserved bytes as
    a dashed line, the peak marked; each site's area, the reserved line and the peak have
    hover titles. Samples closer than a pixel are thinned to the largest one per pixel. The
    root's data-x / data-y attributes give the axes' ranges (x in the timeline's unit, y
    in bytes) and data-plot-box the plot area."""
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
    left, right = _MEM_LEFT, _MEM_W - _MEM_RIGHT
    top, bottom = _MEM_TOP, _MEM_TOP + _MEM_PLOT_H
    single = len(x) <= 1
    x_lo, x_hi = (float(x[0]), float(x[-1])) if len(x) else (0.0, 1.0)
    if single or x_hi <= x_lo:
        x_lo, x_hi = x_lo - 0.5, x_lo + 0.5
    sx = svg.LinearScale(x_lo, x_hi, left, right)
    sy = svg.LinearScale(0.0, y_top, bottom, top)
    n = svg.num
    unit_x = "time (ms)" if timeline.time_unit == "ms" else "history entry"
    out: list[str] = []
    out.append(
        svg.text(
            _MEM_W / 2,
            16,
            "Active memory by allocation site",
            size=12,
            anchor="middle",
            extra=' font-weight="600"',
        )
    )
    scale, unit = next((v, u) for v, u in _UNITS if y_top / 1.08 >= v or v == 1)
    grid, ticks = [], []
    for v in svg.nice_ticks(0.0, y_top / scale, target=6):
        y = sy(v * scale)
        grid.append(f"M{left} {n(y)}H{right}")
        ticks.append(
            svg.text(left - 5, y + 3.5, f"{svg.tick_label(v)} {unit}", size=10, anchor="end")
        )
    if not single:
        for v in svg.nice_ticks(x_lo, x_hi, target=10):
            xp = sx(v)
            grid.append(f"M{n(xp)} {top}V{bottom}")
            ticks.append(svg.text(xp, bottom + 14, svg.tick_label(v), size=10, anchor="middle"))
    out.append(
        f'<path d="{"".join(grid)}" fill="none" stroke="currentColor" stroke-opacity="0.13"/>'
    )
    colours = _site_colours(len(labels))
    peak_sample = int(np.argmax(totals)) if totals.size else 0
    drawn: list[int] = []
    if single:
        # One sample: a stacked bar in the middle.
        base = 0.0
        for k, label in enumerate(labels):
            v = float(ys[k, 0]) if ys.size else 0.0
            if v <= 0:
                continue
            drawn.append(k)
            y0, y1 = sy(base), sy(base + v)
            out.append(
                f'<rect class="gp-site" x="{n(sx(x_lo + 0.25))}" y="{n(y1)}" '
                f'width="{n(sx(x_hi - 0.25) - sx(x_lo + 0.25))}" height="{n(y0 - y1)}" '
                f'fill="{colours[k]}">' + svg.title(f"{label}\n{fmt_bytes(v)}") + "</rect>"
            )
            base += v
    else:
        px = np.array([sx(v) for v in x])
        keep = _column_maxima(px, totals)
        cum = np.cumsum(ys[:, keep], axis=0)
        # A tenth of a pixel is plenty for these curves (and a fifth shorter than n()).
        xs = [f"{v:.1f}" for v in px[keep]]
        axis = n(bottom)
        # Top site first, each area from the axis up to its stack top: the ones drawn after
        # it cover its lower part, so only its own band shows, and the path is half as long.
        for k in range(len(labels) - 1, -1, -1):
            if not ys[k].any():
                continue
            drawn.append(k)
            hs = [f"{sy(v):.1f}" for v in cum[k]]
            d = [f"M{xs[0]} {axis}V{hs[0]}"]
            last = hs[0]
            for xv, hv in zip(xs[1:], hs[1:], strict=True):
                d.append(f"H{xv}" + (f"V{hv}" if hv != last else ""))
                last = hv
            d.append(f"V{axis}Z")
            tip = (
                f"{labels[k]}\nat the peak: {fmt_bytes(float(ys[k, peak_sample]))}; "
                f"largest: {fmt_bytes(float(ys[k].max()))}"
            )
            out.append(
                f'<path class="gp-site" d="{"".join(d)}" fill="{colours[k]}" '
                f'fill-opacity="0.9">' + svg.title(tip) + "</path>"
            )
        drawn.reverse()
        if has_reserved and reserved is not None:
            rx = np.asarray(timeline.x, dtype=float)
            rv = np.asarray(reserved, dtype=float)
            rpx = np.array([sx(v) for v in rx])
            rkeep = _column_maxima(rpx, rv)
            pts = [(f"{rpx[i]:.1f}", f"{sy(rv[i]):.1f}") for i in rkeep]
            d = [f"M{pts[0][0]} {pts[0][1]}"]
            last = pts[0][1]
            for xv, hv in pts[1:]:
                d.append(f"H{xv}" + (f"V{hv}" if hv != last else ""))
                last = hv
            out.append(
                f'<path class="gp-reserved" d="{"".join(d)}" fill="none" '
                'stroke="currentColor" stroke-width="1.2" stroke-dasharray="5 3">'
                + svg.title(
                    f"reserved by the caching allocator; peak "
                    f"{fmt_bytes(timeline.reserved_peak_bytes)}"
                )
                + "</path>"
            )
    # The peak: a thin line across, a marker and its value.
    yp = sy(float(timeline.peak_bytes))
    xp = sx(float(timeline.peak_x)) if not single else (left + right) / 2
    peak_tip = f"peak {fmt_bytes(timeline.peak_bytes)} at {_x(timeline.peak_x, timeline.time_unit)}"
    out.append(f'<path d="M{left} {n(yp)}H{right}" stroke="{PEAK_COLOUR}" stroke-width="0.8"/>')
    out.append(
        f'<path class="gp-peak" d="M{n(xp - 5)} {n(yp - 9)}h10l-5 9z" '
        f'fill="{PEAK_COLOUR}">' + svg.title(peak_tip) + "</path>"
    )
    label = f"peak {fmt_bytes(timeline.peak_bytes)}"
    anchor = "end" if xp + 6 + svg.text_width(label, 10) > right else "start"
    out.append(
        svg.text(
            xp + 6 if anchor == "start" else xp - 6,
            yp - 5,
            label,
            size=10,
            anchor=anchor,
            fill=PEAK_COLOUR,
        )
    )
    out.append(
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="none" stroke="currentColor" stroke-opacity="0.45"/>'
    )
    out.extend(ticks)
    if not single:
        out.append(svg.text((left + right) / 2, bottom + 30, unit_x, anchor="middle"))
    out.append(
        svg.text(
            14,
            (top + bottom) / 2,
            "active memory",
            anchor="middle",
            extra=f' transform="rotate(-90 14 {n((top + bottom) / 2)})"',
        )
    )
    entries = [
        (
            labels[k] if len(labels[k]) <= 70 else labels[k][:67] + "...",
            f'<rect width="12" height="12" fill="{colours[k]}"/>',
        )
        for k in drawn
    ]
    if has_reserved:
        entries.append(
            (
                "reserved",
                '<path d="M0 6h12" stroke="currentColor" '
                'stroke-width="1.2" stroke-dasharray="4 2"/>',
            )
        )
    legend, legend_h = svg.legend_row(entries, left, bottom + 42, right - left, size=10)
    out.append(legend)
    height = int(bottom + 42 + legend_h + 4)
    head = svg.svg_open(
        _MEM_W,
        height,
        "active memory by allocation site over time",
        f' data-x="{x_lo!r} {x_hi!r}" data-y="0 {y_top!r}"'
        f' data-plot-box="{left} {top} {right} {bottom}"',
    )
    return head + "".join(out) + "</svg>"


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
