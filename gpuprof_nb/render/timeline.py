"""The Timeline section: the idle-time breakdown over the window and per step, with a
drawing of one representative step (inline SVG from `timeline_svg`; `plot_timeline` draws
the same with matplotlib, imported inside it, for a Figure)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from gpuprof_nb.analysis.classify import kernel_class
from gpuprof_nb.analysis.timeline import top_level_ops, top_level_ops_within
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.render import svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.hotspots import waiting_lines
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.render.utilisation import utilisation_strip, utilisation_text
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.timeline import IdleBreakdown, StepTimeline, Timeline

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
_MAX_STEP_ROWS = 30


def timeline_section(
    timeline: Timeline, trace: Trace | None, hotspots: Hotspots | None = None
) -> Section:
    """Return the Timeline section: the breakdown over the window and per step, the user
    lines the idle time was charged to (with `hotspots`), and a drawing (SVG) of the
    representative step (lanes from the trace when given)."""
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
    waiting = waiting_lines(hotspots) if hotspots is not None else []
    if waiting:
        lead = (
            "Idle time by the line of yours running on the host"
            if timeline.on_device
            else "Gaps between ops by the line of yours running"
        )
        text_parts.append(f"{lead}:\n" + "\n".join(f"  {w}" for w in waiting))
        html_parts.append(
            f"<p>{esc(lead)}:</p><ul>"
            + "".join(f"<li>{esc_inline(w)}</li>" for w in waiting)
            + "</ul>"
        )
    elif hotspots is None:
        hint = (
            "Which lines of yours left these gaps: profile with %%gpuprofile --stack "
            "(offline: with_stack=True)."
        )
        text_parts.append(hint)
        html_parts.append(note(hint))
    rep = timeline.representative_step
    shown = f"step {rep.number} (median duration)" if rep else "the whole window"
    html_parts.append(
        f"<p>Timeline of {esc(shown)}:</p>" + svg.plot_html(timeline_svg(timeline, trace, step=rep))
    )
    text_parts.append(f"(the HTML view draws {shown})")
    util = trace.utilisation if trace is not None else None
    if util is not None and util.ts_us:
        lo, hi = (rep.start_us, rep.end_us) if rep else (timeline.start_us, timeline.end_us)
        text_parts.append(
            f"utilisation during {shown} (the strip under the drawing):\n"
            + "\n".join(utilisation_text(util, lo, max(hi, lo + 1e-3)))
        )
    if timeline.steps:
        shown_steps = timeline.steps[:_MAX_STEP_ROWS]
        rows_s = _step_rows(shown_steps)
        text_parts.append(
            "per step:\n" + text_table(_STEP_HEADERS, rows_s, right=(True,) * len(_STEP_HEADERS))
        )
        html_parts.append(
            "<p>Per step:</p>"
            + html_table(_STEP_HEADERS, rows_s, numeric=(True,) * len(_STEP_HEADERS))
        )
        if len(timeline.steps) > _MAX_STEP_ROWS:
            more = f"{len(timeline.steps) - _MAX_STEP_ROWS} more steps not shown"
            text_parts.append(more)
            html_parts.append(note(more))
    for x in timeline.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section("Timeline", "\n\n".join(text_parts), "".join(html_parts))


_MAX_CPU_LANES = 4
_MAX_GPU_LANES = 8

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


_start = attrgetter("start_us")


def _lane_items(
    timeline: Timeline, trace: Trace | None, lo: float, hi: float
) -> list[tuple[str, str, list[tuple[float, float, str, str]]]]:
    """Return (lane label, what its bars are, [(start, end, colour, name)] by start) per
    lane, chosen as plot_timeline chooses them: the busiest CPU threads' top-level ops, then
    the device's streams."""
    lanes: list[tuple[str, str, list[tuple[float, float, str, str]]]] = []
    if trace is not None:
        # Only ops overlapping the drawn span are drawn, and an op enclosing one of them
        # overlaps it too: the top-level test on those finds the same ops as on the whole
        # trace, for a fraction of the cost when one step of a long trace is drawn.
        by_thread: dict[str, list[tuple[float, float, str, str]]] = {}
        for o in top_level_ops_within(trace, lo, hi):
            by_thread.setdefault(str(o.tid), []).append(
                (o.start_us, o.start_us + o.dur_us, CPU_COLOUR, o.name)
            )
        busy = {t: sum(e - s for s, e, _, _ in items) for t, items in by_thread.items()}
        for t in sorted(by_thread, key=lambda t: (-busy[t], t))[:_MAX_CPU_LANES]:
            lanes.append((f"CPU thread {t}", "ops", by_thread[t]))
        if timeline.device is not None:
            by_stream: dict[int, list[tuple[float, float, str, str]]] = {}
            device = timeline.device
            for k in trace.kernels[: bisect.bisect_left(trace.kernels, hi, key=_start)]:
                if k.device == device and k.start_us + k.dur_us > lo:
                    by_stream.setdefault(k.stream, []).append(
                        (k.start_us, k.start_us + k.dur_us, KERNEL_COLORS[kernel_class(k)], k.name)
                    )
            for st in sorted(by_stream)[:_MAX_GPU_LANES]:
                lanes.append((f"GPU {device} stream {st}", "kernels", by_stream[st]))
    if not lanes:
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
        lanes.append(("device" if timeline.on_device else "host", "busy stretches", spans))
    for _, _, items in lanes:
        items.sort(key=lambda it: (it[0], it[1]))
    return lanes


def _merge(
    items: Sequence[tuple[float, float, float, float, str, str]], merge_px: float
) -> list[_Run]:
    """Return items (a_px, b_px, start, end, colour, name), sorted by start, as rectangles,
    neighbours less than `merge_px` apart joined; bars of different colours join only where
    one of them is that narrow."""
    runs: list[_Run] = []
    r: _Run | None = None
    for a, b, s, e, colour, name in items:
        dur = e - s
        if (
            r is not None
            and a - r.b < merge_px
            and (colour in r.colour_us or b - a < merge_px or r.b - r.a < merge_px)
        ):
            if b > r.b:
                r.b = b
            if e > r.end_us:
                r.end_us = e
            r.count += 1
            r.busy_us += dur
            r.colour_us[colour] = r.colour_us.get(colour, 0.0) + dur
            if dur > r.longest[0]:
                r.longest = (dur, name)
            continue
        r = _Run(a, b, s, e, 1, dur, {colour: dur}, (dur, name))
        runs.append(r)
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


def _pixels(
    items: Sequence[tuple[float, float, str, str]], sx: svg.LinearScale, lo: float, hi: float
) -> list[tuple[float, float, float, float, str, str]]:
    """Return (a_px, b_px, start, end, colour, name) per item, its span clipped to [lo, hi]
    and scaled by sx (the same arithmetic as sx(max(start, lo)), for all items at once)."""
    if not items:
        return []
    starts = np.array([it[0] for it in items], dtype=float)
    ends = np.array([it[1] for it in items], dtype=float)
    a_px = (sx.p0 + (np.maximum(starts, lo) - sx.lo) * sx.k).tolist()
    b_px = (sx.p0 + (np.minimum(ends, hi) - sx.lo) * sx.k).tolist()
    return [(a, b, s, e, c, name) for a, b, (s, e, c, name) in zip(a_px, b_px, items, strict=True)]


def timeline_svg(
    timeline: Timeline, trace: Trace | None, step: StepTimeline | int | None = None
) -> str:
    """Return one step (or the whole window) as an inline SVG string: CPU threads and GPU
    streams as lanes of bars (kernels coloured by class), idle gaps shaded by cause with the
    cause written over long stretches, a time axis in milliseconds from the start of what is
    drawn, and a legend. Every bar and gap has a hover title (name, duration, start); bars
    closer than a pixel are merged (the title then counts them), and more as needed to keep
    under MAX_TIMELINE_MARKS rectangles. The root's data-x-us attribute gives the drawn span
    (trace microseconds) and data-plot-box the plot area, so tests can check positions."""
    if isinstance(step, int):
        step = next((s for s in timeline.steps if s.number == step), None)
    lo, hi = (
        (step.start_us, step.end_us) if step is not None else (timeline.start_us, timeline.end_us)
    )
    hi = max(hi, lo + 1e-3)
    span = hi - lo
    lanes = _lane_items(timeline, trace, lo, hi)
    labels = CATEGORY_LABELS if timeline.on_device else HOST_CATEGORY_LABELS
    left = int(min(220, max(90, 16 + max(svg.text_width(n, 11) for n, _, _ in lanes))))
    right = _TL_WIDTH - 14
    band_top, lanes_top = 24, 44
    bottom = lanes_top + _LANE_H * len(lanes)
    sx = svg.LinearScale(lo, hi, left, right)
    gaps = [
        (max(g.start_us, lo), min(g.end_us, hi), g.cause, g.cause)
        for g in timeline.gaps
        if g.end_us > lo and g.start_us < hi
    ]
    gaps.sort(key=lambda g: (g[0], g[1]))
    # Pixel spans computed once, each merged at growing distances until the drawing is small.
    lane_px = [_pixels(items, sx, lo, hi) for _, _, items in lanes]
    gap_px: dict[str, list[tuple[float, float, float, float, str, str]]] = {
        c: [] for c in CAUSE_COLORS
    }
    for px in _pixels(gaps, sx, lo, hi):  # already within [lo, hi]: clipping keeps them
        gap_px[px[4]].append(px)
    merge_px = 1.0
    while True:
        lane_runs = [_merge(items, merge_px) for items in lane_px]
        gap_runs = {c: _merge(items, merge_px) for c, items in gap_px.items()}
        marks = sum(map(len, lane_runs)) + sum(map(len, gap_runs.values()))
        # About 100 bytes of markup and numbers per rectangle, plus its title's name.
        size = 100 * marks + sum(
            min(len(r.longest[1]), _TITLE_NAME_CHARS) for runs in lane_runs for r in runs
        )
        if (marks <= MAX_TIMELINE_MARKS and size <= MAX_TIMELINE_BYTES) or merge_px > _TL_WIDTH:
            break
        merge_px *= 2
    n = svg.num
    body: list[str] = []
    title = f"step {step.number}" if step is not None else "whole window"
    body.append(
        svg.text(
            _TL_WIDTH / 2,
            15,
            f"Timeline of {title}: idle gaps shaded by cause",
            size=12,
            anchor="middle",
            extra=' font-weight="600"',
        )
    )
    # Shaded gaps under everything, one group per cause.
    for cause, runs in gap_runs.items():
        if not runs:
            continue
        body.append(f'<g fill="{CAUSE_COLORS[cause]}" fill-opacity="0.28">')
        body.extend(
            f'<rect x="{n(r.a)}" y="{band_top}" width="{n(max(r.b - r.a, 0.6))}" '
            f'height="{bottom - band_top}">'
            + svg.title(_gap_title(r, labels[cause], lo))
            + "</rect>"
            for r in runs
        )
        body.append("</g>")
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
            body.append(
                svg.text(
                    sx((a + b) / 2),
                    band_top + 13,
                    cause,
                    size=10,
                    anchor="middle",
                    fill=CAUSE_COLORS[cause],
                )
            )
    # Time axis: grid lines and labels in ms from the start of what is drawn.
    grid, ticks = [], []
    for t in svg.nice_ticks(0.0, span / 1e3, target=10):
        x = sx(lo + t * 1e3)
        grid.append(f"M{n(x)} {lanes_top}V{bottom}")
        ticks.append(svg.text(x, bottom + 14, svg.tick_label(t), size=10, anchor="middle"))
    body.append(
        f'<path d="{"".join(grid)}" fill="none" stroke="currentColor" stroke-opacity="0.13"/>'
    )
    body.append(
        f'<rect x="{left}" y="{band_top}" width="{right - left}" '
        f'height="{bottom - band_top}" fill="none" stroke="currentColor" '
        'stroke-opacity="0.45"/>'
    )
    body.extend(ticks)
    body.append(svg.text((left + right) / 2, bottom + 30, "time (ms)", anchor="middle"))
    # The machine's utilisation over the same span, under the axis and aligned with it.
    util = trace.utilisation if trace is not None else None
    strip_h = 0
    if util is not None and util.ts_us:
        strip, strip_h = utilisation_strip(util, lo, hi, right - left)
        body.append(svg.text(left - 6, bottom + 50, "utilisation", anchor="end", size=10))
        body.append(f'<g class="gp-util" transform="translate({left},{bottom + 40})">{strip}</g>')
        strip_h += 8
    # Lanes: a label on the left, bars coloured by what ran.
    used_colours: set[str] = set()
    for i, ((name, what, items), runs) in enumerate(zip(lanes, lane_runs, strict=True)):
        y = lanes_top + _LANE_H * i
        busy = sum(e - s for s, e, _, _ in items)
        body.append(
            svg.text(
                left - 6,
                y + _LANE_H / 2 + 4,
                name,
                anchor="end",
                tip=f"{name}: {fmt_num(len(items))} {what}, {fmt_us(busy)} busy",
            )
        )
        colours = [max(r.colour_us, key=lambda c: (r.colour_us[c], c)) for r in runs]
        # The lane's most frequent colour goes on its group; bars repeat only other colours.
        default = max(sorted(set(colours)), key=colours.count) if colours else CPU_COLOUR
        body.append(f'<g class="gp-lane" data-lane="{esc(name)}" fill="{default}">')
        for r, colour in zip(runs, colours, strict=True):
            used_colours.add(colour)
            fill = f' fill="{colour}"' if colour != default else ""
            body.append(
                f'<rect x="{n(r.a)}" y="{y + (_LANE_H - _BAR_H) // 2}" '
                f'width="{n(max(r.b - r.a, 0.6))}" height="{_BAR_H}"{fill}>'
                + svg.title(_bar_title(r, what, lo))
                + "</rect>"
            )
        body.append("</g>")
    # Legend below the axis: the causes shaded and the kernel classes drawn.
    entries = [
        (labels[c], f'<rect width="12" height="12" fill="{CAUSE_COLORS[c]}" fill-opacity="0.45"/>')
        for c in CAUSE_COLORS
        if gap_runs[c]
    ]
    entries += [
        (KERNEL_LABELS[k], f'<rect width="12" height="12" fill="{KERNEL_COLORS[k]}"/>')
        for k in KERNEL_COLORS
        if KERNEL_COLORS[k] in used_colours
    ]
    legend, legend_h = svg.legend_row(entries, left, bottom + 40 + strip_h, right - left, size=10)
    body.append(legend)
    height = int(bottom + 40 + strip_h + legend_h + 4)
    head = svg.svg_open(
        _TL_WIDTH,
        height,
        f"timeline of {title}: lanes of ops and kernels, idle gaps shaded by cause",
        f' data-x-us="{lo!r} {hi!r}" data-plot-box="{left} {band_top} {right} {bottom}"',
    )
    return head + "".join(body) + "</svg>"


def plot_timeline(
    timeline: Timeline, trace: Trace | None, step: StepTimeline | int | None = None, ax: Any = None
) -> Any:
    """Return a matplotlib Figure of one step (or the whole window): CPU threads and GPU
    streams as lanes, ops and kernels as bars, idle gaps shaded and labelled by cause.
    Times on the x axis are milliseconds from the start of what is drawn."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if isinstance(step, int):
        step = next((s for s in timeline.steps if s.number == step), None)
    lo, hi = (
        (step.start_us, step.end_us) if step is not None else (timeline.start_us, timeline.end_us)
    )
    if ax is None:
        fig = Figure(figsize=(10, 3.2))
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    span = max(hi - lo, 1e-9)

    def ms(t: float) -> float:
        return (t - lo) / 1e3

    lanes: list[tuple[str, list[tuple[float, float]], Any]] = []
    if trace is not None:
        ops = [o for o in top_level_ops(trace) if o.end_us > lo and o.start_us < hi]
        by_thread: dict[str, list[tuple[float, float]]] = {}
        for o in ops:
            by_thread.setdefault(str(o.tid), []).append((o.start_us, o.end_us))
        threads = sorted(by_thread, key=lambda t: (-sum(e - s for s, e in by_thread[t]), t))
        for t in threads[:_MAX_CPU_LANES]:
            lanes.append((f"CPU thread {t}", by_thread[t], "#1f77b4"))
        if timeline.device is not None:
            by_stream: dict[int, list[tuple[float, float]]] = {}
            colors: dict[int, list[str]] = {}
            for k in trace.kernels:
                if k.device == timeline.device and k.end_us > lo and k.start_us < hi:
                    by_stream.setdefault(k.stream, []).append((k.start_us, k.end_us))
                    colors.setdefault(k.stream, []).append(KERNEL_COLORS[kernel_class(k)])
            for s in sorted(by_stream)[:_MAX_GPU_LANES]:
                lanes.append((f"GPU {timeline.device} stream {s}", by_stream[s], colors[s]))
    if not lanes:
        # Without the trace, draw busy time as the complement of the gaps.
        busy: list[tuple[float, float]] = []
        cursor = lo
        for g in timeline.gaps:
            if g.end_us <= lo or g.start_us >= hi:
                continue
            if g.start_us > cursor:
                busy.append((cursor, g.start_us))
            cursor = max(cursor, g.end_us)
        if cursor < hi:
            busy.append((cursor, hi))
        lanes.append(("device" if timeline.on_device else "host", busy, "#2ca02c"))
    for i, (_, spans, color) in enumerate(lanes):
        bars = [(ms(max(s, lo)), (min(e, hi) - max(s, lo)) / 1e3) for s, e in spans]
        ax.broken_barh(bars, (i - 0.4, 0.8), facecolors=color)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([name for name, _, _ in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5 - 0.6)
    # One collection per cause (not one patch per gap): a window holds thousands of gaps.
    shaded: dict[str, list[tuple[float, float]]] = {}
    # Labels go on stretches of one cause; tiny ops inside a DataLoader call or a Python
    # stretch cut it into pieces, so pieces closer than 1% of the width join for labelling.
    stretches: list[list[Any]] = []
    for g in timeline.gaps:
        a, b = max(g.start_us, lo), min(g.end_us, hi)
        if b <= a:
            continue
        shaded.setdefault(g.cause, []).append((ms(a), (b - a) / 1e3))
        if stretches and stretches[-1][2] == g.cause and a - stretches[-1][1] <= 0.01 * span:
            stretches[-1][1] = b
        else:
            stretches.append([a, b, g.cause])
    for a, b, cause in stretches:
        if (b - a) / span >= 0.06:
            ax.text(
                ms((a + b) / 2),
                -0.75,
                cause,
                ha="center",
                va="center",
                fontsize=8,
                color=CAUSE_COLORS[cause],
            )
    top = -0.5 - 0.6
    for cause, bars in shaded.items():
        ax.broken_barh(
            bars,
            (top, len(lanes) - 0.5 - top),
            facecolors=CAUSE_COLORS[cause],
            alpha=0.25,
            lw=0,
            zorder=0,
        )
    seen = set(shaded)
    ax.set_xlim(0, span / 1e3)
    ax.set_xlabel("time (ms)")
    title = f"step {step.number}" if step is not None else "whole window"
    ax.set_title(f"Timeline of {title}: idle gaps shaded by cause", fontsize=10)
    labels = CATEGORY_LABELS if timeline.on_device else HOST_CATEGORY_LABELS
    handles = [
        Patch(color=CAUSE_COLORS[c], alpha=0.4, label=labels[c]) for c in CAUSE_COLORS if c in seen
    ]
    used = {c for _, _, col in lanes if isinstance(col, list) for c in col}
    handles += [
        Patch(color=KERNEL_COLORS[k], label=KERNEL_LABELS[k])
        for k in KERNEL_COLORS
        if KERNEL_COLORS[k] in used
    ]
    if handles:
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False
        )
    fig.tight_layout()
    return fig


@report_of.register
def _timeline(timeline: Timeline) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb timeline", [timeline_section(timeline, None)]
