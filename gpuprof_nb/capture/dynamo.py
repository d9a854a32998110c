"""What torch.compile did while a cell ran, from Dynamo's own structured log: the frames it
compiled (compile time, graph size), every graph break (reason, the user's line) and every
recompile (the guard that failed).

Dynamo reports each of these through `torch._logging.trace_structured` into the
`torch.__trace` logger (what `TORCH_TRACE=dir` writes to files). While a cell runs, a handler
of ours on that logger keeps the few records that matter; nothing is printed and no
environment variable or logging setting of the user's changes. Where the logger is missing
(an older torch), Dynamo's compilation metrics (`torch._dynamo.utils`) still give the frames
and their restart reasons. Frames compiled in an earlier cell (whose graphs this cell's trace
may still run, as `Torch-Compiled Region: F/G` ranges) are listed from those metrics too,
marked `earlier`.

The entry goes under gpuprof_nb's own key of the trace (`{"gpuprof_nb": {"compile": ...}}`);
io/compile_log.py reads it, analysis/compile.py explains it.
"""

from __future__ import annotations

import json
import linecache
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

# Longest text kept from one record (graph-break explanations run to a few hundred
# characters; their tracebacks can be long); records kept at most.
MAX_TEXT = 4000
MAX_RECORDS = 2000
# The compilation-metrics fields kept per compiled frame.
_METRIC_KEYS = (
    "compile_id",
    "co_name",
    "co_filename",
    "co_firstlineno",
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "graph_op_count",
    "graph_node_count",
    "guard_count",
    "fail_type",
    "fail_reason",
    "fail_user_frame_filename",
    "fail_user_frame_lineno",
    "restart_reasons",
    "cache_size",
    "recompile_reason",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        value = sorted(value, key=str)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)[:MAX_TEXT]


def _metrics_entry(metrics: Any) -> dict[str, Any]:
    """The kept fields of one compilation-metrics record (a dataclass or a dict)."""
    fields: dict[str, Any] = (
        metrics
        if isinstance(metrics, dict)
        else {k: getattr(metrics, k, None) for k in _METRIC_KEYS}
    )
    return {k: _jsonable(fields[k]) for k in _METRIC_KEYS if fields.get(k) is not None}


class _Handler(logging.Handler):
    def __init__(self, recorder: CompileRecorder) -> None:
        super().__init__(level=logging.DEBUG)
        self.recorder = recorder

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.recorder._take(record)
        except Exception:  # noqa: BLE001, S110 - never disturb a compile
            pass


class CompileRecorder:
    """Collects Dynamo's structured records between `start()` and `stop()` (idempotent,
    never raises); `record(to_trace_us)` returns the JSON-able entry:
    {"logged": bool, "events": [...], "frames": [...], "earlier": [...]}, each event
    {"kind": "graph_break" | "recompile", "compile_id", "ts_us", "text"} and each frame the
    compilation metrics of one compile (see _METRIC_KEYS), in the order they happened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._frames: list[dict[str, Any]] = []
        self._strings: dict[int, str] = {}
        self._logger: logging.Logger | None = None
        self._handler: _Handler | None = None
        self._before: set[str] = set()
        self._started = self._stopped = False
        self._dropped = 0

    def start(self) -> None:
        if self._started:
            raise RuntimeError("this CompileRecorder was already started; make a new one")
        self._started = True
        self._before = {m.get("compile_id", "") for m in _all_metrics()}
        try:
            from torch._logging import _internal

            logger = getattr(_internal, "trace_log", None)
        except ImportError:
            logger = None
        if isinstance(logger, logging.Logger):
            self._logger = logger
            self._handler = _Handler(self)
            logger.addHandler(self._handler)

    def stop(self) -> None:
        if not self._started or self._stopped:
            return
        self._stopped = True
        if self._logger is not None and self._handler is not None:
            try:
                self._logger.removeHandler(self._handler)
            except Exception:  # noqa: BLE001, S110 - stop() never raises
                pass

    def _take(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if not isinstance(meta, dict):
            return
        if "str" in meta:
            # Interned file names of the stacks below: ("name", index).
            value = meta["str"]
            if isinstance(value, list | tuple) and len(value) == 2:
                self._strings[int(value[1])] = str(value[0])
            return
        compile_id = _compile_id(meta)
        now = time.perf_counter_ns()
        if "compilation_metrics" in meta:
            entry = _metrics_entry(meta["compilation_metrics"])
            entry.setdefault("compile_id", compile_id)
            entry["ns"] = now
            self._add(self._frames, entry)
            return
        artifact = meta.get("artifact")
        if not isinstance(artifact, dict):
            return
        name = artifact.get("name")
        if name == "dynamo_graph_break_reason":
            kind = "graph_break"
        elif name == "recompile_reasons":
            kind = "recompile"
        else:
            return
        payload = getattr(record, "payload", None)
        text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
        event: dict[str, Any] = {
            "kind": kind,
            "compile_id": compile_id,
            "ns": now,
            "text": text[:MAX_TEXT],
        }
        if kind == "graph_break":
            line = _break_line(text)
            if line is not None:
                event["source"] = linecache.getline(line[0], line[1]).strip()[:200]
                mark = f'File "{line[0]}", line {line[1]}, in '
                at = text.rfind(mark)
                if at >= 0:
                    event["function"] = text[at + len(mark) :].split("\n", 1)[0].strip()[:200]
            # The reason comes before the user's traceback; the traceback (every frame of
            # the caller's stack) is left out.
            event["text"] = text.split("\nUser code traceback:", 1)[0][:MAX_TEXT]
        self._add(self._events, event)

    def _add(self, into: list[dict[str, Any]], entry: dict[str, Any]) -> None:
        with self._lock:
            if len(self._events) + len(self._frames) >= MAX_RECORDS:
                self._dropped += 1
                return
            into.append(entry)

    def record(self, to_trace_us: Callable[[int], float] | None = None) -> dict[str, Any]:
        """Return the entry (times on the trace's clock with `to_trace_us`, else left out)."""
        with self._lock:
            events = [dict(e) for e in self._events]
            frames = [dict(f) for f in self._frames]
        for item in (*events, *frames):
            ns = item.pop("ns", None)
            if to_trace_us is not None and ns is not None:
                item["ts_us"] = float(to_trace_us(ns))
        logged = self._handler is not None
        seen = {f.get("compile_id") for f in frames}
        earlier = []
        for m in _all_metrics():
            cid = m.get("compile_id")
            if cid in seen:
                continue
            if cid in self._before:
                earlier.append(m)
            elif not logged:
                frames.append(m)  # compiled during the run, known from the metrics alone
        entry: dict[str, Any] = {
            "logged": logged,
            "events": events,
            "frames": frames,
            "earlier": earlier,
        }
        if self._dropped:
            entry["dropped"] = self._dropped
        return entry

    def attach(
        self,
        artifact: dict[str, Any] | None,
        cell_numbers: Callable[[list[str]], dict[str, int]] | None = None,
    ) -> dict[str, Any] | None:
        """Put the entry under gpuprof_nb's key of `artifact` (a trace dict) when something
        was compiled or ran compiled; return `artifact`. Times are left out: most compiling
        happens in the warm-up, before the profiled run's clock starts. `cell_numbers` maps
        the notebook cells' file names the entry mentions to their execution numbers, kept
        with the trace's cells (so a break is named `In [4], line 2`)."""
        if artifact is None:
            return None
        entry = self.record()
        if entry["events"] or entry["frames"] or entry["earlier"]:
            from gpuprof_nb.io.cells import KEY

            own = artifact.setdefault(KEY, {})
            if isinstance(own, dict):
                own["compile"] = entry
                if cell_numbers is not None:
                    files = [f.get("co_filename", "") for f in entry["frames"]]
                    files += [w[0] for e in entry["events"] if (w := _break_line(e["text"]))]
                    found = cell_numbers([f for f in files if f])
                    if found:
                        own.setdefault("cells", {}).update(found)
        return artifact


def _compile_id(meta: dict[str, Any]) -> str:
    frame, attempt = meta.get("frame_id"), meta.get("frame_compile_id")
    return f"{frame}/{attempt}" if frame is not None and attempt is not None else ""


def _break_line(text: str) -> tuple[str, int] | None:
    """(file, line) from "Graph break in user code at FILE:LINE" (the payload's first line)."""
    first = text.split("\n", 1)[0]
    mark = "Graph break in user code at "
    if not first.startswith(mark):
        return None
    where = first[len(mark) :]
    file, _, line = where.rpartition(":")
    return (file, int(line)) if line.isdigit() and file else None


def _all_metrics() -> list[dict[str, Any]]:
    """Dynamo's compilation metrics of this process so far (the latest 64 by default)."""
    try:
        from torch._dynamo import utils
    except ImportError:
        return []
    getter = getattr(utils, "get_compilation_metrics", None)
    if getter is None:
        return []
    try:
        return [_metrics_entry(m) for m in getter()]
    except Exception:  # noqa: BLE001 - metrics are a bonus, never a failure
        return []
