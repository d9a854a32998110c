"""The sections of a distributed run's report: Diagnosis, Ranks (the table and a rank x step
heatmap of compute), Collectives and Summary; text and HTML with the same numbers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof_nb.render import plot, svg
from gpuprof_nb.render.bundle import report_of
from gpuprof_nb.render.diagnosis import diagnosis_section
from gpuprof_nb.render.html import esc, html_table, note
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us
from gpuprof_nb.results.distributed import RankRow, RunReport

# Idle categories shown as columns of the rank table (busy has its own column).
IDLE_COLUMNS = (
    ("dataloader", "DataLoader"),
    ("sync", "sync"),
    ("launch", "launch gaps"),
    ("host", "host"),
    ("other", "other idle"),
)
# Heatmap cells: the colour runs from LOW (least compute in a step) to HIGH (most).
HEAT_LOW = (0xE3, 0xF2, 0xFD)
HEAT_HIGH = (0xC6, 0x28, 0x28)
MAX_HEATMAP_STEPS = 200


def _idle_of(row: RankRow) -> dict[str, float]:
    return dict(row.idle_us)


def rank_table(
    report: RunReport,
) -> tuple[tuple[str, ...], list[tuple[str, ...]], tuple[bool, ...]]:
    """The Ranks table: headers, formatted rows (the same strings for text and HTML) and
    which columns are numbers. Idle categories appear where some rank has any."""
    idle = [
        (key, label)
        for key, label in IDLE_COLUMNS
        if any(_idle_of(r).get(key, 0.0) > 0 for r in report.ranks)
    ]
    straggler = set(report.stragglers)
    headers = (
        "rank",
        "device",
        "steps",
        "step median",
        "busy",
        "compute",
        "compute/step",
        "comm",
        "exposed comm",
        "wait",
        *(label for _, label in idle),
    )
    rows = [
        (
            f"{r.rank}{' (straggler)' if r.rank in straggler else ''}",
            r.device,
            fmt_num(r.steps),
            fmt_us(r.median_step_us),
            fmt_us(r.busy_us),
            fmt_us(r.compute_us),
            fmt_us(r.compute_per_step_us),
            fmt_us(r.comm_us),
            fmt_us(r.exposed_comm_us),
            fmt_us(r.wait_us),
            *(fmt_us(_idle_of(r).get(key, 0.0)) for key, _ in idle),
        )
        for r in report.ranks
    ]
    numeric = (False, False, *([True] * (len(headers) - 2)))
    return headers, rows, numeric


def _heat(fraction: float) -> str:
    f = min(max(fraction, 0.0), 1.0)
    return "#" + "".join(
        f"{round(a + (b - a) * f):02x}" for a, b in zip(HEAT_LOW, HEAT_HIGH, strict=True)
    )


def heatmap_chart(report: RunReport) -> plot.Chart:
    """Return a rank x step heatmap of compute per step as a chart description: one row per
    rank, one cell per step (the first MAX_HEATMAP_STEPS), darker where the rank computed
    longer (hover for the numbers). A straggler shows as a dark row."""
    rows = [(rank, steps[:MAX_HEATMAP_STEPS]) for rank, steps in report.step_compute_us if steps]
    values = [v for _, steps in rows for v in steps]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    n_steps = max((len(s) for _, s in rows), default=1)
    cell_w = max(4.0, min(40.0, 800 / n_steps))
    x0, x1, y0, y1, fills, tips = [], [], [], [], [], []
    for i, (rank, steps) in enumerate(rows):
        for j, v in enumerate(steps):
            x0.append(float(j))
            x1.append(j + 1 - 1 / cell_w)
            y0.append(float(i))
            y1.append(i + 1 - 1 / 18)
            fills.append(_heat((v - lo) / (hi - lo) if hi > lo else 0.5))
            tips.append(f"rank {rank}, step {j}: compute {fmt_us(v)}")
    step_ticks = tuple(
        plot.Tick(v + 0.5, svg.tick_label(v))
        for v in svg.nice_ticks(0, n_steps - 1, target=8)
        if float(v).is_integer()
    )
    return plot.Chart(
        title="Compute per step (darker: longer)",
        description="compute per step, rank by rank",
        x=plot.Axis(0.0, float(n_steps), "step", ticks=step_ticks, grid=False),
        y=plot.Axis(
            0.0,
            float(len(rows)),
            ticks=tuple(plot.Tick(i + 0.5, f"rank {rank}") for i, (rank, _) in enumerate(rows)),
            grid=False,
            reverse=True,
        ),
        marks=(plot.Rects(x0, x1, y0, y1, fills, tips=tips, cls="gp-heat"),),
        width=int(80 + n_steps * cell_w + plot.RIGHT),
        plot_height=18 * max(len(rows), 1),
        left=80,
        frame=False,
        notes=(f"lightest {fmt_us(lo)}, darkest {fmt_us(hi)} of compute in a step",),
    )


def heatmap_svg(report: RunReport) -> str:
    """Return the heatmap (`heatmap_chart`) as inline SVG."""
    return plot.chart_svg(heatmap_chart(report))


def plot_heatmap(report: RunReport, ax: Any = None) -> Any:
    """Return a matplotlib Figure of the heatmap (`heatmap_chart`), drawn into `ax` when
    given."""
    return chart_figure(heatmap_chart(report), ax)


def ranks_section(report: RunReport) -> Section:
    """Return the Ranks section: the table and the compute heatmap."""
    headers, rows, numeric = rank_table(report)
    caption = (
        "Totals over each rank's profiled window. busy: device busy (host time in "
        "torch ops for CPU traces); compute: busy outside collectives; comm: time in "
        "collectives; exposed comm: the part no compute overlaps; wait: time in "
        "collectives beyond the last rank to arrive (waiting for peers)"
    )
    text = caption + "\n" + text_table(headers, rows, right=numeric)
    html = note(caption) + html_table(headers, rows, numeric=numeric)
    if any(steps for _, steps in report.step_compute_us):
        html += svg.plot_html(heatmap_svg(report))
    return Section("Ranks", text, html)


COLLECTIVE_HEADERS = (
    "collective",
    "calls",
    "ranks",
    "time",
    "per call",
    "bytes",
    "algorithm bandwidth",
    "bus bandwidth",
)
COLLECTIVE_NUMERIC = (False, True, True, True, True, True, True, True)


def collectives_section(report: RunReport) -> Section:
    """Return the Collectives section: calls, time, bytes and bandwidth per collective."""
    if not report.collectives:
        text = (
            "No collectives in these traces (no NCCL/RCCL kernels, no gloo or c10d "
            "ranges): nothing to balance or overlap."
        )
        return Section("Collectives", text, note(text))
    rows = [
        (
            c.name,
            fmt_num(c.calls),
            fmt_num(c.ranks),
            fmt_us(c.time_us),
            fmt_us(c.time_us / c.calls if c.calls else None),
            fmt_bytes(c.bytes),
            fmt_rate(c.algbw_bytes_per_s, "B/s"),
            fmt_rate(c.busbw_bytes_per_s, "B/s"),
        )
        for c in report.collectives
    ]
    caption = (
        "Summed over all ranks. Bytes come from the traces' message sizes and dtypes "
        "(NCCL kernel arguments); bandwidth is bytes over time in the calls, and bus "
        "bandwidth scales it by what each link carries (NCCL's convention); n/a where "
        "the traces do not record sizes"
    )
    return Section(
        "Collectives",
        caption + "\n" + text_table(COLLECTIVE_HEADERS, rows, right=COLLECTIVE_NUMERIC),
        note(caption)
        + html_table(COLLECTIVE_HEADERS, rows, numeric=COLLECTIVE_NUMERIC, name_cols=(0,)),
    )


def summary_section(report: RunReport) -> Section:
    """Return the Summary section: ranks read, world size, step times, stragglers and the
    ranks that could not be read (the notes are in the Diagnosis)."""
    medians = [r.median_step_us for r in report.ranks if r.median_step_us is not None]
    comm = sum(r.comm_us for r in report.ranks)
    exposed = sum(r.exposed_comm_us for r in report.ranks)
    rows = [
        ("ranks read", fmt_num(len(report.ranks))),
        ("world size", fmt_num(report.world_size) if report.world_size else "not recorded"),
        ("ranks that failed", fmt_num(len(report.failures))),
        ("step median, fastest rank", fmt_us(min(medians) if medians else None)),
        ("step median, slowest rank", fmt_us(max(medians) if medians else None)),
        ("stragglers", ", ".join(map(str, report.stragglers)) or "none"),
        ("communication overlapped by compute", fmt_pct(1 - exposed / comm) if comm > 0 else "n/a"),
    ]
    text_parts = [text_table(("", ""), rows, right=(False, True))]
    html_parts = [html_table(("", ""), rows, numeric=(False, True))]
    for f in report.failures:
        text_parts.append(f"Failed: {f}")
        html_parts.append(f"<p><b>Failed:</b> {esc(f)}</p>")
    return Section("Summary", "\n".join(text_parts), "".join(html_parts))


def run_sections(report: RunReport) -> list[Section]:
    return [
        diagnosis_section(report.diagnosis),
        ranks_section(report),
        collectives_section(report),
        summary_section(report),
    ]


@report_of.register
def _run(report: RunReport) -> tuple[str, Sequence[Section]]:
    who = ", ".join(map(str, report.stragglers))
    return (
        f"gpuprof_nb run: {len(report.ranks)} ranks" + (f", stragglers {who}" if who else ""),
        run_sections(report),
    )
