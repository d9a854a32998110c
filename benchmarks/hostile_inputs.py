"""Comparison 12: hostile inputs. The worst case of each family of the outside battery
(issue 33) is built here, opened the way a user would in a fresh child process, and measured:
the outcome (the library's own error, or a report), wall time and peak memory, against the
input's size. The target: an input under 10 MB takes at most 500 MB and 10 s; none crashes
or hangs. Larger inputs (a 200 MB NUL-padded file, a big trace to save) are measured to show
memory follows the input's real content, not its size or its claims.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import run_watched

REPO = Path(__file__).resolve().parent.parent
MB = 2**20
LIMIT_BYTES = 500 * MB
LIMIT_SECONDS = 10.0
SMALL_INPUT = 10 * MB

# The child: imports, then the case's code; prints outcome, seconds, peak and baseline RSS.
_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
import gpuprof_nb
from gpuprof_nb import GpuprofError
import gpuprof_nb.render.display  # the display's own imports, outside the measured work
ns = {"gpuprof_nb": gpuprof_nb}
exec(sys.argv[3], ns)  # the case's set-up (loads a trace to save, ...), not measured
base = rss()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM restarts from here: the peak is the case's own
except OSError:
    pass
t = time.perf_counter()
try:
    exec(sys.argv[2], ns)
    result = ns.get("result")
    if hasattr(result, "_repr_mimebundle_"):
        bundle = result._repr_mimebundle_()
        json.dumps(bundle)
        outcome = f"report ({len(bundle['text/html']) / 2**20:.2f} MB of HTML)"
    else:
        outcome = "done"
except GpuprofError as exc:
    outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
except BaseException as exc:
    outcome = f"RAW {type(exc).__name__}: {str(exc)[:90]}"
seconds = time.perf_counter() - t
print(json.dumps({"outcome": outcome, "seconds": seconds, "peak": peak(), "base": base}))
"""


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _snapshot_cases(d: Path, quick: bool) -> list[tuple[str, Path, str]]:
    deep = 100_000 if quick else 1_000_000
    memo = d / "memo.pickle"
    memo.write_bytes(b"\x80\x02N" + b"r" + struct.pack("<I", 2**28) + b"0N." + b"\0" * 12)
    key = d / "deep_key.pickle"
    key.write_bytes(b"\x80\x04}K\x01" + b"\x85" * deep + b"Ns.")
    action = d / "deep_action.pickle"
    entry = b"}" + _s("action") + b"K\x01" + b"\x85" * deep + b"s"
    action.write_bytes(
        b"\x80\x04}(" + _s("segments") + b"]" + _s("device_traces") + b"](](" + entry + b"eeu."
    )
    frame = d / "frame_2_63.pickle"
    frame.write_bytes(b"\x80\x04\x95" + struct.pack("<Q", 2**63 - 1) + b"N.")
    long = d / "long_frame.pickle"
    big = "x" * 1_500_000
    entries = [
        {
            "action": "alloc",
            "addr": 512 * i,
            "size": 512,
            "stream": 0,
            "frames": [{"filename": big, "line": i, "name": "f"}],
        }
        for i in range(300 if quick else 3_000)
    ]
    long.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=4))
    bomb = d / "snapshot_bomb.pickle.gz"
    with gzip.open(bomb, "wb") as f:
        for _ in range(50 if quick else 2_000):
            f.write(b"\x00" * MB)
    load = "result = gpuprof_nb.analyze_memory(gpuprof_nb.load_snapshot({!r}))"
    return [
        ("snapshot: memo index 2**28", memo, load),
        (f"snapshot: tuple {deep:,} deep as a dict key", key, load),
        (f"snapshot: tuple {deep:,} deep as 'action'", action, load),
        ("snapshot: FRAME of 2**63 bytes", frame, load),
        ("snapshot: 1.5 MB frame name shared by every frame", long, load),
        ("snapshot: gzip bomb (NUL)", bomb, load),
    ]


def _op(name: str, ts: int) -> str:
    return json.dumps(
        {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1}
    )


def _trace_cases(d: Path, quick: bool) -> list[tuple[str, Path, str]]:
    nul_mb = 20 if quick else 200
    nul = d / "nul.json"
    with open(nul, "wb") as f:
        f.write(b'{"traceEvents": [')
        for _ in range(nul_mb):
            f.write(b"\x00" * MB)
    nul_gz = d / "nul.json.gz"
    events_gz = d / "events_bomb.json.gz"
    row = (_op("aten::mm", 1) + ", ").encode() * 1000
    with gzip.open(nul_gz, "wb") as f:
        f.write(b'{"traceEvents": [')
        for _ in range(50 if quick else 2_000):
            f.write(b"\x00" * MB)
    with gzip.open(events_gz, "wb") as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [')
        for _ in range(100 if quick else 5_000):
            f.write(row)
        f.write(_op("aten::mm", 1).encode() + b"]}")
    cut_gz = d / "events_bomb_cut.json.gz"
    raw = events_gz.read_bytes()
    cut_gz.write_bytes(raw[: len(raw) // 2])
    long_op = d / "long_op.json"
    name = "aten::" + "x" * (1_000_000 if quick else 10_000_000)
    long_op.write_text('{"schemaVersion": 1, "traceEvents": [' + _op(name, 1) + "]}")
    kernel = d / "long_kernel.json"
    kname = "void k<" + "int," * (40_000 if quick else 400_000) + ">()"
    events = [
        _op("aten::mm", 1),
        json.dumps(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kname,
                "pid": 0,
                "tid": 7,
                "ts": 2,
                "dur": 1,
                "args": {"device": 0, "stream": 7, "correlation": 1},
            }
        ),
    ]
    kernel.write_text('{"schemaVersion": 1, "traceEvents": [' + ", ".join(events) + "]}")
    deep = d / "deep_events.json"
    deep.write_text('{"traceEvents": [' + _op("aten::mm", 1) + ", " + "[" * 200_000)
    load = "result = gpuprof_nb.analyze(gpuprof_nb.load_trace({!r}))"
    return [
        (f'trace: {{"traceEvents": [ + {nul_mb} MB of NUL', nul, load),
        ("trace: the same NUL padding gzipped (a bomb)", nul_gz, load),
        ("trace: gzip bomb of repeated events", events_gz, load),
        ("trace: that bomb cut in half (truncated gzip)", cut_gz, load),
        (f"trace: op name of {len(name):,} characters", long_op, load),
        (f"trace: kernel name of {len(kname):,} characters", kernel, load),
        ("trace: events nested 200,000 deep", deep, load),
    ]


def _other_cases(d: Path, quick: bool) -> list[tuple[str, Path, str]]:
    fifo = d / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    ladder = d / "ladder.json"
    rung = {
        "name": "r",
        "settings": "s",
        "status": "kept",
        "reason": "",
        "samples_per_step": 8,
        "step_times_us": [500.0] * 20,
    }
    ladder.write_text(
        json.dumps(
            {
                "format": "gpuprof_nb.ladder/1",
                "device_name": "cpu",
                "memory_method": "m",
                "steps": 20,
                "warmup": 1,
                "batch_size": 8,
                "seed": 0,
                "loss_tolerance": 0.05,
                "rungs": [dict(rung, name="fp32", status="baseline")]
                + [dict(rung, name=f"r{i}") for i in range(999)],
            }
        )
    )
    return [
        ("FIFO as a trace path", fifo, "result = gpuprof_nb.load_trace({!r})"),
        ("FIFO as a snapshot path", fifo, "result = gpuprof_nb.load_snapshot({!r})"),
        ("FIFO as a ladder file", fifo, "result = gpuprof_nb.ladder.load({!r})"),
        ("ladder file of 1,000 rungs", ladder, "result = gpuprof_nb.ladder.load({!r})"),
    ]


_COMBINE = """
from gpuprof_nb.analysis.distributed import combine
from gpuprof_nb.results.distributed import RankSummary
calls = (("allreduce", tuple(float(i % 7 + 1) for i in range({n}))),)
ranks = [RankSummary(rank=r, source=f"rank-{{r}}", world_size=8, device="cpu",
         on_device=False, steps=10, median_step_us=1e3, window_us=1e6, busy_us=5e5,
         compute_us=4e5, comm_us=1e5, exposed_comm_us=5e4, collective_calls=calls)
         for r in range(8)]
"""


def _run_case(code: str, setup: str, cap_bytes: int, timeout: float) -> dict[str, object]:
    """The case in a child under RLIMIT_AS `cap_bytes` (an allocation past it fails in the
    child, as a MemoryError it reports) and a `timeout`; a crash or hang is its outcome."""
    started = time.perf_counter()
    try:
        rc, out, err, _ = run_watched(
            [sys.executable, "-c", _CHILD, str(REPO), code, setup],
            cap_bytes=2 * cap_bytes,  # the process tree's cap: only a backstop here
            timeout_s=timeout,
            poll_s=0.1,
            env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
            address_space_bytes=cap_bytes,
        )
    except RuntimeError as exc:
        if "ran over" in str(exc):
            return {
                "outcome": f"HANG (over {timeout:.0f} s)",
                "seconds": timeout,
                "peak": 0,
                "base": 0,
            }
        raise
    text = out.decode(errors="replace")
    if rc != 0 or not text.strip():
        return {
            "outcome": f"CRASH (exit {rc}): {err.decode(errors='replace')[-200:]}",
            "seconds": time.perf_counter() - started,
            "peak": 0,
            "base": 0,
        }
    return dict(json.loads(text.strip().splitlines()[-1]))


def measure_cases(cfg: BenchConfig, work: Path) -> list[dict[str, object]]:
    """Build every case under `work` and run each in its own child; return the rows."""
    work.mkdir(parents=True, exist_ok=True)
    builders: list[Callable[[Path, bool], list[tuple[str, Path, str]]]] = [
        _snapshot_cases,
        _trace_cases,
        _other_cases,
    ]
    cases = [c for build in builders for c in build(work, cfg.quick)]
    rows = []
    for name, path, code in cases:
        size = path.stat().st_size if path.is_file() else 0
        row = _run_case(code.format(str(path)), "", cfg.cap_bytes, 120.0)
        rows.append({"case": name, "bytes": size, **row})
    n = 150_000 if cfg.quick else 3_000_000
    row = _run_case("result = combine(ranks)", _COMBINE.format(n=n), cfg.cap_bytes, 120.0)
    rows.append({"case": f"8 ranks of {n:,} collective calls each (combine)", "bytes": 0, **row})
    rows.append(_save_case(cfg, work))
    return rows


def _save_case(cfg: BenchConfig, work: Path) -> dict[str, object]:
    """report.save() of a large trace loaded from a gzip file: what the save itself adds."""
    source = work / "save_source.json.gz"
    target_mb = 8 if cfg.quick else 256
    if not source.exists():
        with gzip.open(source, "wb", compresslevel=1) as f:
            f.write(b'{"schemaVersion": 1, "traceEvents": [')
            step = 0
            written = 0
            while written < target_mb * MB:
                rows = ", ".join(_op(f"aten::op{(step + i) % 97}", step + i) for i in range(10_000))
                data = rows.encode() + b", "
                f.write(data)
                written += len(data)
                step += 10_000
            f.write(_op("aten::mm", step).encode() + b"]}")
    setup = f"trace = gpuprof_nb.load_trace({str(source)!r})"
    # Only save is measured: the trace is loaded in the set-up.
    code = (
        "from gpuprof_nb.results.report import ProfileReport\n"
        f"ProfileReport(timing=None, trace=trace).save({str(work / 'saved.json')!r})"
    )
    row = _run_case(code, setup, cfg.cap_bytes, 600.0)
    return {
        "case": f"report.save() of a {target_mb} MB trace (gzip source)",
        "bytes": source.stat().st_size,
        **row,
    }


def _mb(n: object) -> str:
    value = float(n) / MB  # type: ignore[arg-type]
    return f"{value:,.1f} MB" if value < 100 else f"{value:,.0f} MB"


def run(cfg: BenchConfig) -> Section:
    rows = measure_cases(cfg, cfg.cache_dir / "hostile")
    lines = [
        "Each case is built by `benchmarks/hostile_inputs.py` and opened in its own fresh "
        "child process, as a user would (`load_*` + `analyze*` + the report's mimebundle); "
        "peak = the child's high-water RSS during the case (reset after the imports and set-up "
        "with /proc/self/clear_refs), added = peak minus the RSS before the case. Outcome: the "
        "library's own error, or a report (its HTML size). "
        f"Target: an input under {SMALL_INPUT // MB} MB takes at most "
        f"{LIMIT_BYTES // MB} MB added and {LIMIT_SECONDS:.0f} s; no crash, hang or raw "
        "exception.",
        "",
        "| case | input | outcome | time | peak | added |",
        "|---|---|---|---|---|---|",
    ]
    worst_mem = worst_time = 0.0
    bad = []
    for r in rows:
        added = max(int(r["peak"]) - int(r["base"]), 0)  # type: ignore[call-overload]
        seconds = float(r["seconds"])  # type: ignore[arg-type]
        outcome = str(r["outcome"]).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {r['case']} | {_mb(r['bytes'])} | {outcome} | {seconds:.2f} s | "
            f"{_mb(r['peak'])} | {_mb(added)} |"
        )
        if outcome.startswith(("RAW", "CRASH", "HANG")):
            bad.append(str(r["case"]))
        if int(r["bytes"]) < SMALL_INPUT:  # type: ignore[call-overload]
            worst_mem = max(worst_mem, added)
            worst_time = max(worst_time, seconds)
    targets = (
        Target(
            "no crash, hang or raw exception on the worst cases",
            "none" if not bad else "; ".join(bad),
            "none",
            not bad,
        ),
        Target(
            f"inputs under {SMALL_INPUT // MB} MB: worst added memory",
            _mb(worst_mem),
            f"<= {LIMIT_BYTES // MB} MB",
            worst_mem <= LIMIT_BYTES,
        ),
        Target(
            f"inputs under {SMALL_INPUT // MB} MB: worst time",
            f"{worst_time:.2f} s",
            f"<= {LIMIT_SECONDS:.0f} s",
            worst_time <= LIMIT_SECONDS,
        ),
    )
    return Section("14. Hostile inputs", "\n".join(lines), targets)
