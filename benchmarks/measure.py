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

import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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


def run_watched(
    argv: list[str],
    *,
    cap_bytes: int,
    timeout_s: float,
    poll_s: float,
    env: dict[str, str] | None = None,
    address_space_bytes: int | None = None,
) -> tuple[int, bytes, bytes, int]:
    """Run `argv` in a new session, reading its process tree's memory every `poll_s` seconds;
    kill the tree (RuntimeError saying why) past `cap_bytes` or `timeout_s`. With
    `address_space_bytes`, the child also runs under that RLIMIT_AS, so an allocation past it
    fails inside the child (MemoryError) instead of the child being killed from outside.
    Return (exit code, stdout, stderr, the tree's peak RSS seen)."""
    child_env = dict(os.environ if env is None else env, KINETO_LOG_LEVEL="6", MPLBACKEND="Agg")
    child_env["PYTHONHASHSEED"] = "0"

    def limit() -> None:
        if address_space_bytes is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))

    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env,
        start_new_session=True,
        preexec_fn=limit if address_space_bytes is not None else None,
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
    # Read stdout on a thread and stderr here, so a chatty child cannot block on a full pipe.
    out_box: list[bytes] = []
    reader = threading.Thread(
        target=lambda: out_box.append(proc.stdout.read() if proc.stdout else b""), daemon=True
    )
    reader.start()
    err = proc.stderr.read() if proc.stderr else b""
    reader.join()
    _, status, _usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    if killed_for:
        raise RuntimeError(f"killed: {killed_for} (peak seen {peak_tree / 2**30:.2f} GiB)")
    return proc.returncode, out_box[0] if out_box else b"", err, peak_tree


def _last_error_line(err: bytes) -> str:
    lines = err.decode(errors="replace").strip().splitlines() or ["(no message)"]
    # The exception line (the last) says what went wrong; the traceback is noise here.
    return lines[-1][:200]


def run_script(
    code: str,
    *args: str,
    cap_bytes: int = 12 * 2**30,
    timeout_s: float = 1800.0,
    poll_s: float = 0.05,
    python: str | None = None,
) -> Any:
    """Run `python -c code args...` as a watched child (memory cap, timeout: RuntimeError
    saying why) and return the JSON value on its last line of stdout (None when it printed
    nothing): what a comparison's own child code reports."""
    rc, out, err, _ = run_watched(
        [python or sys.executable, "-c", code, *args],
        cap_bytes=cap_bytes,
        timeout_s=timeout_s,
        poll_s=poll_s,
    )
    if rc != 0:
        raise RuntimeError(f"exit {rc}: {_last_error_line(err)}")
    lines = out.decode().strip().splitlines()
    return json.loads(lines[-1]) if lines else None


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
    env = dict(os.environ)
    if profile:
        env["GPUPROF_BENCH_PROFILE"] = "1"
    rc, out, err, peak_tree = run_watched(
        [python, str(HERE / "child.py"), mode, path],
        cap_bytes=cap_bytes,
        timeout_s=timeout_s,
        poll_s=poll_s,
        env=env,
    )
    if rc != 0:
        raise RuntimeError(f"exit {rc}: {_last_error_line(err)}")
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


# --------------------------------------------------------------------------------------------
# in-process timing and the numbers every section prints


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of `repeats` calls of `fn` (perf_counter), and the last call's value."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def interleaved(
    approaches: dict[str, Callable[[], Any]], repeats: int, *, collect: bool = True
) -> dict[str, list[float]]:
    """Seconds per call of each approach, round-robin (one call of each per round) so a slow
    spell of a shared machine falls on all of them alike; an untimed gc.collect() before each
    call unless `collect` is false."""
    times: dict[str, list[float]] = {label: [] for label in approaches}
    for _ in range(repeats):
        for label, fn in approaches.items():
            if collect:
                gc.collect()
            t0 = time.perf_counter()
            result = fn()
            times[label].append(time.perf_counter() - t0)
            del result
    return times


def precision(values: list[float]) -> float:
    """Standard error of a median of `values` (normal approximation from the IQR)."""
    if len(values) < 4:
        return float("nan")
    q1, _, q3 = statistics.quantiles(values, n=4)
    return 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(values))


def ratios(values: list[int] | list[float], reference: list[int] | list[float]) -> list[float]:
    """Each round's value over the same round's reference, less one (+0.05 = 5% more)."""
    return [v / r - 1 for v, r in zip(values, reference, strict=True)]


def pct(values: list[float]) -> str:
    """The median of per-round ratios as a signed percentage, ± its standard error."""
    error = precision(values)
    spread = f" (± {error:.1%})" if not math.isnan(error) else ""
    return f"{statistics.median(values):+.1%}{spread}"


def fmt_s(seconds: float) -> str:
    """A duration for a table: '4.2 ms', '412 ms', '2.07 s'; '-' for nan (not measured)."""
    if seconds != seconds:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
