"""One description per chart, drawn two ways.

The render modules say what a chart shows in data coordinates: the axes (scale, limits, ticks
with their labels), the marks (rectangles, dots, lines, stacked areas, text, rules across the
plot), labels that must not collide, and a legend with one swatch per entry. Two renderers
draw a `Chart`:

- `chart_svg` (here): the inline SVG of the report. Text and axes in `currentColor` (the
  notebook theme's ink), a `<title>` (hover) on every mark that has a tip, labels placed
  where they overlap no other label, mark or legend (or numbered, with a key under the plot).
- `render/plot_mpl.chart_figure`: a matplotlib Figure of the same description, for papers
  (matplotlib is imported there, lazily), with the same ticks, marks, labels and legend.

Pure Python: no matplotlib, no torch, no IPython (render/plot_mpl.py holds the adapter).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import numpy as np

from gpuprof_nb.render import svg
from gpuprof_nb.render.html import esc

Scale = Literal["linear", "log", "log2"]
# Numbers along an axis: a sequence, or a numpy array (a memory timeline's samples).
Values: TypeAlias = Sequence[float] | np.ndarray
Anchor = Literal["start", "middle", "end"]
Swatch = Literal["rect", "dot", "ring", "line", "dash", "triangle"]
INK = "currentColor"


@dataclass(frozen=True, slots=True)
class Tick:
    """A tick at `value` with its label; `tip` is hover text on the label (a lane's numbers)."""

    value: float
    label: str
    tip: str | None = None


@dataclass(frozen=True, slots=True)
class Axis:
    """An axis over [lo, hi]. `reverse` puts lo at the top (lanes, rows of bars); `hidden`
    draws no ticks, labels or grid (an icicle chart's rows)."""

    lo: float
    hi: float
    label: str = ""
    scale: Scale = "linear"
    ticks: tuple[Tick, ...] = ()
    grid: bool = True
    reverse: bool = False
    hidden: bool = False


@dataclass(frozen=True, slots=True)
class Rects:
    """Rectangles [x0, x1] x [y0, y1] in data units, drawn as one group. `fill` is one colour
    or one per rectangle; `labels` are written inside the rectangles they fit in."""

    x0: Values
    x1: Values
    y0: Values
    y1: Values
    fill: str | Sequence[str]
    opacity: float = 1.0
    tips: Sequence[str | None] | None = None
    labels: Sequence[str | None] | None = None
    label_colour: str = "#ffffff"
    stroke: str | None = None
    stroke_width: float = 1.0
    min_px: float = 0.6
    cls: str = ""
    attrs: tuple[tuple[str, str], ...] = ()
    # Per-rectangle group classes and attributes (the icicle's frames), when given.
    item_cls: str = ""
    item_attrs: Sequence[tuple[tuple[str, str], ...]] | None = None


@dataclass(frozen=True, slots=True)
class Dots:
    """Markers at (x, y) in data units, `r` pixels in radius. `ring` draws a coloured outline
    (None: the page background, so overlapping dots stay apart)."""

    x: Values
    y: Values
    r: Values
    fill: Sequence[str]
    ring: Sequence[str | None] | None = None
    tips: Sequence[str | None] | None = None
    opacity: float = 0.8
    shape: Literal["circle", "triangle"] = "circle"
    cls: str = ""


@dataclass(frozen=True, slots=True)
class Line:
    """A polyline through (x, y) in data units, clipped to the plot. `step`: the value holds
    until the next x (an allocator's bytes). Points closer than a pixel are thinned to the
    largest value per pixel column (no peak lost)."""

    x: Values
    y: Values
    colour: str = INK
    width: float = 1.2
    dash: str | None = None
    step: bool = False
    tip: str | None = None
    cls: str = ""
    label: str | None = None  # written along the line near its start (the bandwidth roof)


@dataclass(frozen=True, slots=True)
class Layer:
    values: Values
    colour: str
    label: str
    tip: str | None = None


@dataclass(frozen=True, slots=True)
class Stack:
    """Layers stacked upward from zero over x, as steps (each value holds until the next x).
    Samples closer than a pixel are thinned to the one with the largest total."""

    x: Values
    layers: tuple[Layer, ...]
    opacity: float = 0.9
    cls: str = ""


@dataclass(frozen=True, slots=True)
class Text:
    """Text at (x, y) in data units, moved by (dx, dy) pixels (dy down), baseline at y."""

    x: float
    y: float
    text: str
    anchor: Anchor = "start"
    size: float = 10
    colour: str = INK
    dx: float = 0
    dy: float = 0
    bold: bool = False
    faint: bool = False
    tip: str | None = None
    # Other spots tried in order where the text would cross a line or overlap a mark, the
    # legend or a text drawn before it: (x in data units, dx, dy, anchor) each (a roof's
    # label below its roof, not over the bandwidth slope or a dot).
    avoid: tuple[tuple[float, float, float, Anchor], ...] = ()


@dataclass(frozen=True, slots=True)
class Rule:
    """A line across the whole plot at `value` on the x axis (vertical) or y axis, with an
    optional label at its end."""

    axis: Literal["x", "y"]
    value: float
    colour: str = INK
    width: float = 1.0
    dash: str | None = None
    opacity: float = 1.0
    tip: str | None = None
    label: str | None = None
    cls: str = ""


@dataclass(frozen=True, slots=True)
class Label:
    """A label for the mark at (x, y) (data units, `r` pixels in radius): placed beside it
    where it overlaps no other label, mark or legend, else replaced by a number with the
    text in a key under the plot."""

    x: float
    y: float
    text: str
    r: float = 0.0
    colour: str = INK


@dataclass(frozen=True, slots=True)
class LegendEntry:
    label: str
    colour: str
    swatch: Swatch = "rect"
    opacity: float = 1.0


@dataclass(frozen=True, slots=True)
class Embed:
    """A drawing made elsewhere (SVG only), `height` px tall, placed under the x axis across
    the plot's width with `title` on its left (the utilisation strip under a timeline)."""

    svg: str
    height: float
    title: str = ""
    cls: str = ""


Mark: TypeAlias = Rects | Dots | Line | Stack | Text | Rule


@dataclass(frozen=True, slots=True)
class Chart:
    """What one chart shows. `width` and `plot_height` are the SVG's natural size (px) of the
    whole drawing and of its plot area; `left` fixes the left margin (else it fits the
    y tick labels). `data` are extra attributes on the SVG root (tests read positions)."""

    title: str
    description: str
    x: Axis
    y: Axis
    marks: tuple[Mark, ...] = ()
    labels: tuple[Label, ...] = ()
    legend: tuple[LegendEntry, ...] = ()
    legend_inside: bool = False
    width: int = 900
    plot_height: int = 300
    left: int | None = None
    frame: bool = True
    notes: tuple[str, ...] = ()
    embeds: tuple[Embed, ...] = ()
    data: tuple[tuple[str, str], ...] = field(default=())


# -- ticks ----------------------------------------------------------------------------------------


def linear_ticks(lo: float, hi: float, target: int = 8, fmt: object = None) -> tuple[Tick, ...]:
    """Return round ticks over [lo, hi] labelled plainly (or by `fmt(value)`)."""
    label = fmt if callable(fmt) else svg.tick_label
    return tuple(Tick(v, str(label(v))) for v in svg.nice_ticks(lo, hi, target=target))


def log_ticks(lo: float, hi: float, fmt: object = None) -> tuple[Tick, ...]:
    """Return decade (or finer) ticks over [lo, hi] labelled '0.1', '10³'... (or by fmt)."""
    label = fmt if callable(fmt) else svg.log_label
    return tuple(Tick(v, str(label(v))) for v in svg.log_ticks(lo, hi))


# -- layout ---------------------------------------------------------------------------------------

TITLE_H = 28
RIGHT = 14
TICK_SIZE = 10
LABEL_SIZE = 10
KEY_ROW = 14
_NOTE_ROW = 14


@dataclass(frozen=True, slots=True)
class Box:
    left: float
    top: float
    right: float
    bottom: float


def plot_box(chart: Chart) -> Box:
    """Return the plot area (px) of the chart's SVG: left of it the y tick labels and the y
    axis label, above it the title."""
    if chart.left is not None:
        left = float(chart.left)
    elif chart.y.hidden:
        left = 4.0
    else:
        widest = max((svg.text_width(t.label, TICK_SIZE) for t in chart.y.ticks), default=0.0)
        left = math.ceil(widest + 10 + (22 if chart.y.label else 4))
    top = float(TITLE_H if chart.title else 6)
    return Box(left, top, right_edge(chart.width, chart.x), top + chart.plot_height)


def right_edge(width: int, x: Axis) -> float:
    """Return the plot area's right edge (px) in a drawing `width` px wide: RIGHT px in,
    or more where the last tick label, centred on its tick, needs room for its right half."""
    right = float(RIGHT)
    if x.ticks and not x.hidden:
        last = max(x.ticks, key=lambda t: t.value)
        f = math.log10 if x.scale != "linear" else float
        span = f(x.hi) - f(x.lo)
        if span and (f(x.hi) - f(last.value)) / span < 0.05:
            right = max(right, svg.text_width(last.label, TICK_SIZE) / 2 + 3)
    return width - right


class _Scale:
    """A data -> pixel mapping for one axis (linear, log10 or log2)."""

    def __init__(self, axis: Axis, p0: float, p1: float) -> None:
        self.log = axis.scale != "linear"
        lo, hi = axis.lo, axis.hi
        self.lo = math.log10(lo) if self.log else lo
        span = (math.log10(hi) if self.log else hi) - self.lo
        self.p0 = p0
        self.k = (p1 - p0) / span if span else 0.0

    def __call__(self, v: float) -> float:
        return self.p0 + ((math.log10(v) if self.log else v) - self.lo) * self.k

    def many(self, values: Values) -> np.ndarray:
        a = np.asarray(values, dtype=float)
        return self.p0 + ((np.log10(a) if self.log else a) - self.lo) * self.k


def scales(chart: Chart, box: Box) -> tuple[_Scale, _Scale]:
    """Return the x and y scales of the chart in its plot box."""
    sx = _Scale(chart.x, box.left, box.right)
    if chart.y.reverse:
        sy = _Scale(chart.y, box.top, box.bottom)
    else:
        sy = _Scale(chart.y, box.bottom, box.top)
    return sx, sy


# -- label placement ------------------------------------------------------------------------------

Rect = tuple[float, float, float, float]  # left, top, right, bottom (px)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a label went: text at (x, y) (baseline) with its anchor; `number` > 0 when the
    label did not fit and a number stands in its place (the text is in the key)."""

    x: float
    y: float
    anchor: Anchor
    text: str
    number: int = 0
    moved: bool = False


def _overlaps(a: Rect, b: Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _crosses(rect: Rect, seg: tuple[float, float, float, float]) -> bool:
    return svg.clip_segment(*seg, rect) is not None


def text_box(x: float, y: float, text: str, size: float, anchor: Anchor) -> Rect:
    """The box (px) a text takes with its baseline at y: from the glyph tops to descenders."""
    w = svg.text_width(text, size)
    left = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
    return (left, y - size * 0.8, left + w, y + size * 0.25)


def _label_spots(
    x: float, y: float, r: float, size: float, numbered: bool
) -> list[tuple[float, float, Anchor]]:
    """Candidate spots (text x, baseline y, anchor) for a label of the mark at (x, y): right
    of it, left of it, then a line higher or lower, up to three lines away; a number also
    tries above and below the mark and farther out."""
    base = y + size * 0.35
    step = size + 3
    spots: list[tuple[float, float, Anchor]] = []
    for dy in (0.0, -step, step, -2 * step, 2 * step, -3 * step, 3 * step):
        spots += [(x + r + 3, base + dy, "start"), (x - r - 3, base + dy, "end")]
    if numbered:
        for far in (r + 3, r + 10, r + 20):
            spots += [
                (x, y - far, "middle"),
                (x, y + far + size * 0.8, "middle"),
                (x + far, y - far, "start"),
                (x - far, y - far, "end"),
                (x + far, y + far + size * 0.8, "start"),
                (x - far, y + far + size * 0.8, "end"),
            ]
    return spots


def place_labels(
    labels: Sequence[tuple[float, float, float, str]],
    size: float,
    box: Rect,
    taken: list[Rect],
    segments: Sequence[tuple[float, float, float, float]] = (),
) -> list[Placed]:
    """Place each label (anchor x, y, mark radius r, text; px) beside its mark at the first
    of `_label_spots` inside `box` that overlaps no box in `taken` and crosses no segment
    (it is then added to `taken`). A label with no such spot becomes a number (1, 2, ...),
    its text left for a key under the plot; the number takes the free spot, or else the one
    it overlaps least. Pixel geometry only: both renderers use it."""
    out: list[Placed] = []
    number = 0
    pad = 2.0

    # Each spot is tested against every box taken so far (hundreds of tests a chart): the
    # `_overlaps` test of the spot padded by `pad` is written out in the loops below.

    def cost(rect: Rect) -> int:
        left, top, right, bottom = rect[0] - pad, rect[1] - pad, rect[2] + pad, rect[3] + pad
        hits = 0
        for t_left, t_top, t_right, t_bottom in taken:
            if left < t_right and t_left < right and top < t_bottom and t_top < bottom:
                hits += 1
        return hits + sum(_crosses(rect, g) for g in segments)

    def free(rect: Rect) -> bool:
        """cost(rect) == 0, stopping at the first box or segment in the way."""
        left, top, right, bottom = rect[0] - pad, rect[1] - pad, rect[2] + pad, rect[3] + pad
        for t_left, t_top, t_right, t_bottom in taken:
            if left < t_right and t_left < right and top < t_bottom and t_top < bottom:
                return False
        return not any(_crosses(rect, g) for g in segments)

    def inside(rect: Rect) -> bool:
        return rect[0] >= box[0] and rect[2] <= box[2] and rect[1] >= box[1] and rect[3] <= box[3]

    for x, y, r, text in labels:
        placed = None
        for cx, cy, anchor in _label_spots(x, y, r, size, numbered=False):
            rect = text_box(cx, cy, text, size, anchor)
            if inside(rect) and free(rect):
                placed = Placed(cx, cy, anchor, text, 0, cy != y + size * 0.35)
                taken.append(rect)
                break
        if placed is None:
            number += 1
            shown = str(number)
            best: tuple[int, float, float, Anchor, Rect] | None = None
            for cx, cy, anchor in _label_spots(x, y, r, size, numbered=True):
                rect = text_box(cx, cy, shown, size, anchor)
                if not inside(rect):
                    continue
                c = cost(rect)
                if best is None or c < best[0]:
                    best = (c, cx, cy, anchor, rect)
                if c == 0:
                    break
            if best is None:
                cx, cy, anchor = x + r + 2, y + size * 0.35, "start"
                rect = text_box(cx, cy, shown, size, anchor)
            else:
                _, cx, cy, anchor, rect = best
            far = abs(cy - (y + size * 0.35)) > size or abs(cx - x) > r + 12
            placed = Placed(cx, cy, anchor, text, number, far)
            taken.append(rect)
        out.append(placed)
    return out


def text_spot(
    m: Text,
    sx: Callable[[float], float],
    sy: Callable[[float], float],
    taken: Sequence[Rect],
    segments: Sequence[tuple[float, float, float, float]],
    bounds: Rect,
) -> tuple[float, float, Anchor]:
    """Return where a Text goes (px, baseline, anchor): its own spot, else the first of its
    `avoid` spots inside `bounds` that crosses no segment and overlaps no box in `taken`,
    else its own."""
    y0 = sy(m.y)
    spots: list[tuple[float, float, Anchor]] = [(sx(m.x) + m.dx, y0 + m.dy, m.anchor)]
    spots += [(sx(x) + dx, y0 + dy, anchor) for x, dx, dy, anchor in m.avoid]
    if len(spots) == 1:
        return spots[0]
    for x, y, anchor in spots:
        rect = text_box(x, y, m.text, m.size, anchor)
        inside = (
            rect[0] >= bounds[0]
            and rect[2] <= bounds[2]
            and rect[1] >= bounds[1]
            and rect[3] <= bounds[3]
        )
        if not inside:
            continue
        left, top, right, bottom = rect
        # _overlaps(rect, t) for each box taken, written out (charts test hundreds).
        for t_left, t_top, t_right, t_bottom in taken:
            if left < t_right and t_left < right and top < t_bottom and t_top < bottom:
                break
        else:
            if not any(_crosses(rect, seg) for seg in segments):
                return x, y, anchor
    return spots[0]


def dot_boxes(
    chart: Chart, sx: Callable[[float], float], sy: Callable[[float], float]
) -> list[Rect]:
    """The boxes (px) of every dot of the chart: what labels and texts keep off."""
    out: list[Rect] = []
    for m in chart.marks:
        if isinstance(m, Dots):
            for x, y, r in zip(m.x, m.y, m.r, strict=True):
                px, py = sx(x), sy(y)
                if m.shape == "triangle":
                    out.append((px - r, py - 1.8 * r, px + r, py))
                else:
                    out.append((px - r, py - r, px + r, py + r))
    return out


# -- the SVG renderer -----------------------------------------------------------------------------

n = svg.num


def _attrs(pairs: Sequence[tuple[str, str]]) -> str:
    return "".join(f' {k}="{esc(v)}"' for k, v in pairs)


def _tip(tip: str | None) -> str:
    return svg.title(tip) if tip else ""


def _seq(value: str | Sequence[str], count: int) -> Sequence[str]:
    return [value] * count if isinstance(value, str) else value


def _thin(px: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return the indices to draw: per whole-pixel column, the sample with the largest
    value (so no peak is lost), plus the first and the last sample, in order."""
    cols = np.floor(px).astype(np.int64)
    order = np.lexsort((-values, cols))
    first = np.ones(len(order), dtype=bool)
    first[1:] = cols[order][1:] != cols[order][:-1]
    return np.union1d(order[first], [0, len(px) - 1])


def _step_path(xs: Sequence[str], ys: Sequence[str]) -> list[str]:
    """Return the path commands of a step curve through (xs, ys): each level holds until
    the next x (vertical moves only where the level changes)."""
    d = [f"M{xs[0]} {ys[0]}"]
    last = ys[0]
    for xv, yv in zip(xs[1:], ys[1:], strict=True):
        d.append(f"H{xv}" + (f"V{yv}" if yv != last else ""))
        last = yv
    return d


class _SvgWriter:
    def __init__(self, chart: Chart) -> None:
        self.chart = chart
        self.box = plot_box(chart)
        self.sx, self.sy = scales(chart, self.box)
        self.out: list[str] = []
        # What labels must keep off (px boxes), and lines they must not cross.
        self.taken: list[Rect] = []
        self.segments: list[tuple[float, float, float, float]] = []

    @property
    def clip(self) -> Rect:
        b = self.box
        return (b.left, b.top, b.right, b.bottom)

    def axes(self) -> None:
        c, b = self.chart, self.box
        grid: list[str] = []
        labels: list[str] = []
        if not c.x.hidden:
            for t in c.x.ticks:
                x = self.sx(t.value)
                if c.x.grid:
                    grid.append(f"M{n(x)} {n(b.top)}V{n(b.bottom)}")
                labels.append(
                    svg.text(x, b.bottom + 14, t.label, size=TICK_SIZE, anchor="middle", tip=t.tip)
                )
        if not c.y.hidden:
            for t in c.y.ticks:
                y = self.sy(t.value)
                if c.y.grid:
                    grid.append(f"M{n(b.left)} {n(y)}H{n(b.right)}")
                labels.append(
                    svg.text(b.left - 6, y + 3.5, t.label, size=TICK_SIZE, anchor="end", tip=t.tip)
                )
        if grid:
            self.out.append(
                f'<path d="{"".join(grid)}" fill="none" stroke="currentColor" '
                'stroke-opacity="0.13"/>'
            )
        if c.frame:
            self.out.append(
                f'<rect x="{n(b.left)}" y="{n(b.top)}" width="{n(b.right - b.left)}" '
                f'height="{n(b.bottom - b.top)}" fill="none" stroke="currentColor" '
                'stroke-opacity="0.45"/>'
            )
        self.out.extend(labels)
        if c.x.label and not c.x.hidden:
            self.out.append(
                svg.text((b.left + b.right) / 2, b.bottom + 30, c.x.label, anchor="middle")
            )
        if c.y.label and not c.y.hidden:
            cy = (b.top + b.bottom) / 2
            self.out.append(
                svg.text(
                    14, cy, c.y.label, anchor="middle", extra=f' transform="rotate(-90 14 {n(cy)})"'
                )
            )

    def rects(self, m: Rects) -> None:
        count = len(m.x0)
        if not count:
            return
        fills = _seq(m.fill, count)
        # The most frequent colour goes on the group; rectangles repeat only other colours.
        counts = Counter(fills)
        default = max(sorted(counts), key=counts.__getitem__)
        a = self.sx.many(m.x0)
        b = self.sx.many(m.x1)
        ya = self.sy.many(m.y0)
        yb = self.sy.many(m.y1)
        xs = np.minimum(a, b)
        ws = np.maximum(np.abs(b - a), m.min_px)
        ys = np.minimum(ya, yb)
        hs = np.abs(yb - ya)
        opacity = f' fill-opacity="{m.opacity:g}"' if m.opacity < 1 else ""
        if m.stroke:
            opacity += f' stroke="{m.stroke}" stroke-width="{m.stroke_width:g}"'
        cls = f' class="{esc(m.cls)}"' if m.cls else ""
        self.out.append(f'<g{cls}{_attrs(m.attrs)} fill="{default}"{opacity}>')
        # As Python floats, once; a lane's rectangles share their y and height, formatted once.
        xs_l, ws_l = xs.tolist(), ws.tolist()
        ys_l, hs_l = ys.tolist(), hs.tolist()
        shown_y: dict[float, str] = {}
        for i in range(count):
            fill = f' fill="{fills[i]}"' if fills[i] != default else ""
            tip = _tip(m.tips[i]) if m.tips is not None else ""
            y, h = ys_l[i], hs_l[i]
            y_s = shown_y.get(y)
            if y_s is None:
                y_s = shown_y[y] = n(y)
            h_s = shown_y.get(h)
            if h_s is None:
                h_s = shown_y[h] = n(h)
            rect = (
                f'<rect x="{n(xs_l[i])}" y="{y_s}" width="{n(ws_l[i])}" '
                f'height="{h_s}"{fill}>{tip}</rect>'
            )
            label = m.labels[i] if m.labels is not None else None
            if label:
                chars = int((ws_l[i] - 6) / (0.58 * LABEL_SIZE))
                if chars >= 4:
                    shown = label if len(label) <= chars else label[: chars - 1] + "…"
                    rect += svg.text(
                        xs_l[i] + 3,
                        ys_l[i] + hs_l[i] / 2 + 4,
                        shown,
                        size=LABEL_SIZE,
                        fill=m.label_colour,
                    )
            if m.item_attrs is not None or m.item_cls:
                item_cls = f' class="{esc(m.item_cls)}"' if m.item_cls else ""
                extra = _attrs(m.item_attrs[i]) if m.item_attrs is not None else ""
                rect = f"<g{item_cls}{extra}>{rect}</g>"
            self.out.append(rect)
        self.out.append("</g>")

    def dots(self, m: Dots) -> None:
        if not len(m.x):
            return
        cls = f' class="{esc(m.cls)}"' if m.cls else ""
        self.out.append(
            f'<g fill-opacity="{m.opacity:g}" stroke-width="0.7" style="stroke:{svg.BACKGROUND}">'
        )
        xs, ys = self.sx.many(m.x), self.sy.many(m.y)
        for i in range(len(m.x)):
            x, y, r = float(xs[i]), float(ys[i]), float(m.r[i])
            ring = m.ring[i] if m.ring is not None else None
            stroke = f' stroke="{ring}" stroke-width="2"' if ring else ""
            tip = _tip(m.tips[i]) if m.tips is not None else ""
            if m.shape == "triangle":
                self.out.append(
                    f'<path{cls} d="M{n(x - r)} {n(y - 1.8 * r)}h{n(2 * r)}l{n(-r)} '
                    f'{n(1.8 * r)}z" fill="{m.fill[i]}"{stroke}>{tip}</path>'
                )
            else:
                self.out.append(
                    f'<circle{cls} cx="{n(x)}" cy="{n(y)}" r="{n(r)}" fill="{m.fill[i]}"'
                    f"{stroke}>{tip}</circle>"
                )
        self.out.append("</g>")

    def line(self, m: Line) -> None:
        if len(m.x) < 2:
            return
        px, py = self.sx.many(m.x), self.sy.many(m.y)
        dash = f' stroke-dasharray="{m.dash}"' if m.dash else ""
        cls = f' class="{esc(m.cls)}"' if m.cls else ""
        tip = _tip(m.tip)
        if m.step:
            keep = _thin(px, np.asarray(m.y, dtype=float))
            xs = [f"{v:.1f}" for v in px[keep]]
            ys = [f"{v:.1f}" for v in py[keep]]
            d = "".join(_step_path(xs, ys))
            kx, ky = px[keep].tolist(), py[keep].tolist()
            for i in range(len(kx) - 1):
                self.segments.append((kx[i], ky[i], kx[i + 1], ky[i]))
                if ky[i + 1] != ky[i]:
                    self.segments.append((kx[i + 1], ky[i], kx[i + 1], ky[i + 1]))
        else:
            parts = []
            for i in range(len(px) - 1):
                seg = svg.clip_segment(
                    float(px[i]), float(py[i]), float(px[i + 1]), float(py[i + 1]), self.clip
                )
                if seg is None:
                    continue
                a0, b0, a1, b1 = seg
                self.segments.append((a0, b0, a1, b1))
                parts.append(f"M{n(seg[0])} {n(seg[1])}L{n(seg[2])} {n(seg[3])}")
            d = "".join(parts)
            if not d:
                return
            if m.label:
                x1, y1, x2, y2 = (float(v) for v in self.segments[-len(parts)])
                angle = math.degrees(math.atan2(y2 - y1, x2 - x1))
                lx, ly = x1 + 0.06 * (x2 - x1) + 4, y1 + 0.06 * (y2 - y1) - 5
                self.out.append(
                    svg.text(
                        lx,
                        ly,
                        m.label,
                        size=LABEL_SIZE,
                        extra=f' transform="rotate({n(angle)} {n(lx)} {n(ly)})"',
                    )
                )
                # The rotated label's box, roughly: labels keep off the start of the line.
                w = svg.text_width(m.label, LABEL_SIZE)
                ex, ey = (
                    lx + w * math.cos(math.radians(angle)),
                    ly + w * math.sin(math.radians(angle)),
                )
                self.taken.append(
                    (min(lx, ex) - 2, min(ly, ey) - LABEL_SIZE, max(lx, ex) + 2, max(ly, ey) + 3)
                )
        self.out.append(
            f'<path{cls} d="{d}" stroke="{m.colour}" stroke-width="{m.width:g}" '
            f'fill="none"{dash}>{tip}</path>'
        )

    def stack(self, m: Stack) -> None:
        if not m.layers or len(m.x) < 2:
            return
        px = self.sx.many(m.x)
        values = np.array([layer.values for layer in m.layers], dtype=float)
        keep = _thin(px, values.sum(axis=0))
        cum = np.cumsum(values[:, keep], axis=0)
        xs = [f"{v:.1f}" for v in px[keep]]
        axis = n(self.box.bottom)
        cls = f' class="{esc(m.cls)}"' if m.cls else ""
        # Top layer first, each area from the axis up to its stack top: the ones drawn after
        # it cover its lower part, so only its own band shows, and the path is half as long.
        for k in range(len(m.layers) - 1, -1, -1):
            if not values[k].any():
                continue
            ys = [f"{self.sy(float(v)):.1f}" for v in cum[k]]
            d = [f"M{xs[0]} {axis}V{ys[0]}"] + _step_path(xs, ys)[1:] + [f"V{axis}Z"]
            self.out.append(
                f'<path{cls} d="{"".join(d)}" fill="{m.layers[k].colour}" '
                f'fill-opacity="{m.opacity:g}">{_tip(m.layers[k].tip)}</path>'
            )

    def text(self, m: Text) -> None:
        x, y, anchor = text_spot(m, self.sx, self.sy, self.taken, self.segments, self.clip)
        extra = (' font-weight="600"' if m.bold else "") + (
            ' fill-opacity="0.7"' if m.faint else ""
        )
        self.out.append(
            svg.text(
                x, y, m.text, size=m.size, anchor=anchor, fill=m.colour, extra=extra, tip=m.tip
            )
        )
        self.taken.append(text_box(x, y, m.text, m.size, anchor))

    def rule(self, m: Rule) -> None:
        b = self.box
        dash = f' stroke-dasharray="{m.dash}"' if m.dash else ""
        op = f' stroke-opacity="{m.opacity:g}"' if m.opacity < 1 else ""
        cls = f' class="{esc(m.cls)}"' if m.cls else ""
        if m.axis == "x":
            x = self.sx(m.value)
            d = f"M{n(x)} {n(b.top)}V{n(b.bottom)}"
            self.segments.append((x, b.top, x, b.bottom))
        else:
            y = self.sy(m.value)
            d = f"M{n(b.left)} {n(y)}H{n(b.right)}"
            self.segments.append((b.left, y, b.right, y))
        self.out.append(
            f'<path{cls} d="{d}" stroke="{m.colour}" stroke-width="{m.width:g}" fill="none"'
            f"{dash}{op}>{_tip(m.tip)}</path>"
        )
        if m.label:
            anchor: Anchor
            if m.axis == "x":
                lx, ly, anchor = x + 4, b.top + 12, "start"
                if lx + svg.text_width(m.label, LABEL_SIZE) > b.right:
                    lx, anchor = x - 4, "end"
            else:
                lx, ly, anchor = b.right - 4, y - 4, "end"
            self.out.append(
                svg.text(lx, ly, m.label, size=LABEL_SIZE, anchor=anchor, fill=m.colour)
            )
            self.taken.append(text_box(lx, ly, m.label, LABEL_SIZE, anchor))

    def legend_box(self) -> Rect:
        """Where the legend sits inside the plot: its bottom right corner."""
        b = self.box
        width = max(svg.text_width(e.label, 10) for e in self.chart.legend) + 30
        height = 16 * len(self.chart.legend) + 6
        x0, y0 = b.right - width - 6, b.bottom - height - 6
        return (x0, y0, x0 + width, y0 + height)

    def legend_inside(self) -> None:
        x0, y0, x1, y1 = self.legend_box()
        self.out.append(
            f'<g class="gp-legend" transform="translate({n(x0)},{n(y0)})"><rect '
            f'width="{n(x1 - x0)}" height="{n(y1 - y0)}" rx="3" fill-opacity="0.85" '
            f'stroke="currentColor" stroke-opacity="0.3" style="fill:{svg.BACKGROUND}"/>'
        )
        for i, e in enumerate(self.chart.legend):
            self.out.append(
                f'<g transform="translate(5,{5 + 16 * i})">{swatch_svg(e)}</g>'
                + svg.text(22, 15 + 16 * i, e.label, size=10)
            )
        self.out.append("</g>")


def swatch_svg(e: LegendEntry) -> str:
    """The legend swatch of an entry, in a 12x12 box at (0, 0): as the marks are drawn."""
    op = f' fill-opacity="{e.opacity:g}"' if e.opacity < 1 else ""
    if e.swatch == "dot":
        return f'<circle cx="6" cy="6" r="4.5" fill="{e.colour}"{op}/>'
    if e.swatch == "ring":
        return f'<circle cx="6" cy="6" r="4.5" fill="none" stroke="{e.colour}" stroke-width="2"/>'
    if e.swatch == "line":
        return f'<path d="M0 6h12" stroke="{e.colour}" stroke-width="1.5"/>'
    if e.swatch == "dash":
        return f'<path d="M0 6h12" stroke="{e.colour}" stroke-width="1.2" stroke-dasharray="4 2"/>'
    if e.swatch == "triangle":
        return f'<path d="M1 2h10l-5 9z" fill="{e.colour}"/>'
    return f'<rect width="12" height="12" fill="{e.colour}"{op}/>'


def chart_svg(chart: Chart) -> str:
    """Return the chart as an inline SVG string (see the module docstring). The root's
    data-plot-box attribute gives the plot area (px) and data-x / data-y the axes' limits
    (data units), so tests can check where marks sit."""
    w = _SvgWriter(chart)
    c, b = chart, w.box
    if c.title:
        w.out.append(
            svg.text(c.width / 2, 16, c.title, size=12, anchor="middle", extra=' font-weight="600"')
        )
    w.axes()
    # What texts and labels keep off, known before any is placed: dots and the legend.
    w.taken.extend(dot_boxes(c, w.sx, w.sy))
    if c.legend and c.legend_inside:
        w.taken.append(w.legend_box())
    _draw_marks(w, c.marks)
    if c.legend and c.legend_inside:
        w.legend_inside()
    key = _place_labels(w, c.labels)
    height = int(math.ceil(_draw_below(w, key) + 4))
    data = [
        ("data-plot-box", f"{n(b.left)} {n(b.top)} {n(b.right)} {n(b.bottom)}"),
        ("data-x", f"{c.x.lo!r} {c.x.hi!r}"),
        ("data-y", f"{c.y.lo!r} {c.y.hi!r}"),
        *c.data,
    ]
    head = svg.svg_open(c.width, height, c.description, _attrs(data))
    return head + "".join(w.out) + "</svg>"


def _draw_marks(w: _SvgWriter, marks: Sequence[Mark]) -> None:
    """Draw the marks in three passes: areas (rects, stacks) under lines and rules, under
    dots and texts."""
    for m in marks:
        if isinstance(m, Rects):
            w.rects(m)
        elif isinstance(m, Stack):
            w.stack(m)
    for m in marks:
        if isinstance(m, Line):
            w.line(m)
        elif isinstance(m, Rule):
            w.rule(m)
    for m in marks:
        if isinstance(m, Dots):
            w.dots(m)
        elif isinstance(m, Text):
            w.text(m)


def _place_labels(w: _SvgWriter, labels: Sequence[Label]) -> list[Placed]:
    """Draw the dots' labels where they fit; return those shown as a number (their text
    goes in the key under the plot)."""
    key: list[Placed] = []
    if not labels:
        return key
    anchors = [(w.sx(lb.x), w.sy(lb.y), lb.r, lb.text) for lb in labels]
    placed = place_labels(anchors, LABEL_SIZE, w.clip, w.taken, w.segments)
    for lb, (ax, ay, r, _), p in zip(labels, anchors, placed, strict=True):
        shown = str(p.number) if p.number else p.text
        if p.moved:
            # Moved up or down out of the crowd: a leader line says which dot it names.
            side = 1 if p.anchor == "start" else -1
            w.out.append(
                f'<path d="M{n(ax + side * r * 0.7)} {n(ay)}L{n(p.x - side)} '
                f'{n(p.y - 3.5)}" stroke="currentColor" stroke-opacity="0.45"/>'
            )
        w.out.append(
            svg.text(
                p.x,
                p.y,
                shown,
                size=LABEL_SIZE,
                anchor=p.anchor,
                fill=lb.colour,
                extra=' class="gp-label"' + (' font-weight="600"' if p.number else ""),
                tip=p.text if p.number else None,
            )
        )
        if p.number:
            key.append(p)
    return key


def _draw_below(w: _SvgWriter, key: Sequence[Placed]) -> float:
    """Draw what goes under the plot (after the x ticks and label): embedded strips, the
    labels' key, the legend, notes; return the y (px) where it ends."""
    c, b, body = w.chart, w.box, w.out
    y = b.bottom + (40 if c.x.label and not c.x.hidden else 22 if not c.x.hidden else 8)
    for e in c.embeds:
        if e.title:
            body.append(svg.text(b.left - 6, y + 10, e.title, anchor="end", size=10))
        cls = f' class="{esc(e.cls)}"' if e.cls else ""
        body.append(f'<g{cls} transform="translate({n(b.left)},{n(y)})">{e.svg}</g>')
        y += e.height + 8
    for p in key:
        body.append(
            svg.text(b.left, y + 10, f"{p.number}  {p.text}", size=10, extra=' class="gp-key"')
        )
        y += KEY_ROW
    if c.legend and not c.legend_inside:
        items = [(e.label, swatch_svg(e)) for e in c.legend]
        legend, legend_h = svg.legend_row(items, b.left, y, b.right - b.left, size=10)
        body.append(f'<g class="gp-legend">{legend}</g>')
        y += legend_h
    for note in c.notes:
        body.append(svg.text(b.left, y + 10, note, size=10, extra=' fill-opacity="0.7"'))
        y += _NOTE_ROW
    return y
