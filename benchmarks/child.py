"""One measured approach, run alone in a child process so its peak memory is its own.

Usage: python benchmarks/child.py MODE PATH
Prints one JSON line: {"mode", "seconds", "stages": {...}, "baseline_rss_bytes", "facts": {...}}.
`seconds` covers the work only (after imports); the parent adds peak memory from the
process tree. This file is run by both the project venv and the HTA venv, so it imports
neither gpuprof_nb nor HTA at module level.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _open_text(path: str) -> Any:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _peak_rss_bytes() -> int:
    """This process's own high-water RSS in bytes (VmHWM). Not ru_maxrss: Linux carries the
    parent's high-water mark into ru_maxrss across fork+exec, which would mix the numbers."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _rss_bytes() -> int:
    """Current resident set size of this process in bytes (Linux /proc)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _Stages:
    """Times named stages in seconds; the sum is the measured work."""

    def __init__(self, profiler: Any = None) -> None:
        self.seconds: dict[str, float] = {}
        # A cProfile.Profile switched on around the stages only (imports stay out of it).
        self.profiler = profiler
        # RSS once imports are done, just before the first stage: what the work adds on top.
        self.baseline_rss_bytes = 0

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        if not self.seconds:
            self.baseline_rss_bytes = _rss_bytes()
        t0 = time.perf_counter()
        if self.profiler is not None:
            value = self.profiler.runcall(fn)
        else:
            value = fn()
        self.seconds[name] = time.perf_counter() - t0
        return value


def json_floor(path: str, stages: _Stages) -> dict[str, Any]:
    """The floor: plain json.load of the whole file (gzip decompressed on the fly)."""

    def load() -> Any:
        with _open_text(path) as fh:
            return json.load(fh)

    doc = stages.run("json.load", load)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return {"events": len(events)}


def orjson_floor(path: str, stages: _Stages) -> dict[str, Any]:
    """A faster floor, for reference: orjson.loads of the whole text (bench venv only)."""
    import orjson

    def load() -> Any:
        with open(path, "rb") as fh:
            raw = fh.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return orjson.loads(raw)

    doc = stages.run("orjson.loads", load)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return {"events": len(events)}


def _import_display_layer() -> None:
    """Import what the first display of a report imports lazily (the render layer and the
    matplotlib parts it draws with), so `seconds` leaves imports out for gpuprof_nb as it
    does for HTA, whose imports happen before its first stage."""
    import importlib
    import pkgutil

    import gpuprof_nb.render

    for info in pkgutil.iter_modules(gpuprof_nb.render.__path__):
        importlib.import_module(f"gpuprof_nb.render.{info.name}")
    for name in (
        "matplotlib.figure",
        "matplotlib.patches",
        "matplotlib.lines",
        "matplotlib.backends.backend_agg",
        "matplotlib.backends.backend_svg",
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def gpuprof_trace(path: str, stages: _Stages) -> dict[str, Any]:
    """gpuprof_nb end to end, what a user gets from a trace file: load_trace, analyze (every
    table, the timeline, the roofline and the diagnosis), then the displayed bundle
    (`_repr_mimebundle_`: the HTML and text of every tab)."""
    sys.path.insert(0, str(REPO))
    from gpuprof_nb.analysis.report import analyze
    from gpuprof_nb.io.trace import load_trace

    _import_display_layer()
    trace = stages.run("load", lambda: load_trace(path))
    report = stages.run("analyze", lambda: analyze(trace))
    bundle = stages.run("display", lambda: report._repr_mimebundle_())
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    timeline = getattr(report, "timeline", None)
    kernels = getattr(report, "kernels", None)
    ops = getattr(report, "ops", None)
    diagnosis = getattr(report, "diagnosis", None)
    return {
        "kernels": len(trace.kernels),
        "op_rows": len(getattr(ops, "rows", ()) or ()),
        "kernel_rows": len(getattr(kernels, "rows", ()) or ()),
        "busy_us": float(getattr(timeline, "busy_us", float("nan"))),
        "findings": len(getattr(diagnosis, "findings", ()) or ()),
        "notes": list(getattr(report, "notes", ()) or ()),
        "bundle_chars": {str(k): len(str(v)) for k, v in dict(data).items()},
    }


def hta_trace(path: str, stages: _Stages) -> dict[str, Any]:
    """HolisticTraceAnalysis doing the same: parse, kernel breakdown, idle breakdown
    (plus its temporal breakdown, the GPU busy/idle split)."""
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analyzer = stages.run(
        "load", lambda: TraceAnalysis(trace_files={0: os.path.abspath(path)}, trace_dir="/")
    )
    kernels = stages.run("kernels", lambda: analyzer.get_gpu_kernel_breakdown(visualize=False))
    stages.run(
        "idle breakdown", lambda: analyzer.get_idle_time_breakdown(ranks=[0], visualize=False)
    )
    temporal = stages.run(
        "temporal breakdown", lambda: analyzer.get_temporal_breakdown(visualize=False)
    )
    facts: dict[str, Any] = {"kernel_rows": int(len(kernels[1]))}
    try:
        facts["idle_us_hta"] = float(temporal["idle_time(us)"].iloc[0])
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    return facts


def _gpuprof_run(workers: int) -> Callable[[str, _Stages], dict[str, Any]]:
    """gpuprof_nb.analyze_run on a directory of rank traces with a pool of `workers`
    processes; this process is the coordinator, whose own peak memory is reported."""

    def run(path: str, stages: _Stages) -> dict[str, Any]:
        sys.path.insert(0, str(REPO))
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        from gpuprof_nb.session.distributed import analyze_run

        before = _rss_bytes()

        def go() -> Any:
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                return analyze_run(path, executor=pool, progress=False)

        report = stages.run("analyze_run", go)
        return {
            "ranks": len(report.ranks),
            "failures": len(report.failures),
            "coordinator_rss_before_bytes": before,
            "coordinator_peak_rss_bytes": _peak_rss_bytes(),
            "busy_us": [r.busy_us for r in report.ranks],
            "comm_us": [r.comm_us for r in report.ranks],
        }

    return run


def hta_run(path: str, stages: _Stages) -> dict[str, Any]:
    """HolisticTraceAnalysis on the same directory: TraceAnalysis(trace_dir) parses every
    rank, then its communication/computation overlap and temporal breakdown per rank."""
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analyzer = stages.run("load", lambda: TraceAnalysis(trace_dir=os.path.abspath(path)))
    overlap = stages.run(
        "comm/comp overlap", lambda: analyzer.get_comm_comp_overlap(visualize=False)
    )
    stages.run("temporal breakdown", lambda: analyzer.get_temporal_breakdown(visualize=False))
    return {"ranks": int(len(overlap)), "coordinator_peak_rss_bytes": _peak_rss_bytes()}


def unpickle_floor(path: str, stages: _Stages) -> dict[str, Any]:
    """The floor for snapshots: pickle.load alone."""

    def load() -> Any:
        with open(path, "rb") as fh:
            return pickle.load(fh)

    doc = stages.run("pickle.load", load)
    traces = doc.get("device_traces", []) if isinstance(doc, dict) else []
    return {"trace_entries": sum(len(t) for t in traces)}


def gpuprof_snapshot(path: str, stages: _Stages) -> dict[str, Any]:
    """gpuprof_nb: load_snapshot, then the analysis %%memsnap shows (timeline, peak,
    at-peak; analyze_snapshot also does leaks, segments and findings in the same pass)."""
    sys.path.insert(0, str(REPO))
    from gpuprof_nb.analysis.memory import analyze_snapshot
    from gpuprof_nb.io.snapshot import load_snapshot

    snapshot = stages.run("load", lambda: load_snapshot(path))
    analysis = stages.run("analysis", lambda: analyze_snapshot(snapshot))
    return {
        "peak_bytes": int(analysis.timeline.peak_bytes),
        "at_peak_rows": len(getattr(analysis.at_peak, "rows", ()) or ()),
    }


def _hotspots(profiler: Any) -> list[list[Any]]:
    """The functions with the most own time in the profiled stages, so a missed target
    comes with where the time goes (times are inflated by the profiler)."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
    out = []
    for (filename, line, name), (_, ncalls, tottime, cumtime, _) in rows[:8]:
        short = filename.split("/site-packages/")[-1].split("/work/main/")[-1]
        out.append([f"{short}:{line}({name})", ncalls, round(tottime, 3), round(cumtime, 3)])
    return out


MODES: dict[str, Callable[[str, _Stages], dict[str, Any]]] = {
    "json-floor": json_floor,
    "orjson-floor": orjson_floor,
    "gpuprof-trace": gpuprof_trace,
    "hta-trace": hta_trace,
    "gpuprof-run-1": _gpuprof_run(1),
    "gpuprof-run-2": _gpuprof_run(2),
    "hta-run": hta_run,
    "unpickle-floor": unpickle_floor,
    "gpuprof-snapshot": gpuprof_snapshot,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in MODES:
        print(f"usage: child.py {{{'|'.join(MODES)}}} PATH", file=sys.stderr)
        return 2
    mode, path = argv
    if os.environ.get("GPUPROF_BENCH_PROFILE"):
        import cProfile

        stages = _Stages(cProfile.Profile())
        facts = MODES[mode](path, stages)
        facts["hotspots"] = _hotspots(stages.profiler)
    else:
        stages = _Stages()
        facts = MODES[mode](path, stages)
    print(
        json.dumps(
            {
                "mode": mode,
                "seconds": sum(stages.seconds.values()),
                "stages": stages.seconds,
                "baseline_rss_bytes": stages.baseline_rss_bytes,
                "peak_rss_bytes": _peak_rss_bytes(),
                "facts": facts,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
