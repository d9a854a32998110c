"""What holds a cell back: findings (kind, severity, evidence, fix) and the diagnosis that
orders them. Produced by analysis/diagnose.py and analysis/memory/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from gpuprof_nb.results.display import Displayable
from gpuprof_nb.results.invariants import ImpossibleValue, check_share, step_percents

# Every kind of finding (ARCHITECTURE.md's table): what holds a cell back, what a memory
# snapshot shows, and what a multi-rank run adds.
FindingKind = Literal[
    "dataloader",
    "host_sync",
    "launch_overhead",
    "python_overhead",
    "memory_bound",
    "compute_bound",
    "precision",
    "dtype_cast",
    "host_device_copy",
    "communication",
    "cold_start",
    "recompilation",
    "graph_break",
    "memory_growth",
    "fragmentation",
    "oom",
    "peak_memory",
    "straggler",
    "load_imbalance",
    "critical_path",
    "noisy_measurement",
]
Severity = Literal["high", "medium", "low", "info"]
FINDING_KINDS: tuple[FindingKind, ...] = get_args(FindingKind)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that holds the cell back. `evidence` maps names whose suffix is the unit
    (`_us`, `_fraction`, `_bytes`, `_bytes_per_s`, `_count`, `_per_step`, `_ratio`) to numbers
    from the trace; `share` is the fraction (0..1) of the profiled time fixing it could recover
    (for memory_growth: the fraction of the memory the window held at its peak, above its
    lowest level, that is growth)."""

    kind: FindingKind
    severity: Severity
    title: str
    evidence: Mapping[str, float] = field(default_factory=dict)
    fix: str = ""
    share: float = 0.0

    def __post_init__(self) -> None:
        owner = f"Finding({self.kind})"
        check_share(owner, "share", self.share)
        for name, value in self.evidence.items():
            if name.endswith("_fraction"):
                check_share(owner, f"evidence[{name!r}]", value)
        for pct in step_percents(self.title):
            if pct > 100:
                raise ImpossibleValue(f"{owner}.title says {pct:g}% of a step: {self.title!r}")


@dataclass(frozen=True, slots=True)
class Diagnosis(Displayable):
    """The findings about the steady state, most important first, what could not be judged,
    and a one-line verdict. `one_off` holds what the first run alone paid (cold_start),
    reported apart: it is not what holds the cell back run after run (under --once, where
    the first run is what was measured, it is a finding like any other). `considered` holds
    every rule that measured something, reported or not (below the reporting share), so its
    evidence is still at hand."""

    findings: tuple[Finding, ...] = ()
    not_judged: tuple[str, ...] = ()
    verdict: str = ""
    considered: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    one_off: tuple[Finding, ...] = ()

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def finding(self, kind: FindingKind) -> Finding | None:
        """Return the considered finding of one kind, reported or not, or None."""
        for f in self.considered:
            if f.kind == kind:
                return f
        return None
