"""The Roofline section: a log-log plot (roofs, ridge points, one dot per op group) and the
tables under it. The report draws the plot as inline SVG (`roofline_svg`); `plot_roofline`
draws the same plot with matplotlib (imported inside it) for users who want a Figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render import svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, html_table, note
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


def plot_roofline(roofline: Roofline, ax: Any = None, *, top: int = 5) -> Any:
    """Return a matplotlib Figure: log-log FLOP/s against FLOP/byte, with the device's roofs
    and ridge points drawn and labelled, one dot per op group (area ~ time, colour = bound),
    the `top` longest groups labelled and dots above the roof ringed in red."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if ax is None:
        fig = Figure(figsize=(7.5, 4.8), dpi=100)
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    points = _plottable(roofline)
    spec = roofline.device
    xs = [p.intensity_flop_per_byte or 1.0 for p in points]
    ys = [p.achieved_flops_per_s or 1.0 for p in points]
    roofs = drawn_roofs(roofline)
    bw = spec.bandwidth_bytes_per_s if spec is not None else None
    ridges = [peak / bw for _, peak in roofs] if bw else []
    lo = min(xs + ridges, default=0.1) / 4
    hi = max(xs + ridges, default=100.0) * 4
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    if bw and roofs:
        top_peak = roofs[-1][1]
        ax.plot([lo, top_peak / bw], [lo * bw, top_peak], color="black", linewidth=1.2)
        ax.text(
            lo * 1.3,
            lo * bw * 4,
            f"memory {fmt_rate(bw, 'B/s')}",
            fontsize=7,
            rotation=0,
            va="bottom",
        )
        for roof, peak in roofs:
            ridge = peak / bw
            ax.plot([ridge, hi], [peak, peak], color="black", linewidth=1.0, linestyle="-")
            ax.plot([ridge], [peak], marker="o", markersize=3, color="black")
            ax.text(
                hi / 1.05,
                peak * 1.08,
                f"{roof} {fmt_rate(peak, 'FLOP/s')}",
                fontsize=7,
                ha="right",
                va="bottom",
            )
            ax.text(
                ridge,
                peak / 1.35,
                f"ridge {fmt_num(ridge)}",
                fontsize=6,
                ha="center",
                va="top",
                color="#444444",
            )
    if points:
        longest = max(p.time_us for p in points) or 1.0
        sizes = [20 + 380 * p.time_us / longest for p in points]
        colours = [BOUND_COLOURS.get(p.bound, BOUND_COLOURS[None]) for p in points]
        edges = [ABOVE_ROOF_COLOUR if p.above_roof else "white" for p in points]
        widths = [2.0 if p.above_roof else 0.5 for p in points]
        ax.scatter(
            xs, ys, s=sizes, c=colours, edgecolors=edges, linewidths=widths, alpha=0.8, zorder=3
        )
        for p in points[:top]:
            flag = " (above roof!)" if p.above_roof else ""
            ax.annotate(
                short_label(p) + flag,
                (p.intensity_flop_per_byte, p.achieved_flops_per_s),
                textcoords="offset points",
                xytext=(6, -10),
                fontsize=7,
                color=ABOVE_ROOF_COLOUR if p.above_roof else "black",
            )
        for p in points[top:]:
            if p.above_roof:
                ax.annotate(
                    "above roof!",
                    (p.intensity_flop_per_byte, p.achieved_flops_per_s),
                    textcoords="offset points",
                    xytext=(6, -10),
                    fontsize=7,
                    color=ABOVE_ROOF_COLOUR,
                )
        low = min(ys + [peak for _, peak in roofs]) / 10
        high = max(ys + [peak for _, peak in roofs]) * 3
        ax.set_ylim(low, high)
    else:
        ax.text(
            0.5,
            0.5,
            "no op with FLOPs and measured time",
            transform=ax.transAxes,
            ha="center",
            va="center",
        )
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    title = f"Roofline: {spec.name}" if spec is not None else "Roofline (no device ceilings)"
    if spec is not None:
        title += " (measured)" if spec.measured else " (datasheet)"
    ax.set_title(title, fontsize=9)
    handles = [
        Line2D([], [], marker="o", linestyle="", color=BOUND_COLOURS[b], label=lab)
        for b, lab in (("memory", "memory-bound"), ("compute", "compute-bound"))
    ]
    handles.append(
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            color="white",
            markeredgecolor=ABOVE_ROOF_COLOUR,
            label="above roof",
        )
    )
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.grid(True, which="major", linewidth=0.3)
    return fig


# The SVG plot's natural size and plot-area margins (px); CSS scales it down where needed.
_SVG_W, _SVG_H = 680, 420
_SVG_LEFT, _SVG_RIGHT, _SVG_TOP, _SVG_BOTTOM = 62, 14, 30, 46
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


def _place_label(
    label: str,
    x: float,
    y: float,
    r: float,
    size: float,
    placed: list[tuple[float, float, float, float]],
    box: tuple[float, float, float, float],
) -> tuple[float, float, str]:
    """Return (x, baseline y, anchor) for a dot's label: right of the dot, else left of
    it, then a line higher or lower, and so on: the first spot inside the plot that
    overlaps no label or dot placed so far (crowded: the first spot inside the plot)."""
    w, h = svg.text_width(label, size), size
    base = y + size * 0.35
    candidates = []
    for dy in (0.0, -h - 2, h + 2, -2 * (h + 2), 2 * (h + 2), -3 * (h + 2), 3 * (h + 2)):
        candidates += [(x + r + 3, base + dy, "start"), (x - r - 3, base + dy, "end")]
    inside = []
    for cx, cy, anchor in candidates:
        left = cx - w if anchor == "end" else cx
        rect = (left, cy - h, left + w, cy + 2)
        if left < box[0] or rect[2] > box[2] or rect[1] < box[1] or rect[3] > box[3]:
            continue
        inside.append((cx, cy, anchor, rect))
        if not any(
            rect[0] < b[2] and b[0] < rect[2] and rect[1] < b[3] and b[1] < rect[3] for b in placed
        ):
            placed.append(rect)
            return cx, cy, anchor
    cx, cy, anchor, rect = inside[0] if inside else (*candidates[0], (0.0, 0.0, 0.0, 0.0))
    placed.append(rect)
    return cx, cy, anchor


def roofline_svg(roofline: Roofline, *, top: int = 5) -> str:
    """Return the roofline plot as an inline SVG string: log-log achieved FLOP/s against
    FLOP/byte, the device's memory and compute roofs with their ridge points, one dot per op
    group (area ~ time, colour = bound, a red ring when above the roof), the `top` longest
    groups labelled; every dot, roof and ridge has a hover title with its numbers. The
    root's data-x-log / data-y-log / data-plot-box attributes give the axes' limits and the
    plot area, so tests can check positions. Empty string when no op has FLOPs and time."""
    points = _plottable(roofline)
    if not points:
        return ""
    spec = roofline.device
    xs = [p.intensity_flop_per_byte or 1.0 for p in points]
    ys = [p.achieved_flops_per_s or 1.0 for p in points]
    roofs = drawn_roofs(roofline)
    bw = spec.bandwidth_bytes_per_s if spec is not None else None
    ridges = [peak / bw for _, peak in roofs] if bw else []
    peaks = [peak for _, peak in roofs]
    # The same limits as plot_roofline: room for the dots' size and the roofs' labels.
    x_lo, x_hi = min(xs + ridges) / 4, max(xs + ridges) * 4
    y_lo, y_hi = min(ys + peaks) / 10, max(ys + peaks) * 3
    left, top_px = _SVG_LEFT, _SVG_TOP
    right, bottom = _SVG_W - _SVG_RIGHT, _SVG_H - _SVG_BOTTOM
    box = (left, top_px, right, bottom)
    sx = svg.LogScale(x_lo, x_hi, left, right)
    sy = svg.LogScale(y_lo, y_hi, bottom, top_px)
    n = svg.num
    title = f"Roofline: {spec.name}" if spec is not None else "Roofline (no device ceilings)"
    if spec is not None:
        title += " (measured)" if spec.measured else " (datasheet)"
    out = [
        svg.svg_open(
            _SVG_W,
            _SVG_H,
            f"{title}: achieved FLOP/s against arithmetic intensity per op group",
            f' data-x-log="{x_lo!r} {x_hi!r}" data-y-log="{y_lo!r} {y_hi!r}"'
            f' data-plot-box="{left} {top_px} {right} {bottom}"',
        )
    ]
    out.append(
        svg.text(_SVG_W / 2, 16, title, size=12, anchor="middle", extra=' font-weight="600"')
    )
    # Grid and decade ticks.
    grid, labels = [], []
    for v in svg.log_ticks(x_lo, x_hi):
        x = sx(v)
        grid.append(f"M{n(x)} {top_px}V{bottom}")
        labels.append(svg.text(x, bottom + 14, svg.log_label(v), size=10, anchor="middle"))
    for v in svg.log_ticks(y_lo, y_hi):
        y = sy(v)
        grid.append(f"M{left} {n(y)}H{right}")
        labels.append(svg.text(left - 5, y + 3.5, fmt_rate(v, "").strip(), size=10, anchor="end"))
    out.append(
        f'<path d="{"".join(grid)}" fill="none" stroke="currentColor" stroke-opacity="0.13"/>'
    )
    out.append(
        f'<rect x="{left}" y="{top_px}" width="{right - left}" height="{bottom - top_px}"'
        ' fill="none" stroke="currentColor" stroke-opacity="0.45"/>'
    )
    out.extend(labels)
    out.append(
        svg.text(
            (left + right) / 2, _SVG_H - 8, "arithmetic intensity (FLOP/byte)", anchor="middle"
        )
    )
    out.append(
        svg.text(
            14,
            (top_px + bottom) / 2,
            "achieved FLOP/s",
            anchor="middle",
            extra=f' transform="rotate(-90 14 {n((top_px + bottom) / 2)})"',
        )
    )
    # Label boxes placed so far (left, top, right, bottom): dot labels avoid them.
    placed: list[tuple[float, float, float, float]] = []
    # Roofs: the bandwidth slope up to the highest ridge, then one flat roof per precision.
    if bw and roofs:
        top_peak = roofs[-1][1]
        seg = svg.clip_segment(sx(x_lo), sy(x_lo * bw), sx(top_peak / bw), sy(top_peak), box)
        mem_label = f"memory {fmt_rate(bw, 'B/s')}"
        if seg is not None:
            x1, y1, x2, y2 = seg
            out.append(
                f'<path d="M{n(x1)} {n(y1)}L{n(x2)} {n(y2)}" stroke="currentColor" '
                f'stroke-width="1.4" fill="none">'
                + svg.title(f"{mem_label} (bandwidth roof)")
                + "</path>"
            )
            angle = math.degrees(math.atan2(y2 - y1, x2 - x1))
            lx, ly = x1 + 0.06 * (x2 - x1) + 4, y1 + 0.06 * (y2 - y1) - 5
            out.append(
                svg.text(
                    lx,
                    ly,
                    mem_label,
                    size=10,
                    extra=f' transform="rotate({n(angle)} {n(lx)} {n(ly)})"',
                )
            )
        for roof, peak in roofs:
            ridge = peak / bw
            xr, yr = sx(ridge), sy(peak)
            tip = (
                f"{roof} roof: {fmt_rate(peak, 'FLOP/s')}; ridge at {fmt_num(ridge)} "
                "FLOP/byte (left of it memory-bound, right of it compute-bound)"
            )
            out.append(
                f'<path d="M{n(xr)} {n(yr)}H{right}" stroke="currentColor" '
                'stroke-width="1.2" fill="none">' + svg.title(tip) + "</path>"
            )
            out.append(
                f'<circle class="gp-ridge" cx="{n(xr)}" cy="{n(yr)}" r="2.6">'
                + svg.title(tip)
                + "</circle>"
            )
            roof_label = f"{roof} {fmt_rate(peak, 'FLOP/s')}"
            out.append(svg.text(right - 4, yr - 4, roof_label, size=10, anchor="end"))
            placed.append((right - 4 - svg.text_width(roof_label, 10), yr - 14, right, yr))
            ridge_label = f"ridge {fmt_num(ridge)}"
            out.append(
                svg.text(
                    xr, yr + 12, ridge_label, size=9, anchor="middle", extra=' fill-opacity="0.7"'
                )
            )
            half = svg.text_width(ridge_label, 9) / 2
            placed.append((xr - half, yr + 3, xr + half, yr + 14))
    # Dots, longest first so short ones stay on top and hoverable.
    shown = points[:MAX_SVG_POINTS]
    longest = max(p.time_us for p in shown) or 1.0
    dots = [f'<g fill-opacity="0.8" stroke-width="0.7" style="stroke:{svg.BACKGROUND}">']
    geometry = []
    for p in shown:
        x, y = sx(p.intensity_flop_per_byte or 1.0), sy(p.achieved_flops_per_s or 1.0)
        r = math.sqrt((20 + 380 * p.time_us / longest) / math.pi) * 1.2
        geometry.append((x, y, r))
        ring = f' stroke="{ABOVE_ROOF_COLOUR}" stroke-width="2"' if p.above_roof else ""
        colour = BOUND_COLOURS.get(p.bound, BOUND_COLOURS[None])
        dots.append(
            f'<circle class="gp-point" cx="{n(x)}" cy="{n(y)}" r="{n(r)}" '
            f'fill="{colour}"{ring}>' + svg.title(_point_title(p)) + "</circle>"
        )
    dots.append("</g>")
    out.extend(dots)
    # Legend, bottom right inside the plot: only what the dots use.
    bounds = [b for b in ("memory", "compute", None) if any(p.bound == b for p in shown)]
    entries = [(BOUND_LABELS[b], BOUND_COLOURS[b], "") for b in bounds]
    if any(p.above_roof for p in shown):
        entries.append(("above roof", "none", f' stroke="{ABOVE_ROOF_COLOUR}" stroke-width="2"'))
    width = max(svg.text_width(label, 10) for label, _, _ in entries) + 30
    height = 16 * len(entries) + 6
    lx0, ly0 = right - width - 6, bottom - height - 6
    out.append(
        f'<g transform="translate({n(lx0)},{n(ly0)})"><rect width="{n(width)}" '
        f'height="{height}" rx="3" fill-opacity="0.85" stroke="currentColor" '
        f'stroke-opacity="0.3" style="fill:{svg.BACKGROUND}"/>'
    )
    for i, (label, colour, ring) in enumerate(entries):
        cy = 11 + 16 * i
        out.append(
            f'<circle cx="11" cy="{cy}" r="4.5" fill="{colour}"{ring}/>'
            + svg.text(22, cy + 3.5, label, size=10)
        )
    out.append("</g>")
    placed.append((lx0, ly0, lx0 + width, ly0 + height))
    # Labels keep off the dots too (the crowded fallback may still cover one).
    placed.extend((x - r, y - r, x + r, y + r) for x, y, r in geometry)
    for i, (p, (x, y, r)) in enumerate(zip(shown, geometry, strict=True)):
        if i >= top and not p.above_roof:
            continue
        label = (
            (short_label(p) + (" (above roof!)" if p.above_roof else ""))
            if i < top
            else "above roof!"
        )
        lx, ly, anchor = _place_label(label, x, y, r, 10, placed, box)
        colour = ABOVE_ROOF_COLOUR if p.above_roof else "currentColor"
        if abs(ly - 3.5 - y) > 1:
            # Moved up or down out of the crowd: a leader line says which dot it names.
            side = 1 if anchor == "start" else -1
            out.append(
                f'<path d="M{n(x + side * r * 0.7)} {n(y)}L{n(lx - side)} '
                f'{n(ly - 3.5)}" stroke="currentColor" stroke-opacity="0.45"/>'
            )
        out.append(svg.text(lx, ly, label, size=10, anchor=anchor, fill=colour))
    if len(points) > len(shown):
        out.append(
            svg.text(
                left + 4,
                top_px + 12,
                f"{len(points) - len(shown)} shorter op groups not drawn",
                size=10,
                extra=' fill-opacity="0.7"',
            )
        )
    out.append("</svg>")
    return "".join(out)


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
    points = roofline.points[:top]
    spec = roofline.device
    lines: list[str] = []
    html: list[str] = []
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
    if _plottable(roofline):
        html.append(svg.plot_html(roofline_svg(roofline)))
    html.extend(note(line) for line in lines)

    if points:
        rows = _point_rows(points)
        lines.append("")
        lines.append(text_table(_POINT_HEAD, rows, right=_POINT_NUM, max_width=200))
        html.append(html_table(_POINT_HEAD, rows, numeric=_POINT_NUM, name_cols=(0, 1)))
        more = len(roofline.points) - len(points)
        if more > 0:
            lines.append(f"... {more} more op groups")
            html.append(note(f"... {more} more op groups"))
    else:
        lines.append("no op with a FLOP formula and measured time")
        html.append(note("no op with a FLOP formula and measured time"))

    if roofline.kernel_points:
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
    if roofline.data_movement:
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
    if roofline.unmodelled:
        rows = [[u.name, fmt_num(u.calls), fmt_us(u.time_us)] for u in roofline.unmodelled[:10]]
        unmod_head = ["op (no formula)", "calls", "time"]
        lines += [
            "",
            "not on the roofline (no formula or no shapes):",
            text_table(unmod_head, rows, right=[False, True, True]),
        ]
        html.append(f"<p><b>{esc('not on the roofline (no formula or no shapes)')}</b></p>")
        html.append(html_table(unmod_head, rows, numeric=[False, True, True], name_cols=(0,)))
    return Section("Roofline", "\n".join(lines), "".join(html))


@report_of.register
def _roofline(roofline: Roofline) -> tuple[str, Sequence[Section]]:
    return "Roofline", [roofline_section(roofline)]
