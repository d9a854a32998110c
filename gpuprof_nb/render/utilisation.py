"""Utilisation beside a timeline: a strip of rows under the timeline's plot area (CPU cores
as thin heat rows, this process and the GPU's memory, power and clock as small bar plots),
and the same numbers as plain text.

The strip and the text share one binning: the intervals inside the drawn span, grouped
into at most MAX_CELLS bins (time-weighted means), so every number a cell's hover text shows
is in the text's table too."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuprof_nb.model.utilisation import Utilisation, UtilisationSeries
from gpuprof_nb.render import svg
from gpuprof_nb.render.html import esc
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num

NVML_NOTE = (
    'NVML\'s GPU "utilisation" is the share of each sample period (1/6 s to 1 s, set by the '
    "driver) in which at least one kernel was running, not how busy the SMs were: a GPU at "
    '100% "utilisation" can be using a few % of its SMs. So it is not the trace\'s busy time.'
)

# The most cells per row: a drawn span holding more intervals groups them into this many bins
# (time-weighted means), which keeps the strip under about 100 kB and the text's table short.
MAX_CELLS = 50
# The most per-core rows; with more cores one row shows their mean.
MAX_CORE_ROWS = 16
CPU_COLOUR = "#1f77b4"
PROCESS_COLOUR = "#9467bd"
GPU_COLOUR = "#2ca02c"
_CORE_H, _HEAT_H, _BAR_H, _LABEL_H, _GAP = 6, 11, 18, 13, 5

# Short names for hover text and table headers; the series' own labels head the rows.
_SHORT = {
    "process": "process",
    "gpu_util": "GPU util",
    "gpu_mem_util": "GPU mem ctrl",
    "gpu_mem_used": "GPU mem used",
    "gpu_power": "GPU power",
    "gpu_sm_clock": "GPU SM clock",
}
_GPU_ORDER = ("gpu_util", "gpu_mem_util", "gpu_mem_used", "gpu_power", "gpu_sm_clock")


def _fmt(value: float, unit: str) -> str:
    """Return a value with its unit, as both the strip and the text show it."""
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "cores":
        return f"{value:.2f}"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "W":
        return f"{value:.1f} W"
    if unit == "MHz":
        return f"{value:,.0f} MHz"
    return f"{fmt_num(value)} {unit}".rstrip()


def _ms(us: float) -> str:
    """Return a time offset in microseconds as milliseconds with at most two decimals."""
    return svg.num(us / 1e3)


@dataclass(frozen=True, slots=True)
class _Row:
    """One drawn row: `key` names it in hover text and the table, `bins` holds its
    time-weighted mean per bin; `heat` rows shade cells by %, the others draw bars."""

    key: str
    unit: str
    heat: bool
    bins: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class _Group:
    """Rows under one label line: `title` is that line (in the text too), `tip` its hover."""

    title: str
    tip: str | None
    colour: str
    rows: tuple[_Row, ...]


@dataclass(frozen=True, slots=True)
class _Layout:
    lo_us: float
    hi_us: float
    bins: tuple[tuple[float, float], ...]  # (start, end) of each bin, trace microseconds
    groups: tuple[_Group, ...]
    summary: tuple[str, ...]


def _window(u: Utilisation, lo: float, hi: float) -> list[tuple[int, float, float]]:
    """Return (index, start, end) of the intervals overlapping [lo, hi], clipped to it."""
    out = []
    for i, end in enumerate(u.ts_us):
        start = u.interval_start_us(i)
        a, b = max(start, lo), min(end, hi)
        if b > a:
            out.append((i, a, b))
    return out


def _bin_values(
    values: tuple[float, ...], groups: list[list[tuple[int, float, float]]]
) -> tuple[float, ...]:
    """Return the time-weighted mean of `values` over each group of clipped intervals."""
    out = []
    for group in groups:
        weight = sum(b - a for _, a, b in group)
        out.append(sum(values[i] * (b - a) for i, a, b in group) / weight)
    return tuple(out)


def _stats(
    values: tuple[float, ...], window: list[tuple[int, float, float]]
) -> tuple[float, float]:
    """Return (time-weighted mean, max) of `values` over the window's intervals."""
    weight = sum(b - a for _, a, b in window)
    mean = sum(values[i] * (b - a) for i, a, b in window) / weight
    return mean, max(values[i] for i, _, _ in window)


_Window = list[tuple[int, float, float]]


def _layout(u: Utilisation, lo: float, hi: float) -> _Layout:
    """Return the bins, rows and summary lines of `u` over [lo, hi]."""
    window = _window(u, lo, hi)
    size = max(1, math.ceil(len(window) / MAX_CELLS))
    groups_i = [window[j : j + size] for j in range(0, len(window), size)]
    bins = tuple((g[0][1], g[-1][2]) for g in groups_i)
    rate = f"{fmt_num(u.samples_per_s)} samples/s"
    summary: list[str] = []
    if not window:
        return _Layout(lo, hi, (), (), ("no utilisation samples in this span",))
    cpu_parts, groups = _cpu_groups(u, window, groups_i)
    if cpu_parts:
        cpu_source = "+".join(p for p in u.source.split("+") if p != "nvml") or u.source
        summary.append(f"CPU utilisation ({cpu_source}, {rate}): " + "; ".join(cpu_parts))
    gpu_parts, gpu_groups = _gpu_groups(u, window, groups_i)
    groups += gpu_groups
    if gpu_parts:
        summary.append(f"GPU utilisation (NVML, {rate}): " + "; ".join(gpu_parts))
        if u.series_named("gpu_util") is not None:
            summary.append(NVML_NOTE)
    return _Layout(lo, hi, bins, tuple(groups), tuple(summary))


def _row(s: UtilisationSeries, key: str, heat: bool, groups_i: list[_Window]) -> _Row:
    """Return the drawn row of series `s`, binned over `groups_i`."""
    return _Row(key, s.unit, heat, _bin_values(s.values, groups_i))


def _cpu_groups(
    u: Utilisation, window: _Window, groups_i: list[_Window]
) -> tuple[list[str], list[_Group]]:
    """Return the CPU summary's parts and the row groups of the cores (one row each, or
    their mean past MAX_CORE_ROWS) and of this process."""
    cores = u.cpu_cores()
    process = u.series_named("process")
    cpu_parts = []
    groups: list[_Group] = []
    if cores:
        means = [_stats(s.values, window)[0] for s in cores]
        cores_mean = _fmt(sum(means) / len(means), "%")
        busiest = _fmt(max(means), "%")
        cpu_parts.append(f"cores mean {cores_mean}, max core {busiest}")
        if len(cores) <= MAX_CORE_ROWS:
            title = (
                f"CPU cores {cores[0].name.removeprefix('cpu')}-"
                f"{cores[-1].name.removeprefix('cpu')}, % busy, one row each "
                f"(mean {cores_mean}, max core {busiest})"
            )
            rows = tuple(_row(s, s.name, True, groups_i) for s in cores)
        else:
            mean_values = tuple(
                sum(v) / len(v) for v in zip(*(s.values for s in cores), strict=True)
            )
            mean_series = UtilisationSeries("cores", "%", "cores mean", mean_values)
            title = (
                f"CPU: all {len(cores)} cores, mean % busy (mean {cores_mean}, max core {busiest})"
            )
            rows = (_row(mean_series, "cores mean", True, groups_i),)
        groups.append(_Group(title, None, CPU_COLOUR, rows))
    if process is not None:
        mean, top = _stats(process.values, window)
        cpu_parts.append(
            f"{process.label} {_fmt(mean, 'cores')} cores mean, {_fmt(top, 'cores')} max"
        )
        groups.append(
            _Group(
                f"{process.label}, CPU cores in use (mean {_fmt(mean, 'cores')}, "
                f"max {_fmt(top, 'cores')})",
                None,
                PROCESS_COLOUR,
                (_row(process, "process", False, groups_i),),
            )
        )
    return cpu_parts, groups


def _gpu_groups(
    u: Utilisation, window: _Window, groups_i: list[_Window]
) -> tuple[list[str], list[_Group]]:
    """Return the GPU summary's parts and a row group per NVML series, then per series a
    later version may add (drawn after the known ones, by their own labels)."""
    gpu_parts = []
    groups: list[_Group] = []
    for name in _GPU_ORDER:
        s = u.series_named(name)
        if s is None:
            continue
        mean, top = _stats(s.values, window)
        numbers = (
            f"max {_fmt(top, s.unit)}"
            if s.unit == "bytes"
            else f"mean {_fmt(mean, s.unit)}, max {_fmt(top, s.unit)}"
        )
        gpu_parts.append(f"{_SHORT[name]} {numbers}")
        groups.append(
            _Group(
                f"{s.label} ({numbers})",
                NVML_NOTE if name == "gpu_util" else None,
                GPU_COLOUR,
                (_row(s, _SHORT[name], s.unit == "%", groups_i),),
            )
        )
    known = {s.name for s in u.cpu_cores()} | {"process", *_GPU_ORDER}
    for s in u.series:
        if s.name in known:
            continue
        mean, top = _stats(s.values, window)
        numbers = f"mean {_fmt(mean, s.unit)}, max {_fmt(top, s.unit)}"
        gpu_parts.append(f"{s.label} {numbers}")
        groups.append(
            _Group(
                f"{s.label} ({numbers})",
                None,
                GPU_COLOUR,
                (_row(s, s.name, s.unit == "%", groups_i),),
            )
        )
    return gpu_parts, groups


def _span(u: Utilisation, lo_us: float | None, hi_us: float | None) -> tuple[float, float]:
    if not u.ts_us:
        return (lo_us or 0.0, hi_us or 0.0)
    lo = u.interval_start_us(0) if lo_us is None else lo_us
    hi = u.ts_us[-1] if hi_us is None else hi_us
    return lo, max(hi, lo + 1e-3)


def _cell_tip(r: _Row, value: float, a: float, b: float, lo: float) -> str:
    return f"{r.key}: {_fmt(value, r.unit)} ({_ms(a - lo)}-{_ms(b - lo)} ms)"


def utilisation_text(
    u: Utilisation, lo_us: float | None = None, hi_us: float | None = None
) -> list[str]:
    """Return plain-text lines: the CPU and GPU summary over [lo_us, hi_us] (the whole
    recording by default), NVML's caveat, the notes, and a table of the values per bin
    (milliseconds from lo_us): the numbers utilisation_strip_svg draws for the same span."""
    lo, hi = _span(u, lo_us, hi_us)
    lay = _layout(u, lo, hi)
    lines = list(lay.summary)
    lines.extend(f"Note: {n}" for n in u.notes)
    if not lay.bins:
        return lines
    lines.extend(g.title for g in lay.groups)
    rows = [r for g in lay.groups for r in g.rows]
    headers = ("time (ms)", *(r.key for r in rows))
    table = [
        (f"{_ms(a - lo)}-{_ms(b - lo)}", *(_fmt(r.bins[j], r.unit) for r in rows))
        for j, (a, b) in enumerate(lay.bins)
    ]
    lines.append(f"over time, from the start of the span ({len(lay.bins)} bins):")
    lines.extend(text_table(headers, table, right=(False,) + (True,) * len(rows)).splitlines())
    return lines


def utilisation_strip_svg(u: Utilisation, lo_us: float, hi_us: float, width: int) -> str:
    """Return the strip alone (see utilisation_strip)."""
    return utilisation_strip(u, lo_us, hi_us, width)[0]


def utilisation_strip(u: Utilisation, lo_us: float, hi_us: float, width: int) -> tuple[str, int]:
    """Return an SVG strip, `width` px wide, whose x axis maps [lo_us, hi_us] (trace
    microseconds) onto [0, width], so it lines up under a timeline of the same span: a heat
    row per CPU core (one row of their mean above MAX_CORE_ROWS cores) and for NVML's %
    counters, small bar plots for this process's cores and the GPU's memory, power and
    clock, each under a label with its mean and max. Every cell has a hover title with its
    value and time span (ms from lo_us). The root's data-x-us attribute gives the span.
    Returns the SVG and its height (px)."""
    lo, hi = lo_us, max(hi_us, lo_us + 1e-3)
    lay = _layout(u, lo, hi)
    sx = svg.LinearScale(lo, hi, 0.0, float(width))
    n = svg.num
    body: list[str] = []
    y = 0.0
    if not lay.bins:
        body.append(svg.text(2, 11, lay.summary[0], size=10))
        y = 16.0
    for group in lay.groups:
        body.append(svg.text(2, y + 10, group.title, size=10, tip=group.tip))
        y += _LABEL_H
        for r in group.rows:
            h = _CORE_H if r.key.startswith("cpu") else _HEAT_H if r.heat else _BAR_H
            body.append(f'<g class="gp-util-row" data-row="{esc(r.key)}" fill="{group.colour}">')
            body.append(
                f'<rect x="0" y="{n(y)}" width="{width}" height="{h}" fill="none" '
                'stroke="currentColor" stroke-opacity="0.15"/>'
            )
            top = max(max(r.bins), 1.0 if r.unit == "cores" else 0.0) if not r.heat else 100.0
            # Neighbouring bins that show the same value are drawn as one cell.
            j = 0
            while j < len(r.bins):
                k = j
                shown = _fmt(r.bins[j], r.unit)
                while k + 1 < len(r.bins) and _fmt(r.bins[k + 1], r.unit) == shown:
                    k += 1
                a, b = lay.bins[j][0], lay.bins[k][1]
                x0, x1 = sx(a), sx(b)
                tip = svg.title(_cell_tip(r, r.bins[j], a, b, lo))
                v = r.bins[j]
                if r.heat:
                    opacity = 0.05 + 0.95 * min(max(v / 100.0, 0.0), 1.0)
                    body.append(
                        f'<rect x="{n(x0)}" y="{n(y)}" width="{n(max(x1 - x0, 0.5))}" '
                        f'height="{h}" fill-opacity="{opacity:.2f}">{tip}</rect>'
                    )
                else:
                    bar = max(h * v / top, 0.5) if top > 0 else 0.5
                    body.append(
                        f'<rect x="{n(x0)}" y="{n(y + h - bar)}" '
                        f'width="{n(max(x1 - x0, 0.5))}" height="{n(bar)}">{tip}'
                        "</rect>"
                    )
                j = k + 1
            body.append("</g>")
            y += h + 1
        y += _GAP
    height = max(int(math.ceil(y)), 1)
    head = svg.svg_open(
        width,
        height,
        "CPU and GPU utilisation over the timeline's span",
        f' data-x-us="{lo!r} {hi!r}"',
    )
    return head + "".join(body) + "</svg>", height
