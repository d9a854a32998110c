"""The matplotlib adapter of render/plot.py: a `Chart` drawn as a matplotlib Figure, for papers
and for users who want to restyle a plot. The same axes, ticks, marks, labels (placed by the
same rule, in the figure's pixels) and legend as the report's SVG; hover titles and the
SVG-only strips (`Embed`) have no counterpart. matplotlib is imported here, inside functions,
so the report never pays for it."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuprof_nb.render import plot as P

# SVG pixels to matplotlib points at the figure's 100 dpi.
_PT = 0.72
_INK = "#1f1f1f"


def _colour(c: str) -> str:
    return _INK if c == P.INK else c


def _dash(dash: str | None) -> Any:
    if not dash:
        return "-"
    on_off = tuple(float(v) * _PT for v in dash.split())
    return (0, on_off)


def _axis(ax: Any, axis: P.Axis, which: str) -> None:
    set_scale = ax.set_xscale if which == "x" else ax.set_yscale
    set_lim = ax.set_xlim if which == "x" else ax.set_ylim
    set_ticks = ax.set_xticks if which == "x" else ax.set_yticks
    set_label = ax.set_xlabel if which == "x" else ax.set_ylabel
    if axis.scale == "log":
        set_scale("log")
    elif axis.scale == "log2":
        set_scale("log", base=2)
    set_lim((axis.hi, axis.lo) if axis.reverse else (axis.lo, axis.hi))
    if axis.hidden:
        set_ticks([])
        (ax.xaxis if which == "x" else ax.yaxis).set_visible(False)
        return
    set_ticks([t.value for t in axis.ticks], [t.label for t in axis.ticks])
    (ax.xaxis if which == "x" else ax.yaxis).set_minor_locator(_null_locator())
    if axis.label:
        set_label(axis.label)
    if axis.grid:
        ax.grid(True, axis=which, linewidth=0.3, alpha=0.5)


def _null_locator() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def _rects(ax: Any, m: P.Rects) -> None:
    from matplotlib.collections import PolyCollection

    count = len(m.x0)
    if not count:
        return
    x0, x1 = np.asarray(m.x0, dtype=float), np.asarray(m.x1, dtype=float)
    y0, y1 = np.asarray(m.y0, dtype=float), np.asarray(m.y1, dtype=float)
    verts = np.stack(
        [
            np.stack([x0, y0], 1),
            np.stack([x1, y0], 1),
            np.stack([x1, y1], 1),
            np.stack([x0, y1], 1),
        ],
        axis=1,
    )
    fills = [m.fill] * count if isinstance(m.fill, str) else list(m.fill)
    coll = PolyCollection(
        list(verts),
        facecolors=[_colour(c) if c != "none" else (0, 0, 0, 0) for c in fills],
        edgecolors=_colour(m.stroke) if m.stroke else "none",
        linewidths=m.stroke_width,
        alpha=m.opacity if not m.stroke else None,
        zorder=1 if m.opacity < 1 else 2,
    )
    ax.add_collection(coll)
    if m.labels is not None:
        for i, label in enumerate(m.labels):
            if label:
                ax.text(
                    x0[i],
                    (y0[i] + y1[i]) / 2,
                    " " + label,
                    va="center",
                    ha="left",
                    fontsize=6,
                    color=m.label_colour,
                    clip_on=True,
                )


def _dots(ax: Any, m: P.Dots) -> None:
    if not len(m.x):
        return
    rings = list(m.ring) if m.ring is not None else [None] * len(m.x)
    ax.scatter(
        list(m.x),
        list(m.y),
        s=[(2 * r * _PT) ** 2 for r in m.r],
        c=[_colour(c) for c in m.fill],
        edgecolors=[r or "white" for r in rings],
        linewidths=[2.0 if r else 0.5 for r in rings],
        alpha=m.opacity,
        marker="v" if m.shape == "triangle" else "o",
        zorder=3,
    )


def _line(ax: Any, m: P.Line) -> None:
    ax.plot(
        list(m.x),
        list(m.y),
        color=_colour(m.colour),
        linewidth=m.width,
        linestyle=_dash(m.dash),
        drawstyle="steps-post" if m.step else "default",
        zorder=2.5,
    )


def _stack(ax: Any, m: P.Stack) -> None:
    if not m.layers:
        return
    ys = np.array([layer.values for layer in m.layers], dtype=float)
    if len(m.x) > 1:
        ax.stackplot(
            list(m.x),
            ys,
            colors=[layer.colour for layer in m.layers],
            step="post",
            alpha=m.opacity,
            linewidth=0,
        )


def _line_label(ax: Any, m: P.Line) -> None:
    """Write a line's label along its first visible segment, as the SVG does."""
    import math

    from gpuprof_nb.render.svg import clip_segment

    bbox = ax.get_window_extent()
    (x1, y1), (x2, y2) = ax.transData.transform([(m.x[0], m.y[0]), (m.x[1], m.y[1])])
    seg = clip_segment(x1, y1, x2, y2, (bbox.x0, bbox.y0, bbox.x1, bbox.y1))
    if seg is None:
        return
    a, b, c, d = seg
    angle = math.degrees(math.atan2(d - b, c - a))
    at = ax.transData.inverted().transform((a + 0.06 * (c - a), b + 0.06 * (d - b)))
    ax.annotate(
        m.label,
        (float(at[0]), float(at[1])),
        xytext=(3, 3),
        textcoords="offset points",
        rotation=angle,
        rotation_mode="anchor",
        fontsize=7,
        color=_colour(m.colour),
    )


def _text(ax: Any, m: P.Text) -> None:
    ax.annotate(
        m.text,
        (m.x, m.y),
        xytext=(m.dx * _PT, -m.dy * _PT),
        textcoords="offset points",
        ha=_HA[m.anchor],
        va="baseline",
        fontsize=m.size * _PT,
        color=_colour(m.colour),
        fontweight="bold" if m.bold else "normal",
        alpha=0.7 if m.faint else 1.0,
        annotation_clip=False,
    )


def _rule(ax: Any, m: P.Rule) -> None:
    kw = dict(color=_colour(m.colour), linewidth=m.width, linestyle=_dash(m.dash), alpha=m.opacity)
    if m.axis == "x":
        ax.axvline(m.value, **kw)
        if m.label:
            ax.annotate(
                m.label,
                (m.value, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -10),
                textcoords="offset points",
                fontsize=7,
                color=_colour(m.colour),
            )
    else:
        ax.axhline(m.value, **kw)
        if m.label:
            ax.annotate(
                m.label,
                (1.0, m.value),
                xycoords=("axes fraction", "data"),
                xytext=(-3, 3),
                textcoords="offset points",
                ha="right",
                fontsize=7,
                color=_colour(m.colour),
            )


def _legend(ax: Any, chart: P.Chart) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = []
    for e in chart.legend:
        colour = _colour(e.colour)
        if e.swatch == "rect":
            handles.append(Patch(color=colour, alpha=e.opacity, label=e.label))
        elif e.swatch in ("dot", "ring", "triangle"):
            ring = e.swatch == "ring"
            handles.append(
                Line2D(
                    [],
                    [],
                    marker="v" if e.swatch == "triangle" else "o",
                    linestyle="",
                    color="white" if ring else colour,
                    markeredgecolor=colour,
                    markeredgewidth=2 if ring else 0.5,
                    label=e.label,
                )
            )
        else:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=colour,
                    linestyle=_dash("4 2" if e.swatch == "dash" else None),
                    label=e.label,
                )
            )
    if not handles:
        return
    if chart.legend_inside:
        ax.legend(handles=handles, fontsize=7, loc="lower right")
    else:
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False
        )


class _Pixels:
    """The figure's pixel geometry after layout, with y growing downward as in the SVG, and
    what texts and labels must keep off: dots, the legend, texts drawn, lines."""

    def __init__(self, ax: Any, chart: P.Chart) -> None:
        fig = ax.figure
        if not hasattr(fig.canvas, "get_renderer"):
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            FigureCanvasAgg(fig)
        self.renderer = fig.canvas.get_renderer()
        self.ax, self.height = ax, fig.bbox.height
        self.trans = ax.transData
        bbox = ax.get_window_extent(self.renderer)
        self.box: P.Rect = (bbox.x0, self.height - bbox.y1, bbox.x1, self.height - bbox.y0)
        lo_x, lo_y = chart.x.lo, chart.y.lo
        self.taken: list[P.Rect] = P.dot_boxes(
            chart, lambda v: self.xy(v, lo_y)[0], lambda v: self.xy(lo_x, v)[1]
        )
        legend = ax.get_legend()
        if legend is not None:
            self.taken.append(self.extent(legend))
        for t in ax.texts:
            self.taken.append(self.extent(t))
        self.segments: list[tuple[float, float, float, float]] = []
        for m in chart.marks:
            if isinstance(m, P.Line) and not m.step:
                for i in range(len(m.x) - 1):
                    a, b = self.xy(m.x[i], m.y[i]), self.xy(m.x[i + 1], m.y[i + 1])
                    seg = svg_clip(a[0], a[1], b[0], b[1], self.box)
                    if seg is not None:
                        self.segments.append(seg)

    def xy(self, x: float, y: float) -> tuple[float, float]:
        px, py = self.trans.transform((x, y))
        return float(px), float(self.height - py)

    def extent(self, artist: Any) -> P.Rect:
        bb = artist.get_window_extent(self.renderer)
        return (bb.x0, self.height - bb.y1, bb.x1, self.height - bb.y0)


def svg_clip(x1: float, y1: float, x2: float, y2: float, box: P.Rect) -> Any:
    from gpuprof_nb.render.svg import clip_segment

    return clip_segment(x1, y1, x2, y2, box)


_HA = {"start": "left", "middle": "center", "end": "right"}


def _placed_texts(ax: Any, chart: P.Chart, px: _Pixels) -> None:
    """Draw the texts that choose their spot (`avoid`), as the SVG renderer chooses it."""
    for m in chart.marks:
        if not isinstance(m, P.Text) or not m.avoid:
            continue
        size = m.size
        x, y, anchor = P.text_spot(
            m,
            lambda v: px.xy(v, chart.y.lo)[0],
            lambda v: px.xy(chart.x.lo, v)[1],
            px.taken,
            px.segments,
            px.box,
        )
        ax0 = px.xy(m.x, m.y)
        ax.annotate(
            m.text,
            (m.x, m.y),
            xytext=((x - ax0[0]) * _PT, -(y - ax0[1]) * _PT),
            textcoords="offset points",
            ha=_HA[anchor],
            va="baseline",
            fontsize=size * _PT,
            color=_colour(m.colour),
            alpha=0.7 if m.faint else 1.0,
            annotation_clip=False,
        )
        px.taken.append(P.text_box(x, y, m.text, size, anchor))


def _labels(ax: Any, chart: P.Chart, px: _Pixels) -> list[P.Placed]:
    """Place the chart's labels in the figure's pixels, by the SVG renderer's rule."""
    anchors = []
    for lb in chart.labels:
        x, y = px.xy(lb.x, lb.y)
        anchors.append((x, y, lb.r, lb.text))
    placed = P.place_labels(anchors, P.LABEL_SIZE, px.box, px.taken, px.segments)
    for lb, (x, y, _, _), p in zip(chart.labels, anchors, placed, strict=True):
        shown = str(p.number) if p.number else p.text
        ax.annotate(
            shown,
            (lb.x, lb.y),
            xytext=((p.x - x) * _PT, -(p.y - y) * _PT),
            textcoords="offset points",
            ha=_HA[p.anchor],
            va="baseline",
            fontsize=P.LABEL_SIZE * _PT,
            fontweight="bold" if p.number else "normal",
            color=_colour(lb.colour),
            arrowprops={"arrowstyle": "-", "alpha": 0.45, "lw": 0.6} if p.moved else None,
        )
    return [p for p in placed if p.number]


def chart_figure(chart: P.Chart, ax: Any = None) -> Any:
    """Return a matplotlib Figure of the chart, drawn into `ax` when given (its figure is
    returned), else into a new Figure of the chart's natural size at 100 dpi."""
    from matplotlib.figure import Figure

    if ax is None:
        box = P.plot_box(chart)
        extra = 0.9 + 0.18 * len(chart.labels)
        fig = Figure(figsize=(chart.width / 100, (box.bottom + 60) / 100 + extra * 0.5), dpi=100)
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    _axis(ax, chart.x, "x")
    _axis(ax, chart.y, "y")
    for m in chart.marks:
        if isinstance(m, P.Rects):
            _rects(ax, m)
        elif isinstance(m, P.Dots):
            _dots(ax, m)
        elif isinstance(m, P.Line):
            _line(ax, m)
        elif isinstance(m, P.Stack):
            _stack(ax, m)
        elif isinstance(m, P.Text) and not m.avoid:
            _text(ax, m)
        elif isinstance(m, P.Rule):
            _rule(ax, m)
    # Limits again: collections and stackplot may have widened them.
    _axis(ax, chart.x, "x")
    _axis(ax, chart.y, "y")
    if chart.title:
        ax.set_title(chart.title, fontsize=9)
    if not chart.frame:
        for spine in ax.spines.values():
            spine.set_visible(False)
    _legend(ax, chart)
    fig.tight_layout()
    for m in chart.marks:
        if isinstance(m, P.Line) and m.label:
            _line_label(ax, m)
    px = _Pixels(ax, chart)
    _placed_texts(ax, chart, px)
    key = _labels(ax, chart, px) if chart.labels else []
    lines = [f"{p.number}  {p.text}" for p in key] + list(chart.notes)
    if lines:
        ax.text(
            0.0,
            -0.14,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=7,
            alpha=0.8,
        )
    return fig
