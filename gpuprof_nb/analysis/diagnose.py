"""PLACEHOLDER (owned by the diagnosis work): findings about what holds a cell back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuprof_nb.model.trace import Trace


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    severity: str  # "high" | "medium" | "low" | "info"
    title: str
    evidence: Mapping[str, float] = field(default_factory=dict)
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    findings: tuple[Finding, ...] = ()
    not_judged: tuple[str, ...] = ()


def diagnose(trace: Trace) -> Diagnosis:
    """Return the findings for a trace, most important first (placeholder: none)."""
    return Diagnosis()
