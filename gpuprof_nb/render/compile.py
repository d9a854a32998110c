"""The Compile section: what torch.compile did in the cell (graphs, graph breaks with their
line, reason and fix, recompiles with the guard that failed, compile time per frame) and
the kernels CUDA graphs replayed, charged to the op and module that launched them. Text and
HTML show the same rows."""

from __future__ import annotations

from collections.abc import Sequence

from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_num, fmt_us
from gpuprof_nb.results.compile import CompileReport, GraphReplays

_TAB = "Compile"
MAX_FRAMES = 30


def _table(
    title: str, headers: Sequence[str], rows: list[list[str]], right: Sequence[bool]
) -> tuple[str, str]:
    text = f"{title}\n" + text_table(headers, rows, right=right)
    html = f"<p>{esc(title)}</p>" + html_table(headers, rows, numeric=right, name_cols=(0,))
    return text, html


def compile_section(comp: CompileReport | None, replays: GraphReplays | None) -> Section:
    """Return the Compile section of a report (either part may be None)."""
    text_parts: list[str] = []
    html_parts: list[str] = []
    if comp is not None:
        text_parts, html_parts = _compile_parts(comp)
    if replays is not None:
        t, h = _replays_table(replays)
        text_parts.append(t)
        html_parts.append(h)
    return Section(_TAB, "\n\n".join(text_parts), "".join(html_parts))


def _compile_parts(comp: CompileReport) -> tuple[list[str], list[str]]:
    """Return the text and HTML parts of what torch.compile did: a head line, the graph
    breaks, recompiles and frames compiled in this cell, and the notes."""
    made = (
        f"{fmt_num(comp.graphs)} graph(s) made in this cell, "
        f"{fmt_num(len(comp.breaks))} graph break(s), {fmt_num(len(comp.recompiles))} "
        f"recompile(s), {fmt_us(comp.compile_time_s * 1e6)} compiling; "
        if comp.logged or comp.frames
        else ""
    )
    head = (
        f"torch.compile: {made}{fmt_num(comp.regions)} call(s) of "
        f"{fmt_num(comp.graphs_ran)} compiled graph(s) in the profiled run, "
        f"{fmt_us(comp.between_regions_us)} left uncompiled by graph breaks."
    )
    text_parts = [head]
    html_parts = [f"<p>{esc(head)}</p>"]
    tables: list[tuple[str, str]] = []
    if comp.breaks:
        rows = [[b.where, b.source, b.reason, fmt_num(b.count), b.fix] for b in comp.breaks]
        tables.append(
            _table(
                "Graph breaks:",
                ("where", "line", "reason", "compiles", "fix"),
                rows,
                (False, False, False, True, False),
            )
        )
    if comp.recompiles:
        rows = [
            [r.compile_id, r.function, r.where, "; ".join(r.reasons), r.fix]
            for r in comp.recompiles
        ]
        tables.append(
            _table(
                "Recompiles (the guard that failed):",
                ("compile", "function", "where", "failed guard", "fix"),
                rows,
                (False,) * 5,
            )
        )
    frames = [f for f in comp.frames if not f.earlier][:MAX_FRAMES]
    if frames:
        rows = [
            [
                f.compile_id,
                f.function,
                f.where,
                fmt_us(f.compile_time_s * 1e6) if f.compile_time_s is not None else "",
                fmt_num(f.graph_ops) if f.graph_ops is not None else "",
            ]
            for f in frames
        ]
        tables.append(
            _table(
                "Frames compiled in this cell:",
                ("compile", "function", "where", "compile time", "graph ops"),
                rows,
                (False, False, False, True, True),
            )
        )
    for t, h in tables:
        text_parts.append(t)
        html_parts.append(h)
    for x in comp.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return text_parts, html_parts


def _replays_table(replays: GraphReplays) -> tuple[str, str]:
    """Return the text and HTML table of the kernels CUDA graphs replayed, by launcher."""
    head = (
        f"CUDA graphs: {fmt_num(replays.launches)} launch(es) replayed "
        f"{fmt_num(replays.kernels)} kernels, {fmt_us(replays.device_us)} of device time; "
        f"{fmt_us(replays.outside_ops_us)} of it launched outside every torch op."
    )
    rows = [
        [
            r.launched_from,
            r.module or "",
            fmt_num(r.launches),
            fmt_num(r.kernels),
            fmt_us(r.device_us),
        ]
        for r in replays.rows
    ]
    return _table(
        head,
        ("launched from", "module", "launches", "kernels", "device time"),
        rows,
        (False, False, True, True, True),
    )


@report_of.register
def _compile(comp: CompileReport) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb torch.compile", [compile_section(comp, None)]


@report_of.register
def _replays(replays: GraphReplays) -> tuple[str, Sequence[Section]]:
    return "gpuprof_nb CUDA graphs", [compile_section(None, replays)]
