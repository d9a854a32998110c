"""Comparison 7: does the before/after verdict know noise?

Twenty pairs of `%%gpuprofile --quiet -o r` runs (the magic's defaults: warm-up, 3 timed
runs, one profiled run) in the in-process shell, each pair compared with
`gpuprof_nb.compare`:
- the same cell twice: the verdict must be "no clear change" in at least 19 of 20 pairs;
- the cell, then the same cell doing 1.5x the work (a planted slowdown): "slower" in 20 of 20.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.shell import SETUP, run_cell, start_shell

# Four 256x256 matmuls (a few ms here); the planted slowdown does six.
CELL = "for _ in range({k}):\n    y = a @ b"
BASE_K, SLOW_K = 4, 6


def pairs(shell: object, n: int, k_after: int) -> list[tuple[str, float]]:
    """Run n pairs (base cell, then a cell of `k_after` matmuls); return each verdict's kind
    and the ratio of medians after/before."""
    from gpuprof_nb.analysis.compare import compare

    ns = shell.user_ns  # type: ignore[attr-defined]
    out = []
    for _ in range(n):
        run_cell(shell, f"%%gpuprofile --quiet -o _before\n{CELL.format(k=BASE_K)}\n")
        run_cell(shell, f"%%gpuprofile --quiet -o _after\n{CELL.format(k=k_after)}\n")
        c = compare(ns["_before"], ns["_after"])
        assert c.verdict is not None
        out.append((c.verdict.kind, c.verdict.ratio))
    return out


def run(cfg: BenchConfig) -> Section:
    shell = start_shell()
    run_cell(shell, SETUP.format(n=256, threads=cfg.threads))
    n = 3 if cfg.quick else 20
    t0 = time.perf_counter()
    same = pairs(shell, n, BASE_K)
    slow = pairs(shell, n, SLOW_K)
    elapsed = time.perf_counter() - t0
    quiet = sum(1 for kind, _ in same if kind == "no clear change")
    caught = sum(1 for kind, _ in slow if kind == "slower")
    lines = [
        f"torch threads: {cfg.threads}. {n} pairs of `%%gpuprofile --quiet -o r` runs "
        f"(defaults: warm-up, 3 timed runs, one profiled run) of `{BASE_K}` 256x256 matmuls, "
        f"then either the same cell or one doing `{SLOW_K}` (1.5x the work); each pair "
        f"compared with `gpuprof_nb.compare` ({elapsed:.0f} s in all). The verdict's method "
        "is in docs/compare.md.",
        "",
        "| pairs | verdicts | ratio of medians after/before (median, range) |",
        "|---|---|---|",
    ]
    for what, got in (("same cell twice", same), ("1.5x the work after", slow)):
        kinds = {
            k: sum(1 for kind, _ in got if kind == k)
            for k in ("no clear change", "slower", "faster")
        }
        ratios = [r for _, r in got]
        lines.append(
            f"| {what} | "
            + ", ".join(f"{k}: {v}" for k, v in kinds.items() if v)
            + f" | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
        )
    need = max(n - 1, 1) if n >= 20 else n - 1
    targets = (
        Target(
            "same cell twice: no clear change",
            f"{quiet} of {n}",
            f">= {need} of {n}",
            quiet >= need,
        ),
        Target("planted 1.5x slowdown: slower", f"{caught} of {n}", f"{n} of {n}", caught == n),
    )
    return Section("7. Before/after verdict and noise", "\n".join(lines), targets)
