"""The two reports users hold: ProfileReport (what `%%gpuprofile` and `analyze(trace)`
return) and MemoryReport (what `%%memsnap` and `analyze_memory(snapshot)` return)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.guards import FileIdentity
from gpuprof_nb.io.snapshot import save_snapshot
from gpuprof_nb.io.timing import with_timing
from gpuprof_nb.io.trace import copy_trace_file, save_trace_dict
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.model.utilisation import Utilisation
from gpuprof_nb.results.annotations import AnnotationTable
from gpuprof_nb.results.compile import CompileReport, GraphReplays
from gpuprof_nb.results.critical_path import CriticalPath
from gpuprof_nb.results.diagnosis import Diagnosis, Finding
from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.exports import Exportable
from gpuprof_nb.results.fit import (
    BatchFit,
    CheckpointPlan,
    MemoryByCategory,
    Prediction,
    budget_bytes,
    plan_with,
)
from gpuprof_nb.results.hotspots import Hotspots
from gpuprof_nb.results.memory import (
    AtPeak,
    Leaks,
    MemoryAnalysis,
    MemoryTimeline,
    OomEvent,
    SegmentSummary,
)
from gpuprof_nb.results.mfu import Mfu
from gpuprof_nb.results.modules import ModuleBreakdown
from gpuprof_nb.results.roofline import Roofline
from gpuprof_nb.results.tables import KernelTable, OpTable, TraceSummary
from gpuprof_nb.results.timeline import Timeline, TimelineLanes


@dataclass(frozen=True, slots=True, repr=False)
class ProfileReport(Displayable, Exportable):
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
    # Time per nn.Module (analysis/modules.py); its notes say what is missing when empty.
    modules: ModuleBreakdown | None = None
    # Model FLOPs utilisation of the step (analysis/mfu.py); None without counted FLOPs.
    mfu: Mfu | None = None
    # What torch.compile did (analysis/compile.py) and the CUDA graph replays
    # (analysis/cudagraphs.py); None when the cell compiled nothing / launched no graph.
    compile: CompileReport | None = None
    graph_replays: GraphReplays | None = None
    # Every record_function range as a tree (analysis/annotations.py).
    annotations: AnnotationTable | None = None
    # The median step's critical path (analysis/critical_path.py).
    critical_path: CriticalPath | None = None
    # What the Timeline tab's drawing of the representative step shows (analysis/lanes.py).
    timeline_lanes: TimelineLanes | None = None

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
        reads back; return the path written. Live runs write the profiler's own trace, with
        the timed samples under gpuprof_nb's own key (io/timing.py), so `gpuprof compare`
        and named baselines judge a saved report as they would the live one; offline reports
        copy the file the trace was loaded from."""
        target = Path(path)
        if self.artifact is not None:
            artifact = self.artifact
            if self.timing is not None:
                artifact = with_timing(artifact, self.timing)
            return save_trace_dict(artifact, target)
        if self.trace is None:
            raise GpuprofError(
                f"cannot save {target}: this report has no trace (run without --timing-only)"
            )
        source = self.trace.source
        if self.trace.source_stat is None or not os.path.isfile(source):
            raise GpuprofError(
                f"cannot save {target}: the trace came from {source!r}, which is not "
                "a file to copy; save the trace dict itself with gpuprof_nb.io.trace."
                "save_trace_dict"
            )
        FileIdentity(source, *self.trace.source_stat).check(what="this report", error=_error)
        copy_trace_file(source, target)
        return target


def _error(message: str) -> GpuprofError:
    return GpuprofError(message)


@dataclass(frozen=True, slots=True, eq=False)
class MemoryReport(Displayable, Exportable):
    """A snapshot and its analysis for one device. Bytes everywhere; `oom_message` is the
    text of the out-of-memory error the cell raised, when it did."""

    snapshot: MemorySnapshot
    analysis: MemoryAnalysis
    oom_message: str | None = None
    # Will it fit (analysis/fit.py): the peak by category, how it grows with the batch, a
    # budget (bytes, and where it came from) and a checkpointing plan under it.
    by_category: MemoryByCategory | None = None
    fit: BatchFit | None = None
    budget_bytes: int | None = None
    budget_source: str = ""
    plan: CheckpointPlan | None = None

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

    @property
    def memory_by_category(self) -> MemoryByCategory | None:
        """The peak split into parameters, gradients, optimizer state, inputs, activations
        (by module), temporaries, other, and the allocator's overhead above it; None when
        the snapshot cannot tell tensors apart (a CUDA snapshot not recorded by %%memsnap)."""
        return self.by_category

    def _fit(self) -> BatchFit:
        if self.fit is None:
            raise GpuprofError(
                "this report cannot predict other batch sizes: nothing in it tells which "
                "memory grows with the batch. Record the cell with %%memsnap --fit VAR "
                "(VAR: the batch-size variable the cell reads)"
            )
        return self.fit

    def predict(self, batch_size: int, *, recorded_batch_size: int | None = None) -> Prediction:
        """Return the predicted peak (bytes, with its interval) at `batch_size`. A report
        from %%memsnap --fit knows its batch size; for others pass `recorded_batch_size`."""
        return self._fit().predict(batch_size, recorded_batch_size=recorded_batch_size)

    def largest_batch(
        self,
        budget: int | str | None = None,
        *,
        recorded_batch_size: int | None = None,
        conservative: bool = False,
    ) -> int | None:
        """Return the largest batch size predicted to fit `budget` (bytes or '8GiB'; default
        the report's budget: --budget, or the device's memory); None when none does.
        `conservative`: the top of the prediction's interval must fit."""
        return self._fit().largest_batch(
            self._budget(budget),
            recorded_batch_size=recorded_batch_size,
            conservative=conservative,
        )

    def checkpoint_plan(
        self, budget: int | str | None = None, *, batch_size: int | None = None
    ) -> CheckpointPlan:
        """Return which modules to checkpoint so the step fits `budget` (bytes or '8GiB';
        default the report's budget) at `batch_size` (default: as recorded) with the least
        recompute time, with the code to paste."""
        return plan_with(
            self.snapshot,
            self._budget(budget),
            fit=self.fit,
            batch_size=batch_size,
            device=self.device,
        )

    def _budget(self, budget: int | str | None) -> int:
        if budget is None:
            if self.budget_bytes is None:
                raise GpuprofError("pass a budget (bytes, or a size like '8GiB')")
            return self.budget_bytes
        return budget_bytes(budget)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot as a pickle PyTorch's memory_viz opens; return the path."""
        return save_snapshot(self.snapshot, path)

    def __repr__(self) -> str:
        return (
            f"MemoryReport(device={self.device}, peak_bytes={self.peak_bytes}, "
            f"events={self.timeline.n_events}, findings={len(self.findings)})"
        )
