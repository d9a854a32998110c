"""gpuprof_nb's module and torch.compile records kept with a trace it recorded, under its own
top-level key: `{"gpuprof_nb": {"modules": {...}, "compile": {...}}}` (capture/modules.py and
capture/dynamo.py write them). Read into model.modules.ModuleCapture and
model.compile.CompileLog; a malformed entry is a TraceFormatError naming the field (the
loader then leaves it out with a warning, keeping the trace)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.cells import KEY
from gpuprof_nb.model.compile import CompiledFrame, CompileEvent, CompileLog
from gpuprof_nb.model.modules import ModuleCapture, RootInput

# Entries kept at most from one record (a record is written by us, but a file can be edited).
MAX_ITEMS = 100_000


def module_capture_of(top: Mapping[str, Any], source: str = "trace") -> ModuleCapture | None:
    """Return the module recorder's summary in a trace's top-level dict, None without one."""
    entry = _entry(top, "modules", source)
    if entry is None:
        return None
    where = f"{KEY}.modules"
    prefix = entry.get("prefix", "nn.Module: ")
    if not isinstance(prefix, str) or not prefix:
        _bad(source, f"{where}.prefix", "must be a non-empty string")
    calls = _count(source, entry.get("calls", 0), f"{where}.calls")
    roots = []
    for i, raw in enumerate(_list(source, entry.get("roots", []), f"{where}.roots")):
        at = f"{where}.roots[{i}]"
        if not isinstance(raw, Mapping):
            _bad(source, at, f"must be an object, got {type(raw).__name__}")
        shape = raw.get("input_shape")
        if shape is not None and not (
            isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)
        ):
            _bad(source, f"{at}.input_shape", f"must list sizes (ints >= 0), got {shape!r:.60}")
        dtype = raw.get("input_dtype")
        roots.append(
            RootInput(
                path=_text(source, raw.get("path"), f"{at}.path"),
                module_type=_text(source, raw.get("class", ""), f"{at}.class", empty=True),
                calls=_count(source, raw.get("calls", 0), f"{at}.calls"),
                input_shape=tuple(shape) if shape is not None else None,
                input_dtype=dtype if isinstance(dtype, str) else None,
            )
        )
    types = entry.get("types", {})
    if not isinstance(types, Mapping):
        _bad(source, f"{where}.types", f"must be an object, got {type(types).__name__}")
    kept = {
        k: v
        for k, v in list(types.items())[:MAX_ITEMS]
        if isinstance(k, str) and isinstance(v, str)
    }
    note = entry.get("note", "")
    return ModuleCapture(
        recorded=bool(entry.get("recorded", True)),
        prefix=prefix,
        calls=calls,
        roots=tuple(roots),
        types=kept,
        note=note if isinstance(note, str) else "",
    )


def compile_log_of(top: Mapping[str, Any], source: str = "trace") -> CompileLog | None:
    """Return Dynamo's record in a trace's top-level dict, None without one."""
    entry = _entry(top, "compile", source)
    if entry is None:
        return None
    where = f"{KEY}.compile"
    events = []
    for i, raw in enumerate(_list(source, entry.get("events", []), f"{where}.events")):
        at = f"{where}.events[{i}]"
        if not isinstance(raw, Mapping):
            _bad(source, at, f"must be an object, got {type(raw).__name__}")
        kind = raw.get("kind")
        if kind not in ("graph_break", "recompile"):
            _bad(source, f"{at}.kind", f"must be 'graph_break' or 'recompile', got {kind!r:.40}")
        events.append(
            CompileEvent(
                kind=kind,
                compile_id=_text(source, raw.get("compile_id", ""), f"{at}.compile_id", empty=True),
                text=_text(source, raw.get("text", ""), f"{at}.text", empty=True),
                source=_text(source, raw.get("source", ""), f"{at}.source", empty=True),
                function=_text(source, raw.get("function", ""), f"{at}.function", empty=True),
            )
        )
    frames = [
        _frame(source, raw, f"{where}.frames[{i}]", earlier=False)
        for i, raw in enumerate(_list(source, entry.get("frames", []), f"{where}.frames"))
    ]
    frames += [
        _frame(source, raw, f"{where}.earlier[{i}]", earlier=True)
        for i, raw in enumerate(_list(source, entry.get("earlier", []), f"{where}.earlier"))
    ]
    return CompileLog(
        logged=bool(entry.get("logged", False)), events=tuple(events), frames=tuple(frames)
    )


def _frame(source: str, raw: Any, at: str, *, earlier: bool) -> CompiledFrame:
    if not isinstance(raw, Mapping):
        _bad(source, at, f"must be an object, got {type(raw).__name__}")
    seconds = raw.get("entire_frame_compile_time_s")
    if seconds is not None and not (
        type(seconds) in (int, float) and math.isfinite(seconds) and seconds >= 0
    ):
        _bad(source, f"{at}.entire_frame_compile_time_s", f"must be seconds >= 0, got {seconds!r}")
    ops = raw.get("graph_op_count")
    reasons = raw.get("restart_reasons") or []
    if not isinstance(reasons, list | tuple):
        _bad(source, f"{at}.restart_reasons", "must be a list of strings")
    line = raw.get("co_firstlineno", 0)
    return CompiledFrame(
        compile_id=_text(source, raw.get("compile_id", ""), f"{at}.compile_id", empty=True),
        function=_text(source, raw.get("co_name", ""), f"{at}.co_name", empty=True),
        file=_text(source, raw.get("co_filename", ""), f"{at}.co_filename", empty=True),
        first_line=line if type(line) is int else 0,
        compile_time_s=float(seconds) if seconds is not None else None,
        graph_ops=ops if type(ops) is int and ops >= 0 else None,
        restart_reasons=tuple(str(r) for r in reasons),
        fail_type=str(raw.get("fail_type") or ""),
        fail_reason=str(raw.get("fail_reason") or ""),
        earlier=earlier,
    )


def _entry(top: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any] | None:
    own = top.get(KEY)
    entry = own.get(name) if isinstance(own, Mapping) else None
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        _bad(source, f"{KEY}.{name}", f"is a {type(entry).__name__}, not an object")
    return entry


def _list(source: str, value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        _bad(source, where, f"must be a list, got {type(value).__name__}")
    if len(value) > MAX_ITEMS:
        _bad(source, where, f"holds {len(value):,} entries, more than {MAX_ITEMS:,}")
    return value


def _text(source: str, value: Any, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        _bad(source, where, f"must be a {'' if empty else 'non-empty '}string, got {value!r:.40}")
    return value


def _count(source: str, value: Any, where: str) -> int:
    if type(value) is not int or value < 0:
        _bad(source, where, f"must be a count (an int >= 0), got {value!r:.40}")
    return int(value)


def _bad(source: str, where: str, what: str) -> NoReturn:
    raise TraceFormatError(f"{source}: {where} {what}")
