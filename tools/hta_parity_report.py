"""Print the tables of docs/hta-parity.md: gpuprof_nb's answers next to HolisticTraceAnalysis
0.5.0's (tests/data/hta_reference/hta-0.5.0.reference.gz) on every trace HTA reads, both on
the trace as recorded and as HTA reads it (tests/analysis/test_hta_parity.hta_view).

Run: KINETO_LOG_LEVEL=6 .venv/bin/python tools/hta_parity_report.py > /tmp/tables.md
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _parity() -> object:
    spec = importlib.util.spec_from_file_location(
        "parity", REPO / "tests" / "analysis" / "test_hta_parity.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    from gpuprof_nb.analysis.critical_path import critical_path
    from gpuprof_nb.analysis.streams import launch_delays, stream_idle, stream_queues

    p = _parity()
    ref = p.REF  # type: ignore[attr-defined]
    print("| trace | values | within 1% (HTA's reading) | within 1% (as recorded) |")
    print("|---|---|---|---|")
    total = agree_view = agree_raw = 0
    for key in p.READABLE:  # type: ignore[attr-defined]
        trace, float_ts, device = p._loaded(key)  # type: ignore[attr-defined]
        e = ref[key]
        pairs_view: list[tuple[float, float]] = []
        pairs_raw: list[tuple[float, float]] = []
        for view, pairs in ((p.hta_view(trace, float_ts), pairs_view), (trace, pairs_raw)):  # type: ignore[attr-defined]
            idle = {str(s.stream): s.us_by_cause() for s in stream_idle(view, device)}
            for stream, causes in e["idle"].items():
                for cause, us in causes.items():
                    pairs.append((us, idle.get(stream, {}).get(cause, float("nan"))))
        for view, pairs in (
            (p.hta_view(trace, float_ts, p.HTA_QUEUE_LAUNCHES), pairs_view),  # type: ignore[attr-defined]
            (trace, pairs_raw),
        ):
            queues = {str(q.stream): q for q in stream_queues(view, device)}
            for stream, stats in e["queue"].items():
                q = queues.get(stream)
                pairs.append((stats["count"], 2 * q.launches if q else float("nan")))
                pairs.append((stats["max"], q.max_length if q else float("nan")))
                pairs.append((stats["mean"], q.event_mean if q else float("nan")))
        if "launch" in e:
            for view, pairs in (
                (p.hta_view(trace, float_ts, p.HTA_STAT_LAUNCHES), pairs_view),  # type: ignore[attr-defined]
                (trace, pairs_raw),
            ):
                got = launch_delays(view, device)
                for name, attr in (("count", "count"), ("median", "median_us"), ("max", "max_us")):
                    pairs.append((e["launch"][name], getattr(got, attr) if got else float("nan")))

        def ok(a: float, b: float) -> bool:
            return abs(a - b) <= max(0.01 * abs(a), 1e-6)

        n = len(pairs_view)
        v = sum(ok(a, b) for a, b in pairs_view)
        r = sum(ok(a, b) for a, b in pairs_raw)
        total += n
        agree_view += v
        agree_raw += r
        print(f"| {key} | {n} | {v} | {r} |")
    print(f"| all | {total} | {agree_view} | {agree_raw} |")
    print()
    print(
        "| run | HTA's critical events (as top-level units) | on our path | HTA-only, where ours "
        "took the other branch | HTA: device share | ours: device share | HTA path length | "
        "our step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    device_cats = {"GPU kernels", "communication kernels", "memcpy/memset", "gaps between kernels"}
    for key, run in p.CRITICAL_RUNS:  # type: ignore[attr-defined]
        trace, _, _ = p._loaded(key)  # type: ignore[attr-defined]
        e = ref[key]["critical_path"][run]
        offset = e["ts_offset_us"] or 0.0
        lo, hi = (t + offset for t in e["window_us"])
        path = critical_path(trace, window=(lo, hi))
        assert path is not None
        ours = {s.index for s in path if s.index >= 0}
        theirs = {p._unit(trace, x["index"]) for x in e["events"]}  # type: ignore[attr-defined]
        bound = e["bound_by_us"]
        hta_dev = sum(us for b, us in bound.items() if b in p.DEVICE_BOUND) / sum(bound.values())  # type: ignore[attr-defined]
        our_dev = sum(us for c, us in path.by_category_us if c in device_cats) / path.dur_us
        print(
            f"| {key} `{run[:40]}` | {len(theirs)} | {len(ours & theirs)} | "
            f"{len(theirs - ours)} | {hta_dev:.0%} | {our_dev:.0%} | "
            f"{e['length_us'] / 1e3:.1f} ms | {path.dur_us / 1e3:.1f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
