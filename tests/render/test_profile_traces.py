"""The whole report (analyze + every section, text and HTML) on every real trace copied
into tests/data: nothing raises, no section fails, and the summary agrees with the trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.render.units import fmt_num

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted(p for p in DATA.glob("*/*") if p.name.endswith((".json", ".json.gz")))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name)
def test_full_report_renders(path: Path) -> None:
    try:
        trace = load_trace(path)
    except TraceFormatError:
        pytest.skip(f"{path.name} is not a trace (a loader error case)")
    report = analyze(trace, top=5)
    assert not [n for n in report.notes if "could not be computed" in n], report.notes
    bundle = report._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    assert "could not render this section" not in text
    assert "-- Summary --" in text and "Summary" in html
    # Kernel count (an independent plain count over the model) shows in the Kernels caption.
    if trace.kernels:
        assert f"{fmt_num(len(trace.kernels))} device activities" in text
    else:
        assert re.search(r"GPU busy\s+(n/a|not judged)", text)
