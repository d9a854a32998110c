"""ProfileReport: everything `%%gpuprofile` and `analyze(trace)` found, and how it renders.

This module joins analyses written in separate modules (ops/kernels/summary, timeline,
roofline, diagnosis); it imports no torch, IPython or ipywidgets, and render code only inside
`_repr_mimebundle_`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError, TraceFormatError
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace

TITLE = "gpuprof_nb profile"


@dataclass(frozen=True, slots=True, repr=False)
class ProfileReport:
    """The result of `%%gpuprofile` (or `analyze(trace)`, where `timing` is None).

    `trace` and the analyses are None after `--timing-only`. `artifact` is the raw Chrome
    trace dict of a live run (None offline); `notes` are one-line caveats shown in the summary.
    `top` and `sort` record how `ops` was cut and ordered.
    """

    timing: TimingStats | None
    trace: Trace | None
    ops: Any = None
    kernels: Any = None
    summary: Any = None
    timeline: Any = None
    roofline: Any = None
    diagnosis: Any = None
    artifact: dict[str, Any] | None = field(default=None, compare=False)
    notes: tuple[str, ...] = ()
    top: int | None = None
    sort: str | None = None

    def __repr__(self) -> str:
        parts = []
        if self.timing is not None:
            from gpuprof_nb.render.units import fmt_us

            parts.append(f"{self.timing.runs} runs, median {fmt_us(self.timing.median_us)}")
        if self.trace is not None:
            parts.append(f"{len(self.trace.ops)} op events, {len(self.trace.kernels)} kernels")
        return f"<ProfileReport {'; '.join(parts) or 'empty'}>"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome trace JSON (gzip when the name ends in .gz) that `load_trace`
        reads back; return the path written. Live runs write the profiler's own trace; offline
        reports copy the file the trace was loaded from."""
        target = Path(path)
        if self.artifact is not None:
            return save_trace_dict(self.artifact, target)
        if self.trace is None:
            raise GpuprofError(
                f"cannot save {target}: this report has no trace (run without --timing-only)"
            )
        source = Path(self.trace.source)
        if not source.is_file():
            raise GpuprofError(
                f"cannot save {target}: the trace came from {self.trace.source!r}, which is not "
                "a file to copy; save the trace dict itself with gpuprof_nb.report.save_trace_dict"
            )
        raw = source.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as exc:
                raise TraceFormatError(f"{source}: gzip data is corrupt ({exc})") from exc
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.name.endswith(".gz"):
            with gzip.open(target, "wb") as fh:
                fh.write(raw)
        else:
            target.write_bytes(raw)
        return target

    def sections(self) -> list[Any]:
        """Return the report's render Sections in display order: Diagnosis, Summary, Top ops,
        Kernels, Timeline, Roofline (those with nothing to show are left out)."""
        from gpuprof_nb.render.profile import guarded_section

        return [guarded_section(title, build) for title, build in self._section_builders()]

    def _section_builders(self) -> list[tuple[str, Any]]:
        """Return (title, build) for every section the report shows, in display order."""
        from gpuprof_nb.render import profile as rp

        wanted: list[tuple[str, Any]] = []
        if self.diagnosis is not None:
            wanted.append(("Diagnosis", lambda: _diag_section(self.diagnosis)))
        wanted.append(("Summary", lambda: rp.summary_section(self)))
        if self.ops is not None:
            wanted.append(("Top ops", lambda: rp.ops_section(self.ops)))
        if self.kernels is not None:
            wanted.append(("Kernels", lambda: rp.kernels_section(self.kernels)))
        if self.timeline is not None and self.trace is not None:
            wanted.append(("Timeline", lambda: _timeline_section(self.timeline, self.trace)))
        if self.roofline is not None:
            wanted.append(("Roofline", lambda: _roofline_section(self.roofline)))
        return wanted

    def text(self) -> str:
        """Return the report as plain text (the bundle's text/plain), every section in order."""
        from gpuprof_nb.render.sections import Section, report_text

        if [title for title, _ in self._section_builders()] == ["Summary"]:
            # Timing only: the Summary is the one section, and its HTML is not needed.
            from gpuprof_nb.render.profile import summary_text

            return report_text(TITLE, [Section("Summary", summary_text(self), "")])
        return report_text(TITLE, self.sections())

    def _repr_mimebundle_(
        self, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
    ) -> dict[str, Any]:
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle(TITLE, self.sections(), include=include, exclude=exclude)

    def widget(self) -> Any:
        """Return the report as a live ipywidgets Tab whose Top ops tab re-sorts from a
        dropdown. It renders only while its kernel runs (`display(report.widget())`); the
        default display is plain HTML tabs, which survive saving, nbviewer and nbconvert."""
        from gpuprof_nb.render.profile import profile_widget

        return profile_widget(self, TITLE)


def _diag_section(diagnosis: Any) -> Any:
    from gpuprof_nb.render.diagnosis import diagnosis_section

    return diagnosis_section(diagnosis)


def _timeline_section(timeline: Any, trace: Trace) -> Any:
    from gpuprof_nb.render.diagnosis import timeline_section

    return timeline_section(timeline, trace)


def _roofline_section(roofline: Any) -> Any:
    from gpuprof_nb.render.roofline import roofline_section

    return roofline_section(roofline)


def save_trace_dict(trace: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a Chrome trace dict as JSON (gzip when the name ends in .gz), creating the
    parent folder; return the path written."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.name.endswith(".gz"):
            with gzip.open(target, "wt", encoding="utf-8") as fh:
                json.dump(trace, fh)
        else:
            with open(target, "w", encoding="utf-8") as fh:
                json.dump(trace, fh)
    except OSError as exc:
        raise GpuprofError(f"cannot write the trace to {target}: {exc}") from exc
    return target


def count_steps_per_run(trace: Trace) -> int | None:
    """Return how many training steps one profiled run of the cell held: the distinct
    `ProfilerStep#N` annotations, else the calls of the most frequent `Optimizer.step#...`
    annotation (each optimizer step ends one training step, even the first, which
    `Trace.steps` cannot bound), else None."""
    if trace.steps and trace.steps[0].name.startswith("ProfilerStep#"):
        return len(trace.steps)
    counts: dict[str, int] = {}
    for op in trace.ops:
        if op.kind == "annotation" and op.name.startswith("Optimizer.step#"):
            counts[op.name] = counts.get(op.name, 0) + 1
    if not counts:
        return None
    return max(counts.values())


def _diagnose(trace: Trace, timeline: Any, roofline: Any, timing: TimingStats | None) -> Any:
    from gpuprof_nb.analysis.diagnose import diagnose

    return diagnose(trace, timeline=timeline, roofline=roofline, timing=timing)


def _attempt(what: str, compute: Callable[[], Any], notes: list[str]) -> Any:
    """Return compute(), or None with a note naming the error when it raises."""
    try:
        return compute()
    except Exception as exc:  # noqa: BLE001 - reported in the notes, not hidden
        notes.append(f"{what} could not be computed: {type(exc).__name__}: {exc}")
        return None


def _ceilings(trace: Trace, device: Any, timing: TimingStats | None) -> Any:
    """Return what the roofline is drawn against: the caller's `device`, else the ceilings
    measured by `measure_ceilings()` and cached for the trace's device (for a CPU trace only
    when it was captured live on this machine, i.e. `timing` is given), else the datasheet."""
    if device is not None:
        return device
    from gpuprof_nb.capture.device import trace_device_spec

    return trace_device_spec(trace, this_machine=timing is not None)


def analyze(
    trace: Trace,
    device: Any = None,
    *,
    timing: TimingStats | None = None,
    top: int | None = 20,
    sort: str | None = None,
    artifact: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> ProfileReport:
    """Return the ProfileReport of a trace: top ops (`top` rows ordered by `sort`, the
    default being self device time when there are kernels, else self CPU time), kernels,
    summary, device timeline, roofline (against `device`, or the trace's device) and
    diagnosis. `timing` is given by the live magic; offline it stays None."""
    from gpuprof_nb.analysis.ops import kernel_table, summarize_trace, top_ops
    from gpuprof_nb.analysis.roofline import compute_roofline
    from gpuprof_nb.analysis.timeline import device_timeline

    ops = top_ops(trace, n=top, sort=sort)
    kernels = kernel_table(trace)
    summary = summarize_trace(trace)
    all_notes = list(notes)
    # The remaining analyses add judgement on top of the tables; one failing on an unusual
    # trace should cost its own tab, not the whole report, and the note says what broke.
    timeline = _attempt("timeline", lambda: device_timeline(trace), all_notes)
    roofline = _attempt(
        "roofline", lambda: compute_roofline(trace, _ceilings(trace, device, timing)), all_notes
    )
    diagnosis = _attempt(
        "diagnosis", lambda: _diagnose(trace, timeline, roofline, timing), all_notes
    )
    return ProfileReport(
        timing=timing,
        trace=trace,
        ops=ops,
        kernels=kernels,
        summary=summary,
        timeline=timeline,
        roofline=roofline,
        diagnosis=diagnosis,
        artifact=artifact,
        notes=tuple(all_notes),
        top=top,
        sort=ops.sort_key,
    )
