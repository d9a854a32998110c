"""The public front end of the analyses (`gpuprof_nb.analyze`, `analyze_memory`,
`analyze_batches`, `compare`): what users hand them, read into the model, analysed."""

from __future__ import annotations

from gpuprof_nb.analysis.compare import compare
from gpuprof_nb.analysis.gate import check_threshold, regression_gate
from gpuprof_nb.analysis.report import analyze, analyze_batches, analyze_memory

__all__ = [
    "analyze",
    "analyze_batches",
    "analyze_memory",
    "check_threshold",
    "compare",
    "regression_gate",
]
