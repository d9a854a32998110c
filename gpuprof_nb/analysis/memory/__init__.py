"""Memory snapshot analysis: timeline, what was live at the peak, leaks, segments, findings.

All functions are pure and work on the columnar MemorySnapshot with numpy, never with one
Python object per trace entry. The modules, in the order the analysis runs:
- sites: the user's line behind each recorded stack; blocks grouped by site
- replay: each allocation's lifetime and the active/reserved bytes after every entry (its
  docstring states the rules the replay follows)
- timeline: the curve over a window, its peak, the bytes stacked by site
- peak, leaks: what was live at the peak; what was left allocated, growth per step
- segments, ooms: the allocator's segments at dump time; out-of-memory entries
- findings: what the numbers above call for
- analyze: all of the above for one device
- window: the text of the --window option
"""

from __future__ import annotations

from gpuprof_nb.analysis.memory.analyze import analyze_snapshot
from gpuprof_nb.analysis.memory.findings import memory_findings
from gpuprof_nb.analysis.memory.replay import _Replay as _Replay
from gpuprof_nb.analysis.memory.replay import _replay as _replay
from gpuprof_nb.analysis.memory.replay import choose_device
from gpuprof_nb.analysis.memory.segments import segment_summary
from gpuprof_nb.analysis.memory.sites import BEFORE_LABEL as BEFORE_LABEL
from gpuprof_nb.analysis.memory.sites import NO_STACK_LABEL as NO_STACK_LABEL
from gpuprof_nb.analysis.memory.sites import OTHER_LABEL as OTHER_LABEL
from gpuprof_nb.analysis.memory.sites import _group as _group
from gpuprof_nb.analysis.memory.sites import stack_sites, user_frame
from gpuprof_nb.analysis.memory.timeline import memory_timeline
from gpuprof_nb.analysis.memory.window import parse_window
from gpuprof_nb.results.memory import (
    AtPeak,
    Leaks,
    MemoryAnalysis,
    MemoryTimeline,
    OomEvent,
    PeakBlock,
    SegmentRow,
    SegmentSummary,
    Site,
    SiteBytes,
)

__all__ = [
    "AtPeak",
    "Leaks",
    "MemoryAnalysis",
    "MemoryTimeline",
    "OomEvent",
    "PeakBlock",
    "Site",
    "SiteBytes",
    "SegmentRow",
    "SegmentSummary",
    "analyze_snapshot",
    "choose_device",
    "memory_findings",
    "memory_timeline",
    "parse_window",
    "segment_summary",
    "stack_sites",
    "user_frame",
]
