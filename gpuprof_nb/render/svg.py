"""Inline SVG building blocks for the report's plots: scales, ticks, text, legends.

The report draws its plots as SVG strings (no matplotlib): drawing a PNG costs a few hundred
milliseconds per display, an SVG string a few. Text and axes are painted with `currentColor`,
so they take the notebook theme's text colour (light and dark alike); every mark can carry a
`<title>`, which browsers show on hover. Every string that reaches the SVG goes through `esc`.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Sequence

from gpuprof_nb.render.html import esc

SVG_NS = "http://www.w3.org/2000/svg"
# The page background, for outlines and legend boxes that must stand out from the marks.
BACKGROUND = "var(--jp-layout-color0, var(--vscode-editor-background, #fff))"
# A title longer than this (templated kernel names run to thousands of characters) is cut.
MAX_TITLE_CHARS = 300
_SUPERSCRIPT = str.maketrans(
    "-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
)


def num(v: float) -> str:
    """Return a coordinate with at most two decimals and no trailing zeros ('12.5', '40')."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


class LinearScale:
    """Map values in [lo, hi] linearly onto pixels [p0, p1] (p1 < p0 flips the axis)."""

    __slots__ = ("lo", "hi", "p0", "p1", "_k")

    def __init__(self, lo: float, hi: float, p0: float, p1: float) -> None:
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1
        self._k = (p1 - p0) / (hi - lo) if hi != lo else 0.0

    def __call__(self, v: float) -> float:
        return self.p0 + (v - self.lo) * self._k

    @property
    def k(self) -> float:
        """Pixels per unit: value v maps to p0 + (v - lo) * k (arrays alike)."""
        return self._k


class LogScale:
    """Map positive values in [lo, hi] onto pixels [p0, p1] by their base-10 logarithm."""

    __slots__ = ("lo", "hi", "p0", "p1", "_l0", "_k")

    def __init__(self, lo: float, hi: float, p0: float, p1: float) -> None:
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1
        self._l0 = math.log10(lo)
        span = math.log10(hi) - self._l0
        self._k = (p1 - p0) / span if span else 0.0

    def __call__(self, v: float) -> float:
        return self.p0 + (math.log10(v) - self._l0) * self._k


def log_ticks(lo: float, hi: float) -> list[float]:
    """Return tick values for a log axis over [lo, hi]: the powers of ten (every 2nd, 3rd,
    ... decade when more than 12 fit), with 2x and 5x, then every multiple, added while fewer
    than 3 ticks would show (a range under two decades)."""
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    exps = list(range(first, last + 1))
    step = max(1, math.ceil(len(exps) / 12))
    ticks = [10.0**e for e in exps if (e - first) % step == 0]
    for mantissas in ((1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
        if len(ticks) >= 3:
            break
        ticks = [
            m * 10.0**e
            for e in range(first - 1, last + 1)
            for m in mantissas
            if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)
        ]
    return ticks


def log_label(v: float) -> str:
    """Return a log-axis tick label: plain digits from 0.01 to 9,000 ('0.05', '1,000'),
    else a power of ten with a superscript exponent ('10⁻⁵', '2×10⁶')."""
    e = math.floor(math.log10(v) + 1e-9)
    m = round(v / 10.0**e)
    if -2 <= e <= 3:
        return f"{m * 10.0**e:,.{max(0, -e)}f}"
    power = "10" + str(e).translate(_SUPERSCRIPT)
    return power if m == 1 else f"{m}\u00d7{power}"


def nice_ticks(lo: float, hi: float, target: int = 8) -> list[float]:
    """Return round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi],
    about `target` of them."""
    span = hi - lo
    if span <= 0 or not math.isfinite(span):
        return [lo]
    raw = span / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    # Rounded to the step's decimals so 0.1 * 3 prints as 0.3.
    digits = max(0, -math.floor(math.log10(step)))
    return [round(i * step, digits) for i in range(first, last + 1)]


def tick_label(v: float) -> str:
    """Return a linear tick label without float noise ('0.25', '3', '1,200')."""
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.6g}"


def text_width(s: str, size: float) -> float:
    """Return an estimate of the rendered width (px) of `s` at font size `size` (px): the
    report never measures fonts, so labels are placed with this average glyph width."""
    return 0.58 * size * len(s)


def title(s: str) -> str:
    """Return a <title> child (the browser's hover text), cut to MAX_TITLE_CHARS."""
    if len(s) > MAX_TITLE_CHARS:
        s = s[: MAX_TITLE_CHARS - 3] + "..."
    return f"<title>{esc(s)}</title>"


def text(
    x: float,
    y: float,
    s: str,
    *,
    size: float = 11,
    anchor: str = "start",
    fill: str = "currentColor",
    extra: str = "",
    tip: str | None = None,
) -> str:
    """Return a <text> element (escaped) with its baseline at y, and a hover title `tip`."""
    a = f' text-anchor="{anchor}"' if anchor != "start" else ""
    f = f' fill="{fill}"' if fill != "currentColor" else ""
    t = title(tip) if tip is not None else ""
    return (
        f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}"{a}{f}{extra}>{esc(s)}{t}</text>'
    )


def svg_open(width: int, height: int, label: str, attrs: str = "") -> str:
    """Return the opening <svg> tag: fixed natural size, scaled down by CSS where the
    output is narrower, text in the frontend's colour and font."""
    return (
        f'<svg xmlns="{SVG_NS}" class="gp-svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{esc(label)}" '
        f'fill="currentColor" font-family="inherit"{attrs}>'
    )


def clip_segment(
    x1: float, y1: float, x2: float, y2: float, box: tuple[float, float, float, float]
) -> tuple[float, ...] | None:
    """Return the part of the segment (x1, y1)-(x2, y2) inside box (left, top, right,
    bottom), or None when none of it is (Liang-Barsky)."""
    left, top, right, bottom = box
    dx, dy = x2 - x1, y2 - y1
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x1 - left), (dx, right - x1), (-dy, y1 - top), (dy, bottom - y1)):
        if p == 0:
            if q < 0:
                return None
            continue
        t = q / p
        if p < 0:
            if t > t1:
                return None
            t0 = max(t0, t)
        else:
            if t < t0:
                return None
            t1 = min(t1, t)
    return (x1 + t0 * dx, y1 + t0 * dy, x1 + t1 * dx, y1 + t1 * dy)


def legend_row(
    items: Sequence[tuple[str, str]], x: float, y: float, width: float, *, size: float = 11
) -> tuple[str, float]:
    """Return (SVG, height used) of legend entries laid out left to right from (x, y),
    wrapping at `width`. Each item is (label, swatch SVG drawn in a 12x12 box at 0,0)."""
    parts: list[str] = []
    cx, cy, row_h = x, y, size + 7
    for label, swatch in items:
        w = 16 + text_width(label, size) + 14
        if cx > x and cx + w > x + width:
            cx, cy = x, cy + row_h
        parts.append(
            f'<g transform="translate({num(cx)},{num(cy)})">{swatch}'
            + text(16, 10, label, size=size)
            + "</g>"
        )
        cx += w
    return "".join(parts), (cy - y + row_h) if items else 0.0


# What an SVG drawn for the page becomes inside an <img> (no page CSS, no theme variables, no
# inherited font, no hover): dark ink on a white card, a font named, no <title>s.
IMAGE_INK = "#1f1f1f"
IMAGE_FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
_TITLE = re.compile(r"<title>[^<]*</title>")
_SIZE = re.compile(r'^<svg [^>]*?width="(\d+)" height="(\d+)"[^>]*?aria-label="([^"]*)"')


def image_svg(svg: str) -> str:
    """Return the SVG as a standalone image: the theme's colours resolved to dark ink on
    white, the font named, hover titles dropped (an <img> shows none)."""
    out = _TITLE.sub("", svg)
    out = out.replace(BACKGROUND, "#ffffff").replace("currentColor", IMAGE_INK)
    out = out.replace('font-family="inherit"', f'font-family="{IMAGE_FONT}"', 1)
    head = out.index(">") + 1
    return out[:head] + '<rect width="100%" height="100%" fill="#ffffff"/>' + out[head:]


def plot_html(svg: str) -> str:
    """Return a plot for the report, twice: inline SVG (theme colours, hover titles) for a
    viewer that keeps the report's style, and the same drawing as an <img> (an SVG data URI,
    which sanitizers keep) for one that strips style and SVG: an untrusted notebook in
    JupyterLab, GitHub. The style shows the first and hides the second; without it the
    inline SVG stays hidden (hidden="hidden", display:none, a closed <details>: see
    render/html.py), so none of its text leaks. Empty string for an empty drawing."""
    if not svg:
        return ""
    found = _SIZE.match(svg)
    width, height, label = found.groups() if found else ("", "", "plot")
    data = base64.b64encode(image_svg(svg).encode("utf-8")).decode("ascii")
    size = f' width="{width}" height="{height}"' if width else ""
    return (
        '<details class="gp-plot" hidden="hidden" style="display:none">'
        "<summary>the same chart with hover details (shown where the notebook is trusted)"
        f"</summary>{svg}</details>"
        f'<img class="gp-plot-img" alt="{label}"{size} '
        'style="max-width:100%;height:auto;background:#ffffff" '
        f'src="data:image/svg+xml;base64,{data}"/>'
    )
