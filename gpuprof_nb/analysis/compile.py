"""torch.compile explained: graphs, graph breaks, recompiles and compile time, from what
Dynamo logged while the cell ran (model.compile.CompileLog) and the compiled regions the
trace shows. Pure functions.

Rules:
- A graph break is one "Graph break in user code at FILE:LINE" record; breaks met again by
  a recompile of the same frame are one break with a higher count. Its reason is Dynamo's
  one-line reason (the line after "Encountered graph break when attempting to ..."), and
  the fix is ours, chosen by what the reason names (`.item()`, a print, a data-dependent
  branch, ...), else Dynamo's first hint.
- A recompile lists the guards that failed ("F/G: tensor 'x' size mismatch at index 0...").
  Failed guards on the global module hooks are gpuprof_nb's own (its module ranges were on
  while the cell compiled for the first time): left out, with a note.
- Time between compiled regions: on each host thread, the gap from a `Torch-Compiled
  Region: F/G` range to the next one, when that next one runs a different frame that a
  graph break resumed in (a `torch_dynamo_resume_in_...` frame; without Dynamo's log, any
  other frame): eager Python and torch ops the break left out of the graphs.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from collections.abc import Mapping

from gpuprof_nb.analysis.derived import TraceIndex, index_of, memo, op_names
from gpuprof_nb.analysis.sources import source_label
from gpuprof_nb.model.compile import CompileEvent, CompileLog
from gpuprof_nb.model.trace import Trace
from gpuprof_nb.results.compile import CompileReport, FrameCompile, GraphBreak, Recompile

_WHERE = re.compile(r"^Graph break in user code at (.*):(\d+)\s*$")
_REASON = re.compile(r"^Graph Break Reason:\s*(.*)$")
_REGION = re.compile(r"Torch-Compiled Region: (\d+)/(\d+)")
_SIZE = re.compile(r"tensor '([^']+)' size mismatch at index (\d+)")
_TRACEBACK = re.compile(r'File "(.*)", line (\d+), in (\S+)')
RESUME_PREFIX = "torch_dynamo_resume_in_"
# The guards Dynamo puts on global module hooks: ours while the module ranges were on.
_OUR_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def compile_report(trace: Trace | TraceIndex) -> CompileReport | None:
    """Return what torch.compile did in the trace's cell, None when nothing compiled ran
    (no Dynamo log, no compiled region). Computed once per trace."""
    ix = index_of(trace)
    return memo(ix, "compile_report", lambda: _report(ix))


def _report(trace: Trace | TraceIndex) -> CompileReport | None:
    ix = index_of(trace)
    trace = ix.trace
    log = trace.compile_log
    has_regions = any("Torch-Compiled Region" in n for n in op_names(ix))
    if log is None and not has_regions:
        return None
    log = log if log is not None else CompileLog(logged=False)
    cells = trace.cells
    notes: list[str] = []
    breaks = _breaks(log.events, cells)
    recompiles, ours = _recompiles(log, cells)
    if ours:
        notes.append(
            f"{ours} recompile(s) on gpuprof_nb's own module hooks (the cell compiled for "
            "the first time while its module ranges were on) are left out; the next run "
            "without them compiles once more (profile after a warm-up run, or --no-modules)"
        )
    frames = tuple(
        FrameCompile(
            compile_id=f.compile_id,
            function=f.function,
            where=source_label(f.file, f.first_line, f.function, cells),
            compile_time_s=f.compile_time_s,
            graph_ops=f.graph_ops,
            earlier=f.earlier,
        )
        for f in log.frames
    )
    made = [f for f in frames if not f.earlier]
    graphs = sum(1 for f in made if f.graph_ops)
    compile_s = float(sum(f.compile_time_s or 0.0 for f in made))
    regions, between = _between_regions(ix, log)
    ran = {m.group(0) for n in op_names(ix) if (m := _REGION.search(n))}
    if not log.logged and log.frames:
        notes.append(
            "Dynamo's structured log was not readable here: frames from its compilation "
            "metrics only; graph breaks and recompile reasons are not listed"
        )
    if log.frames == () and has_regions and trace.compile_log is None:
        notes.append(
            "this trace was recorded without gpuprof_nb: compiled regions are in it, but not "
            "why the graphs broke or recompiled (profile the cell with %%gpuprofile)"
        )
    return CompileReport(
        graphs=graphs,
        breaks=breaks,
        recompiles=recompiles,
        frames=frames,
        compile_time_s=compile_s,
        regions=regions,
        between_regions_us=between,
        steps=max(len(trace.steps), 1),
        logged=log.logged,
        notes=tuple(notes),
        graphs_ran=len(ran),
    )


def explain_log(
    log: CompileLog, cells: Mapping[str, int]
) -> tuple[tuple[GraphBreak, ...], tuple[Recompile, ...]]:
    """The graph breaks and recompiles (ours left out) of one Dynamo log."""
    recompiles, _ = _recompiles(log, cells)
    return _breaks(log.events, cells), recompiles


def break_parts(text: str) -> tuple[str, int, str, str, list[str], str]:
    """(file, line, reason, explanation, hints, function) of a graph-break record."""
    lines = text.splitlines()
    file, line = "", 0
    if lines:
        m = _WHERE.match(lines[0])
        if m:
            file, line = m.group(1), int(m.group(2))
    reason = explanation = function = ""
    hints: list[str] = []
    for i, raw in enumerate(lines):
        s = raw.strip()
        m = _REASON.match(s)
        if m and not reason:
            reason = m.group(1).strip()
            if reason.startswith("Encountered graph break") or not reason:
                reason = next((x.strip() for x in lines[i + 1 :] if x.strip()), reason)
        elif s.startswith("Explanation:") and not explanation:
            explanation = s.removeprefix("Explanation:").strip()
        elif s.startswith("Hint:"):
            hints.append(s.removeprefix("Hint:").strip())
        tb = _TRACEBACK.search(s)
        if tb and tb.group(1) == file and int(tb.group(2)) == line:
            function = tb.group(3)
    # A generic reason ("Failed to trace builtin operator") gains the name the explanation
    # quotes (`print`).
    named = re.search(r"`([^`]+)`", explanation)
    if named and named.group(1) not in reason and len(reason) < 60:
        reason = f"{reason} `{named.group(1)}`"
    return file, line, reason, explanation, hints, function


def break_fix(reason: str, explanation: str, hints: list[str]) -> str:
    """What to change for a graph break, chosen by what its reason names."""
    words = f"{reason} {explanation}".lower()
    if "item()" in words or "capture_scalar_outputs" in words:
        return (
            "Move the .item() out of the compiled code (return the tensor and read it after "
            "the call), or let Dynamo trace it: torch._dynamo.config.capture_scalar_outputs "
            "= True before compiling"
        )
    if "print" in words or "logging" in words:
        return (
            "Print outside the compiled function, or let Dynamo reorder it: "
            "torch._dynamo.config.reorderable_logging_functions.add(print)"
        )
    if "data-dependent" in words or "data dependent" in words or "generic_jump" in words:
        return (
            "Replace the Python branch on a tensor's value with torch.where(cond, a, b) (or "
            "torch.cond), or decide before calling the compiled function"
        )
    if "numpy" in words or "tolist" in words:
        return "Keep .numpy() / .tolist() out of the compiled function: call them on its result"
    if "disable" in words or "skip" in words:
        return (
            "The call is marked not to compile (torch._dynamo.disable, or a file Dynamo "
            "skips): move it out of the compiled step"
        )
    if hints:
        return hints[0]
    return "See where it breaks with torch._dynamo.explain(fn)(*args) and move that call out"


def _breaks(events: tuple[CompileEvent, ...], cells: Mapping[str, int]) -> tuple[GraphBreak, ...]:
    found: dict[tuple[str, int, str], GraphBreak] = {}
    order: list[tuple[str, int, str]] = []
    for e in events:
        if e.kind != "graph_break":
            continue
        file, line, reason, explanation, hints, function = break_parts(e.text)
        function = e.function or function
        key = (file, line, reason)
        if key in found:
            b = found[key]
            found[key] = GraphBreak(
                b.where, b.file, b.line, b.source, b.reason, b.explanation, b.fix, b.count + 1
            )
            continue
        order.append(key)
        where = (
            source_label(file, line, function or "<module>", cells) if file else "an unknown line"
        )
        found[key] = GraphBreak(
            where=where,
            file=file,
            line=line,
            source=e.source,
            reason=reason or "(no reason recorded)",
            explanation=explanation,
            fix=break_fix(reason, explanation, hints),
            count=1,
        )
    return tuple(found[k] for k in order)


def recompile_fix(reasons: tuple[str, ...]) -> str:
    """What keeps a frame from compiling again, chosen by the guard that failed."""
    words = " ".join(reasons)
    size = _SIZE.search(words)
    if size:
        name, dim = size.group(1), size.group(2)
        return (
            f"The size of {name!r} changed at dimension {dim}: mark it dynamic before the "
            f"call, torch._dynamo.mark_dynamic({name}, {dim}), or compile with dynamic=True, "
            "or pad inputs to a few fixed sizes"
        )
    lower = words.lower()
    if "dtype" in lower:
        return "The dtype changed between calls: cast once, before the compiled call"
    if "requires_grad" in lower:
        return "requires_grad changed between calls: keep it the same (or detach the input)"
    if "grad_mode" in lower or "global_state" in lower or "autocast" in lower:
        return "Grad or autocast mode changed between calls: call it under one mode"
    if "id_match" in lower or "obj_id" in lower or "type_match" in lower:
        return "A different object was passed: pass tensors, and reuse the same module"
    return "Keep what the failed guard checks the same between calls, or compile with dynamic=True"


def _recompiles(log: CompileLog, cells: Mapping[str, int]) -> tuple[tuple[Recompile, ...], int]:
    by_frame = {f.compile_id.split("/")[0]: f for f in log.frames}
    out = []
    ours = 0
    for e in log.events:
        if e.kind != "recompile":
            continue
        reasons = tuple(r.strip() for r in _reason_lines(e.text) if r.strip())
        kept = tuple(r for r in reasons if not any(h in r for h in _OUR_HOOKS))
        if not kept:
            ours += 1
            continue
        frame = by_frame.get(e.compile_id.split("/")[0])
        function = frame.function if frame is not None else ""
        where = (
            source_label(frame.file, frame.first_line, frame.function, cells)
            if frame is not None
            else ""
        )
        out.append(Recompile(e.compile_id, function, where, kept, recompile_fix(kept)))
    return tuple(out), ours


def _reason_lines(text: str) -> list[str]:
    """The failed guards of a recompile record: JSON text of one string or a list."""
    try:
        value = json.loads(text)
    except ValueError:
        return text.splitlines()
    if isinstance(value, str):
        return value.splitlines()
    if isinstance(value, list):
        return [line for v in value for line in str(v).splitlines()]
    return [str(value)]


# Eager ops that read a tensor's value to the host: what a `.item()` graph break runs.
SCALAR_READS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::tolist"})


def _between_regions(trace: Trace | TraceIndex, log: CompileLog) -> tuple[int, float]:
    """(compiled region calls, host microseconds a graph break left uncompiled).

    A break resumes in a new region nested inside the one that broke (the first graph's
    code calls the resume function). In each region that holds another, the uncompiled
    time is its host time outside every op inside it (the Python at the break, Dynamo's
    glue) plus the scalar reads (`aten::_local_scalar_dense`: the `.item()` itself)."""
    ix = index_of(trace)
    trace = ix.trace
    del log  # the regions themselves say where breaks resumed
    names = {n for n in op_names(ix) if "Torch-Compiled Region" in n}
    if not names:
        return 0, 0.0
    per_thread: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    regions: list[tuple[tuple[str, str], float, float]] = []
    for o in trace.ops:
        if o.kind != "op":
            continue
        key = (str(o.pid), str(o.tid))
        per_thread[key].append((o.start_us, o.end_us, o.name))
        if o.name in names:
            regions.append((key, o.start_us, o.end_us))
    for spans in per_thread.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
    starts = {k: [x[0] for x in v] for k, v in per_thread.items()}
    between = 0.0
    for key, lo, hi in regions:
        spans = per_thread[key]
        a = bisect.bisect_left(starts[key], lo)
        inside = []
        for s, e, name in spans[a:]:
            if s >= hi:
                break
            if s == lo and e == hi and name in names:
                continue  # the region itself
            inside.append((s, min(e, hi), name))
        if not any(name in names for _, _, name in inside):
            continue  # no break resumed inside: all of it is one graph's call
        covered = 0.0
        reach = lo
        for s, e, _ in inside:
            if e > reach:
                covered += e - max(s, reach)
                reach = e
        between += (hi - lo) - covered
        between += sum(e - s for s, e, name in inside if name in SCALAR_READS)
    return len(regions), between
