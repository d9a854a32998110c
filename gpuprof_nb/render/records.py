"""Results as plain records: the JSON export (`report.to_json()`) and the headline scalars the
trackers log (`report.log_to(run)`, `report.to_tensorboard(writer)`). docs/exports.md
documents the schema.

Every record starts with `schema` ("gpuprof_nb.report"), `schema_version` (SCHEMA_VERSION,
raised when a field changes meaning or goes away; new fields may appear without it), `kind`
(profile, memory, run, comparison) and `headline`: the scalars, units in their names
(`_us`, `_bytes`, `_fraction`, `_count`, `_ratio`). Numbers JSON cannot hold (NaN, infinity)
are null.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Mapping
from typing import Any

from gpuprof_nb.results.compare import Comparison
from gpuprof_nb.results.diagnosis import Diagnosis, Finding
from gpuprof_nb.results.distributed import RunReport
from gpuprof_nb.results.report import MemoryReport, ProfileReport
from gpuprof_nb.version import __version__

SCHEMA = "gpuprof_nb.report"
SCHEMA_VERSION = 2
# Findings whose shares the headline carries (most important first).
HEADLINE_FINDINGS = 3
# Rows of the top-ops and kernel tables a record holds.
RECORD_ROWS = 20


def plain(value: Any) -> Any:
    """Return `value` as JSON-able data: dataclasses and mappings as dicts, tuples as lists,
    numpy scalars as numbers, NaN and infinity as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return plain(item())
    return str(value)


def _finding(f: Finding) -> dict[str, Any]:
    return {
        "kind": f.kind,
        "severity": f.severity,
        "title": f.title,
        "share_fraction": plain(f.share),
        "evidence": plain(f.evidence),
        "fix": f.fix,
    }


def _diagnosis(d: Diagnosis | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "verdict": d.verdict,
        "findings": [_finding(f) for f in d.findings],
        "one_off": [_finding(f) for f in d.one_off],
        "not_judged": list(d.not_judged),
        "notes": list(d.notes),
    }


def _finding_scalars(findings: tuple[Finding, ...]) -> dict[str, float]:
    out: dict[str, float] = {"findings_count": float(len(findings))}
    for f in findings[:HEADLINE_FINDINGS]:
        out[f"finding/{f.kind}/share_fraction"] = float(f.share)
    return out


def _peak_trace_bytes(report: ProfileReport) -> int | None:
    """The highest allocator level in the profiler's memory events (`--memory`), if any."""
    trace = report.trace
    if trace is None:
        return None
    levels = [m.total_allocated for m in trace.memory if m.total_allocated is not None]
    return max(levels) if levels else None


def _mfu(report: ProfileReport) -> float | None:
    """The model FLOPs utilisation the report carries, where it knows one (0..1)."""
    for owner in (report, report.summary):
        value = getattr(owner, "mfu", None)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


@functools.singledispatch
def headline(obj: object) -> dict[str, float]:
    """Return a result's headline scalars, units in their names (what trackers log)."""
    raise TypeError(f"gpuprof_nb has no export for a {type(obj).__name__}")


@headline.register
def _(report: ProfileReport) -> dict[str, float]:
    out: dict[str, float] = {}
    timing, summary = report.timing, report.summary
    step = None
    if timing is not None and timing.times_us:
        out["run_time_us"] = timing.median_us
        step = timing.median_step_us
    if step is None and summary is not None:
        step = summary.median_step_us
    if step is not None:
        out["step_time_us"] = step
    if summary is not None:
        out["window_us"] = summary.window_us
        out["device_busy_fraction"] = summary.busy_fraction
        out["steps_count"] = float(summary.step_count)
    mfu = _mfu(report)
    if mfu is not None:
        out["mfu_fraction"] = mfu
    peak = _peak_trace_bytes(report)
    if peak is not None:
        out["peak_memory_bytes"] = float(peak)
    if report.diagnosis is not None:
        out.update(_finding_scalars(report.diagnosis.findings))
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}


@headline.register
def _(report: MemoryReport) -> dict[str, float]:
    out = {
        "peak_memory_bytes": float(report.peak_bytes),
        "reserved_bytes": float(report.segments.reserved_bytes),
        "left_allocated_bytes": float(report.leaks.left_bytes),
        "ooms_count": float(len(report.ooms)),
    }
    growth = report.leaks.growth_bytes_per_step
    if growth is not None:
        out["growth_bytes_per_step"] = float(growth)
    out.update(_finding_scalars(report.findings))
    return {k: v for k, v in out.items() if math.isfinite(v)}


@headline.register
def _(report: RunReport) -> dict[str, float]:
    steps = [r.median_step_us for r in report.ranks if r.median_step_us is not None]
    waits = [r.wait_us for r in report.ranks if r.wait_us is not None]
    out = {
        "ranks_count": float(len(report.ranks)),
        "failed_ranks_count": float(len(report.failures)),
        "stragglers_count": float(len(report.stragglers)),
    }
    if steps:
        out["step_time_us"] = float(statistics.median(steps))
        out["slowest_rank_step_time_us"] = float(max(steps))
    if waits:
        out["max_wait_us"] = float(max(waits))
    if report.ranks:
        out["exposed_comm_us"] = float(max(r.exposed_comm_us for r in report.ranks))
    out.update(_finding_scalars(report.diagnosis.findings))
    return {k: v for k, v in out.items() if math.isfinite(v)}


@headline.register
def _(c: Comparison) -> dict[str, float]:
    before, after = c.median_step_us
    out: dict[str, float] = {}
    if before is not None:
        out["before_time_us"] = before
    if after is not None:
        out["after_time_us"] = after
    if c.speedup is not None:
        out["speedup_ratio"] = c.speedup
    v = c.verdict
    if v is not None:
        out["time_ratio"] = v.ratio
        out["time_ratio_ci_low"] = v.ci_low
        out["time_ratio_ci_high"] = v.ci_high
    out["findings_new_count"] = float(len(c.findings_new))
    out["findings_resolved_count"] = float(len(c.findings_resolved))
    return {k: float(val) for k, val in out.items() if math.isfinite(val)}


def _envelope(kind: str, obj: object, title: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "gpuprof_nb_version": __version__,
        "title": title,
        "headline": plain(headline(obj)),
    }


@functools.singledispatch
def record(obj: object) -> dict[str, Any]:
    """Return a result as the JSON-able record of the export schema (module docstring)."""
    raise TypeError(f"gpuprof_nb has no export for a {type(obj).__name__}")


@record.register
def _(report: ProfileReport) -> dict[str, Any]:
    timing = report.timing
    out = _envelope("profile", report, "Profile report")
    out["source"] = report.trace.source if report.trace is not None else None
    out["timing"] = (
        None
        if timing is None
        else {
            "samples_us": plain(timing.times_us),
            "clock": "device" if timing.device_us else "wall",
            "runs_per_sample": timing.number,
            "median_us": plain(timing.median_us),
            "min_us": plain(timing.min_us),
            "max_us": plain(timing.max_us),
            "iqr_us": plain(timing.iqr_us),
            "median_step_us": plain(timing.median_step_us),
            "steps_per_run": timing.steps_per_run,
            "device_name": timing.device_name,
            "noisy": timing.noisy,
        }
    )
    out["summary"] = plain(report.summary)
    out["diagnosis"] = _diagnosis(report.diagnosis)
    out["top_ops"] = (
        None
        if report.ops is None
        else {
            "sort_key": report.ops.sort_key,
            "rows": plain(report.ops.rows[:RECORD_ROWS]),
        }
    )
    out["kernels"] = None if report.kernels is None else plain(report.kernels.rows[:RECORD_ROWS])
    out["steps_us"] = (
        [plain(s.dur_us) for s in report.trace.steps] if report.trace is not None else []
    )
    out["notes"] = list(report.notes)
    return out


@record.register
def _(report: MemoryReport) -> dict[str, Any]:
    out = _envelope("memory", report, "Memory report")
    out["device"] = report.device
    out["at_peak"] = plain(report.at_peak)
    out["leaks"] = plain(report.leaks)
    seg = report.segments
    out["segments"] = {
        k: v for k, v in plain(seg).items() if k != "largest_segments"
    }  # the summary, not every segment
    out["ooms"] = plain(report.ooms)
    out["findings"] = [_finding(f) for f in report.findings]
    out["oom_message"] = report.oom_message
    return out


@record.register
def _(report: RunReport) -> dict[str, Any]:
    out = _envelope("run", report, "Distributed run")
    out["world_size"] = report.world_size
    out["ranks"] = plain(report.ranks)
    out["stragglers"] = list(report.stragglers)
    out["collectives"] = plain(report.collectives)
    out["diagnosis"] = _diagnosis(report.diagnosis)
    out["failures"] = list(report.failures)
    out["notes"] = list(report.notes)
    return out


@record.register
def _(c: Comparison) -> dict[str, Any]:
    from gpuprof_nb.render.compare import verdict_words

    out = _envelope("comparison", c, "Before and after")
    before, after = c.median_step_us
    v = c.verdict
    out.update(
        {
            "before_label": c.before_label,
            "after_label": c.after_label,
            "per": c.per,
            "before_time_us": plain(before),
            "after_time_us": plain(after),
            "verdict": None
            if v is None
            else {
                "kind": v.kind,
                "time_ratio": plain(v.ratio),
                "ci_low_ratio": plain(v.ci_low),
                "ci_high_ratio": plain(v.ci_high),
                "noise_floor_fraction": plain(v.noise_floor),
                "before_samples_count": v.before_samples,
                "after_samples_count": v.after_samples,
                "samples_from": c.samples_from,
            },
            "verdict_text": verdict_words(c),
            "verdict_note": c.verdict_note,
            "changes": [
                {**plain(r), "delta_us": plain(r.delta_us)} for r in c.changes[:RECORD_ROWS]
            ],
            "idle": [{**plain(d), "delta_us": plain(d.delta_us)} for d in c.idle],
            "memory_peak_bytes": list(c.memory_peak_bytes),
            "findings_resolved": [_finding(f) for f in c.findings_resolved],
            "findings_new": [_finding(f) for f in c.findings_new],
            "findings_still": [_finding(f) for f in c.findings_still],
            "notes": list(c.notes),
        }
    )
    return out
