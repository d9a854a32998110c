"""The two reports users hold: ProfileReport (what `%%gpuprofile` and `analyze(trace)`
return) and MemoryReport (what `%%memsnap` and `analyze_memory(snapshot)` return)."""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError, TraceFormatError
from gpuprof_nb.io.snapshot import save_snapshot
from gpuprof_nb.io.trace import save_trace_dict
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.model.utilisation import Utilisation
from gpuprof_nb.results.annotations import AnnotationTable
from gpuprof_nb.results.critical_path import CriticalPath
from gpuprof_nb.results.diagnosis import Diagnosis, Finding
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.memory import (
    AtPeak,
    Leaks,
    MemoryAnalysis,
    MemoryTimeline,
    OomEvent,
    SegmentSummary,
)
from gpuprof_nb.results.roofline import Roofline
from gpuprof_nb.results.tables import KernelTable, OpTable, TraceSummary
from gpuprof_nb.results.timeline import Timeline


@dataclass(frozen=True, slots=True, repr=False)
class ProfileReport(Displayable):
    """The result of `%%gpuprofile` (or `analyze(trace)`, where `timing` is None).

    `trace` and the analyses are None after `--timing-only`. `artifact` is the raw Chrome
    trace dict of a live run (None offline); `notes` are one-line caveats shown in the summary.
    `top` and `sort` record how `ops` was cut and ordered. `hotspots` (host time and idle
    time by Python line) needs stacks: `--stack`, or python_function events offline.
    """

    timing: TimingStats | None
    trace: Trace | None
    ops: OpTable | None = None
    kernels: KernelTable | None = None
    summary: TraceSummary | None = None
    timeline: Timeline | None = None
    roofline: Roofline | None = None
    diagnosis: Diagnosis | None = None
    artifact: dict[str, Any] | None = field(default=None, compare=False)
    notes: tuple[str, ...] = ()
    top: int | None = None
    sort: str | None = None
    hotspots: Hotspots | None = None
    # Every record_function range as a tree (analysis/annotations.py).
    annotations: AnnotationTable | None = None
    # The median step's critical path (analysis/critical_path.py).
    critical_path: CriticalPath | None = None

    @property
    def utilisation(self) -> Utilisation | None:
        """What the utilisation sampler read beside the profiled run (None offline, unless
        the trace was recorded by gpuprof_nb)."""
        return self.trace.utilisation if self.trace is not None else None

    def __repr__(self) -> str:
        parts = []
        if self.timing is not None:
            parts.append(f"{self.timing.runs} runs, median {self.timing.median_us:.4g} us")
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
                "a file to copy; save the trace dict itself with gpuprof_nb.io.trace."
                "save_trace_dict"
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


@dataclass(frozen=True, slots=True, eq=False)
class MemoryReport(Displayable):
    """A snapshot and its analysis for one device. Bytes everywhere; `oom_message` is the
    text of the out-of-memory error the cell raised, when it did."""

    snapshot: MemorySnapshot
    analysis: MemoryAnalysis
    oom_message: str | None = None

    @property
    def device(self) -> int:
        return self.analysis.device

    @property
    def timeline(self) -> MemoryTimeline:
        return self.analysis.timeline

    @property
    def peak_bytes(self) -> int:
        """Peak active bytes (allocated or awaiting free) in the window."""
        return self.analysis.timeline.peak_bytes

    @property
    def at_peak(self) -> AtPeak:
        return self.analysis.at_peak

    @property
    def leaks(self) -> Leaks:
        return self.analysis.leaks

    @property
    def segments(self) -> SegmentSummary:
        return self.analysis.segments

    @property
    def ooms(self) -> tuple[OomEvent, ...]:
        return self.analysis.ooms

    @property
    def findings(self) -> tuple[Finding, ...]:
        """Findings, most important first (oom, fragmentation, memory_growth, peak_memory)."""
        return self.analysis.findings

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot as a pickle PyTorch's memory_viz opens; return the path."""
        return save_snapshot(self.snapshot, path)

    def __repr__(self) -> str:
        return (
            f"MemoryReport(device={self.device}, peak_bytes={self.peak_bytes}, "
            f"events={self.timeline.n_events}, findings={len(self.findings)})"
        )
