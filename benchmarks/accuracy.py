"""Comparison 2: does %%gpuprofile's median agree with torch.utils.benchmark?

Same statement, same shell namespace: `%%gpuprofile --quiet -o r` (default warm-up 1,
repeat 3, then its profiled run) gives `r.timing.median_us`; `Timer(stmt).blocked_autorange()`
gives its median. Each pair is measured back to back, `rounds` times; the table shows the
median of the per-round ratios and the worst round.
"""

from __future__ import annotations

import statistics

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.shell import SETUP, run_cell, start_shell

# name -> (setup size n, statement). Small: tens of microseconds per run, where fixed
# per-run costs (exec, clock reads) show; large: tens of milliseconds.
STATEMENTS_FULL = {
    "small (one 64x64 matmul + add)": (64, "y = (a @ b) + 1"),
    "medium (2 matmuls 256x256)": (256, "for _ in range(2):\n    y = a @ b"),
    "large (4 matmuls 512x512)": (512, "for _ in range(4):\n    y = a @ b"),
}
STATEMENTS_QUICK = {
    "small (one 64x64 matmul + add)": (64, "y = (a @ b) + 1"),
    "large (2 matmuls 256x256)": (256, "for _ in range(2):\n    y = a @ b"),
}

TIMER_CELL = """
import torch.utils.benchmark as _tb
_m = _tb.Timer(stmt={stmt!r}, globals=globals(), num_threads=torch.get_num_threads())
_m = _m.blocked_autorange(min_run_time={min_s})
_timer_median_us = _m.median * 1e6
"""


def compare(shell: object, stmt: str, *, repeat: int, min_s: float) -> tuple[float, float, int]:
    """One back-to-back pair: (gpuprofile median us, Timer median us, gpuprofile's runs per
    sample)."""
    run_cell(shell, f"%%gpuprofile --quiet --repeat {repeat} -o _acc\n{stmt}\n")
    run_cell(shell, TIMER_CELL.format(stmt=stmt, min_s=min_s))
    ns = shell.user_ns  # type: ignore[attr-defined]
    timing = ns["_acc"].timing
    return float(timing.median_us), float(ns["_timer_median_us"]), int(timing.number)


def run(cfg: BenchConfig) -> Section:
    shell = start_shell()
    statements = STATEMENTS_QUICK if cfg.quick else STATEMENTS_FULL
    # More rounds than elsewhere: Timer's long blocks catch preemption on a busy machine.
    rounds = cfg.repeats if cfg.quick else max(cfg.repeats, 5)
    min_s = 0.05 if cfg.quick else 0.3
    lines = [
        f"torch threads: {cfg.threads}. Per statement, {rounds} back-to-back rounds of "
        "`%%gpuprofile --quiet -o r` "
        "(its defaults: a warm-up of at least 1 run and about 5 ms, --repeat 3; and with "
        "--repeat 10; a statement under "
        "0.5 ms per run is timed like Timer does, in samples of K back-to-back runs of about "
        "1 ms, K shown below) and "
        f"`torch.utils.benchmark.Timer(stmt, num_threads=torch.get_num_threads())"
        f".blocked_autorange(min_run_time={min_s})`; ratio = gpuprofile median / Timer median. "
        "(Timer defaults to ONE thread while a notebook cell runs with all of them: left at "
        "its default it reports a different workload, 2-3x slower on this machine.)",
        "",
        "| statement | --repeat | runs per sample | gpuprofile median | Timer median "
        "| ratio (median of rounds) | worst round |",
        "|---|---|---|---|---|---|---|",
    ]
    worst_by_repeat: dict[int, float] = {}
    per_run_gap_us: list[tuple[str, float]] = []
    for name, (n, stmt) in statements.items():
        run_cell(shell, SETUP.format(n=n, threads=cfg.threads))
        for repeat in (3, 10):
            triples = [compare(shell, stmt, repeat=repeat, min_s=min_s) for _ in range(rounds)]
            pairs = [(ours, timer) for ours, timer, _ in triples]
            numbers = sorted({k for _, _, k in triples})
            ratios = [ours / timer for ours, timer in pairs]
            ratio = statistics.median(ratios)
            worst = max(ratios, key=lambda r: abs(r - 1))
            worst_by_repeat[repeat] = max(worst_by_repeat.get(repeat, 0.0), abs(ratio - 1))
            if repeat == 10:
                per_run_gap_us.append((name, statistics.median(o - t for o, t in pairs)))
            per_sample = (
                "-".join(str(k) for k in (numbers[0], numbers[-1]))
                if len(numbers) > 1
                else str(numbers[0])
            )
            lines.append(
                f"| {name} | {repeat} | {per_sample} "
                f"| {statistics.median(p[0] for p in pairs):.1f} us "
                f"| {statistics.median(p[1] for p in pairs):.1f} us | {ratio:.3f} "
                f"| {worst:.3f} |"
            )
    if any(dev > 0.05 for dev in worst_by_repeat.values()) and per_run_gap_us:
        lines += [
            "",
            "- Where the ratio is off, the difference per run is: "
            + "; ".join(f"{name}: {gap:+.1f} us" for name, gap in per_run_gap_us)
            + ". Statements of "
            "0.5 ms or more run once per sample (3 samples at the default --repeat), so "
            "their medians carry the machine's run-to-run noise; Timer takes the median of "
            "hundreds of blocks.",
        ]
    targets = tuple(
        Target(
            f"gpuprofile median vs Timer (--repeat {rep}, worst statement)",
            f"{dev:.1%} off",
            "within 5%",
            dev <= 0.05,
        )
        for rep, dev in sorted(worst_by_repeat.items())
    )
    return Section("2. Timing accuracy", "\n".join(lines), targets)
