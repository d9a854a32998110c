"""The Roofline section: a log-log plot (roofs, ridge points, one dot per op group) and the
tables under it. matplotlib is imported inside plot_roofline only."""

from __future__ import annotations

import io
from typing import Any

from gpuprof_nb.analysis.roofline import Roofline, RooflinePoint
from gpuprof_nb.render.html import esc, html_table, note, png_img
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us

BOUND_COLOURS = {"memory": "#1f77b4", "compute": "#ff7f0e", None: "#7f7f7f"}
ABOVE_ROOF_COLOUR = "#d62728"
ROOF_LABELS = {"fp32": "fp32 vector", "fp64": "fp64 vector", "tf32": "tf32 tensor",
               "bf16": "bf16 tensor", "fp16": "fp16 tensor"}


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
    return [p for p in roofline.points
            if p.intensity_flop_per_byte and p.achieved_flops_per_s]


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
        ax.text(lo * 1.3, lo * bw * 4, f"memory {fmt_rate(bw, 'B/s')}", fontsize=7,
                rotation=0, va="bottom")
        for roof, peak in roofs:
            ridge = peak / bw
            ax.plot([ridge, hi], [peak, peak], color="black", linewidth=1.0, linestyle="-")
            ax.plot([ridge], [peak], marker="o", markersize=3, color="black")
            ax.text(hi / 1.05, peak * 1.08, f"{roof} {fmt_rate(peak, 'FLOP/s')}",
                    fontsize=7, ha="right", va="bottom")
            ax.text(ridge, peak / 1.35, f"ridge {fmt_num(ridge)}", fontsize=6, ha="center",
                    va="top", color="#444444")
    if points:
        longest = max(p.time_us for p in points) or 1.0
        sizes = [20 + 380 * p.time_us / longest for p in points]
        colours = [BOUND_COLOURS.get(p.bound, BOUND_COLOURS[None]) for p in points]
        edges = [ABOVE_ROOF_COLOUR if p.above_roof else "white" for p in points]
        widths = [2.0 if p.above_roof else 0.5 for p in points]
        ax.scatter(xs, ys, s=sizes, c=colours, edgecolors=edges, linewidths=widths,
                   alpha=0.8, zorder=3)
        for p in points[:top]:
            flag = " (above roof!)" if p.above_roof else ""
            ax.annotate(short_label(p) + flag,
                        (p.intensity_flop_per_byte, p.achieved_flops_per_s),
                        textcoords="offset points", xytext=(6, -10), fontsize=7,
                        color=ABOVE_ROOF_COLOUR if p.above_roof else "black")
        for p in points[top:]:
            if p.above_roof:
                ax.annotate("above roof!", (p.intensity_flop_per_byte, p.achieved_flops_per_s),
                            textcoords="offset points", xytext=(6, -10), fontsize=7,
                            color=ABOVE_ROOF_COLOUR)
        low = min(ys + [peak for _, peak in roofs]) / 10
        high = max(ys + [peak for _, peak in roofs]) * 3
        ax.set_ylim(low, high)
    else:
        ax.text(0.5, 0.5, "no op with FLOPs and measured time", transform=ax.transAxes,
                ha="center", va="center")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    title = f"Roofline: {spec.name}" if spec is not None else "Roofline (no device ceilings)"
    if spec is not None:
        title += " (measured)" if spec.measured else " (datasheet)"
    ax.set_title(title, fontsize=9)
    handles = [Line2D([], [], marker="o", linestyle="", color=BOUND_COLOURS[b], label=lab)
               for b, lab in (("memory", "memory-bound"), ("compute", "compute-bound"))]
    handles.append(Line2D([], [], marker="o", linestyle="", color="white",
                          markeredgecolor=ABOVE_ROOF_COLOUR, label="above roof"))
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.grid(True, which="major", linewidth=0.3)
    return fig


def _point_rows(points: tuple[RooflinePoint, ...]) -> list[list[str]]:
    return [
        [p.name, p.shapes, p.dtype, fmt_num(p.calls), fmt_us(p.time_us),
         fmt_rate(p.flops, "FLOP"), fmt_bytes(p.bytes_moved),
         fmt_num(p.intensity_flop_per_byte), fmt_rate(p.achieved_flops_per_s, "FLOP/s"),
         ROOF_LABELS.get(p.roof, p.roof) if p.roof else "n/a", p.bound or "n/a",
         fmt_pct(p.fraction_of_roof), "above roof!" if p.above_roof else ""]
        for p in points
    ]


_POINT_HEAD = ["op", "input shapes", "dtype", "calls", "time", "FLOPs", "bytes", "FLOP/B",
               "achieved", "roof", "bound", "% of roof", "flag"]
_POINT_NUM = [False, False, False, True, True, True, True, True, True, False, False, True,
              False]
_KERNEL_HEAD = ["kernel", "op", "calls", "time", "FLOP/B", "achieved", "bound", "% of roof",
                "flag"]
_KERNEL_NUM = [False, False, True, True, True, True, False, True, False]
_MOVE_HEAD = ["op", "input shapes", "dtype", "calls", "time", "bytes", "achieved",
              "% of bandwidth", "where"]
_MOVE_NUM = [False, False, False, True, True, True, True, True, False]


def roofline_section(roofline: Roofline, *, top: int = 20) -> Section:
    """Return the Roofline section: plot (HTML only), the op-group table (the `top` groups
    by time), data movement and the time no formula covers, as text and as HTML."""
    points = roofline.points[:top]
    spec = roofline.device
    lines: list[str] = []
    html: list[str] = []
    if spec is not None:
        roofs = ", ".join(f"{ROOF_LABELS.get(r, r)} {fmt_rate(p, 'FLOP/s')}"
                          for r, p in spec.roofs())
        head = (f"device: {spec.name} ({'measured' if spec.measured else 'datasheet'}); "
                f"bandwidth {fmt_rate(spec.bandwidth_bytes_per_s, 'B/s')}; {roofs}")
        lines.append(head)
    lines.append(roofline.note)
    share_mem, share_cmp = roofline.time_share("memory"), roofline.time_share("compute")
    summary = (f"time basis: {roofline.time_basis}; attributed "
               f"{fmt_us(roofline.attributed_time_us)} of {fmt_us(roofline.total_time_us)}")
    if share_mem is not None and share_cmp is not None:
        summary += (f"; memory-bound {fmt_pct(share_mem)}, compute-bound "
                    f"{fmt_pct(share_cmp)} of attributed time")
    lines.append(summary)
    if _plottable(roofline):
        fig = plot_roofline(roofline)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        html.append(png_img(buf.getvalue(), "roofline plot: achieved FLOP/s against "
                                            "arithmetic intensity per op group"))
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
        rows = [[k.name, k.op_name, fmt_num(k.calls), fmt_us(k.time_us),
                 fmt_num(k.intensity_flop_per_byte), fmt_rate(k.achieved_flops_per_s, "FLOP/s"),
                 k.bound or "n/a", fmt_pct(k.fraction_of_roof),
                 "above roof!" if k.above_roof else ""]
                for k in roofline.kernel_points[:10]]
        lines += ["", "per kernel (ops that launched a single kernel):",
                  text_table(_KERNEL_HEAD, rows, right=_KERNEL_NUM, max_width=160)]
        html.append("<p><b>per kernel (ops that launched a single kernel)</b></p>")
        html.append(html_table(_KERNEL_HEAD, rows, numeric=_KERNEL_NUM, name_cols=(0,)))
    if roofline.data_movement:
        rows = [[d.name, d.shapes, d.dtype, fmt_num(d.calls), fmt_us(d.time_us),
                 fmt_bytes(d.bytes_moved), fmt_rate(d.achieved_bytes_per_s, "B/s"),
                 fmt_pct(d.fraction_of_bandwidth), d.direction]
                for d in roofline.data_movement[:top]]
        lines += ["", "data movement (no FLOPs):",
                  text_table(_MOVE_HEAD, rows, right=_MOVE_NUM, max_width=160)]
        html.append("<p><b>data movement (no FLOPs)</b></p>")
        html.append(html_table(_MOVE_HEAD, rows, numeric=_MOVE_NUM, name_cols=(0, 1)))
    if roofline.unmodelled:
        rows = [[u.name, fmt_num(u.calls), fmt_us(u.time_us)]
                for u in roofline.unmodelled[:10]]
        unmod_head = ["op (no formula)", "calls", "time"]
        lines += ["", "not on the roofline (no formula or no shapes):",
                  text_table(unmod_head, rows, right=[False, True, True])]
        html.append(f"<p><b>{esc('not on the roofline (no formula or no shapes)')}</b></p>")
        html.append(html_table(unmod_head, rows, numeric=[False, True, True], name_cols=(0,)))
    return Section("Roofline", "\n".join(lines), "".join(html))
