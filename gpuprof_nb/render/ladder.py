"""Sections and plots for the optimisation ladder: summary, rung table, bar chart, batch-size
sweep and settings. Every number goes through render/units so text and HTML agree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_us
from gpuprof_nb.results.ladder import BatchSweep, LadderComparison, LadderReport, RungResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STATUS_COLOURS = {
    "baseline": "#607d8b",
    "kept": "#2e7d32",
    "dropped": "#9e9e9e",
    "no clear change": "#bdbdbd",
    "flagged": "#ef6c00",
    "reference": "#1565c0",
    "trial": "#9e9e9e",
}

RUNG_HEADERS = (
    "rung",
    "status",
    "samples/s",
    "step median",
    "step IQR",
    "peak memory",
    "compile",
    "MFU",
    "loss",
    "loss drift",
    "settings",
    "why",
)
RUNG_NUMERIC = (False, False, True, True, True, True, True, True, True, True, False, False)


def fmt_samples(rate: float | None) -> str:
    """Format samples/s: whole numbers from 100 up, three significant digits below."""
    if not rate:
        return "-"
    return fmt_num(float(round(rate))) if rate >= 100 else fmt_num(rate, 3)


def rung_row(rung: RungResult) -> tuple[str, ...]:
    """Return the formatted cells of one rung (the same strings in text and HTML)."""
    return (
        rung.name,
        rung.status,
        fmt_samples(rung.samples_per_s),
        fmt_us(rung.median_step_us) if rung.measured else "-",
        fmt_us(rung.step_iqr_us) if rung.measured else "-",
        fmt_bytes(rung.peak_memory_bytes) if rung.peak_memory_bytes is not None else "-",
        fmt_us(rung.compile_time_us) if rung.compile_time_us is not None else "-",
        fmt_pct(rung.mfu) if rung.mfu is not None else "-",
        fmt_num(rung.final_loss, 5) if rung.final_loss is not None else "-",
        fmt_pct(rung.loss_drift) if rung.loss_drift is not None else "-",
        rung.settings,
        rung.reason,
    )


_STATUS_LABELS = {"baseline": "baseline (fp32)"}
# Bars in the rung chart (a real ladder has about 15): a file of hundreds of rungs would make
# a chart as tall as hundreds of rows.
MAX_CHART_RUNGS = 40


def rungs_chart(report: LadderReport) -> plot.Chart:
    """Return a horizontal bar chart description of samples/s for every measured rung,
    coloured by status, each bar labelled with its rate, the fp32 baseline marked (at most
    MAX_CHART_RUNGS bars)."""
    measured = [r for r in report.rungs if r.samples_per_s][:MAX_CHART_RUNGS]
    rates = [r.samples_per_s or 0.0 for r in measured]
    top = max(rates, default=1.0) or 1.0
    marks: list[plot.Mark] = [
        plot.Rects(
            [0.0] * len(measured),
            rates,
            [i - 0.35 for i in range(len(measured))],
            [i + 0.35 for i in range(len(measured))],
            [_STATUS_COLOURS.get(r.status, "#9e9e9e") for r in measured],
            tips=[
                f"{r.name} ({r.status}): {fmt_samples(r.samples_per_s)} samples/s" for r in measured
            ],
            min_px=2.0,
        )
    ]
    marks += [
        plot.Text(rate, float(i), fmt_samples(rate), dx=5, dy=3.5) for i, rate in enumerate(rates)
    ]
    legend = [
        plot.LegendEntry(_STATUS_LABELS.get(status, status), colour)
        for status, colour in _STATUS_COLOURS.items()
        if any(r.status == status for r in measured)
    ]
    base = report.baseline.samples_per_s
    if base:
        marks.append(
            plot.Rule("x", base, dash="4 3", tip=f"fp32 baseline: {fmt_samples(base)} samples/s")
        )
        legend.append(plot.LegendEntry("fp32 baseline", plot.INK, "dash"))
    return plot.Chart(
        title="Optimisation ladder",
        description="samples/s per rung",
        x=plot.Axis(
            0.0,
            top * 1.25,
            "samples/s (median step)",
            ticks=plot.linear_ticks(0.0, top * 1.25, 6, fmt_num),
        ),
        y=plot.Axis(
            -0.6,
            len(measured) - 0.4,
            ticks=tuple(
                plot.Tick(float(i), f"{r.name} ({r.status})") for i, r in enumerate(measured)
            ),
            grid=False,
            reverse=True,
        ),
        marks=tuple(marks),
        legend=tuple(legend),
        width=700,
        plot_height=max(24 * len(measured), 24),
    )


def plot_rungs(report: LadderReport, ax: Any = None) -> Figure:
    """Return a matplotlib Figure of the ladder's bar chart (`rungs_chart`): samples/s for
    every measured rung, coloured by status, with the fp32 baseline marked."""
    fig: Figure = chart_figure(rungs_chart(report), ax)
    return fig


def batch_sweep_chart(sweep: BatchSweep) -> plot.Chart:
    """Return samples/s against batch size (log2 axis, every size tried as a tick) as a chart
    description, marking the plateau and the first batch size that ran out of memory."""
    ok = sorted((p for p in sweep.points if p.samples_per_s), key=lambda p: p.batch_size)
    sizes = sorted({p.batch_size for p in sweep.points})
    lo, hi = (min(sizes) / 1.3, max(sizes) * 1.3) if sizes else (1.0, 2.0)
    rates = [p.samples_per_s or 0.0 for p in ok]
    top = max(rates, default=1.0) * 1.15 or 1.0
    marks: list[plot.Mark] = []
    if len(ok) > 1:
        marks.append(plot.Line([p.batch_size for p in ok], rates, colour="#1f77b4", width=1.5))
    marks.append(
        plot.Dots(
            [p.batch_size for p in ok],
            rates,
            [3.5] * len(ok),
            ["#1f77b4"] * len(ok),
            tips=[f"batch {p.batch_size}: {fmt_samples(p.samples_per_s)} samples/s" for p in ok],
            opacity=1.0,
        )
    )
    legend = [plot.LegendEntry("samples/s", "#1f77b4", "dot")]
    plateau, oom = sweep.plateau_batch_size, sweep.oom_batch_size
    if plateau is not None:
        marks.append(
            plot.Rule("x", plateau, colour="#2e7d32", dash="4 3", label=f"plateau from {plateau}")
        )
        legend.append(plot.LegendEntry(f"plateau from {plateau}", "#2e7d32", "dash"))
    if oom is not None:
        marks.append(
            plot.Rule(
                "x", oom, colour="#c62828", dash="2 2", width=1.5, label=f"out of memory at {oom}"
            )
        )
        legend.append(plot.LegendEntry(f"out of memory at {oom}", "#c62828", "dash"))
    return plot.Chart(
        title="Throughput against batch size",
        description="samples/s against batch size",
        x=plot.Axis(
            lo, hi, "batch size", "log2", tuple(plot.Tick(float(b), str(b)) for b in sizes)
        ),
        y=plot.Axis(0.0, top, "samples/s", ticks=plot.linear_ticks(0.0, top, 6, fmt_num)),
        marks=tuple(marks),
        legend=tuple(legend),
        width=600,
        plot_height=240,
    )


def plot_batch_sweep(sweep: BatchSweep, ax: Any = None) -> Figure:
    """Return a matplotlib Figure of samples/s against batch size (`batch_sweep_chart`),
    marking the plateau and the first batch size that ran out of memory."""
    fig: Figure = chart_figure(batch_sweep_chart(sweep), ax)
    return fig


def _summary_section(report: LadderReport) -> Section:
    lines = [report.recommendation]
    if report.three_run is not None:
        three = report.three_run
        lines.append(f"Three-run reading: {three.verdict}")
    lines.extend(f"Note: {n}" for n in report.notes)
    text = "\n".join(lines)
    html = "".join(f"<p>{esc(line)}</p>" for line in text.splitlines())
    return Section("Summary", text, html)


def _three_run_section(report: LadderReport) -> Section | None:
    three = report.three_run
    if three is None:
        return None
    rows = [
        ("fp32", fmt_samples(three.fp32_samples_per_s), "-"),
        (
            f"{three.amp_label} autocast",
            fmt_samples(three.amp_samples_per_s),
            fmt_pct(three.precision_gain) if three.precision_gain is not None else "-",
        ),
        (
            f"{three.amp_label} + compile",
            fmt_samples(three.compile_samples_per_s),
            fmt_pct(three.compile_gain) if three.compile_gain is not None else "-",
        ),
    ]
    headers = ("run", "samples/s", "gain over previous")
    text = (
        text_table(headers, rows, right=(False, True, True))
        + f"\n{three.verdict}\nNext: {three.next_step}"
    )
    html = (
        html_table(headers, rows, numeric=(False, True, True)) + f"<p>{esc(three.verdict)}"
        f"</p><p><b>Next:</b> {esc(three.next_step)}</p>"
    )
    return Section("Three-run reading", text, html)


def _rungs_section(report: LadderReport) -> Section:
    rows = [rung_row(r) for r in report.rungs]
    text = text_table(RUNG_HEADERS, rows, right=RUNG_NUMERIC)
    html = html_table(RUNG_HEADERS, rows, numeric=RUNG_NUMERIC, name_cols=(10, 11))
    for rung in report.rungs:
        if rung.trials:
            trial_rows = [rung_row(t) for t in rung.trials]
            title = f"{rung.name}: every setting tried"
            text += f"\n\n{title}\n" + text_table(RUNG_HEADERS, trial_rows, right=RUNG_NUMERIC)
            html += f"<p><b>{esc(title)}</b></p>" + html_table(
                RUNG_HEADERS, trial_rows, numeric=RUNG_NUMERIC, name_cols=(10, 11)
            )
    foot = (
        f"Step times over {report.steps} optimizer steps after {report.warmup} warm-up "
        f"steps; loss is the fp32 eval loss on the first batch after the last step; peak "
        f"memory is {report.memory_method}."
    )
    return Section("Rungs", text + "\n" + foot, html + note(foot))


def _chart_section(report: LadderReport) -> Section:
    every = [r for r in report.rungs if r.samples_per_s]
    measured = every[:MAX_CHART_RUNGS]
    top = max((r.samples_per_s or 0.0) for r in measured) if measured else 0.0
    width = max((len(r.name) for r in measured), default=4)
    lines = []
    for rung in measured:
        rate = rung.samples_per_s or 0.0
        bar = "#" * (round(30 * rate / top) if top else 0)
        lines.append(f"{rung.name.ljust(width)}  {bar} {fmt_samples(rate)} samples/s")
    text = "\n".join(lines) or "no rung was measured"
    html = svg.plot_html(plot.chart_svg(rungs_chart(report))) if measured else note(text)
    if len(every) > len(measured):
        more = f"the first {len(measured)} measured rungs are charted, of {len(every):,}"
        text += "\n" + more
        html += note(more)
    return Section("Chart", text, html)


def batch_sweep_sections(sweep: BatchSweep) -> tuple[Section, ...]:
    """Return the sweep's table and plot as one section."""
    headers = ("batch size", "status", "samples/s", "step median", "peak memory", "error")
    rows = [
        (
            str(p.batch_size),
            p.status,
            fmt_samples(p.samples_per_s),
            fmt_us(p.median_step_us) if p.step_times_us else "-",
            fmt_bytes(p.peak_memory_bytes) if p.peak_memory_bytes is not None else "-",
            p.error,
        )
        for p in sweep.points
    ]
    numeric = (True, False, True, True, True, False)
    summary = sweep.summary()
    text = f"{summary}\n{text_table(headers, rows, right=numeric)}\nconfiguration: {sweep.settings}"
    html = (
        f"<p>{esc(summary)}</p>"
        + svg.plot_html(plot.chart_svg(batch_sweep_chart(sweep)))
        + html_table(headers, rows, numeric=numeric, name_cols=(5,))
        + note(f"configuration: {sweep.settings}")
    )
    return (Section("Batch sweep", text, html),)


def _settings_section(report: LadderReport) -> Section:
    rows = [
        ("device", report.device_name),
        ("torch", report.torch_version),
        ("batch size", str(report.batch_size)),
        ("steps (timed)", str(report.steps)),
        ("warm-up steps", str(report.warmup)),
        ("seed", str(report.seed)),
        ("loss tolerance", fmt_pct(report.loss_tolerance)),
        ("peak memory", report.memory_method),
        ("created (UTC)", report.created_utc),
    ]
    if report.label:
        rows.insert(0, ("label", report.label))
    headers = ("setting", "value")
    return Section("Settings", text_table(headers, rows), html_table(headers, rows))


def ladder_sections(report: LadderReport) -> tuple[Section, ...]:
    """Return the report's sections: summary, three-run reading, rungs, chart, batch sweep
    (when run) and settings."""
    sections = [_summary_section(report)]
    three = _three_run_section(report)
    if three is not None:
        sections.append(three)
    sections += [_rungs_section(report), _chart_section(report)]
    if report.batch_sweep is not None:
        sections += batch_sweep_sections(report.batch_sweep)
    sections.append(_settings_section(report))
    return tuple(sections)


def comparison_sections(comparison: LadderComparison) -> tuple[Section, ...]:
    """Return one section: each rung's samples/s and peak memory in both reports."""
    this, other = comparison.this_label, comparison.other_label
    headers = (
        "rung",
        f"status ({this})",
        f"status ({other})",
        f"samples/s ({this})",
        f"samples/s ({other})",
        "ratio",
        "verdict",
        f"peak ({this})",
        f"peak ({other})",
    )
    rows = [
        (
            r.name,
            r.this_status,
            r.other_status,
            fmt_samples(r.this_samples_per_s),
            fmt_samples(r.other_samples_per_s),
            f"{fmt_num(r.speed_ratio, 3)}x" if r.speed_ratio else "-",
            r.verdict.kind if r.verdict is not None else "-",
            fmt_bytes(r.this_peak_memory_bytes) if r.this_peak_memory_bytes is not None else "-",
            fmt_bytes(r.other_peak_memory_bytes) if r.other_peak_memory_bytes is not None else "-",
        )
        for r in comparison.rows
    ]
    numeric = (False, False, False, True, True, True, False, True, True)
    speed = (
        f"Combined speed-up over fp32: {fmt_num(comparison.this_speedup, 3)}x ({this}) vs "
        f"{fmt_num(comparison.other_speedup, 3)}x ({other})"
    )
    text = text_table(headers, rows, right=numeric) + "\n" + speed
    html = html_table(headers, rows, numeric=numeric) + f"<p>{esc(speed)}</p>"
    return (Section("Rung by rung", text, html),)


@report_of.register
def _ladder_report(report: LadderReport) -> tuple[str, Sequence[Section]]:
    return "Optimisation ladder", ladder_sections(report)


@report_of.register
def _batch_sweep(sweep: BatchSweep) -> tuple[str, Sequence[Section]]:
    return "Batch-size sweep", batch_sweep_sections(sweep)


@report_of.register
def _comparison(comparison: LadderComparison) -> tuple[str, Sequence[Section]]:
    return "Ladder comparison", comparison_sections(comparison)
