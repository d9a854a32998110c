"""The torch.compile rule: compilations during the cell and recompiled graphs
(`recompilation`), and the compile spans the overhead rule leaves out."""

from __future__ import annotations

import re

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.derived import TraceIndex, index_of, memo, op_names
from gpuprof_nb.analysis.intervals import Interval, merge_intervals
from gpuprof_nb.analysis.rules.context import Context, make_finding, union_in
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.diagnosis import Finding

_COMPILE_MARKERS = (
    "Torch-Compiled Region",
    "TorchDynamo Cache Lookup",
    "CompiledFunction",
    "Compiled Function",
    "(dynamo_timed)",
    "torch._dynamo",
    "inductor",
)


_REGION_IDS = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")


def compile_spans(trace: Trace | TraceIndex) -> list[Interval]:
    """The merged spans of torch.compile's compilations (`compile_inner` annotations, which
    nest: the outermost count), or [] when the trace shows no torch.compile at all."""
    ix = index_of(trace)
    trace = ix.trace

    def compute() -> list[Interval]:
        if not _has_compile_markers(ix) or "compile_inner" not in _joined_names(ix):
            return []
        # torch 2.11 also marks each compile with a short "entire_frame_compile_data:
        # fn_name=_compile.compile_inner, compile_id=F/G" annotation just before it: not a
        # compile.
        return merge_intervals(
            (o.start_us, o.end_us)
            for o in trace.ops
            if "compile_inner" in o.name and not o.name.startswith("entire_frame_compile_data")
        )

    # Read by the recompilation rule and by launch overhead (which leaves compiling out).
    spans: list[Interval] = memo(ix, "compile_spans", compute)
    return spans


def _joined_names(ix: TraceIndex) -> str:
    """The trace's distinct op names joined by NUL: a marker (no NUL in it) is in a name
    when it is in this text, so one search per marker tests every name at once."""
    return memo(ix, "joined_op_names", lambda: "\0".join(op_names(ix)))


def _has_compile_markers(ix: TraceIndex) -> bool:
    """Whether an op name shows torch.compile (one of _COMPILE_MARKERS), once per trace."""
    return memo(
        ix,
        "has_compile_markers",
        lambda: any(m in _joined_names(ix) for m in _COMPILE_MARKERS),
    )


def rule_recompilation(c: Context) -> Finding | None:
    if not _has_compile_markers(c.index):
        return None
    spans = compile_spans(c.index)
    compile_us = union_in(spans, c.lo, c.hi)
    region_names = {n for n in op_names(c.index) if "Torch-Compiled Region" in n}
    regions = [o for o in c.trace.ops if o.name in region_names] if region_names else []
    # "Torch-Compiled Region: F/N" runs graph N of frame F: graphs beyond the first of a frame
    # are recompilations, even when they were compiled before the profiled run.
    graphs: dict[int, set[int]] = {}
    for o in regions:
        m = _REGION_IDS.search(o.name)
        if m:
            graphs.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    recompiles = sum(len(ids) - 1 for ids in graphs.values())
    n = len(spans)
    share = c.frac(compile_us)
    if recompiles:
        # Each new shape or guard failure compiles again; even when this run paid nothing,
        # the next new shape will: worth reporting, at least as a detail.
        share = max(share, th.MIN_REPORT_SHARE)
    elif not n:
        share = 0.0
    title = (
        f"torch.compile compiled {n} time(s) during the cell, taking "
        f"{c.frac(compile_us) * 100:.0f}% of the time"
    )
    if recompiles:
        title += f"; {recompiles} recompiled graph(s) ran (shapes or guards changed)"
    return make_finding(
        "recompilation",
        title,
        share,
        {
            "compile_count": float(n),
            "compile_time_us": compile_us,
            "recompiled_graphs_count": float(recompiles),
            "compiled_region_calls_count": float(len(regions)),
        },
    )
