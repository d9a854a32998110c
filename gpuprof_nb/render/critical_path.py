"""The critical path in the Timeline tab: what the step's length is made of (by category),
the blocking calls on it, the off-path kernels' slack, the longest segments; and the lane
the timeline drawing gives it. Text and HTML show the same numbers."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import attrgetter
from typing import overload

from gpuprof_nb.render import plot
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.critical_path import CriticalPath, PathSegment

# Bar colours of the path's lane, by segment kind (host work blue like the ops' lanes,
# device work green like kernels, launches and syncs as their idle causes are shaded).
PATH_COLOURS: dict[str, str] = {
    "cpu": "#1f77b4",
    "runtime": "#1f77b4",
    "python": "#9467bd",
    "sync": "#d62728",
    "launch": "#ff7f0e",
    "kernel": "#2ca02c",
    "gpu_gap": "#7f7f7f",
    "stream_wait": "#7f7f7f",
}
PATH_LABELS: dict[str, str] = {
    "#1f77b4": "path: host op or runtime call",
    "#9467bd": "path: Python",
    "#d62728": "path: sync return",
    "#ff7f0e": "path: launch latency",
    "#2ca02c": "path: device activity",
    "#7f7f7f": "path: stream gap or wait",
}
LONGEST = 12
_NAME_CHARS = 80


def _short(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 3] + "..."


class _BarNames(Sequence[str]):
    """The hover names of the path's segments, each made when read: a drawing reads only
    those of the bars it names (the longest of each rectangle)."""

    __slots__ = ("_segments",)

    def __init__(self, segments: Sequence[PathSegment]) -> None:
        self._segments = segments

    def __len__(self) -> int:
        return len(self._segments)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [_bar_name(s) for s in self._segments[i]]
        return _bar_name(self._segments[i])


def lane_columns(
    cp: CriticalPath,
) -> tuple[list[float], list[float], list[str], Sequence[str]]:
    """The path's segments as timeline bars, by column: starts, ends, colours and hover
    names (each name made when read)."""
    segments = cp.segments
    return (
        list(map(attrgetter("start_us"), segments)),
        list(map(attrgetter("end_us"), segments)),
        [PATH_COLOURS[k] for k in map(attrgetter("kind"), segments)],
        _BarNames(segments),
    )


# What each kind of segment is, in a bar's hover name.
_KIND_WORDS: dict[str, str] = {
    "cpu": "host op",
    "runtime": "runtime call",
    "python": "Python",
    "sync": "sync return",
    "launch": "launch latency",
    "kernel": "on the device",
    "gpu_gap": "stream idle",
    "stream_wait": "cross-stream wait",
}


def _bar_name(s: PathSegment) -> str:
    what = _KIND_WORDS[s.kind]
    name = f"{what}: {s.name}" if s.name else what
    return f"{name} ({s.where})"


def _what(cp: CriticalPath) -> str:
    if cp.step_number is not None:
        return f"step {cp.step_number} ({fmt_us(cp.dur_us)})"
    return f"the window ({fmt_us(cp.dur_us)})"


def category_rows(cp: CriticalPath) -> list[tuple[str, str, str]]:
    return [(c, fmt_us(us), fmt_pct(cp.fraction(c))) for c, us in cp.by_category_us]


def segment_rows(cp: CriticalPath, longest: int = LONGEST) -> list[tuple[str, ...]]:
    """The longest segments, in the order they come on the path."""
    # The `longest` smallest (-duration, index) keys: sorted(...)[:longest] without sorting
    # every segment of a long path.
    keys = [(-s.dur_us, i) for i, s in enumerate(cp.segments)]
    top = [i for _, i in heapq.nsmallest(longest, keys)]
    rows: list[tuple[str, ...]] = []
    for i in sorted(top):
        s = cp.segments[i]
        rows.append(
            (
                fmt_us(s.start_us - cp.start_us),
                fmt_us(s.dur_us),
                s.kind,
                _short(s.name) if s.name else "-",
                s.where,
                _short(s.context) if s.context else "",
            )
        )
    return rows


def critical_path_parts(cp: CriticalPath) -> tuple[list[str], list[str]]:
    """Return the text and HTML parts the Timeline tab shows about the path."""
    head = (
        f"Critical path of {_what(cp)}: what its length is made of ({fmt_num(len(cp))} "
        "segments; report.critical_path lists them in order; the drawing's top lane):"
    )
    rows = category_rows(cp)
    right = (False, True, True)
    texts = [f"{head}\n" + text_table(("on the path", "time", "share"), rows, right=right)]
    htmls = [
        f"<p>{esc(head)}</p>" + html_table(("on the path", "time", "share"), rows, numeric=right)
    ]
    waited = [s for s in cp.syncs if s.device_us > 0]
    if waited:
        main = max(waited, key=lambda s: (s.device_us, -s.start_us))
        where = f" in {main.context}" if main.context else ""
        words = (
            f"The host waits for the device {fmt_num(len(waited))} times on the path; "
            f"longest: {main.name}{where}, after {fmt_us(main.device_us)} of device work"
        )
        texts.append(words)
        htmls.append(f"<p>{esc(words)}</p>")
    if cp.off_path_kernels:
        slack = cp.median_slack_us
        words = (
            f"Off the path: {fmt_num(cp.off_path_kernels)} device activities "
            f"({fmt_us(cp.off_path_kernel_us)}), median slack {fmt_us(slack)}"
            + (
                f" ({fmt_pct(cp.slack_fraction)} of the step)"
                if cp.slack_fraction is not None
                else ""
            )
        )
        texts.append(words)
        htmls.append(f"<p>{esc(words)}</p>")
    srows = segment_rows(cp)
    sheaders = ("at", "time", "kind", "what", "where", "inside")
    sright = (True, True, False, False, False, False)
    lead = f"Its {fmt_num(len(srows))} longest segments, in path order (at: from the step's start):"
    texts.append(f"{lead}\n" + text_table(sheaders, srows, right=sright))
    htmls.append(note(lead) + html_table(sheaders, srows, numeric=sright, name_cols=(3, 5)))
    for n in cp.notes:
        texts.append(f"Note: {n}")
        htmls.append(note(f"Note: {n}"))
    return texts, htmls


def path_legend(used: set[str]) -> list[plot.LegendEntry]:
    """Legend entries (label and swatch) for the path colours drawn."""
    return [
        plot.LegendEntry(label, colour) for colour, label in PATH_LABELS.items() if colour in used
    ]


@report_of.register
def _critical_path(cp: CriticalPath) -> tuple[str, Sequence[Section]]:
    texts, htmls = critical_path_parts(cp)
    return "Critical path", [Section("Critical path", "\n\n".join(texts), "".join(htmls))]
