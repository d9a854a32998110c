"""MemoryReport: what %%memsnap returns and analyze_memory builds from a snapshot."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprof_nb.analysis.diagnose import Finding
from gpuprof_nb.analysis.memory import (
    AtPeak,
    Leaks,
    MemoryAnalysis,
    MemoryTimeline,
    OomEvent,
    SegmentSummary,
    analyze_snapshot,
    parse_window,
)
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.snapshot import save_snapshot, snapshot_from_dict
from gpuprof_nb.model.memory import MemorySnapshot


@dataclass(frozen=True, slots=True, eq=False)
class MemoryReport:
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

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from gpuprof_nb.render.memory import memory_sections, memory_title
        from gpuprof_nb.render.widgets import report_bundle

        return report_bundle(memory_title(self), memory_sections(self), include, exclude)

    def __repr__(self) -> str:
        return (f"MemoryReport(device={self.device}, peak_bytes={self.peak_bytes}, "
                f"events={self.timeline.n_events}, findings={len(self.findings)})")


def analyze_memory(
    snapshot: MemorySnapshot | Mapping[str, Any],
    *,
    device: int | None = None,
    window: str | tuple[float | None, float | None] | None = None,
    step_starts: Sequence[int] | None = None,
    oom_message: str | None = None,
) -> MemoryReport:
    """Return the MemoryReport of one device of a snapshot (default: the busiest); a raw
    snapshot dict (what torch.cuda.memory._snapshot() returns) is accepted too.
    `window` is 'START:END' or (start, end) in ms when the snapshot has time_us, else in
    history entries; `step_starts` are the entry indices where repeats began."""
    if isinstance(snapshot, Mapping):
        snapshot = snapshot_from_dict(snapshot)
    if not isinstance(snapshot, MemorySnapshot):
        raise GpuprofError(
            f"analyze_memory expects a MemorySnapshot, got {type(snapshot).__name__}; "
            "load one with gpuprof_nb.load_snapshot(path)"
        )
    if isinstance(window, str):
        try:
            window = parse_window(window)
        except ValueError as e:
            raise GpuprofError(str(e)) from None
    if device is not None and device not in snapshot.devices:
        raise GpuprofError(
            f"the snapshot has no device {device}; it has {list(snapshot.devices) or 'none'}"
        )
    analysis = analyze_snapshot(snapshot, device=device, window=window, step_starts=step_starts)
    return MemoryReport(snapshot=snapshot, analysis=analysis, oom_message=oom_message)
