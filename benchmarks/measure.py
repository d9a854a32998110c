"""Run one approach in a child process and measure its time and peak memory.

Peak memory is the larger of (a) the child's own high-water RSS (VmHWM, reported by the
child as it exits; ru_maxrss is not used because Linux carries the parent's high-water mark
into it across fork+exec) and (b) the largest sum of RSS over the child and all its
descendants, sampled from /proc every 20 ms (HTA parses in a forked worker, which (a)
does not see).
A child whose tree exceeds `cap_bytes` is killed and reported as such, so a runaway
comparison cannot take the shared machine's memory.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Run:
    """One child run: work seconds (imports excluded), peak bytes, facts it reported."""

    seconds: float
    peak_rss_bytes: int
    baseline_rss_bytes: int
    stages: dict[str, float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Several runs of one approach on one input, or why it failed."""

    label: str
    runs: tuple[Run, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.runs)

    @property
    def median_seconds(self) -> float:
        return statistics.median(r.seconds for r in self.runs) if self.runs else float("nan")

    @property
    def peak_rss_bytes(self) -> int:
        return max((r.peak_rss_bytes for r in self.runs), default=0)

    @property
    def baseline_rss_bytes(self) -> int:
        return min((r.baseline_rss_bytes for r in self.runs), default=0)

    def median_stage(self, name: str) -> float:
        values = [r.stages[name] for r in self.runs if name in r.stages]
        return statistics.median(values) if values else float("nan")

    @property
    def facts(self) -> dict[str, Any]:
        return self.runs[-1].facts if self.runs else {}


def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _tree_rss_bytes(root: int) -> int:
    tree = _children_of()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(tree.get(pid, ()))
    return total


def run_child(
    python: str,
    mode: str,
    path: str,
    *,
    cap_bytes: int,
    timeout_s: float = 1800.0,
    profile: bool = False,
    poll_s: float = 0.02,
) -> Run:
    """Run `child.py MODE PATH` with `python`; raise RuntimeError with the reason on failure.
    With `profile`, the child runs under cProfile and reports its hotspots in the facts.
    The process tree's memory is read every `poll_s` seconds (each read costs about 2 ms of
    CPU: a longer interval for long runs that must leave every core to the child)."""
    env = dict(os.environ, KINETO_LOG_LEVEL="6", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    if profile:
        env["GPUPROF_BENCH_PROFILE"] = "1"
    proc = subprocess.Popen(
        [python, str(HERE / "child.py"), mode, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    peak_tree = 0
    killed_for = ""
    done = threading.Event()

    def watch() -> None:
        nonlocal peak_tree, killed_for
        start = time.monotonic()
        while not done.wait(poll_s):
            rss = _tree_rss_bytes(proc.pid)
            peak_tree = max(peak_tree, rss)
            if rss > cap_bytes:
                killed_for = f"exceeded the {cap_bytes / 2**30:.1f} GiB memory cap"
            elif time.monotonic() - start > timeout_s:
                killed_for = f"ran over {timeout_s:.0f} s"
            if killed_for:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # Read the pipes before reaping so a chatty child cannot block on a full pipe.
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    _, status, _usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    if killed_for:
        raise RuntimeError(f"killed: {killed_for} (peak seen {peak_tree / 2**30:.2f} GiB)")
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or ["(no message)"]
        # The exception line (the last) says what went wrong; the traceback is noise here.
        raise RuntimeError(f"exit {proc.returncode}: {lines[-1][:200]}")
    line = out.decode().strip().splitlines()[-1]
    report = json.loads(line)
    peak = max(peak_tree, int(report.get("peak_rss_bytes", 0)))
    return Run(
        seconds=float(report["seconds"]),
        peak_rss_bytes=peak,
        baseline_rss_bytes=int(report["baseline_rss_bytes"]),
        stages=dict(report["stages"]),
        facts=dict(report["facts"]),
    )


def measure(
    label: str, python: str, mode: str, path: str, *, repeats: int, cap_bytes: int
) -> Outcome:
    """Run an approach `repeats` times; the first failure stops it and is reported."""
    runs: list[Run] = []
    for _ in range(repeats):
        try:
            runs.append(run_child(python, mode, path, cap_bytes=cap_bytes))
        except (RuntimeError, ValueError, OSError) as exc:
            return Outcome(label, tuple(runs), error=str(exc))
    return Outcome(label, tuple(runs))


def measure_interleaved(
    approaches: list[tuple[str, str, str]],
    path: str,
    *,
    repeats: int,
    cap_bytes: int,
    poll_s: float = 0.02,
) -> dict[str, Outcome]:
    """Run each approach (label, python, mode) `repeats` times, round-robin (one run of each
    per round), so a slow spell of a shared machine falls on all of them alike; an approach
    stops at its first failure, which is reported."""
    runs: dict[str, list[Run]] = {label: [] for label, _, _ in approaches}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for label, python, mode in approaches:
            if label in errors:
                continue
            try:
                runs[label].append(
                    run_child(python, mode, path, cap_bytes=cap_bytes, poll_s=poll_s)
                )
            except (RuntimeError, ValueError, OSError) as exc:
                errors[label] = str(exc)
    return {
        label: Outcome(label, tuple(runs[label]), error=errors.get(label))
        for label, _, _ in approaches
    }


def hotspot_lines(run: Run, limit: int = 6) -> list[str]:
    """Markdown rows `| function | calls | own s | cumulative s |` from a profiled run."""
    rows = ["| function | calls | own time | cumulative |", "|---|---|---|---|"]
    for name, calls, own, cum in run.facts.get("hotspots", [])[:limit]:
        rows.append(f"| `{name}` | {calls} | {own:.2f} s | {cum:.2f} s |")
    return rows


def this_python() -> str:
    return sys.executable
