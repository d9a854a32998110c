"""The Hotspots section: which of the user's lines the host's time went to, and which kept the
device waiting (a table), over an icicle chart of host time by frame (inline SVG, hover for
the numbers): the user's frames in blue, each run of library frames under them collapsed into
one grey or orange block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, esc_inline, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.hotspots import FlameNode, Hotspots

KIND_COLOURS = {"user": "#1f77b4", "torch": "#ee7d2b", "library": "#8c8c8c", "stdlib": "#b5b5b5"}
KIND_LABELS = {
    "user": "your code",
    "torch": "torch",
    "library": "other packages",
    "stdlib": "standard library",
}
# Lines shown in the table; icicle rows drawn; text lines of the frame tree.
MAX_ROWS = 15
MAX_DEPTH = 30
MAX_TREE_TEXT = 25
_WIDTH, _ROW_H = 900, 18

_HEADERS = ("line", "source", "host time", "share of host", "idle time", "share of idle")


def idle_words(h: Hotspots) -> str:
    """What the idle time is: the device's, or the gaps between ops on the host."""
    return "device idle time" if h.on_device else "time between ops"


def line_rows(h: Hotspots, n: int = MAX_ROWS) -> list[tuple[str, ...]]:
    """Return the table rows of the top `n` lines."""
    return [
        (
            line.label,
            line.text,
            fmt_us(line.host_us),
            fmt_pct(line.share),
            fmt_us(line.idle_us),
            fmt_pct(line.idle_share),
        )
        for line in h.lines[:n]
    ]


def waiting_lines(h: Hotspots, n: int = 3) -> list[str]:
    """Return sentences naming the lines that held the most idle time, with their share."""
    return [
        f"{line.named}: {fmt_pct(share)} of {idle_words(h)}"
        for line, share in h.top_idle_lines(n=n)
    ]


def hotspots_section(h: Hotspots) -> Section:
    """Return the Hotspots section: a head line, the lines table, the icicle and notes."""
    what = "lines" if h.granularity == "line" else "functions"
    head = (
        f"Host time by Python {what} ({h.source}; {fmt_num(h.samples)} "
        f"{'samples' if h.granularity == 'line' else 'events'}): {fmt_us(h.host_us)} "
        f"of host time, {fmt_us(h.idle_us)} of {idle_words(h)} in it, "
        f"{fmt_pct(h.idle_charged_us / h.idle_us if h.idle_us > 0 else 0.0)} of that "
        "charged to a line of yours."
    )
    text_parts, html_parts = [head], [f"<p>{esc(head)}</p>"]
    waiting = waiting_lines(h)
    if waiting:
        lead = "The device waited most on:" if h.on_device else "The gaps between ops fell in:"
        text_parts.append(lead + "\n" + "\n".join(f"  {w}" for w in waiting))
        html_parts.append(
            f"<p>{esc(lead)}</p><ul>"
            + "".join(f"<li>{esc_inline(w)}</li>" for w in waiting)
            + "</ul>"
        )
    if h.lines:
        rows = line_rows(h)
        right = (False, False, True, True, True, True)
        text_parts.append(text_table(_HEADERS, rows, right=right))
        html_parts.append(html_table(_HEADERS, rows, numeric=right, name_cols=(0, 1)))
        if len(h.lines) > MAX_ROWS:
            more = f"{len(h.lines) - MAX_ROWS} more lines in .hotspots.lines"
            text_parts.append(more)
            html_parts.append(note(more))
    else:
        none = "No time was charged to a line of yours: it all ran in library code."
        text_parts.append(none)
        html_parts.append(note(none))
    if h.nodes:
        html_parts.append(
            "<p>Host time by frame (wider = more time; hover for numbers):</p>"
            + svg.plot_html(icicle_svg(h))
        )
        text_parts.append("host time by frame:\n" + "\n".join(_tree_text(h)))
    for x in h.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section("Hotspots", "\n\n".join(text_parts), "".join(html_parts))


def _node_words(node: FlameNode, whole: float) -> str:
    words = (
        f"{node.label}: {fmt_us(node.total_us)} ({fmt_pct(node.total_us / whole)} of "
        f"host time), own {fmt_us(node.self_us)}"
    )
    if node.kind != "user":
        words += f"; {KIND_LABELS[node.kind]}"
        if node.frames > 1:
            words += f", up to {fmt_num(node.frames)} frames deep"
        if node.detail:
            words += f", mostly in {node.detail}"
    return words


def _children(nodes: Sequence[FlameNode]) -> dict[int, list[int]]:
    """Return {parent index: children indices, most time first} (-1: the roots)."""
    children: dict[int, list[int]] = {}
    for k, node in enumerate(nodes):
        children.setdefault(node.parent, []).append(k)
    for kids in children.values():
        kids.sort(key=lambda k: (-nodes[k].total_us, k))
    return children


def _depth_first(nodes: Sequence[FlameNode]) -> list[int]:
    """Return the node indices parent first, each node's children after it, most time
    first."""
    children = _children(nodes)
    out: list[int] = []
    todo = list(reversed(children.get(-1, [])))
    while todo:
        k = todo.pop()
        out.append(k)
        todo.extend(reversed(children.get(k, [])))
    return out


def _tree_text(h: Hotspots) -> list[str]:
    whole = h.host_us or 1.0
    shown = [k for k in _depth_first(h.nodes) if h.nodes[k].total_us >= 0.01 * whole]
    out = ["  " * h.nodes[k].depth + _node_words(h.nodes[k], whole) for k in shown[:MAX_TREE_TEXT]]
    if len(shown) > MAX_TREE_TEXT:
        out.append(f"... {len(shown) - MAX_TREE_TEXT} more frames of 1% or more (in the HTML view)")
    return out


def _layout(nodes: Sequence[FlameNode]) -> list[tuple[float, float]]:
    """Return each node's [x0, x1) as fractions of the host time: roots side by side, most
    time first, each node's children from its left edge, most time first."""
    children = _children(nodes)
    whole = sum(nodes[k].total_us for k in children.get(-1, ())) or 1.0
    pos: list[tuple[float, float]] = [(0.0, 0.0)] * len(nodes)
    todo = [(-1, 0.0)]
    while todo:
        parent, x = todo.pop()
        for k in children.get(parent, ()):
            w = nodes[k].total_us / whole
            pos[k] = (x, x + w)
            todo.append((k, x))
            x += w
    return pos


def icicle_chart(h: Hotspots) -> plot.Chart:
    """Return the icicle chart description: one row per call depth, roots on top, each block
    as wide as its share of the host time (blocks under half a pixel left out), labelled
    where the label fits, with a hover tip of its numbers. data-blocks counts the blocks."""
    nodes = h.nodes
    pos = _layout(nodes)
    whole = h.host_us or 1.0
    depth = min(max((nd.depth for nd in nodes), default=0) + 1, MAX_DEPTH)
    width_px = _WIDTH - 4 - plot.RIGHT
    gap = 0.5 / width_px  # half a pixel between neighbours
    shown = [
        (nd, x0, x1)
        for nd, (x0, x1) in zip(nodes, pos, strict=True)
        if nd.depth < MAX_DEPTH and (x1 - x0) * width_px >= 0.5
    ]
    marks = (
        plot.Rects(
            [x0 for _, x0, _ in shown],
            [max(x1 - gap, x0 + gap) for _, x0, x1 in shown],
            [float(nd.depth) for nd, _, _ in shown],
            [nd.depth + (_ROW_H - 2) / _ROW_H for nd, _, _ in shown],
            [KIND_COLOURS[nd.kind] for nd, _, _ in shown],
            opacity=0.8,
            tips=[_node_words(nd, whole) for nd, _, _ in shown],
            labels=[nd.label for nd, _, _ in shown],
            item_cls="gp-frame",
            item_attrs=[(("data-kind", nd.kind),) for nd, _, _ in shown],
        ),
    )
    return plot.Chart(
        title="Host time by frame: your lines in blue, library code collapsed",
        description="icicle chart of host time by Python frame",
        x=plot.Axis(0.0, 1.0, hidden=True),
        y=plot.Axis(0.0, float(depth), hidden=True, reverse=True),
        marks=marks,
        legend=tuple(
            plot.LegendEntry(KIND_LABELS[k], c)
            for k, c in KIND_COLOURS.items()
            if any(nd.kind == k for nd in nodes)
        ),
        width=_WIDTH,
        plot_height=depth * _ROW_H,
        frame=False,
        data=(("data-blocks", str(len(shown))),),
    )


def icicle_svg(h: Hotspots) -> str:
    """Return the icicle chart (`icicle_chart`) as inline SVG."""
    return plot.chart_svg(icicle_chart(h))


def plot_icicle(h: Hotspots, ax: Any = None) -> Any:
    """Return a matplotlib Figure of the icicle chart (`icicle_chart`), drawn into `ax`
    when given."""
    return chart_figure(icicle_chart(h), ax)


@report_of.register
def _hotspots(h: Hotspots) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb hotspots", [hotspots_section(h)]
