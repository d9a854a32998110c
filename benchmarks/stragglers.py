"""Comparison 9: is the straggler named, and only when there is one?

Real 4-process gloo DDP jobs on this machine's CPU (tools/record_gloo_run.py: 8 profiled
steps, every rank writes its own trace), alternately with one rank planted 50 ms slow per
step (the slow rank moves round the ranks) and balanced, each read by `analyze_run`:
- planted: the slow rank must be first in `.stragglers` with a `straggler` finding;
- balanced: `straggler` must not be the first finding (and how often any straggler is
  named is reported).
Four processes share two cores, so arrival order at every collective is noisy: the harshest
setting the rule meets here.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.config import BenchConfig, Section, Target

REPO = Path(__file__).resolve().parent.parent
RANKS = 4


def _record(out: Path, slow_rank: int) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from record_gloo_run import record

    record(out, ranks=RANKS, slow_rank=slow_rank)


def run(cfg: BenchConfig) -> Section:
    from gpuprof_nb.session.distributed import analyze_run

    n = 2 if cfg.quick else 10
    rows: list[tuple[str, str, str, str]] = []
    planted_ok = balanced_ok = balanced_none = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            slow = i % RANKS
            for kind, rank in (("planted", slow), ("balanced", -1)):
                out = Path(tmp) / f"{kind}{i}"
                _record(out, rank)
                report = analyze_run(out, progress=False)
                first = report.diagnosis.findings[0].kind if report.diagnosis.findings else "-"
                if kind == "planted":
                    ok = report.stragglers[:1] == (slow,) and any(
                        f.kind == "straggler" for f in report.diagnosis.findings
                    )
                    planted_ok += ok
                else:
                    ok = first != "straggler"
                    balanced_ok += ok
                    balanced_none += not report.stragglers
                rows.append(
                    (
                        f"{kind} (slow rank {rank})" if rank >= 0 else kind,
                        ", ".join(map(str, report.stragglers)) or "none",
                        first,
                        "yes" if ok else "**no**",
                    )
                )
                shutil.rmtree(out)
    elapsed = time.perf_counter() - t0
    lines = [
        f"{n} planted and {n} balanced {RANKS}-rank jobs, alternating ({elapsed:.0f} s in "
        "all). The rule is in docs/distributed.md.",
        "",
        "| job | stragglers | first finding | as expected |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines += ["", f"Balanced jobs with no straggler named at all: {balanced_none} of {n}."]
    targets = (
        Target(
            "planted slow rank first in .stragglers, with a straggler finding",
            f"{planted_ok} of {n}",
            f"{n} of {n}",
            planted_ok == n,
        ),
        Target(
            "balanced twin: straggler not the first finding",
            f"{balanced_ok} of {n}",
            f"{n} of {n}",
            balanced_ok == n,
        ),
    )
    return Section("9. Stragglers named", "\n".join(lines), targets)
