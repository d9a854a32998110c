"""The diagnosis rules, one module per family: each rule measures one kind of bottleneck from
the trace (and the run timings when given) and returns a Finding with its evidence and the
share of the profiled time fixing it could recover, or None when the trace holds nothing to
judge. The rules share a Context computed once per trace (context.py); analysis/diagnose.py
runs them, in the order of RULES below, and orders what they find.

- input_pipeline: dataloader, host_device_copy
- sync: host_sync
- overhead: launch_overhead and python_overhead
- compute: compute_bound, memory_bound, precision, dtype_cast
- communication: communication
- cold_start: cold_start
- compilation: recompilation
- memory_growth: memory_growth
"""

from __future__ import annotations

from gpuprof_nb.analysis.rules.cold_start import (
    _median_without,
    cold_ops_idle_us,
    is_profiler_start_up,
    rule_cold_start,
)
from gpuprof_nb.analysis.rules.communication import rule_communication
from gpuprof_nb.analysis.rules.compilation import compile_spans, rule_recompilation
from gpuprof_nb.analysis.rules.compute import (
    FP32_KERNEL_MARKS,
    _gemm_ops_with_ids,
    compute_capability,
    rule_compute_memory_precision,
    rule_dtype_cast,
)
from gpuprof_nb.analysis.rules.context import (
    Context,
    duration_words,
    make_finding,
    severity_of,
    unrecorded_device_words,
)
from gpuprof_nb.analysis.rules.input_pipeline import rule_dataloader, rule_host_device_copy
from gpuprof_nb.analysis.rules.memory_growth import _memory_series, rule_memory_growth
from gpuprof_nb.analysis.rules.overhead import rule_launch_and_python
from gpuprof_nb.analysis.rules.sync import rule_host_sync

# The rules in the order diagnose runs them (findings with equal sort keys keep this order).
RULES = (
    rule_dataloader,
    rule_host_sync,
    rule_launch_and_python,
    rule_compute_memory_precision,
    rule_dtype_cast,
    rule_host_device_copy,
    rule_communication,
    rule_cold_start,
    rule_recompilation,
    rule_memory_growth,
)

__all__ = [
    "FP32_KERNEL_MARKS",
    "RULES",
    "Context",
    "_gemm_ops_with_ids",
    "_median_without",
    "_memory_series",
    "cold_ops_idle_us",
    "compile_spans",
    "compute_capability",
    "duration_words",
    "is_profiler_start_up",
    "make_finding",
    "rule_cold_start",
    "rule_communication",
    "rule_compute_memory_precision",
    "rule_dataloader",
    "rule_dtype_cast",
    "rule_host_device_copy",
    "rule_host_sync",
    "rule_launch_and_python",
    "rule_memory_growth",
    "rule_recompilation",
    "severity_of",
    "unrecorded_device_words",
]
