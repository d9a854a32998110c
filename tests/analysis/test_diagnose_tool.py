"""tools/diagnose_shared_traces.py: one Markdown line per trace, device names from the file."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from gpuprof_nb.analysis.diagnose import diagnose
from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.io.trace import load_trace

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TRACES = [
    DATA / "a100_multistream_sync" / "event_sync_trace.json.gz",
    DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz",
]


def load_tool():
    spec = importlib.util.spec_from_file_location(
        "diagnose_shared_traces", REPO / "tools" / "diagnose_shared_traces.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_writes_one_line_per_trace(tmp_path, capsys):
    tool = load_tool()
    out = tmp_path / "doc.md"
    assert tool.main(["--traces", str(DATA), "--out", str(out), *map(str, TRACES)]) == 0
    assert "2 traces" in capsys.readouterr().out
    rows = [line for line in out.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) == 2
    for path, row in zip(TRACES, rows, strict=True):
        rel = path.relative_to(DATA).as_posix()
        assert row.startswith(f"| `{rel}` |")
        with gzip.open(path, "rt") as fh:
            props = json.load(fh).get("deviceProperties") or []
        if props:
            assert props[0]["name"] in row
        else:
            assert "no device properties" in row
        trace = load_trace(path)
        d = diagnose(trace, roofline=compute_roofline(trace))
        assert d.findings[0].kind in row
        assert d.verdict.replace("|", "\\|") in row


def test_cells_escape_pipes():
    tool = load_tool()
    assert tool.cell("a|b\nc") == "a\\|b c"
