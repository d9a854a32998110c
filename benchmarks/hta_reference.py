"""What HolisticTraceAnalysis (HTA) answers about each real trace, as JSON: the reference
values that tests/analysis/test_hta_parity.py compares gpuprof_nb's answers with.

Runs in a venv of its own with HTA 0.5.0 and pandas 2 (HTA 0.5.0's critical path fails
under pandas 3, which `make bench`'s venv has), never the test venv:

    python3 -m venv benchmarks/.cache/venv-hta-pandas2
    benchmarks/.cache/venv-hta-pandas2/bin/pip install "HolisticTraceAnalysis==0.5.0" "pandas<3"
    benchmarks/.cache/venv-hta-pandas2/bin/python benchmarks/hta_reference.py \
        --out tests/data/hta_reference/hta-0.5.0.reference.gz

For every trace HTA can read (a trace it fails on is recorded with its error), on its rank:
- `idle`: get_idle_time_breakdown's idle time per stream and category (us);
- `queue`: get_queue_length_summary's statistics per stream;
- `launch`: get_cuda_kernel_launch_stats' launch delays (count, median, p95, max, mean);
- `gpu_annotation_kernels`: get_gpu_kernels_with_user_annotations, kernels per annotation;
- `window`: the trace HTA analysed after its preprocessing: how many kernels it kept and the
  earliest and latest start among them;
- `critical_path`, for the traces of HTA's own critical-path tests and the planted H100
  traces: critical_path_analysis over the whole trace (annotation "") or one annotation
  instance, with its summary (share of the path by bound_by) and the events on the path.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DATA = REPO / "tests" / "data"

# (key, path): the traces HTA is compared on.
TRACES: list[tuple[str, Path]] = [
    (
        "alexnet",
        SHARED
        / "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    ),
    (
        "simple_add",
        SHARED
        / "hta/tests/data/critical_path/simple_add"
        / "benchmark_result_493459_1694039959_trace.json.gz",
    ),
    (
        "event_sync",
        SHARED / "hta/tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    ),
    (
        "event_sync_multi_stream",
        SHARED
        / "hta/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    ),
    ("df_index_resolver", SHARED / "hta/tests/data/df_index_resolver/df_index_resolver.json.gz"),
    (
        "negative_queue_length",
        SHARED / "hta/tests/data/negative_queue_length_values_check/rank0.json.gz",
    ),
    ("nccl_data", SHARED / "hta/tests/data/nccl_parser_config/nccl_data.json.gz"),
    ("sampled_rank-0", SHARED / "hta/tests/data/trace_filter/sampled_rank-0.json.gz"),
    ("sampled_rank-1", SHARED / "hta/tests/data/trace_filter/sampled_rank-1.json.gz"),
    (
        "execution_trace",
        SHARED / "hta/tests/data/execution_trace/benchmark_simple_add_trace.json.gz",
    ),
    ("triton_example", SHARED / "hta/tests/data/triton_example/triton_example.json.gz"),
    ("mi250_toy", SHARED / "hta/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    (
        "resnet50_2021",
        SHARED
        / "kineto/tb_plugin/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz",
    ),
    ("gpu_metrics_input", SHARED / "kineto/tb_plugin/test/gpu_metrics_input.json"),
    ("resnet_kineto", SHARED / "param/et_replay/tests/inputs/resnet_kineto.json.gz"),
    ("linear_kineto", SHARED / "param/et_replay/tests/inputs/linear_kineto.json.gz"),
    (
        "h100_vit",
        SHARED / "tracelens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    ),
    (
        "h100_bert",
        SHARED / "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    ),
    (
        "mi300_bert",
        SHARED / "tracelens/tests/traces/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
    ),
    (
        "mi210_gpu_only",
        SHARED / "tracelens/tests/traces/mi210/gpu_only_trace/gpu_only_trace.json.gz",
    ),
    (
        "mi300_resnet18",
        SHARED / "tracelens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
    ),
    (
        "v100_ns_resolution",
        DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    ),
    ("h100_host_sync", DATA / "gpu/host_sync.json.gz"),
    ("h100_launch_overhead", DATA / "gpu/launch_overhead.json.gz"),
]
# Critical-path runs: (key, annotation, instance). HTA's tests use these on its traces.
CRITICAL_PATHS: list[tuple[str, str, int | None]] = [
    ("simple_add", "", 0),
    ("simple_add", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("alexnet", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("event_sync", "ProfilerStep", 0),
    ("event_sync_multi_stream", "", None),
    ("mi250_toy", "ProfilerStep", 1),
    ("v100_ns_resolution", "ProfilerStep", 1),
    ("h100_host_sync", "", 0),
    ("h100_launch_overhead", "", 0),
]


def _num(v: Any) -> Any:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return None if f != f else f


def _reference(analyzer: Any, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rank": rank}
    df = analyzer.t.get_trace(rank)
    kernels = df[df["stream"].ne(-1) & ~df["cat"].isin(_sync_cats(analyzer))]
    out["window"] = {
        "kernels": int(len(kernels)),
        "first_start_us": _num(kernels["ts"].min()) if len(kernels) else None,
        "last_start_us": _num(kernels["ts"].max()) if len(kernels) else None,
    }
    idle, _ = analyzer.get_idle_time_breakdown(ranks=[rank], visualize=False)
    out["idle"] = {str(int(row.stream)): {} for row in idle.itertuples()}
    for row in idle.itertuples():
        out["idle"][str(int(row.stream))][row.idle_category] = _num(row.idle_time)
    summary = analyzer.get_queue_length_summary(ranks=[rank])
    out["queue"] = {}
    if summary is not None:
        for (_, stream), row in summary.iterrows():
            out["queue"][str(int(stream))] = {
                stat: _num(row[("queue_length", stat)])
                for stat in ("count", "mean", "std", "min", "25%", "50%", "75%", "max")
            }
    stats = analyzer.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)
    delays = stats[rank]["launch_delay"] if rank in stats else None
    if delays is not None and len(delays):
        out["launch"] = {
            "count": int(len(delays)),
            "median": _num(delays.median()),
            "p95": _num(delays.quantile(0.95)),
            "max": _num(delays.max()),
            "mean": _num(delays.mean()),
        }
    kernels_anno = analyzer.get_gpu_kernels_with_user_annotations(rank=rank)
    if kernels_anno is not None:
        counts = kernels_anno["s_user_annotation"].value_counts()
        out["gpu_annotation_kernels"] = {str(k): int(v) for k, v in counts.items()}
    return out


def _sync_cats(analyzer: Any) -> list[int]:
    index = analyzer.t.symbol_table.get_sym_id_map()
    return [index[c] for c in ("cuda_sync",) if c in index]


def _window(analyzer: Any, rank: int, annotation: str, instance: int | None) -> list[Any]:
    """The span critical_path_analysis looks at, computed as it computes it."""
    df = analyzer.t.get_trace(rank)
    if annotation == "":
        return [_num(df.ts.min()), _num((df.ts + df.dur).max())]
    ids = [v for k, v in analyzer.t.symbol_table.get_sym_id_map().items() if annotation in k]
    found = df[df.name.isin(ids)]
    first = last = instance or 0
    start = found.ts[first : last + 1].min()
    end = (found.ts + found.dur)[first : last + 1].max()
    return [_num(start), _num(end)]


def _critical_path(
    analyzer: Any, rank: int, annotation: str, instance: int | None
) -> dict[str, Any]:
    t0 = time.perf_counter()
    got = analyzer.critical_path_analysis(rank=rank, annotation=annotation, instance_id=instance)
    seconds = time.perf_counter() - t0
    if got is None:
        return {"error": "annotation not found"}
    graph, ok = got
    if not ok:
        return {"error": "critical path failed"}
    breakdown = graph.get_critical_path_breakdown()
    summary = breakdown.groupby("bound_by").duration.sum()
    df = analyzer.t.get_trace(rank)
    names = analyzer.t.symbol_table.sym_table
    events = []
    for ev in sorted(graph.critical_path_events_set):
        row = df.loc[ev]
        events.append(
            {
                "index": int(ev),
                "name": names[int(row["name"])],
                "cat": names[int(row["cat"])],
                "ts": _num(row["ts"]),
                "dur": _num(row["dur"]),
                "stream": int(row["stream"]),
            }
        )
    edges = {}
    for e in graph.critical_path_edges_set:
        edges[e.type.value] = edges.get(e.type.value, 0) + 1
    return {
        "window_us": _window(analyzer, rank, annotation, instance),
        "ts_offset_us": _num(analyzer.t.min_ts) if hasattr(analyzer.t, "min_ts") else None,
        "seconds": seconds,
        "nodes": len(graph.critical_path_nodes),
        "length_us": _num(sum(e.weight for e in graph.critical_path_edges_set)),
        "bound_by_us": {str(k) or "dependency": _num(v) for k, v in summary.items()},
        "edges": edges,
        "events": sorted(events, key=lambda e: (e["ts"], e["name"])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", default="", help="comma-separated keys")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    import hta
    from hta.trace_analysis import TraceAnalysis

    # HTA's own tests turn this on (it changes no weight on the path, only adds edges).
    os.environ.setdefault("CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE", "1")
    wanted = {k for k in args.only.split(",") if k}
    import pandas

    python = Path(sys.executable)
    shown = python.relative_to(REPO) if python.is_relative_to(REPO) else python
    result: dict[str, Any] = {
        "hta_version": getattr(hta, "__version__", "0.5.0"),
        "pandas_version": pandas.__version__,
        "command": f"{shown} benchmarks/hta_reference.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "traces": {},
    }
    for key, path in TRACES:
        if wanted and key not in wanted:
            continue
        entry: dict[str, Any] = {
            # Inside the repository: relative to it (its folder's name differs between
            # checkouts); beside it (../shared): relative to the folder above.
            "file": str(path.relative_to(REPO))
            if path.is_relative_to(REPO)
            else str(path.relative_to(REPO.parent))
            if path.is_relative_to(REPO.parent)
            else str(path)
        }
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / path.name).symlink_to(path)
            try:
                analyzer = TraceAnalysis(trace_dir=tmp)
                rank = analyzer.t.get_ranks()[0]
                entry.update(_reference(analyzer, rank))
                for cp_key, annotation, instance in CRITICAL_PATHS:
                    if cp_key == key:
                        entry.setdefault("critical_path", {})[f"{annotation}#{instance}"] = (
                            _critical_path(analyzer, rank, annotation, instance)
                        )
            except Exception as exc:  # noqa: BLE001 - recorded: HTA fails on some traces
                entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        result["traces"][key] = entry
        print(key, "error" if "error" in entry else "ok", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(
        gzip.compress(json.dumps(result, indent=1, sort_keys=True).encode(), mtime=0)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
