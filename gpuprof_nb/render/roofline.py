"""The Roofline section: a log-log plot (roofs, ridge points, one dot per op group) and the
tables under it. One description of the plot (`roofline_chart`) is drawn as the report's
inline SVG (`roofline_svg`) and as a matplotlib Figure (`plot_roofline`, render/plot_mpl)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us
from gpuprof_nb.results.roofline import Roofline, RooflinePoint

BOUND_COLOURS = {"memory": "#1f77b4", "compute": "#ff7f0e", None: "#7f7f7f"}
ABOVE_ROOF_COLOUR = "#d62728"
ROOF_LABELS = {
    "fp32": "fp32 vector",
    "fp64": "fp64 matmul",
    "tf32": "tf32 tensor",
    "bf16": "bf16 tensor",
    "fp16": "fp16 tensor",
}


def short_label(p: RooflinePoint, width: int = 28) -> str:
    """Return a short label for a dot: op name without 'aten::' and the first shape."""
    name = p.name[6:] if p.name.startswith("aten::") else p.name
    first = p.shapes.split(", ")[0] if p.shapes else ""
    label = f"{name} [{first}]" if first else name
    return label if len(label) <= width else label[: width - 3] + "..."


def drawn_roofs(roofline: Roofline) -> list[tuple[str, float]]:
    """Return (label, peak FLOP/s) of the roofs to draw: those some point uses, plus the
    fp32 vector roof; roofs with the same peak share one line ('bf16/fp16 tensor')."""
    spec = roofline.device
    if spec is None:
        return []
    used = {p.roof for p in roofline.points if p.roof} | {"fp32"}
    by_peak: dict[float, list[str]] = {}
    for roof, peak in spec.roofs():
        if roof in used:
            by_peak.setdefault(peak, []).append(roof)
    out = []
    for peak, names in sorted(by_peak.items()):
        kinds = {ROOF_LABELS.get(n, n).split(" ")[1] for n in names}
        label = "/".join(names) + (" " + kinds.pop() if len(kinds) == 1 else "")
        out.append((label, peak))
    return out


def _plottable(roofline: Roofline) -> list[RooflinePoint]:
    return [p for p in roofline.points if p.intensity_flop_per_byte and p.achieved_flops_per_s]


# The SVG plot's natural size and plot-area height (px); CSS scales it down where needed.
_SVG_W, _PLOT_H = 680, 344
# Dots drawn at most (the longest op groups); the table lists them all the same.
MAX_SVG_POINTS = 300
BOUND_LABELS = {"memory": "memory-bound", "compute": "compute-bound", None: "no roof"}


def _point_title(p: RooflinePoint) -> str:
    head = p.name + (f" [{p.shapes}]" if p.shapes else "") + (f" {p.dtype}" if p.dtype else "")
    body = (
        f"{fmt_num(p.calls)} calls, {fmt_us(p.time_us)}; {fmt_rate(p.flops, 'FLOP')}, "
        f"{fmt_bytes(p.bytes_moved)}, {fmt_num(p.intensity_flop_per_byte)} FLOP/B"
    )
    rate = f"achieved {fmt_rate(p.achieved_flops_per_s, 'FLOP/s')}"
    if p.roof:
        rate += (
            f"; {BOUND_LABELS.get(p.bound, 'n/a')}, {fmt_pct(p.fraction_of_roof)} of the "
            f"{ROOF_LABELS.get(p.roof, p.roof)} roof"
        )
    if p.above_roof:
        rate += " (above roof!)"
    return f"{head}\n{body}\n{rate}"


def _dot_radius(time_us: float, longest_us: float) -> float:
    """A dot's radius (px): its area grows with the group's time."""
    return math.sqrt((20 + 380 * time_us / longest_us) / math.pi) * 1.2


def roofline_chart(roofline: Roofline, *, top: int = 5) -> plot.Chart:
    """Return the roofline as one chart description: log-log achieved FLOP/s against
    FLOP/byte, the device's memory and compute roofs with their ridge points, one dot per op
    group (area ~ time, colour = bound, a red ring when above the roof; the MAX_SVG_POINTS
    longest), the `top` longest groups labelled where they collide with nothing (else
    numbered, with a key) and dots above the roof flagged. Every dot, roof and ridge has a
    hover tip with its numbers."""
    points = _plottable(roofline)[:MAX_SVG_POINTS]
    hidden = len(_plottable(roofline)) - len(points)
    spec = roofline.device
    xs = [p.intensity_flop_per_byte or 1.0 for p in points]
    ys = [p.achieved_flops_per_s or 1.0 for p in points]
    roofs = drawn_roofs(roofline)
    bw = spec.bandwidth_bytes_per_s if spec is not None else None
    ridges = [peak / bw for _, peak in roofs] if bw else []
    peaks = [peak for _, peak in roofs]
    # Room for the dots' size and the roofs' labels.
    x_lo = min(xs + ridges, default=0.1) / 4
    x_hi = max(xs + ridges, default=100.0) * 4
    y_lo = min(ys + peaks, default=1e9) / 10
    y_hi = max(ys + peaks, default=1e12) * 3
    title = f"Roofline: {spec.name}" if spec is not None else "Roofline (no device ceilings)"
    if spec is not None:
        title += " (measured)" if spec.measured else " (datasheet)"
    marks: list[plot.Mark] = []
    if bw and roofs:
        top_peak = roofs[-1][1]
        mem_label = f"memory {fmt_rate(bw, 'B/s')}"
        marks.append(
            plot.Line(
                (x_lo, top_peak / bw),
                (x_lo * bw, top_peak),
                width=1.4,
                tip=f"{mem_label} (bandwidth roof)",
                label=mem_label,
            )
        )
        ridge_x, ridge_y, ridge_tips = [], [], []
        for roof, peak in roofs:
            ridge = peak / bw
            tip = (
                f"{roof} roof: {fmt_rate(peak, 'FLOP/s')}; ridge at {fmt_num(ridge)} "
                "FLOP/byte (left of it memory-bound, right of it compute-bound)"
            )
            marks.append(plot.Line((ridge, x_hi), (peak, peak), tip=tip))
            ridge_x.append(ridge)
            ridge_y.append(peak)
            ridge_tips.append(tip)
            # Above its roof at the right edge; else below it, else above or below the
            # roof right of its ridge (where the slope runs through or a dot sits).
            marks.append(
                plot.Text(
                    x_hi,
                    peak,
                    f"{roof} {fmt_rate(peak, 'FLOP/s')}",
                    anchor="end",
                    dx=-4,
                    dy=-4,
                    avoid=((x_hi, -4, 13, "end"), (ridge, 8, -4, "start"), (ridge, 8, 13, "start")),
                )
            )
            marks.append(
                plot.Text(
                    ridge,
                    peak,
                    f"ridge {fmt_num(ridge)}",
                    anchor="middle",
                    size=9,
                    dy=12,
                    faint=True,
                    avoid=((ridge, 0, -6, "middle"), (ridge, -6, 12, "end")),
                )
            )
        marks.append(
            plot.Dots(
                ridge_x,
                ridge_y,
                [2.6] * len(ridge_x),
                [plot.INK] * len(ridge_x),
                tips=ridge_tips,
                opacity=1.0,
                cls="gp-ridge",
            )
        )
    longest = max((p.time_us for p in points), default=1.0) or 1.0
    radii = [_dot_radius(p.time_us, longest) for p in points]
    # Longest first, so short ones stay on top and hoverable.
    marks.append(
        plot.Dots(
            xs,
            ys,
            radii,
            [BOUND_COLOURS.get(p.bound, BOUND_COLOURS[None]) for p in points],
            ring=[ABOVE_ROOF_COLOUR if p.above_roof else None for p in points],
            tips=[_point_title(p) for p in points],
            cls="gp-point",
        )
    )
    labels = []
    for i, (p, x, y, r) in enumerate(zip(points, xs, ys, radii, strict=True)):
        if i >= top and not p.above_roof:
            continue
        text = (
            (short_label(p) + (" (above roof!)" if p.above_roof else ""))
            if i < top
            else "above roof!"
        )
        colour = ABOVE_ROOF_COLOUR if p.above_roof else plot.INK
        labels.append(plot.Label(x, y, text, r, colour))
    bounds = [b for b in ("memory", "compute", None) if any(p.bound == b for p in points)]
    legend = [plot.LegendEntry(BOUND_LABELS[b], BOUND_COLOURS[b], "dot") for b in bounds]
    if any(p.above_roof for p in points):
        legend.append(plot.LegendEntry("above roof", ABOVE_ROOF_COLOUR, "ring"))
    notes = (f"{hidden} shorter op groups not drawn",) if hidden > 0 else ()
    if not points:
        notes = ("no op with FLOPs and measured time",)
    return plot.Chart(
        title=title,
        description=f"{title}: achieved FLOP/s against arithmetic intensity per op group",
        x=plot.Axis(
            x_lo, x_hi, "arithmetic intensity (FLOP/byte)", "log", plot.log_ticks(x_lo, x_hi)
        ),
        y=plot.Axis(
            y_lo,
            y_hi,
            "achieved FLOP/s",
            "log",
            plot.log_ticks(y_lo, y_hi, lambda v: fmt_rate(v, "").strip()),
        ),
        marks=tuple(marks),
        labels=tuple(labels),
        legend=tuple(legend),
        legend_inside=True,
        width=_SVG_W,
        plot_height=_PLOT_H,
        left=62,
        notes=notes,
        data=(("data-x-log", f"{x_lo!r} {x_hi!r}"), ("data-y-log", f"{y_lo!r} {y_hi!r}")),
    )


def plot_roofline(roofline: Roofline, ax: Any = None, *, top: int = 5) -> Any:
    """Return a matplotlib Figure of the roofline chart (`roofline_chart`): log-log FLOP/s
    against FLOP/byte, roofs and ridge points labelled, one dot per op group (area ~ time,
    colour = bound), the `top` longest groups labelled and dots above the roof ringed in
    red. Drawn into `ax` when given."""
    return chart_figure(roofline_chart(roofline, top=top), ax)


def roofline_svg(roofline: Roofline, *, top: int = 5) -> str:
    """Return the roofline chart as an inline SVG string (`roofline_chart`); the root's
    data-x-log / data-y-log / data-plot-box attributes give the axes' limits and the plot
    area, so tests can check positions. Empty string when no op has FLOPs and time."""
    if not _plottable(roofline):
        return ""
    return plot.chart_svg(roofline_chart(roofline, top=top))


def _point_rows(points: tuple[RooflinePoint, ...]) -> list[list[str]]:
    return [
        [
            p.name,
            p.shapes,
            p.dtype,
            fmt_num(p.calls),
            fmt_us(p.time_us),
            fmt_rate(p.flops, "FLOP"),
            fmt_bytes(p.bytes_moved),
            fmt_num(p.intensity_flop_per_byte),
            fmt_rate(p.achieved_flops_per_s, "FLOP/s"),
            ROOF_LABELS.get(p.roof, p.roof) if p.roof else "n/a",
            p.bound or "n/a",
            fmt_pct(p.fraction_of_roof),
            "above roof!" if p.above_roof else "",
        ]
        for p in points
    ]


_POINT_HEAD = [
    "op",
    "input shapes",
    "dtype",
    "calls",
    "time",
    "FLOPs",
    "bytes",
    "FLOP/B",
    "achieved",
    "roof",
    "bound",
    "% of roof",
    "flag",
]
_POINT_NUM = [False, False, False, True, True, True, True, True, True, False, False, True, False]
_KERNEL_HEAD = ["kernel", "op", "calls", "time", "FLOP/B", "achieved", "bound", "% of roof", "flag"]
_KERNEL_NUM = [False, False, True, True, True, True, False, True, False]
_MOVE_HEAD = [
    "op",
    "input shapes",
    "dtype",
    "calls",
    "time",
    "bytes",
    "achieved",
    "% of bandwidth",
    "where",
]
_MOVE_NUM = [False, False, False, True, True, True, True, True, False]


def roofline_section(roofline: Roofline, *, top: int = 20) -> Section:
    """Return the Roofline section: plot (HTML only), the op-group table (the `top` groups
    by time), data movement and the time no formula covers, as text and as HTML."""
    lines = _roofline_head(roofline)
    html: list[str] = []
    if _plottable(roofline):
        html.append(svg.plot_html(roofline_svg(roofline)))
    html.extend(note(line) for line in lines)
    _add_points(roofline, top, lines, html)
    if roofline.kernel_points:
        _add_kernel_points(roofline, lines, html)
    if roofline.data_movement:
        _add_data_movement(roofline, top, lines, html)
    if roofline.unmodelled:
        _add_unmodelled(roofline, lines, html)
    return Section("Roofline", "\n".join(lines), "".join(html))


def _roofline_head(roofline: Roofline) -> list[str]:
    """Return the lines above the tables: the device and its roofs, the roofline's note,
    and how much time the points cover and is memory- or compute-bound."""
    spec = roofline.device
    lines: list[str] = []
    if spec is not None:
        roofs = ", ".join(
            f"{ROOF_LABELS.get(r, r)} {fmt_rate(p, 'FLOP/s')}" for r, p in spec.roofs()
        )
        head = (
            f"device: {spec.name} ({'measured' if spec.measured else 'datasheet'}); "
            f"bandwidth {fmt_rate(spec.bandwidth_bytes_per_s, 'B/s')}; {roofs}"
        )
        lines.append(head)
    lines.append(roofline.note)
    share_mem, share_cmp = roofline.time_share("memory"), roofline.time_share("compute")
    summary = (
        f"time basis: {roofline.time_basis}; attributed "
        f"{fmt_us(roofline.attributed_time_us)} of {fmt_us(roofline.total_time_us)}"
    )
    if share_mem is not None and share_cmp is not None:
        summary += (
            f"; memory-bound {fmt_pct(share_mem)}, compute-bound "
            f"{fmt_pct(share_cmp)} of attributed time"
        )
    lines.append(summary)
    return lines


def _add_points(roofline: Roofline, top: int, lines: list[str], html: list[str]) -> None:
    """Append the op-group table (the `top` groups) to the text lines and HTML parts."""
    points = roofline.points[:top]
    if not points:
        lines.append("no op with a FLOP formula and measured time")
        html.append(note("no op with a FLOP formula and measured time"))
        return
    rows = _point_rows(points)
    lines.append("")
    lines.append(text_table(_POINT_HEAD, rows, right=_POINT_NUM, max_width=200))
    html.append(html_table(_POINT_HEAD, rows, numeric=_POINT_NUM, name_cols=(0, 1)))
    more = len(roofline.points) - len(points)
    if more > 0:
        lines.append(f"... {more} more op groups")
        html.append(note(f"... {more} more op groups"))


def _add_kernel_points(roofline: Roofline, lines: list[str], html: list[str]) -> None:
    """Append the per-kernel table (ops that launched a single kernel, the first 10)."""
    rows = [
        [
            k.name,
            k.op_name,
            fmt_num(k.calls),
            fmt_us(k.time_us),
            fmt_num(k.intensity_flop_per_byte),
            fmt_rate(k.achieved_flops_per_s, "FLOP/s"),
            k.bound or "n/a",
            fmt_pct(k.fraction_of_roof),
            "above roof!" if k.above_roof else "",
        ]
        for k in roofline.kernel_points[:10]
    ]
    lines += [
        "",
        "per kernel (ops that launched a single kernel):",
        text_table(_KERNEL_HEAD, rows, right=_KERNEL_NUM, max_width=160),
    ]
    html.append("<p><b>per kernel (ops that launched a single kernel)</b></p>")
    html.append(
        html_table(_KERNEL_HEAD, rows, numeric=_KERNEL_NUM, name_cols=(0,), short_cols=(0,))
    )


def _add_data_movement(roofline: Roofline, top: int, lines: list[str], html: list[str]) -> None:
    """Append the data-movement table (ops with no FLOPs, the first `top`)."""
    rows = [
        [
            d.name,
            d.shapes,
            d.dtype,
            fmt_num(d.calls),
            fmt_us(d.time_us),
            fmt_bytes(d.bytes_moved),
            fmt_rate(d.achieved_bytes_per_s, "B/s"),
            fmt_pct(d.fraction_of_bandwidth),
            d.direction,
        ]
        for d in roofline.data_movement[:top]
    ]
    lines += [
        "",
        "data movement (no FLOPs):",
        text_table(_MOVE_HEAD, rows, right=_MOVE_NUM, max_width=160),
    ]
    html.append("<p><b>data movement (no FLOPs)</b></p>")
    html.append(html_table(_MOVE_HEAD, rows, numeric=_MOVE_NUM, name_cols=(0, 1)))


def _add_unmodelled(roofline: Roofline, lines: list[str], html: list[str]) -> None:
    """Append the table of ops off the roofline (no formula or no shapes, the first 10)."""
    rows = [[u.name, fmt_num(u.calls), fmt_us(u.time_us)] for u in roofline.unmodelled[:10]]
    unmod_head = ["op (no formula)", "calls", "time"]
    lines += [
        "",
        "not on the roofline (no formula or no shapes):",
        text_table(unmod_head, rows, right=[False, True, True]),
    ]
    html.append(f"<p><b>{esc('not on the roofline (no formula or no shapes)')}</b></p>")
    html.append(html_table(unmod_head, rows, numeric=[False, True, True], name_cols=(0,)))


@report_of.register
def _roofline(roofline: Roofline) -> tuple[str, Sequence[Section]]:
    return "Roofline", [roofline_section(roofline)]
