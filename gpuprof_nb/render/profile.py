"""Summary, Top ops and Kernels sections of a profile report (text and HTML with the same
numbers, every one formatted through render/units)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuprof_nb.model.timing import NOISY_RATIO, TimingStats
from gpuprof_nb.render.annotations import annotations_section
from gpuprof_nb.render.bundle import report_of, tabbed_html, text_of, widget_of
from gpuprof_nb.render.compile import compile_section
from gpuprof_nb.render.diagnosis import diagnosis_section
from gpuprof_nb.render.hotspots import hotspots_section
from gpuprof_nb.render.html import TEXT_CELL, esc, html_table, note, scroll_box
from gpuprof_nb.render.launchers import launcher_parts
from gpuprof_nb.render.mfu import mfu_notes, mfu_pairs
from gpuprof_nb.render.modules import modules_section
from gpuprof_nb.render.roofline import roofline_section
from gpuprof_nb.render.sections import Section, report_text
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.timeline import timeline_section
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.results.tables import KernelTable, OpTable

TITLE = "gpuprof_nb profile"

# Numbers with their unit ("98.7 us") must not break across lines in narrow table columns.
_TABLE_STYLE = "<style>.gpuprof td.num { white-space: nowrap; }</style>"

# A run is flagged noisy when its slowest run took this many times the fastest (see
# TimingStats.noisy); repeated here only for the wording of the warning.


def guarded_section(title: str, build: Callable[[], Section]) -> Section:
    """Return build()'s Section; if building it fails, a Section that says so (with the
    error) so one broken analysis does not hide the rest of the report."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - shown to the user, not swallowed
        text = f"could not render this section: {type(exc).__name__}: {exc}"
        return Section(title, text, note(text))


def _pairs_section(title: str, pairs: Sequence[tuple[str, str]], notes: Sequence[str]) -> Section:
    """Return a Section of label/value rows followed by notes, identical in text and HTML."""
    return Section(title, _pairs_text(pairs, notes), _pairs_html(pairs, notes))


def _pairs_text(pairs: Sequence[tuple[str, str]], notes: Sequence[str]) -> str:
    """Label/value rows (labels padded, as text_table shows them without a header), then
    notes. Built in one pass: every `%%gpuprofile --timing-only` cell prints this, and its
    cost is part of the overhead users pay per cell (issue 7)."""
    width = max((len(label) for label, _ in pairs), default=0)
    text = "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in pairs)
    lines = [text] if text else []
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def _pairs_html(pairs: Sequence[tuple[str, str]], notes: Sequence[str]) -> str:
    """The same rows as a header-less html_table, then the notes."""
    rows = "".join(
        f"<tr><td{TEXT_CELL}>{esc(label)}</td><td{TEXT_CELL}>{esc(value)}</td></tr>"
        for label, value in pairs
    )
    html = scroll_box(f"<table><tbody>{rows}</tbody></table>") if pairs else ""
    return html + "".join(note(f"note: {n}") for n in notes)


def summary_pairs(report: ProfileReport) -> list[tuple[str, str]]:
    """Return the summary as (label, formatted value) rows."""
    pairs: list[tuple[str, str]] = []
    timing = report.timing
    summary = report.summary
    trace = report.trace
    pairs.append(("device", _device_label(report)))
    if report.mfu is not None and report.mfu.on_device:  # a GPU run leads with its MFU
        pairs.extend(mfu_pairs(report.mfu))
    if timing is not None:
        measured = "CUDA events" if timing.device_us else "wall clock"
        if timing.number > 1:
            runs = (
                f"{fmt_num(timing.runs)} timed samples of {fmt_num(timing.number)} "
                f"back-to-back runs ({measured}; times are per run)"
            )
        else:
            runs = f"{fmt_num(timing.runs)} timed ({measured})"
        if timing.warmup_wall_us:
            runs += f", {fmt_num(len(timing.warmup_wall_us))} warm-up not measured"
        if timing.once:
            runs += ", single run (--once)"
        pairs.append(("runs", runs))
        pairs.append(("median per run", fmt_us(timing.median_us)))
        pairs.append(("IQR per run", fmt_us(timing.iqr_us)))
        pairs.append(("min / max per run", f"{fmt_us(timing.min_us)} / {fmt_us(timing.max_us)}"))
        if timing.device_us:
            pairs.append(("median wall per run", fmt_us(statistics.median(timing.wall_us))))
        if timing.warmup_wall_us:
            pairs.append(("first warm-up run", _first_run_words(timing)))
        if timing.steps_per_run:
            pairs.append(("steps per run", fmt_num(timing.steps_per_run)))
            pairs.append(("median per step", fmt_us(timing.median_step_us)))
            pairs.append(("IQR per step", fmt_us(timing.iqr_us / timing.steps_per_run)))
    if summary is not None:
        steps = summary.step_count
        if steps:
            pairs.append(("profiled steps", fmt_num(steps)))
        if summary.median_step_us is not None:
            pairs.append(("median profiled step", fmt_us(summary.median_step_us)))
        pairs.append(("profiled window", fmt_us(summary.window_us)))
        if trace is not None and trace.kernels:
            pairs.append(
                (
                    "GPU busy",
                    f"{fmt_pct(summary.busy_fraction)} ({fmt_us(summary.busy_us)} of the window)",
                )
            )
        elif summary.unrecorded_launches:
            pairs.append(
                (
                    "GPU busy",
                    f"not judged: {fmt_num(summary.unrecorded_launches)} "
                    "calls queued GPU work, but no kernel events were "
                    "recorded",
                )
            )
        else:
            pairs.append(("GPU busy", "n/a (no device activity recorded)"))
        if summary.ops_per_step is not None:
            pairs.append(("ops per step", fmt_num(summary.ops_per_step)))
            pairs.append(("kernels per step", fmt_num(summary.kernels_per_step)))
        else:
            pairs.append(("ops", fmt_num(summary.op_count)))
            pairs.append(("kernels", fmt_num(summary.kernel_count)))
    if report.mfu is not None and not report.mfu.on_device:
        pairs.extend(mfu_pairs(report.mfu))
    return pairs


def _first_run_words(timing: TimingStats) -> str:
    """The first (warm-up) run's time and how it compares: its one-off cost is reported
    here, apart from the steady-state numbers above it."""
    first = timing.warmup_wall_us[0]
    wall_median = statistics.median(timing.wall_us) if timing.wall_us else 0.0
    if wall_median <= 0:
        return fmt_us(first)
    return (
        f"{fmt_us(first)} ({fmt_num(first / wall_median)}x the median wall time; "
        "a one-off, left out of the numbers above)"
    )


def _device_label(report: ProfileReport) -> str:
    if report.timing is not None and report.timing.device_name:
        return str(report.timing.device_name)
    trace = report.trace
    if report.summary is not None and report.summary.device_names:
        return ", ".join(report.summary.device_names)
    if trace is not None and not trace.kernels:
        return "cpu (no device activity in the trace)"
    return "unknown (the trace names no device)"


def summary_notes(report: ProfileReport) -> list[str]:
    """Return the summary's warnings and caveats, most important first."""
    notes = []
    timing = report.timing
    if timing is not None and timing.noisy:
        ratio = timing.max_us / timing.min_us
        notes.append(
            f"noisy runs: the slowest took {fmt_num(ratio)}x the fastest (over "
            f"{fmt_num(NOISY_RATIO)}x); close other work or raise --repeat"
        )
    notes.extend(report.notes)
    if report.mfu is not None:
        notes.extend(mfu_notes(report.mfu))
    return notes


def summary_section(report: ProfileReport) -> Section:
    """Return the Summary section: device, runs, median/IQR/min/max per run and per step,
    GPU busy % over the profiled window, ops and kernels per step, and the report's notes."""
    return _pairs_section("Summary", summary_pairs(report), summary_notes(report))


def summary_text(report: ProfileReport) -> str:
    """Return the Summary section's text alone (what `--timing-only` prints)."""
    return _pairs_text(summary_pairs(report), summary_notes(report))


OP_HEADERS = (
    "name",
    "calls",
    "self CPU",
    "total CPU",
    "self device",
    "total device",
    "% of total",
    "input shapes",
)
OP_NUMERIC = (False, True, True, True, True, True, True, False)
# Columns kept when the trace has no device time (CPU-only): device columns would be all zero.
_CPU_COLUMNS = (0, 1, 2, 3, 6, 7)


def _op_columns(table: OpTable) -> tuple[int, ...]:
    return tuple(range(len(OP_HEADERS))) if table.has_device_time else _CPU_COLUMNS


def op_rows(table: OpTable) -> list[tuple[str, ...]]:
    """Return the ops table as formatted rows (the same strings for text and HTML); the
    device columns are left out when the trace has no device time."""
    cols = _op_columns(table)
    rows = []
    for r in table.rows:
        shapes = "; ".join(r.input_shapes)
        cells = (
            r.name,
            fmt_num(r.calls),
            fmt_us(r.self_cpu_us),
            fmt_us(r.total_cpu_us),
            fmt_us(r.self_device_us),
            fmt_us(r.total_device_us),
            fmt_pct(r.fraction),
            shapes,
        )
        rows.append(tuple(cells[i] for i in cols))
    return rows


def ops_section(table: OpTable) -> Section:
    """Return the Top ops section: one row per op name in the table's order (its sort key,
    descending); names and shapes in full (wrapped in HTML, never truncated)."""
    rows = op_rows(table)
    if not rows:
        text = "No torch ops in this trace."
        launched_text, launched_html = launcher_parts(table)
        if launched_text:
            return Section("Top ops", f"{text}\n\n{launched_text}", note(text) + launched_html)
        return Section("Top ops", text, note(text))
    cols = _op_columns(table)
    headers = [OP_HEADERS[i] for i in cols]
    numeric = [OP_NUMERIC[i] for i in cols]
    caption = (
        f"{fmt_num(len(rows))} of {fmt_num(table.distinct_ops)} ops, sorted by {table.sort_key}; "
        f"% of total = share of {table.fraction_of}"
    )
    if not table.has_device_time:
        caption += "; no device time in this trace, so device columns are left out"
    elif table.unattributed_device_us > 0:
        caption += (
            f"; {fmt_us(table.unattributed_device_us)} of device time was launched "
            "outside any torch op (not in these rows"
            + ("; by runtime call below)" if table.launchers else ")")
        )
    if table.sort_key.startswith("total_"):
        caption += "; nested ops are in their parents' totals too, so shares can pass 100%"
    shape_col = len(headers) - 1
    text = f"{caption}\n" + text_table(headers, rows, right=numeric)
    html = (
        _TABLE_STYLE
        + note(caption)
        + html_table(headers, rows, numeric=numeric, name_cols=(0, shape_col))
    )
    launched_text, launched_html = launcher_parts(table)
    if launched_text:
        text += f"\n\n{launched_text}"
        html += launched_html
    return Section("Top ops", text, html)


KERNEL_HEADERS = (
    "name",
    "kind",
    "calls",
    "total",
    "mean",
    "max",
    "streams",
    "% of device time",
    "bytes",
    "achieved",
)
KERNEL_NUMERIC = (False, False, True, True, True, True, False, True, True, True)


def kernel_rows(table: KernelTable) -> list[tuple[str, ...]]:
    """Return the kernels table as formatted rows (the same strings for text and HTML);
    bytes and bandwidth only where the trace gives them (memcpy/memset)."""
    rows: list[tuple[str, ...]] = []
    for r in table.rows:
        gbps = r.achieved_gbps
        rows.append(
            (
                r.name,
                r.kind,
                fmt_num(r.calls),
                fmt_us(r.total_us),
                fmt_us(r.mean_us),
                fmt_us(r.max_us),
                ", ".join(str(s) for s in r.streams),
                fmt_pct(r.fraction),
                fmt_bytes(r.total_bytes) if r.total_bytes is not None else "",
                fmt_rate(gbps * 1e9, "B/s") if gbps is not None else "",
            )
        )
    return rows


def kernels_section(table: KernelTable) -> Section:
    """Return the Kernels section: kernels, memcpys and memsets by total time, with bytes
    and achieved bandwidth for copies and sets where the trace gives them. Text has the full
    kernel names; HTML a short form with the full name on hover and under a click."""
    rows = kernel_rows(table)
    if not rows:
        text = (
            "No kernels, copies or memsets in this trace (a CPU-only run?)."
            if not table.unrecorded_launches
            else f"No kernel events, though {fmt_num(table.unrecorded_launches)} calls queued "
            "GPU work: the device ran, but its activity was not recorded (CUPTI "
            "range-profiler mode, or a profile without ProfilerActivity.CUDA). Profile "
            "again with ProfilerActivity.CUDA (or %%gpuprofile) to see kernels."
        )
        return Section("Kernels", text, note(text))
    caption = (
        f"{fmt_num(table.calls)} device activities, {fmt_us(table.total_us)} in all: kernels "
        f"{fmt_us(table.kernel_us)}, memcpy {fmt_us(table.memcpy_us)}, "
        f"memset {fmt_us(table.memset_us)}"
    )
    text = f"{caption}\n" + text_table(KERNEL_HEADERS, rows, right=KERNEL_NUMERIC)
    html = (
        _TABLE_STYLE
        + note(caption)
        + html_table(KERNEL_HEADERS, rows, numeric=KERNEL_NUMERIC, name_cols=(0,), short_cols=(0,))
    )
    return Section("Kernels", text, html)


def _section_builders(report: ProfileReport) -> list[tuple[str, Callable[[], Section]]]:
    """Return (title, build) for every section the report shows, in display order: Diagnosis,
    Summary, Top ops, Kernels, Timeline, Hotspots, Annotations, Roofline (those with nothing
    to show left out)."""
    wanted: list[tuple[str, Callable[[], Section]]] = []
    diagnosis, ops, kernels = report.diagnosis, report.ops, report.kernels
    timeline, trace, roofline = report.timeline, report.trace, report.roofline
    hotspots = report.hotspots
    if diagnosis is not None:
        wanted.append(("Diagnosis", lambda: diagnosis_section(diagnosis)))
    wanted.append(("Summary", lambda: summary_section(report)))
    if ops is not None:
        wanted.append(("Top ops", lambda: ops_section(ops)))
    if kernels is not None:
        wanted.append(("Kernels", lambda: kernels_section(kernels)))
    if report.modules is not None and report.modules.rows:
        wanted.append(("Modules", lambda: modules_section(report.modules)))  # type: ignore[arg-type]
    if report.compile is not None or report.graph_replays is not None:
        wanted.append(("Compile", lambda: compile_section(report.compile, report.graph_replays)))
    if timeline is not None and trace is not None:
        path = report.critical_path
        lanes = report.timeline_lanes
        wanted.append(
            ("Timeline", lambda: timeline_section(timeline, trace, hotspots, path, lanes))
        )
    if hotspots is not None:
        wanted.append(("Hotspots", lambda: hotspots_section(hotspots)))
    annotations = report.annotations
    if annotations is not None and annotations.rows:
        wanted.append(("Annotations", lambda: annotations_section(annotations)))
    if roofline is not None:
        wanted.append(("Roofline", lambda: roofline_section(roofline)))
    return wanted


def profile_sections(report: ProfileReport) -> list[Section]:
    """Return the report's Sections in display order (a section that fails to build says
    so in its place, see guarded_section)."""
    return [guarded_section(title, build) for title, build in _section_builders(report)]


@report_of.register
def _profile_report(report: ProfileReport) -> tuple[str, Sequence[Section]]:
    return TITLE, profile_sections(report)


@text_of.register
def _profile_text(report: ProfileReport) -> str:
    if [title for title, _ in _section_builders(report)] == ["Summary"]:
        # Timing only: the Summary is the one section, and its HTML is not needed.
        return report_text(TITLE, [Section("Summary", summary_text(report), "")])
    return report_text(TITLE, profile_sections(report))


@report_of.register
def _op_table(table: OpTable) -> tuple[str, Sequence[Section]]:
    return "Top ops", [ops_section(table)]


@report_of.register
def _kernel_table(table: KernelTable) -> tuple[str, Sequence[Section]]:
    return "Kernels", [kernels_section(table)]


__all__ = [
    "TITLE",
    "guarded_section",
    "kernels_section",
    "ops_section",
    "profile_sections",
    "summary_section",
    "summary_text",
]


# The report's top-ops table ordered by another sort key.
Resort = Callable[[str], OpTable]

# The canonical top_ops sort keys, as the live widget's dropdown offers them.
SORT_CHOICES: tuple[tuple[str, str], ...] = (
    ("self device time", "self_device_us"),
    ("total device time", "total_device_us"),
    ("self CPU time", "self_cpu_us"),
    ("total CPU time", "total_cpu_us"),
    ("calls", "calls"),
)


def perfetto_button(report: ProfileReport) -> Any:
    """Return a button that saves the report's trace next to the notebook (the working
    directory) for Perfetto's UI, and a line under it saying where and how to open it."""
    import datetime

    import ipywidgets as widgets

    from gpuprof_nb.errors import GpuprofError
    from gpuprof_nb.render.timeline import PERFETTO_URL

    button = widgets.Button(
        description="Save the trace for Perfetto",
        tooltip="Writes the whole trace (.json.gz) to the working directory",
        layout=widgets.Layout(width="auto"),
    )
    status = widgets.HTML()

    def save(_: Any) -> None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        try:
            written = report.save(Path.cwd() / f"gpuprof-trace-{stamp}.json.gz")
        except (GpuprofError, OSError) as exc:
            status.value = note(f"Could not save the trace: {exc}")
            return
        status.value = (
            f"<p>Saved <code>{esc(written)}</code>. Open "
            f'<a href="{PERFETTO_URL}" target="_blank" rel="noopener">Perfetto&#x27;s UI</a> '
            "and drag the file onto it: it is read in your browser, nothing is uploaded.</p>"
        )

    button.on_click(save)
    return widgets.VBox([button, status])


@widget_of.register
def profile_widget(report: ProfileReport, resort: Resort | None = None) -> Any:
    """Return an ipywidgets VBox of the report's tabs where Timeline has a button that saves
    the trace for Perfetto and, with `resort` (what the table is in another order: the
    session computes it from the trace, session/analyze.py), Top ops a "sort by" dropdown
    (ipywidgets is imported here, lazily)."""
    import ipywidgets as widgets

    from gpuprof_nb.render.widgets import report_widget, widget_html

    sections = profile_sections(report)
    box = report_widget(TITLE, sections, tabbed_html(TITLE, sections))
    titles = [s.title for s in sections]
    trace = report.trace
    tab = box.children[1]
    if trace is not None and "Timeline" in titles:
        index = titles.index("Timeline")
        children = list(tab.children)
        children[index] = widgets.VBox([perfetto_button(report), children[index]])
        tab.children = tuple(children)
        tab.titles = tuple(titles)
    if report.ops is None or resort is None or "Top ops" not in titles:
        return box
    index = titles.index("Top ops")
    table_html = tab.children[index]
    choice = widgets.Dropdown(
        options=SORT_CHOICES, value=report.ops.sort_key, description="sort by"
    )

    def sort_by(change: dict[str, Any]) -> None:
        table_html.value = widget_html(ops_section(resort(change["new"])).html)

    choice.observe(sort_by, names="value")
    children = list(tab.children)
    children[index] = widgets.VBox([choice, table_html])
    tab.children = tuple(children)
    tab.titles = tuple(titles)
    return box
