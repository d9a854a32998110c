"""PLACEHOLDER (owned by the diagnosis work): Diagnosis and Timeline sections."""

from __future__ import annotations

from gpuprof_nb.analysis.diagnose import Diagnosis
from gpuprof_nb.analysis.timeline import Timeline
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.render.html import esc
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.units import fmt_pct


def diagnosis_section(diagnosis: Diagnosis) -> Section:
    lines = [f"[{f.severity}] {f.title}" for f in diagnosis.findings] or ["No findings."]
    return Section("Diagnosis", "\n".join(lines), "<br>".join(esc(x) for x in lines))


def timeline_section(timeline: Timeline, trace: Trace) -> Section:
    text = f"device busy {fmt_pct(timeline.busy_fraction)} of the window"
    return Section("Timeline", text, esc(text))
