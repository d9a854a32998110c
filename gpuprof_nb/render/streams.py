"""The Timeline tab's per-stream parts: idle time between each stream's kernels by cause,
the launch queue (a table, and a strip per stream over the drawn step as inline SVG) and the
launch delays with the kernels that waited longest. Text and HTML show the same numbers."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render import svg
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.timeline import LaunchDelays, StreamIdle, StreamQueue, Timeline

IDLE_HEADERS = ("stream", "kernels", "busy", "idle", "host wait", "kernel wait", "other")
QUEUE_HEADERS = ("stream", "launches", "max", "mean", "median", "empty")
WAIT_HEADERS = ("kernel", "stream", "waited", "after", "at")
# Names in the longest-waits table are cut here (the Kernels tab lists them in full).
_NAME_CHARS = 90
_STRIP_WIDTH = 900
_ROW_H = 30
QUEUE_COLOUR = "#ff7f0e"


def _short(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 3] + "..."


def idle_rows(streams: Sequence[StreamIdle]) -> list[tuple[str, ...]]:
    """Return one row per stream: kernels, busy and idle time, and each cause's time with
    its share of the stream's idle time."""
    rows = []
    for s in streams:
        causes = tuple(
            f"{fmt_us(us)} ({fmt_pct(s.fraction(c))})" for c, us in s.us_by_cause().items()
        )
        rows.append(
            (str(s.stream), fmt_num(s.activities), fmt_us(s.busy_us), fmt_us(s.idle_us)) + causes
        )
    return rows


def queue_rows(queues: Sequence[StreamQueue]) -> list[tuple[str, ...]]:
    return [
        (
            str(q.stream),
            fmt_num(q.launches),
            fmt_num(q.max_length),
            fmt_num(q.mean_length),
            fmt_num(q.median_length),
            fmt_pct(q.empty_fraction),
        )
        for q in queues
    ]


def wait_rows(delays: LaunchDelays, lo: float) -> list[tuple[str, ...]]:
    return [
        (
            _short(w.name),
            str(w.stream),
            fmt_us(w.delay_us),
            f"{w.launch_name} ({fmt_us(w.launch_dur_us)})",
            fmt_us(w.start_us - lo),
        )
        for w in delays.longest
    ]


def delay_words(delays: LaunchDelays) -> str:
    return (
        f"Launch delay (a launch call's return to its kernel's start), over "
        f"{fmt_num(delays.count)} kernels: median {fmt_us(delays.median_us)}, "
        f"p95 {fmt_us(delays.p95_us)}, max {fmt_us(delays.max_us)}"
    )


def queue_strip_svg(timeline: Timeline) -> str:
    """Return the launch queue of each stream over Timeline.queue_span_us as inline SVG: one
    row per stream, a bar per bin as tall as the longest queue in it (runs of equal bins
    drawn as one bar), and a time axis in milliseconds from the span's start."""
    span = timeline.queue_span_us
    queues = [q for q in timeline.queues if q.strip]
    if span is None or not queues:
        return ""
    lo, hi = span
    label_w = int(
        min(160, max(80, 16 + max(svg.text_width(f"stream {q.stream}", 11) for q in queues)))
    )
    left, right = label_w, _STRIP_WIDTH - 14
    top = 8
    bottom = top + _ROW_H * len(queues)
    sx = svg.LinearScale(lo, max(hi, lo + 1e-3), left, right)
    n = svg.num
    body: list[str] = []
    for i, q in enumerate(queues):
        y0 = top + _ROW_H * i
        peak = max(q.max_length, 1)
        bins = len(q.strip)
        width = (right - left) / bins
        body.append(
            svg.text(
                left - 6,
                y0 + _ROW_H / 2 + 4,
                f"stream {q.stream}",
                anchor="end",
                tip=f"stream {q.stream}: longest queue {q.max_length}",
            )
        )
        body.append(f'<g fill="{QUEUE_COLOUR}">')
        j = 0
        while j < bins:
            k = j
            while k + 1 < bins and q.strip[k + 1] == q.strip[j]:
                k += 1
            v = q.strip[j]
            if v > 0:
                h = (_ROW_H - 6) * v / peak
                body.append(
                    f'<rect x="{n(left + j * width)}" y="{n(y0 + _ROW_H - 3 - h)}" '
                    f'width="{n(max((k - j + 1) * width, 0.6))}" height="{n(h)}">'
                    + svg.title(f"queue {v}")
                    + "</rect>"
                )
            j = k + 1
        body.append("</g>")
        body.append(
            f'<path d="M{left} {n(y0 + _ROW_H - 3)}H{right}" stroke="currentColor" '
            'stroke-opacity="0.3"/>'
        )
    ticks = []
    for t in svg.nice_ticks(0.0, (hi - lo) / 1e3, target=10):
        ticks.append(
            svg.text(sx(lo + t * 1e3), bottom + 14, svg.tick_label(t), size=10, anchor="middle")
        )
    body.extend(ticks)
    body.append(svg.text((left + right) / 2, bottom + 30, "time (ms)", anchor="middle"))
    height = bottom + 36
    head = svg.svg_open(
        _STRIP_WIDTH,
        height,
        "launch queue length per stream over time",
        f' data-x-us="{lo!r} {hi!r}"',
    )
    return head + "".join(body) + "</svg>"


def stream_parts(timeline: Timeline, shown: str) -> tuple[list[str], list[str]]:
    """Return the text and HTML parts on the device's streams (empty off the device):
    `shown` names what the queue strip covers (the step the Timeline draws)."""
    texts: list[str] = []
    htmls: list[str] = []
    if timeline.streams:
        lead = (
            "Idle time between each stream's kernels, by cause (host wait: the next kernel "
            "was launched after the previous one ended; kernel wait: a gap under 30 us "
            "with it launched; other: launched, yet the stream waited):"
        )
        rows = idle_rows(timeline.streams)
        right = (True,) * len(IDLE_HEADERS)
        texts.append(f"{lead}\n" + text_table(IDLE_HEADERS, rows, right=right))
        htmls.append(f"<p>{esc(lead)}</p>" + html_table(IDLE_HEADERS, rows, numeric=right))
    if timeline.queues:
        lead = (
            "Launch queue per stream (kernels launched, not yet started; mean, median and "
            "empty share over time):"
        )
        rows = queue_rows(timeline.queues)
        right = (True,) * len(QUEUE_HEADERS)
        texts.append(f"{lead}\n" + text_table(QUEUE_HEADERS, rows, right=right))
        htmls.append(f"<p>{esc(lead)}</p>" + html_table(QUEUE_HEADERS, rows, numeric=right))
        strip = queue_strip_svg(timeline)
        if strip:
            htmls.append(f"<p>Launch queue over {esc(shown)}:</p>" + svg.plot_html(strip))
            texts.append(f"(the HTML view draws the launch queue over {shown})")
    delays = timeline.launch_delays
    if delays is not None:
        words = delay_words(delays)
        texts.append(words)
        htmls.append(f"<p>{esc(words)}</p>")
        if delays.longest:
            lo = timeline.start_us
            rows = wait_rows(delays, lo)
            right = (False, True, True, False, True)
            lead = "Kernels that waited longest after their launch (at: from the window's start):"
            texts.append(f"{lead}\n" + text_table(WAIT_HEADERS, rows, right=right))
            htmls.append(note(lead) + html_table(WAIT_HEADERS, rows, numeric=right, name_cols=(0,)))
    return texts, htmls
