"""The Diagnosis and Timeline sections: findings with evidence and fixes; the idle-time
breakdown with a drawing of one representative step."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof_nb.analysis.diagnose import Diagnosis, Finding, kernel_class
from gpuprof_nb.analysis.timeline import IdleBreakdown, StepTimeline, Timeline, top_level_ops
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.render.html import esc, html_table, note, png_img
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.text import text_table
from gpuprof_nb.render.units import fmt_bytes, fmt_num, fmt_pct, fmt_rate, fmt_us

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
}
KERNEL_LABELS: dict[str, str] = {
    "gemm": "matmul/conv kernel",
    "elementwise": "other kernel",
    "comm": "collective (NCCL)",
    "copy": "memcpy/memset",
}
CAUSE_COLORS: dict[str, str] = {
    "dataloader": "#e377c2",
    "sync": "#d62728",
    "launch": "#ff7f0e",
    "host": "#9467bd",
    "other": "#7f7f7f",
}

_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_bytes_per_s", "B/s"),
    ("_fraction", "%"),
    ("_bytes", "bytes"),
    ("_us", "time"),
    ("_ratio", "x"),
    ("_per_step", "per step"),
    ("_count", "count"),
)


def evidence_rows(evidence: Mapping[str, float]) -> list[tuple[str, str]]:
    """Return (label, formatted value) per evidence entry, the unit taken from the suffix."""
    rows = []
    for key, value in evidence.items():
        label, unit = key, ""
        for suffix, u in _SUFFIXES:
            if key.endswith(suffix):
                label, unit = key[: -len(suffix)], u
                break
        if unit == "B/s":
            shown = fmt_rate(value, "B/s")
        elif unit == "%":
            shown = fmt_pct(value)
        elif unit == "bytes":
            shown = fmt_bytes(value)
        elif unit == "time":
            shown = fmt_us(value)
        elif unit == "x":
            shown = fmt_num(value) + "x"
        else:
            shown = fmt_num(value)
        if unit == "per step":
            label += " per step"
        rows.append((label.replace("_", " "), shown, unit))
    # The same quantity often comes as time and as share: say which row is which.
    labels = [r[0] for r in rows]
    return [(f"{lab} (share)" if unit == "%" and labels.count(lab) > 1 else lab, shown)
            for lab, shown, unit in rows]


def _finding_text(n: int, f: Finding) -> str:
    table = text_table(("evidence", "value"), evidence_rows(f.evidence), right=(False, True))
    fix = "\n".join("    " + line for line in f.fix.splitlines())
    return (f"{n}. [{f.severity}] {f.title}  ({f.kind})\n"
            + "\n".join("   " + line for line in table.splitlines())
            + f"\n   fix:\n{fix}")


def _finding_html(f: Finding) -> str:
    table = html_table(("evidence", "value"), evidence_rows(f.evidence), numeric=(False, True))
    return (f'<div class="finding" data-kind="{esc(f.kind)}">'
            f'<p><span class="sev-{esc(f.severity)}">{esc(f.severity.upper())}</span> '
            f"<b>{esc(f.title)}</b> <code>{esc(f.kind)}</code></p>"
            f"{table}<p>Fix:</p><pre>{esc(f.fix)}</pre></div>")


def diagnosis_section(diagnosis: Diagnosis) -> Section:
    """Return the Diagnosis section: verdict, findings (severity, title, evidence, fix),
    then what could not be judged."""
    text_parts = [diagnosis.verdict or "No verdict."]
    html_parts = [f"<p><b>{esc(diagnosis.verdict or 'No verdict.')}</b></p>"]
    if not diagnosis.findings:
        text_parts.append("No findings.")
        html_parts.append(note("No findings."))
    for n, f in enumerate(diagnosis.findings, start=1):
        text_parts.append(_finding_text(n, f))
        html_parts.append(_finding_html(f))
    if diagnosis.not_judged:
        text_parts.append("Not judged:\n" + "\n".join(f"  - {x}" for x in diagnosis.not_judged))
        html_parts.append("<p>Not judged:</p><ul>"
                          + "".join(f"<li>{esc(x)}</li>" for x in diagnosis.not_judged)
                          + "</ul>")
    for x in diagnosis.notes:
        text_parts.append(f"Note: {x}")
        html_parts.append(note(f"Note: {x}"))
    return Section("Diagnosis", "\n\n".join(text_parts), "".join(html_parts))


def breakdown_rows(breakdown: IdleBreakdown, on_device: bool) -> list[tuple[str, str, str]]:
    """Return (category, time, share) rows of a breakdown, busy first."""
    labels = CATEGORY_LABELS if on_device else HOST_CATEGORY_LABELS
    return [(labels[c], fmt_us(us), fmt_pct(breakdown.fraction(c)))
            for c, us in breakdown.us_by_category().items()]


def _step_rows(steps: Sequence[StepTimeline]) -> list[tuple[str, ...]]:
    rows = []
    for s in steps:
        b = s.breakdown
        rows.append((str(s.number), fmt_us(s.dur_us))
                    + tuple(fmt_pct(b.fraction(c)) for c in b.us_by_category()))
    return rows


_STEP_HEADERS = ("step", "duration", "busy", "dataloader", "sync", "launch", "host", "other")
_MAX_STEP_ROWS = 30


def timeline_section(timeline: Timeline, trace: Trace | None) -> Section:
    """Return the Timeline section: the breakdown over the window and per step, and a PNG of
    the representative step (lanes from the trace when given)."""
    bd = timeline.breakdown
    what = "device" if timeline.on_device else "host"
    head = (f"{what} busy {fmt_pct(timeline.busy_fraction)} of a {fmt_us(timeline.window_us)} "
            "window")
    if timeline.device is not None:
        head += f" (device {timeline.device})"
    text_parts = [head]
    html_parts = [f"<p>{esc(head)}</p>"]
    if bd is not None:
        rows = breakdown_rows(bd, timeline.on_device)
        text_parts.append(text_table(("category", "time", "share"), rows,
                                     right=(False, True, True)))
        html_parts.append(html_table(("category", "time", "share"), rows,
                                     numeric=(False, True, True)))
    rep = timeline.representative_step
    try:
        fig = plot_timeline(timeline, trace, step=rep)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90)
        shown = f"step {rep.number} (median duration)" if rep else "the whole window"
        html_parts.append(f"<p>Timeline of {esc(shown)}:</p>"
                          + png_img(buf.getvalue(), f"timeline of {shown}"))
        text_parts.append(f"(the HTML view draws {shown})")
    except ImportError:
        html_parts.append(note("matplotlib is not installed: no drawing"))
    if timeline.steps:
        shown_steps = timeline.steps[:_MAX_STEP_ROWS]
        rows_s = _step_rows(shown_steps)
        text_parts.append("per step:\n" + text_table(_STEP_HEADERS, rows_s,
                                                     right=(True,) * len(_STEP_HEADERS)))
        html_parts.append("<p>Per step:</p>" + html_table(
            _STEP_HEADERS, rows_s, numeric=(True,) * len(_STEP_HEADERS)))
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


def plot_timeline(timeline: Timeline, trace: Trace | None, step: StepTimeline | int | None = None,
                  ax: Any = None) -> Any:
    """Return a matplotlib Figure of one step (or the whole window): CPU threads and GPU
    streams as lanes, ops and kernels as bars, idle gaps shaded and labelled by cause.
    Times on the x axis are milliseconds from the start of what is drawn."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if isinstance(step, int):
        step = next((s for s in timeline.steps if s.number == step), None)
    lo, hi = (step.start_us, step.end_us) if step is not None else (timeline.start_us,
                                                                      timeline.end_us)
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
            ax.text(ms((a + b) / 2), -0.75, cause, ha="center", va="center", fontsize=8,
                    color=CAUSE_COLORS[cause])
    top = -0.5 - 0.6
    for cause, bars in shaded.items():
        ax.broken_barh(bars, (top, len(lanes) - 0.5 - top), facecolors=CAUSE_COLORS[cause],
                       alpha=0.25, lw=0, zorder=0)
    seen = set(shaded)
    ax.set_xlim(0, span / 1e3)
    ax.set_xlabel("time (ms)")
    title = f"step {step.number}" if step is not None else "whole window"
    ax.set_title(f"Timeline of {title}: idle gaps shaded by cause", fontsize=10)
    labels = CATEGORY_LABELS if timeline.on_device else HOST_CATEGORY_LABELS
    handles = [Patch(color=CAUSE_COLORS[c], alpha=0.4, label=labels[c])
               for c in CAUSE_COLORS if c in seen]
    used = {c for _, _, col in lanes if isinstance(col, list) for c in col}
    handles += [Patch(color=KERNEL_COLORS[k], label=KERNEL_LABELS[k])
                for k in KERNEL_COLORS if KERNEL_COLORS[k] in used]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                  frameon=False)
    fig.tight_layout()
    return fig
