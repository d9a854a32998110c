"""Record the planted bottlenecks of tests/analysis/test_diagnose_planted.py once, on CPU,
into tests/data/planted_cpu/<kind>.json.gz: real torch.profiler traces the unit tests replay.

The diagnosis of a live recording depends on how fast the machine ran it (a thread paused
between two tiny ops turns a dispatch gap into a "Python" gap), so the unit tests judge
these fixed recordings; how steady the first finding stays on a loaded machine is measured
in benchmarks/first_finding.py. Record on an idle machine; the script checks that each
recording gets its planted kind first and refuses to write one that does not.

Run: KINETO_LOG_LEVEL=6 .venv/bin/python tools/record_planted.py [OUT_DIR]
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PLANTED = REPO / "tests" / "analysis" / "test_diagnose_planted.py"
DEFAULT_OUT = REPO / "tests" / "data" / "planted_cpu"


def planted_module() -> Any:
    """The planted-cell test module, loaded by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpuprof_planted", PLANTED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    from gpuprof_nb.analysis.diagnose import diagnose

    out = Path(argv[0]) if argv else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    planted = planted_module()
    failed = []
    for kind, cell, memory in planted.CASES + [("compute_bound", planted.big_matmul_cell, False)]:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                trace = planted.record(cell, Path(tmp), memory=memory)
            finally:
                planted.NAMESPACE.clear()
            first = diagnose(trace).findings[0].kind
            if first != kind:
                failed.append(f"{kind}: recorded a trace whose first finding is {first}")
                continue
            target = out / f"{kind}.json.gz"
            raw = Path(tmp, "trace.json").read_bytes()
            json.loads(raw)  # a whole JSON document, as exported
            with open(target, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
                gz.write(raw)
            print(
                f"{target.relative_to(REPO)}: {target.stat().st_size:,} bytes, first "
                f"finding {first}"
            )
    for line in failed:
        print("NOT WRITTEN:", line, "(a loaded machine? record again when idle)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
