"""Findings in the model's language: the diagnosis's findings name the nn.Module that holds
their time, torch.compile's graph breaks and recompiles come with Dynamo's reasons and a
concrete fix, and a launch-bound GPU run with static shapes is told to capture CUDA graphs.
Pure functions; `diagnose` calls `model_findings` once, on the findings its rules made.

Which module a finding names:
- memory_bound / compute_bound: the module whose ops (the roofline's costed ops, placed in
  the innermost module where they started) spent the most time under (memory) or over
  (compute) the ridge point, weighted by how much of the module's own op time that is
  (so a block that is mostly memory-bound wins over the whole model that merely contains
  it); without ceilings, by op category (elementwise, norms, softmax, reductions, copies
  against matmuls, convolutions, attention).
- launch_overhead, python_overhead, host_sync, dataloader: the module with the most idle
  time of its own (idle while it was the innermost module on the host).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from operator import is_

import numpy as np

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.compile import compile_report
from gpuprof_nb.analysis.derived import op_columns, op_input_dims, op_name_codes
from gpuprof_nb.analysis.modules import module_breakdown, module_path_at
from gpuprof_nb.analysis.roofline import roofline_anchors
from gpuprof_nb.analysis.rules import Context, severity_of
from gpuprof_nb.results.compile import CompileReport
from gpuprof_nb.results.diagnosis import Finding
from gpuprof_nb.results.modules import ModuleBreakdown
from gpuprof_nb.results.roofline import Roofline

_LOW_INTENSITY = frozenset({"elementwise", "reduction", "softmax", "norm", "copy", "embedding"})
_HIGH_INTENSITY = frozenset({"gemm", "conv", "attention"})
_IDLE_KINDS = frozenset({"launch_overhead", "python_overhead", "host_sync", "dataloader"})
# Graph breaks listed in a fix at most.
MAX_BREAKS = 5
_REGION_FRAME = re.compile(r"Torch-Compiled Region: (\d+)/")
# A module is named for a finding's idle time when it holds at least this share of it.
MIN_IDLE_SHARE = 0.10


def model_findings(
    c: Context, considered: Sequence[Finding], roofline: Roofline | None
) -> list[Finding]:
    """Return `considered` with modules named, recompiles explained and CUDA-graph advice
    added, plus a graph_break finding (and a recompilation one where the rules saw none)."""
    mb = module_breakdown(c.index, c.timeline)
    comp = compile_report(c.index)
    out = []
    # The per-module bound times, found once for every finding that names a module by them.
    bound = functools.cache(lambda: _bound_time_by_module(c, mb, roofline))
    for f in considered:
        f = _name_module(f, c, mb, roofline, bound)
        if f.kind == "recompilation" and comp is not None:
            f = _explain_recompiles(f, comp)
        if f.kind == "launch_overhead" and c.on_device:
            f = _cuda_graph_advice(f, c)
        out.append(f)
    if comp is not None and comp.recompiles and not any(f.kind == "recompilation" for f in out):
        base = Finding(
            "recompilation",
            "low",
            "torch.compile recompiled during the cell",
            {},
            "",
            th.MIN_REPORT_SHARE,
        )
        out.append(_explain_recompiles(base, comp))
    gb = graph_break_finding(c, comp)
    if gb is not None:
        out.append(gb)
    return out


# -- modules ------------------------------------------------------------------------------


def _bound_time_by_module(
    c: Context, mb: ModuleBreakdown, roofline: Roofline | None
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per module path (inclusive of its children): time in memory-bound ops, in
    compute-bound ops, and in all costed ops."""
    anchors = roofline_anchors(c.index)
    if not anchors or not mb.rows:
        return {}, {}, {}
    spec = roofline.device if roofline is not None else None
    costed = [(a, cost, t) for a, cost, t in anchors if cost is not None and t > 0]
    # Each op's thread as modules_at keys it ((pid, tid) as text), read from the op
    # columns' thread codes rather than converted op by op.
    cols = op_columns(c.index)
    keys, thread, start = cols.thread_keys, cols.thread, cols.start
    rows = np.array([a for a, _, _ in costed], dtype=np.intp)
    points = zip(map(keys.__getitem__, thread[rows].tolist()), start[rows].tolist(), strict=True)
    where = module_path_at(c.index, list(points))
    mem: dict[str, float] = defaultdict(float)
    comp: dict[str, float] = defaultdict(float)
    every: dict[str, float] = defaultdict(float)
    parents = {r.path: r.parent for r in mb.rows}
    # Each path with its ancestors, innermost first (the walk up the tree, once per path).
    chains: dict[str, tuple[str, ...]] = {}
    low_of = _LowIntensity(spec)
    for (_, cost, t), path in zip(costed, where, strict=True):
        if path is None:
            continue
        chain = chains.get(path)
        if chain is None:
            chain = chains[path] = _ancestry(path, parents)
        low = low_of(cost)
        for p in chain:
            every[p] += t
        if low:
            for p in chain:
                mem[p] += t
        elif low is False:
            for p in chain:
                comp[p] += t
    return mem, comp, every


def _ancestry(path: str, parents: dict[str, str | None]) -> tuple[str, ...]:
    """`path` and its ancestors by `parents`, innermost first."""
    chain: list[str] = []
    p: str | None = path
    while p is not None:
        chain.append(p)
        p = parents.get(p)
    return tuple(chain)


class _LowIntensity:
    """_is_low with the device's ridge points read once, not once per op."""

    __slots__ = ("ridges",)

    def __init__(self, spec: object) -> None:
        from gpuprof_nb.model.device import DeviceSpec

        # Each roof's ridge as _is_low finds it (the bf16 roof falling back on fp32's).
        self.ridges: dict[str, float | None] | None = None
        if spec is not None and isinstance(spec, DeviceSpec):
            fp32 = spec.ridge_flop_per_byte("fp32")
            self.ridges = {"bf16": spec.ridge_flop_per_byte("bf16") or fp32, "fp32": fp32}

    def __call__(self, cost: object) -> bool | None:
        nbytes = getattr(cost, "bytes_moved", 0)
        if self.ridges is not None and nbytes:
            roof = "bf16" if getattr(cost, "dtype", "") in ("bf16", "fp16") else "fp32"
            ridge = self.ridges[roof]
            if ridge:
                return bool(getattr(cost, "flops", 0) / nbytes < ridge)
        category = getattr(cost, "category", "")
        if category in _LOW_INTENSITY:
            return True
        if category in _HIGH_INTENSITY:
            return False
        return None


def _is_low(cost: object, spec: object) -> bool | None:
    """Whether an op is memory-bound: under the ridge of its roof where ceilings are known,
    else by category; None for a category that says neither."""
    return _LowIntensity(spec)(cost)


def _descend(
    mb: ModuleBreakdown, pick: dict[str, float], every: dict[str, float]
) -> tuple[str | None, str]:
    """The module to name for `pick` time (memory- or compute-bound): from the root with
    the most of it, down to the child holding at least half of it, as long as most of
    that child's op time is of that kind. Where the descent stops above a repeated block
    whose members hold most of it, the block is named (`layers.{0..11}`)."""

    def fit(p: str) -> bool:
        return every.get(p, 0.0) > 0 and pick.get(p, 0.0) >= 0.5 * every[p]

    children: dict[str | None, list[str]] = defaultdict(list)
    for r in mb.rows:
        children[r.parent].append(r.path)
    roots = [p for p in children[None] if fit(p)]
    if not roots:
        return None, ""
    here = max(roots, key=lambda p: (pick[p], p))
    while True:
        kids = [k for k in children[here] if fit(k) and pick[k] >= 0.5 * pick[here]]
        if not kids:
            break
        here = max(kids, key=lambda p: (pick[p], p))
    for g in mb.groups:
        if g.parent == here:
            held = sum(pick.get(m, 0.0) for m in g.members)
            if held >= 0.5 * pick[here]:
                return here, g.pattern
    return here, here


def _best(scores: dict[str, float]) -> str | None:
    return min(scores, key=lambda p: (-scores[p], -p.count("."), p)) if scores else None


def _name_module(
    f: Finding,
    c: Context,
    mb: ModuleBreakdown,
    roofline: Roofline | None,
    bound: Callable[[], tuple[dict[str, float], dict[str, float], dict[str, float]]] | None = None,
) -> Finding:
    if not mb.rows or mb.total_us <= 0:
        return f
    basis = "device time" if mb.on_device else "host time"
    if f.kind in ("memory_bound", "compute_bound", "precision"):
        mem, comp, every = bound() if bound is not None else _bound_time_by_module(c, mb, roofline)
        pick = mem if f.kind == "memory_bound" else comp
        path, label = _descend(mb, pick, every)
        row = mb.row(path) if path is not None else None
        if path is None or row is None:
            return f
        what = "memory-bound" if f.kind == "memory_bound" else "compute-bound"
        of_it = pick[path] / every[path]
        share = row.share
        if label != path:  # a repeated block's members together
            group = next(g for g in mb.groups if g.pattern == label)
            share = group.share
            of_it = sum(pick.get(m, 0.0) for m in group.members) / max(
                sum(every.get(m, 0.0) for m in group.members), 1e-12
            )
        words = (
            f"`{label}`: {share * 100:.0f}% of {basis}, {what} ({of_it * 100:.0f}% of its op time)"
        )
    elif f.kind in _IDLE_KINDS:
        kids: dict[str | None, float] = defaultdict(float)
        for r in mb.rows:
            kids[r.parent] += r.idle_us
        own = {r.path: r.idle_us - kids[r.path] for r in mb.rows}
        total_idle = c.timeline.window_us - c.timeline.busy_us
        path = _best({p: v for p, v in own.items() if v > 0})
        if path is None or total_idle <= 0 or own[path] < MIN_IDLE_SHARE * total_idle:
            return f
        words = f"`{path}` holds {own[path] / total_idle * 100:.0f}% of the idle time"
    else:
        return f
    evidence = dict(f.evidence)
    return dataclasses.replace(f, title=f"{f.title}; {words}", evidence=evidence)


# -- torch.compile -------------------------------------------------------------------------


def graph_break_finding(c: Context, comp: CompileReport | None) -> Finding | None:
    """The graph_break finding: where torch.compile broke the graph and why, with the host
    time spent between compiled regions (the eager code a break leaves out)."""
    if comp is None or not comp.breaks:
        return None
    between = comp.between_regions_us
    share = max(c.frac(between), th.MIN_REPORT_SHARE)
    first = comp.breaks[0]
    n = len(comp.breaks)
    line = f" (`{first.source}`)" if first.source else ""
    title = (
        f"torch.compile breaks the graph at {n} place{'s' if n > 1 else ''}: {first.where}"
        f"{line}: {first.reason}"
    )
    if between > 0:
        title += f"; {c.frac(between) * 100:.0f}% of the time runs uncompiled between graphs"
    fix = "\n".join(
        f"{b.where}{f' (`{b.source}`)' if b.source else ''}: {b.fix}"
        for b in comp.breaks[:MAX_BREAKS]
    )
    if n > MAX_BREAKS:
        fix += f"\n... {n - MAX_BREAKS} more breaks in .compile.breaks"
    evidence = {
        "graph_breaks_count": float(n),
        "graphs_count": float(comp.graphs),
        "time_between_compiled_regions_us": between,
        "compiled_region_calls_count": float(comp.regions),
    }
    severity = severity_of(share)
    return Finding("graph_break", severity, title, evidence, fix, share)


def _explain_recompiles(f: Finding, comp: CompileReport) -> Finding:
    if not comp.recompiles:
        return f
    first = comp.recompiles[0]
    n = len(comp.recompiles)
    who = f"`{first.function}`" if first.function else "a compiled frame"
    title = (
        f"torch.compile recompiled {n} time{'s' if n > 1 else ''} during the cell: {who}"
        f"{f' ({first.where})' if first.where else ''}, because {first.reasons[0]}"
    )
    fix = "\n".join(f"{r.function or r.compile_id}: {r.fix}" for r in comp.recompiles[:MAX_BREAKS])
    evidence = dict(f.evidence)
    evidence["recompiles_count"] = float(n)
    evidence["dynamo_compile_time_us"] = comp.compile_time_s * 1e6
    share = max(f.share, th.MIN_REPORT_SHARE)
    return dataclasses.replace(f, title=title, fix=fix, evidence=evidence, share=share)


# -- CUDA graphs ---------------------------------------------------------------------------


def static_shapes(c: Context) -> bool | None:
    """Whether every step ran the same torch ops with the same input shapes (None: fewer
    than two steps to compare). The loader shares one tuple among equal recorded shapes,
    so shapes compare by identity: read only where the steps' op names already agree."""
    steps = c.trace.steps
    if len(steps) < 2:
        return None
    cols = op_columns(c.index)
    _, names = op_name_codes(c.index)
    dims = op_input_dims(c.index)
    order = np.argsort(cols.start, kind="stable")
    starts = cols.start[order]
    first = None
    first_dims: list[object] = []
    for s in steps:
        lo, hi = np.searchsorted(starts, [s.start_us, s.end_us], side="left")
        picked = order[lo:hi]
        if first is None:
            first = picked
            first_dims = list(map(dims.__getitem__, picked.tolist()))
            continue
        if len(picked) != len(first) or not np.array_equal(names[picked], names[first]):
            return False
        if not all(map(is_, map(dims.__getitem__, picked.tolist()), first_dims)):
            return False
    return True


def _cuda_graph_advice(f: Finding, c: Context) -> Finding:
    static = static_shapes(c)
    # Without steps to compare, only a cell gpuprof_nb ran (over and over, the same code)
    # gets the advice, and then on the condition that its shapes stay the same.
    if static is False or (static is None and c.trace.modules is None):
        return f
    code = (
        'model = torch.compile(model, mode="reduce-overhead")  # captures CUDA graphs\n'
        "(or torch.cuda.make_graphed_callables(module, sample_args) for one module)"
    )
    if static:
        lead = (
            "Every step launches the same kernels with the same shapes: capture it as a "
            "CUDA graph, so one launch replays them all:\n"
        )
        title = f"{f.title}; shapes are static, so capture it as a CUDA graph"
    else:
        lead = (
            "If the input shapes stay the same from step to step, capture it as a CUDA "
            "graph, so one launch replays every kernel:\n"
        )
        title = f.title
    return dataclasses.replace(f, title=title, fix=lead + code + "\n\n" + f.fix)
