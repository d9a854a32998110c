"""What a memory snapshot analysis holds for one device: the timeline, what was live at the
peak, leaks, segments, out-of-memory events and findings (built by analysis/memory/).
Bytes everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuprof_nb.results.diagnosis import Finding


@dataclass(frozen=True, slots=True)
class Site:
    """Where memory was allocated: the user's innermost Python frame (torch frames skipped)."""

    label: str
    filename: str = ""
    line: int = 0
    function: str = ""


@dataclass(frozen=True, slots=True)
class SiteBytes:
    """Bytes held by one allocation site: `bytes` over `blocks` blocks, `share` of a total."""

    site: Site
    bytes: int
    blocks: int
    share: float
    largest_block_bytes: int
    category: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class MemoryTimeline:
    """Active (allocated or pending-free) and reserved bytes after each history entry.

    `x` is in `time_unit`: "ms" since the first entry when the snapshot has `time_us`,
    else "event" (entry index). Arrays cover the window only (`first_index` is the trace
    index of their first element); `reserved_bytes` is None without segment information.
    `sample_x` / `site_bytes` are the curve stacked by the top sites at up to a few
    thousand points that keep every local maximum; rows follow `site_labels`. Each column's
    level holds until the next sample; the last sample, at `end_x`, repeats the level after
    the last entry, so that level has a width too (the area reaches the peak wherever it
    falls).
    """

    device: int
    time_unit: str
    x: np.ndarray
    active_bytes: np.ndarray
    reserved_bytes: np.ndarray | None
    first_index: int
    peak_bytes: int
    peak_index: int
    peak_x: float
    start_bytes: int
    end_bytes: int
    reserved_peak_bytes: int | None
    sample_x: np.ndarray
    site_labels: tuple[str, ...]
    site_bytes: np.ndarray
    window: tuple[float | None, float | None] | None
    notes: tuple[str, ...] = ()
    end_x: float = 0.0

    @property
    def n_events(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True, slots=True)
class PeakBlock:
    address: int
    size: int
    site: Site
    allocated_x: float | None  # None: allocated before recording
    category: str = ""


@dataclass(frozen=True, slots=True)
class AtPeak:
    """What was live at the peak: bytes per site (largest first) and the largest blocks."""

    peak_bytes: int
    peak_x: float
    time_unit: str
    sites: tuple[SiteBytes, ...]
    largest_blocks: tuple[PeakBlock, ...]


@dataclass(frozen=True, slots=True)
class Leaks:
    """What the cell (window) left allocated, and growth across steps where steps are known.

    `step_end_bytes[k]` is the active bytes at the end of step k; `growth_bytes_per_step`
    is the least-squares slope over them (None with fewer than two steps);
    `growing_sites` are sites whose live bytes rose from the first to the last step end
    without falling in between, with `bytes` = growth per step.
    """

    left_bytes: int
    left_sites: tuple[SiteBytes, ...]
    step_end_bytes: tuple[int, ...]
    growth_bytes_per_step: float | None
    growing_sites: tuple[SiteBytes, ...]


@dataclass(frozen=True, slots=True)
class SegmentRow:
    address: int
    segment_type: str
    total_bytes: int
    active_bytes: int
    largest_free_bytes: int


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """The allocator's state at dump time for one device. fragmentation_ratio is
    1 - largest free block / all free bytes in segments (0: one free piece; near 1: many
    small pieces no large request can use)."""

    device: int
    n_segments: int
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    free_bytes: int
    largest_free_block_bytes: int
    n_free_blocks: int
    fragmentation_ratio: float
    largest_segments: tuple[SegmentRow, ...]


@dataclass(frozen=True, slots=True)
class OomEvent:
    """An `oom` entry: the request that failed and the state when it did (bytes)."""

    index: int
    x: float
    requested_bytes: int
    device_free_bytes: int | None
    active_bytes: int
    reserved_bytes: int | None
    site: Site


@dataclass(frozen=True, slots=True, eq=False)
class MemoryAnalysis:
    """Everything analysed for one device and window (what MemoryReport shows)."""

    device: int
    timeline: MemoryTimeline
    at_peak: AtPeak
    leaks: Leaks
    segments: SegmentSummary
    ooms: tuple[OomEvent, ...]
    findings: tuple[Finding, ...]
    sites: tuple[Site, ...]
