"""The Timeline section: the idle-time breakdown over the window and per step, with a
drawing of one representative step: one chart description (`timeline_chart`) drawn as the
report's inline SVG (`timeline_svg`) and as a matplotlib Figure (`plot_timeline`). What the
drawing's lanes hold comes with the report (ProfileReport.timeline_lanes, analysis/lanes.py);
without lanes it shows the busy stretches between the idle gaps."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.model.utilisation import Utilisation
from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.critical_path import critical_path_parts, path_legend
from gpuprof_nb.render.critical_path import lane_columns as path_lane_columns
from gpuprof_nb.render.hotspots import waiting_lines
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.streams import stream_parts
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.render.utilisation import utilisation_strip, utilisation_text
from gpuprof_nb.results.critical_path import CriticalPath
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.timeline import IdleBreakdown, StepTimeline, Timeline, TimelineLanes

# What each breakdown category means, in the user's words.
CATEGORY_LABELS: dict[str, str] = {
    "busy": "busy",
    "dataloader": "waiting on the DataLoader",
    "sync": "waiting on a synchronisation",
    "launch": "short gaps between kernels (launch overhead)",
    "host": "waiting on the host (nothing launched)",
    "other": "other idle",
}
HOST_CATEGORY_LABELS: dict[str, str] = {
    "busy": "inside torch ops",
    "dataloader": "in the DataLoader",
    "sync": "waiting on a synchronisation",
    "launch": "short gaps between ops (dispatch)",
    "host": "Python outside torch ops",
    "other": "other",
}
KERNEL_COLORS: dict[str, str] = {
    "gemm": "#2ca02c",
    "elementwise": "#98df8a",
    "comm": "#8c564b",
    "copy": "#17becf",
    "wait": "#c7c7c7",
}
KERNEL_LABELS: dict[str, str] = {
    "gemm": "matmul/conv kernel",
    "elementwise": "other kernel",
    "comm": "collective (NCCL)",
    "copy": "memcpy/memset",
    "wait": "device-side wait",
}
CAUSE_COLORS: dict[str, str] = {
    "dataloader": "#e377c2",
    "sync": "#d62728",
    "launch": "#ff7f0e",
    "host": "#9467bd",
    "other": "#7f7f7f",
}


def breakdown_rows(breakdown: IdleBreakdown, on_device: bool) -> list[tuple[str, str, str]]:
    """Return (category, time, share) rows of a breakdown, busy first."""
    labels = CATEGORY_LABELS if on_device else HOST_CATEGORY_LABELS
    return [
        (labels[c], fmt_us(us), fmt_pct(breakdown.fraction(c)))
        for c, us in breakdown.us_by_category().items()
    ]


def _step_rows(steps: Sequence[StepTimeline]) -> list[tuple[str, ...]]:
    rows = []
    for s in steps:
        b = s.breakdown
        rows.append(
            (str(s.number), fmt_us(s.dur_us))
            + tuple(fmt_pct(b.fraction(c)) for c in b.us_by_category())
        )
    return rows


_STEP_HEADERS = ("step", "duration", "busy", "dataloader", "sync", "launch", "host", "other")
# Rows of the per-step table in HTML (every step drawn is in the text and on hover).
_MAX_STEP_ROWS = 30
# Steps drawn in the strip of the whole run (and listed in the text).
MAX_STRIP_STEPS = 500
PERFETTO_URL = "https://ui.perfetto.dev"


def _perfetto(trace: Trace | None) -> tuple[str, str]:
    """Return (text, HTML) saying how to browse every event of the run in Perfetto's UI:
    a link (no script: the report never runs code or loads anything) and the file to open."""
    source = trace.source if trace is not None else ""
    if source and Path(source).suffix in (".json", ".gz"):
        # The name alone: the report is the same wherever the file sits.
        name = Path(source).name
        which = f"open {name}, the file this report was read from, there"
        which_html = f"open <code>{esc(name)}</code>, the file this report was read from, there"
    else:
        which = 'save the trace first with report.save("trace.json.gz") and open that file there'
        which_html = (
            "save the trace first with <code>report.save(&quot;trace.json.gz&quot;)</code> "
            "and open that file there"
        )
    tail = (
        " (Open trace file, or drag it onto the page). Perfetto reads it in your browser "
        "and uploads nothing; once opened online it also works offline."
    )
    text = f"Every event of the run, zoomable: Perfetto's UI at {PERFETTO_URL}; {which}{tail}"
    html = (
        f'<p class="gp-perfetto">Every event of the run, zoomable: <a href="{PERFETTO_URL}" '
        f'target="_blank" rel="noopener">open Perfetto&#x27;s UI</a>; {which_html}{esc(tail)}</p>'
    )
    return text, html


def timeline_section(
    timeline: Timeline,
    trace: Trace | None,
    hotspots: Hotspots | None = None,
    critical_path: CriticalPath | None = None,
    lanes: TimelineLanes | None = None,
) -> Section:
    """Return the Timeline section: the breakdown over the window, the user lines the idle
    time was charged to (with `hotspots`), every profiled step as a strip with its numbers
    on hover, a drawing of the representative (median) step (its `lanes` when given), the
    steps' table and how to open the whole trace (`trace`) in Perfetto."""
    text_parts, html_parts = _breakdown_parts(timeline)
    rep = timeline.representative_step
    shown = f"step {rep.number} (median duration)" if rep else "the whole window"
    util = trace.utilisation if trace is not None else None
    parts = [
        _waiting_parts(timeline, hotspots),
        _strip_parts(timeline, lanes),
        _drawing_parts(timeline, lanes, shown, critical_path, util),
    ]
    if critical_path is not None and critical_path.segments:
        parts.append(critical_path_parts(critical_path))
    parts += [stream_parts(timeline, shown), _step_table_parts(timeline)]
    for part_text, part_html in parts:
        text_parts += part_text
        html_parts += part_html
    perfetto_text, perfetto_html = _perfetto(trace)
    text_parts.append(perfetto_text)
    html_parts.append(perfetto_html)
    for x in timeline.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section("Timeline", "\n\n".join(text_parts), "".join(html_parts))


def _breakdown_parts(timeline: Timeline) -> tuple[list[str], list[str]]:
    """Return the text and HTML parts of the head line (how busy the window was) and the
    breakdown table by category."""
    bd = timeline.breakdown
    what = "device" if timeline.on_device else "host"
    head = f"{what} busy {fmt_pct(timeline.busy_fraction)} of a {fmt_us(timeline.window_us)} window"
    if timeline.device is not None:
        head += f" (device {timeline.device})"
    text_parts = [head]
    html_parts = [f"<p>{esc(head)}</p>"]
    if bd is not None:
        rows = breakdown_rows(bd, timeline.on_device)
        text_parts.append(
            text_table(("category", "time", "share"), rows, right=(False, True, True))
        )
        html_parts.append(
            html_table(("category", "time", "share"), rows, numeric=(False, True, True))
        )
    return text_parts, html_parts


def _waiting_parts(timeline: Timeline, hotspots: Hotspots | None) -> tuple[list[str], list[str]]:
    """Return the text and HTML parts listing the user's lines the idle time was charged
    to; without `hotspots`, a hint saying how to get them."""
    waiting = waiting_lines(hotspots) if hotspots is not None else []
    if waiting:
        lead = (
            "Idle time by the line of yours running on the host"
            if timeline.on_device
            else "Gaps between ops by the line of yours running"
        )
        return [f"{lead}:\n" + "\n".join(f"  {w}" for w in waiting)], [
            f"<p>{esc(lead)}:</p><ul>"
            + "".join(f"<li>{esc_inline(w)}</li>" for w in waiting)
            + "</ul>"
        ]
    if hotspots is None:
        hint = (
            "Which lines of yours left these gaps: profile with %%gpuprofile --stack "
            "(offline: with_stack=True)."
        )
        return [hint], [note(hint)]
    return [], []


def _strip_parts(timeline: Timeline, lanes: TimelineLanes | None) -> tuple[list[str], list[str]]:
    """Return the strip of every drawn step (HTML), said in the text; nothing for fewer
    than two steps."""
    drawn = timeline.steps[:MAX_STRIP_STEPS]
    if len(drawn) < 2:
        return [], []
    left = _left_margin(
        _lane_items(timeline, lanes, *timeline.drawn_span(timeline.representative_step)[1:])
    )
    strip = f"All {fmt_num(len(timeline.steps))} profiled steps"
    if len(drawn) < len(timeline.steps):
        strip += f" (the first {fmt_num(len(drawn))} drawn)"
    strip += ", each as wide as it took, split by where its time went"
    return [f"(the HTML view draws a strip: {strip[0].lower()}{strip[1:]})"], [
        f"<p>{esc(strip)} (hover a step for its numbers):</p>"
        + svg.plot_html(plot.chart_svg(steps_chart(timeline, left)))
    ]


def _drawing_parts(
    timeline: Timeline,
    lanes: TimelineLanes | None,
    shown: str,
    critical_path: CriticalPath | None,
    util: Utilisation | None,
) -> tuple[list[str], list[str]]:
    """Return the drawing of the representative step (`shown`; HTML, said in the text) and
    the utilisation over it as text."""
    rep = timeline.representative_step
    html_parts = [
        f"<p>Timeline of {esc(shown)}:</p>"
        + svg.plot_html(
            timeline_svg(timeline, lanes, step=rep, critical_path=critical_path, utilisation=util)
        )
    ]
    text_parts = [f"(the HTML view draws {shown})"]
    if util is not None and util.ts_us:
        lo, hi = (rep.start_us, rep.end_us) if rep else (timeline.start_us, timeline.end_us)
        text_parts.append(
            f"utilisation during {shown} (the strip under the drawing):\n"
            + "\n".join(utilisation_text(util, lo, max(hi, lo + 1e-3)))
        )
    return text_parts, html_parts


def _step_table_parts(timeline: Timeline) -> tuple[list[str], list[str]]:
    """Return the per-step table (HTML keeps the first _MAX_STEP_ROWS rows) of the drawn
    steps, and how many more there are."""
    if not timeline.steps:
        return [], []
    drawn = timeline.steps[:MAX_STRIP_STEPS]
    rows_s = _step_rows(drawn)
    text_parts = [
        "per step:\n" + text_table(_STEP_HEADERS, rows_s, right=(True,) * len(_STEP_HEADERS))
    ]
    html_parts = [
        "<p>Per step:</p>"
        + html_table(_STEP_HEADERS, rows_s[:_MAX_STEP_ROWS], numeric=(True,) * len(_STEP_HEADERS))
    ]
    if len(drawn) > _MAX_STEP_ROWS:
        html_parts.append(
            note(
                f"{len(drawn) - _MAX_STEP_ROWS} more steps: hover the strip above, or "
                "read the text view (print(report.text()))"
            )
        )
    if len(timeline.steps) > len(drawn):
        more = f"{len(timeline.steps) - len(drawn)} more steps not shown"
        text_parts.append(more)
        html_parts.append(note(more))
    return text_parts, html_parts


# The strip of every step: categories stacked from the bottom, busy first.
_STRIP_ORDER = ("busy", "dataloader", "sync", "launch", "host", "other")


def _step_tip(s: StepTimeline, labels: dict[str, str], median: bool) -> str:
    b = s.breakdown
    shares = ", ".join(f"{labels[c]} {fmt_pct(b.fraction(c))}" for c in b.us_by_category())
    return f"step {s.number}: {fmt_us(s.dur_us)}" + (" (median)" if median else "") + f"\n{shares}"


def steps_chart(timeline: Timeline, left: int | None = None) -> plot.Chart:
    """Return every profiled step (up to MAX_STRIP_STEPS) as one strip: each step as wide as
    it took, its height split by where its time went (busy at the bottom, then each idle
    cause), the representative (median) step outlined; hover a step for its duration and
    shares (the same figures as the per-step table)."""
    steps = timeline.steps[:MAX_STRIP_STEPS]
    lo, hi = steps[0].start_us, max(s.end_us for s in steps)
    labels = CATEGORY_LABELS if timeline.on_device else HOST_CATEGORY_LABELS
    colours = {"busy": BUSY_COLOUR if timeline.on_device else CPU_COLOUR, **CAUSE_COLORS}
    rep = timeline.representative_step
    x0 = [s.start_us for s in steps]
    x1 = [s.end_us for s in steps]
    marks: list[plot.Mark] = []
    base = [0.0] * len(steps)
    legend = []
    for c in _STRIP_ORDER:
        shares = [s.breakdown.fraction(c) for s in steps]
        if not any(shares):
            continue
        top = [b + f for b, f in zip(base, shares, strict=True)]
        marks.append(
            plot.Rects(x0, x1, base, top, colours[c], opacity=1.0 if c == "busy" else 0.55)
        )
        legend.append(plot.LegendEntry(labels[c], colours[c], opacity=1.0 if c == "busy" else 0.55))
        base = top
    # One invisible rectangle per step on top carries its numbers (hover anywhere in it).
    marks.append(
        plot.Rects(
            x0,
            x1,
            [0.0] * len(steps),
            [1.0] * len(steps),
            "#000000",
            opacity=0.0,
            tips=[_step_tip(s, labels, rep is not None and s.number == rep.number) for s in steps],
            cls="gp-steps",
        )
    )
    if rep is not None and rep in steps:
        marks.append(
            plot.Rects(
                [rep.start_us],
                [rep.end_us],
                [0.0],
                [1.0],
                "none",
                stroke=plot.INK,
                stroke_width=2.0,
                min_px=2.0,
                cls="gp-median-step",
            )
        )
    median = f"; step {rep.number}, the median, outlined and drawn below" if rep else ""
    return plot.Chart(
        title=f"Every profiled step by where its time went{median}",
        description=f"every profiled step ({len(steps)}) by where its time went",
        x=plot.Axis(lo, hi, "time (ms)", ticks=_ms_ticks(lo, hi)),
        y=plot.Axis(0.0, 1.0, ticks=(plot.Tick(0.0, "0%"), plot.Tick(1.0, "100%")), grid=False),
        marks=tuple(marks),
        legend=tuple(legend),
        width=_TL_WIDTH,
        plot_height=36,
        left=left,
        data=(("data-x-us", f"{lo!r} {hi!r}"), ("data-steps", str(len(steps)))),
    )


PATH_LANE = "critical path"
# The SVG timeline's natural width (px), the most rectangles (bars and shaded gaps) it holds
# and about the most bytes they take (titles included): neighbours closer than a pixel are
# merged first, then closer than 2, 4, ... pixels, until the drawing fits, so a step with
# 100,000 kernels (or with long templated kernel names) stays under about 100 kB.
_TL_WIDTH = 900
MAX_TIMELINE_MARKS = 700
MAX_TIMELINE_BYTES = 100_000
_LANE_H, _BAR_H = 24, 16
CPU_COLOUR = "#1f77b4"
BUSY_COLOUR = "#2ca02c"


@dataclass(slots=True)
class _Run:
    """Bars or gaps merged into one rectangle: pixel span, count and time per colour."""

    a: float
    b: float
    start_us: float
    end_us: float
    count: int
    busy_us: float
    colour_us: dict[str, float]
    longest: tuple[float, str]


@dataclass(frozen=True, slots=True)
class _Bars:
    """One lane's bars (or one cause's gaps) as columns, by start: times, colours and names.
    `names` may compute each name when read (the critical path's): a drawing reads only the
    names of the longest bar of each rectangle."""

    starts: Sequence[float]
    ends: Sequence[float]
    colours: Sequence[str]
    names: Sequence[str]

    def __len__(self) -> int:
        return len(self.starts)


def _bars(items: Sequence[tuple[float, float, str, str]]) -> _Bars:
    """Return (start, end, colour, name) items as columns."""
    if not items:
        return _Bars((), (), (), ())
    starts, ends, colours, names = zip(*items, strict=True)
    return _Bars(starts, ends, colours, names)


def _lane_items(
    timeline: Timeline, lanes: TimelineLanes | None, lo: float, hi: float
) -> list[tuple[str, str, _Bars]]:
    """Return (lane label, what its bars are, its bars by start) per lane of [lo, hi]: the
    `lanes` computed for that span (analysis/lanes.py), else the busy stretches between the
    idle gaps."""
    drawn: list[tuple[str, str, _Bars]] = []
    if lanes is not None:
        if (lanes.start_us, lanes.end_us) != (lo, hi):
            raise GpuprofError(
                f"the lanes were computed for {lanes.start_us!r}..{lanes.end_us!r} us, not the "
                f"drawn {lo!r}..{hi!r}; compute them for this step with "
                "gpuprof_nb.analysis.lanes.timeline_lanes(trace, timeline, step)"
            )
        for lane in lanes.lanes:
            if lane.bars:
                starts, ends, kinds, names = zip(*lane.bars, strict=True)
                colours = tuple(map(_BAR_COLOURS.__getitem__, kinds))
                bars = _Bars(starts, ends, colours, names)
            else:
                bars = _Bars((), (), (), ())
            drawn.append((lane.label, lane.what, bars))
    if not drawn:
        # Without the trace, busy time is the complement of the gaps.
        spans: list[tuple[float, float, str, str]] = []
        cursor = lo
        for g in timeline.gaps:
            if g.end_us <= lo or g.start_us >= hi:
                continue
            if g.start_us > cursor:
                spans.append((cursor, g.start_us, BUSY_COLOUR, "busy"))
            cursor = max(cursor, g.end_us)
        if cursor < hi:
            spans.append((cursor, hi, BUSY_COLOUR, "busy"))
        spans.sort(key=lambda it: (it[0], it[1]))
        drawn.append(("device" if timeline.on_device else "host", "busy stretches", _bars(spans)))
    return drawn


# A bar's colour by its kind (results/timeline.BarKind).
_BAR_COLOURS: dict[str, str] = {"op": CPU_COLOUR, **KERNEL_COLORS}


@dataclass(slots=True)
class _Pixels:
    """Bars with their pixel spans `a`, `b` and durations (numpy, and as lists when read);
    `plain` says the fast merge applies (every number finite, no bar ending left of where it
    starts). Where the bars have more than one colour, `prev` is per bar the index of the
    last bar before it of the same colour (-1: none) and `by_colour` per colour (in order of
    first appearance) the indices of its bars and their durations."""

    bars: _Bars
    a: np.ndarray
    b: np.ndarray
    durs: np.ndarray
    plain: bool
    prev: np.ndarray | None
    by_colour: list[tuple[str, np.ndarray, list[float]]]
    _lists: tuple[list[float], list[float], list[float]] | None = None

    def lists(self) -> tuple[list[float], list[float], list[float]]:
        """(a, b, durations) as lists of floats, made once."""
        if self._lists is None:
            self._lists = (self.a.tolist(), self.b.tolist(), self.durs.tolist())
        return self._lists


def _pixels(bars: _Bars, sx: svg.LinearScale, lo: float, hi: float) -> _Pixels:
    """Return `bars` with their spans clipped to [lo, hi] and scaled by sx (the same
    arithmetic as sx(max(start, lo)), for all bars at once)."""
    starts = np.array(bars.starts, dtype=float)
    ends = np.array(bars.ends, dtype=float)
    a_px = sx.p0 + (np.maximum(starts, lo) - sx.lo) * sx.k
    b_px = sx.p0 + (np.minimum(ends, hi) - sx.lo) * sx.k
    durs = ends - starts
    prev = None
    by_colour = []
    distinct = dict.fromkeys(bars.colours)
    if len(distinct) > 1:
        code = {c: i for i, c in enumerate(distinct)}
        codes = np.fromiter(map(code.__getitem__, bars.colours), np.intp, len(bars))
        prev = np.empty(len(bars), np.intp)
        for i, c in enumerate(code):
            at = np.flatnonzero(codes == i)
            prev[at[0]] = -1
            prev[at[1:]] = at[:-1]
            by_colour.append((c, at, durs[at].tolist()))
    plain = bool(
        np.isfinite(starts).all()
        and np.isfinite(ends).all()
        and np.isfinite(a_px).all()
        and np.isfinite(b_px).all()
        and (b_px >= a_px).all()
    )
    return _Pixels(bars, a_px, b_px, durs, plain, prev, by_colour)


# Fewer bars than this merge item by item (numpy's set-up would cost more).
_VECTOR_MIN = 64


def _merge(px: _Pixels, merge_px: float) -> list[_Run]:
    """Return the bars, sorted by start, as rectangles, neighbours less than `merge_px`
    apart joined; bars of different colours join only where one of them is that narrow.

    Where every number is finite and no bar ends left of its start (`px.plain`), the
    stretches no bar's gap to the furthest end so far breaks are found at once: a bar that
    far right always opens a rectangle. A stretch whose bars join without a colour break
    (no bar of a colour new to it that is wider than `merge_px`, after the stretch is that
    wide) is one rectangle, its sums added in the same order as `_merge_loop` does; any
    other stretch goes through `_merge_loop`. Either way the result is `_merge_loop`'s."""
    n = len(px.bars)
    if n < _VECTOR_MIN or not px.plain or merge_px <= 0:
        return _merge_loop(px, 0, n, merge_px)
    a, b = px.a, px.b
    reach = np.maximum.accumulate(b)
    opens = np.ones(n, dtype=bool)
    opens[1:] = ~(a[1:] - reach[:-1] < merge_px)
    firsts = np.flatnonzero(opens)
    stretch = np.cumsum(opens) - 1
    stretch_start = firsts[stretch]
    bad: set[int] = set()
    if px.prev is not None:
        # A colour break: a bar of a colour new to its stretch, wide, after a wide stretch.
        breaks = ~opens & (px.prev < stretch_start) & ~(b - a < merge_px)
        breaks[1:] &= ~(reach[:-1] - a[stretch_start[1:]] < merge_px)
        bad = set(stretch[breaks].tolist())
    lasts_a = np.append(firsts[1:], n)
    lasts = lasts_a.tolist()
    # Per colour: its durations, and where each stretch's bars of it start and end there.
    colour_spans = [
        (
            c,
            at.tolist(),
            durs_c,
            np.searchsorted(at, firsts).tolist(),
            np.searchsorted(at, lasts_a).tolist(),
        )
        for c, at, durs_c in px.by_colour
    ]
    reach_l = reach.tolist()
    al, _, durs = px.lists()
    bars = px.bars
    starts, ends, colours, names = bars.starts, bars.ends, bars.colours, bars.names
    runs: list[_Run] = []
    for i, (g, h) in enumerate(zip(firsts.tolist(), lasts, strict=True)):
        if i in bad:
            runs += _merge_loop(px, g, h, merge_px)
            continue
        if h - g == 1:
            d = durs[g]
            runs.append(
                _Run(al[g], reach_l[g], starts[g], ends[g], 1, d, {colours[g]: d}, (d, names[g]))
            )
            continue
        busy = functools.reduce(operator.add, durs[g:h])
        k = max(range(g, h), key=durs.__getitem__)
        here = sorted(
            (at[o1[i]], c, durs_c[o1[i] : o2[i]])
            for c, at, durs_c, o1, o2 in colour_spans
            if o2[i] > o1[i]
        )
        if len(here) < 2:
            colour_us = {colours[g]: busy}
        else:
            # Sums in bar order, as _merge_loop adds them: the stretch's first colour from
            # its first bar, the others from 0.0.
            colour_us = {}
            for first, c, vals in here:
                colour_us[c] = (
                    functools.reduce(operator.add, vals)
                    if first == g
                    else functools.reduce(operator.add, vals, 0.0)
                )
        runs.append(
            _Run(
                al[g],
                reach_l[h - 1],
                starts[g],
                max(ends[g:h]),
                h - g,
                busy,
                colour_us,
                (durs[k], names[k]),
            )
        )
    return runs


def _merge_loop(px: _Pixels, lo: int, hi: int, merge_px: float) -> list[_Run]:
    """`_merge` of bars lo..hi-1, item by item (the open rectangle starts afresh at lo)."""
    al, bl, durs = px.lists()
    bars = px.bars
    starts, ends, colours, names = bars.starts, bars.ends, bars.colours, bars.names
    runs: list[_Run] = []
    r: _Run | None = None
    # The open run's changing fields kept in locals (most items join a run: attribute
    # reads and writes per item cost more than the test), written back when it closes.
    ra = rb = end = busy = longest_us = 0.0
    count = longest_at = 0
    colour_us: dict[str, float] = {}
    for i in range(lo, hi):
        a, b, e, colour, dur = al[i], bl[i], ends[i], colours[i], durs[i]
        if (
            r is not None
            and a - rb < merge_px
            and (colour in colour_us or b - a < merge_px or rb - ra < merge_px)
        ):
            if b > rb:
                rb = b
            if e > end:
                end = e
            count += 1
            busy += dur
            colour_us[colour] = colour_us.get(colour, 0.0) + dur
            if dur > longest_us:
                longest_us, longest_at = dur, i
            continue
        if r is not None:
            r.b, r.end_us, r.count, r.busy_us = rb, end, count, busy
            r.longest = (longest_us, names[longest_at])
        colour_us = {colour: dur}
        r = _Run(a, b, starts[i], e, 1, dur, colour_us, (dur, ""))
        runs.append(r)
        ra, rb, end, count, busy, longest_us, longest_at = a, b, e, 1, dur, dur, i
    if r is not None:
        r.b, r.end_us, r.count, r.busy_us = rb, end, count, busy
        r.longest = (longest_us, names[longest_at])
    return runs


# Names in bar titles are cut here (the Kernels tab lists them in full): templated kernel
# names run to thousands of characters and would crowd the merging budget out.
_TITLE_NAME_CHARS = 160


def _short(name: str) -> str:
    return name if len(name) <= _TITLE_NAME_CHARS else name[: _TITLE_NAME_CHARS - 3] + "..."


def _bar_title(r: _Run, what: str, lo: float) -> str:
    if r.count == 1:
        return f"{_short(r.longest[1])}\n{fmt_us(r.busy_us)} at {fmt_us(r.start_us - lo)}"
    return (
        f"{fmt_num(r.count)} {what}, {fmt_us(r.busy_us)} busy in "
        f"{fmt_us(r.end_us - r.start_us)} from {fmt_us(r.start_us - lo)}\n"
        f"longest: {_short(r.longest[1])} ({fmt_us(r.longest[0])})"
    )


def _gap_title(r: _Run, label: str, lo: float) -> str:
    if r.count == 1:
        return f"{label}: {fmt_us(r.busy_us)} idle at {fmt_us(r.start_us - lo)}"
    return (
        f"{label}: {fmt_num(r.count)} gaps, {fmt_us(r.busy_us)} idle in "
        f"{fmt_us(r.end_us - r.start_us)} from {fmt_us(r.start_us - lo)}"
    )


def _left_margin(lanes: Sequence[tuple[str, str, object]]) -> int:
    """The timeline's left margin (px): room for its lane names, within 90-220."""
    return int(min(220, max(90, 16 + max(svg.text_width(n, 11) for n, _, _ in lanes))))


def _ms_ticks(lo: float, hi: float) -> tuple[plot.Tick, ...]:
    """Ticks every round number of milliseconds from lo (trace microseconds)."""
    return tuple(
        plot.Tick(lo + t * 1e3, svg.tick_label(t))
        for t in svg.nice_ticks(0.0, (hi - lo) / 1e3, target=10)
    )


# Lanes sit at y = 0, 1, ...; the band above them (y from _BAND_TOP to -0.5) names the
# causes of long idle stretches.
_BAND_TOP = -1.35


def timeline_chart(
    timeline: Timeline,
    drawn_lanes: TimelineLanes | None = None,
    step: StepTimeline | int | None = None,
    critical_path: CriticalPath | None = None,
    utilisation: Utilisation | None = None,
) -> plot.Chart:
    """Return one step (or the whole window) as a chart description: CPU threads and GPU
    streams as lanes of bars (kernels coloured by class; `drawn_lanes`, computed for that
    step by analysis/lanes.py, else the busy stretches), idle gaps shaded by cause with the
    cause written over long stretches, a time axis in milliseconds from the start of what is
    drawn, the machine's `utilisation` strip under it (SVG only) and a legend with a swatch
    for every colour drawn. Every bar and gap has a hover tip (name, duration, start); bars
    closer than a pixel are merged (the tip then counts them), and more as needed to keep
    under MAX_TIMELINE_MARKS rectangles and about MAX_TIMELINE_BYTES. A `critical_path` of
    the drawn span is drawn as the top lane."""
    step, lo, hi = timeline.drawn_span(step)
    span = hi - lo
    lanes = _lane_items(timeline, drawn_lanes, lo, hi)
    if (
        critical_path is not None
        and critical_path.segments
        and (critical_path.start_us, critical_path.end_us) == (lo, hi)
    ):
        lanes.insert(0, (PATH_LANE, "path segments", _Bars(*path_lane_columns(critical_path))))
    labels = CATEGORY_LABELS if timeline.on_device else HOST_CATEGORY_LABELS
    left = _left_margin(lanes)
    x_axis = plot.Axis(lo, hi, "time (ms)", ticks=_ms_ticks(lo, hi))
    right = plot.right_edge(_TL_WIDTH, x_axis)
    sx = svg.LinearScale(lo, hi, left, right)
    gaps = [
        (max(g.start_us, lo), min(g.end_us, hi), g.cause, g.cause)
        for g in timeline.gaps
        if g.end_us > lo and g.start_us < hi
    ]
    gaps.sort(key=lambda g: (g[0], g[1]))
    # Pixel spans computed once, each merged at growing distances until the drawing is small.
    lane_px = [_pixels(bars, sx, lo, hi) for _, _, bars in lanes]
    by_cause: dict[str, list[tuple[float, float, str, str]]] = {c: [] for c in CAUSE_COLORS}
    for g in gaps:
        by_cause[g[2]].append(g)
    # Already within [lo, hi]: clipping keeps them.
    gap_px = {c: _pixels(_bars(items), sx, lo, hi) for c, items in by_cause.items()}
    merge_px = 1.0
    while True:
        lane_runs = [_merge(items, merge_px) for items in lane_px]
        gap_runs = {c: _merge(items, merge_px) for c, items in gap_px.items()}
        marks_n = sum(map(len, lane_runs)) + sum(map(len, gap_runs.values()))
        # About 100 bytes of markup and numbers per rectangle, plus its title's name.
        size = 100 * marks_n + sum(
            min(len(r.longest[1]), _TITLE_NAME_CHARS) for runs in lane_runs for r in runs
        )
        if (marks_n <= MAX_TIMELINE_MARKS and size <= MAX_TIMELINE_BYTES) or merge_px > _TL_WIDTH:
            break
        merge_px *= 2
    bottom = len(lanes) - 0.5
    marks: list[plot.Mark] = []
    # Shaded gaps under everything, one group per cause.
    for cause, runs in gap_runs.items():
        if runs:
            marks.append(
                plot.Rects(
                    [r.start_us for r in runs],
                    [r.end_us for r in runs],
                    [_BAND_TOP] * len(runs),
                    [bottom] * len(runs),
                    CAUSE_COLORS[cause],
                    opacity=0.28,
                    tips=[_gap_title(r, labels[cause], lo) for r in runs],
                    cls="gp-gaps",
                    attrs=(("data-cause", cause),),
                )
            )
    # The cause over stretches of one cause wider than 6% of the drawing (tiny ops inside a
    # DataLoader call cut its gap in pieces: pieces closer than 1% of the width join).
    stretches: list[list[Any]] = []
    for a, b, cause, _ in gaps:
        if stretches and stretches[-1][2] == cause and a - stretches[-1][1] <= 0.01 * span:
            stretches[-1][1] = b
        else:
            stretches.append([a, b, cause])
    for a, b, cause in stretches:
        if (b - a) / span >= 0.06:
            marks.append(
                plot.Text(
                    (a + b) / 2,
                    (_BAND_TOP - 0.5) / 2,
                    cause,
                    anchor="middle",
                    colour=CAUSE_COLORS[cause],
                    dy=3.5,
                )
            )
    # Lanes: bars coloured by what ran; the lane's most frequent colour on its group.
    ticks = []
    used_colours: set[str] = set()
    path_colours: set[str] = set()
    for i, ((name, what, bars), runs) in enumerate(zip(lanes, lane_runs, strict=True)):
        busy = sum(map(operator.sub, bars.ends, bars.starts))
        ticks.append(
            plot.Tick(float(i), name, f"{name}: {fmt_num(len(bars))} {what}, {fmt_us(busy)} busy")
        )
        colours = [max(r.colour_us, key=lambda c: (r.colour_us[c], c)) for r in runs]
        (path_colours if name == PATH_LANE else used_colours).update(colours)
        # The bars' pixel spans as merged (a merged bar may be narrower than its time span).
        marks.append(
            plot.Rects(
                [sx.lo + (r.a - sx.p0) / sx.k for r in runs],
                [sx.lo + (r.b - sx.p0) / sx.k for r in runs],
                [i - _BAR_H / _LANE_H / 2] * len(runs),
                [i + _BAR_H / _LANE_H / 2] * len(runs),
                colours or CPU_COLOUR,
                tips=[_bar_title(r, what, lo) for r in runs],
                cls="gp-lane",
                attrs=(("data-lane", name),),
            )
        )
    # Legend: the causes shaded, then what the bars' colours mean.
    legend = [
        plot.LegendEntry(labels[c], CAUSE_COLORS[c], opacity=0.45)
        for c in CAUSE_COLORS
        if gap_runs[c]
    ]
    if CPU_COLOUR in used_colours:
        legend.append(
            plot.LegendEntry(
                "torch op (CPU)" if timeline.on_device else HOST_CATEGORY_LABELS["busy"],
                CPU_COLOUR,
            )
        )
    legend += [
        plot.LegendEntry(KERNEL_LABELS[k], KERNEL_COLORS[k])
        for k in KERNEL_COLORS
        if KERNEL_COLORS[k] in used_colours
    ]
    if BUSY_COLOUR in used_colours and lanes[-1][1] == "busy stretches":
        legend.append(plot.LegendEntry(labels["busy"], BUSY_COLOUR))
    legend += path_legend(path_colours)
    # The machine's utilisation over the same span, under the axis and aligned with it.
    embeds = []
    util = utilisation
    if util is not None and util.ts_us:
        strip, strip_h = utilisation_strip(util, lo, hi, int(right - left))
        embeds.append(plot.Embed(strip, strip_h, "utilisation", "gp-util"))
    title = f"step {step.number}" if step is not None else "whole window"
    return plot.Chart(
        title=f"Timeline of {title}: idle gaps shaded by cause",
        description=f"timeline of {title}: lanes of ops and kernels, idle gaps shaded by cause",
        x=x_axis,
        y=plot.Axis(_BAND_TOP, bottom, ticks=tuple(ticks), grid=False, reverse=True),
        marks=tuple(marks),
        legend=tuple(legend),
        width=_TL_WIDTH,
        plot_height=int(round(_LANE_H * (bottom - _BAND_TOP))),
        left=left,
        embeds=tuple(embeds),
        data=(("data-x-us", f"{lo!r} {hi!r}"),),
    )


def timeline_svg(
    timeline: Timeline,
    lanes: TimelineLanes | None = None,
    step: StepTimeline | int | None = None,
    critical_path: CriticalPath | None = None,
    utilisation: Utilisation | None = None,
) -> str:
    """Return the timeline chart (`timeline_chart`) as an inline SVG string. The root's
    data-x-us attribute gives the drawn span (trace microseconds) and data-plot-box the plot
    area, so tests can check positions."""
    return plot.chart_svg(timeline_chart(timeline, lanes, step, critical_path, utilisation))


def plot_timeline(
    timeline: Timeline,
    lanes: TimelineLanes | None = None,
    step: StepTimeline | int | None = None,
    ax: Any = None,
) -> Any:
    """Return a matplotlib Figure of the timeline chart (`timeline_chart`) of one step (or
    the whole window): CPU threads and GPU streams as lanes (`lanes`, computed for that
    step: report.timeline_lanes for the report's step, else
    gpuprof_nb.analysis.lanes.timeline_lanes(trace, timeline, step)), ops and kernels as
    bars, idle gaps shaded and labelled by cause; x in milliseconds from the start of what
    is drawn. Drawn into `ax` when given."""
    return chart_figure(timeline_chart(timeline, lanes, step), ax)


@report_of.register
def _timeline(timeline: Timeline) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb timeline", [timeline_section(timeline, None)]
