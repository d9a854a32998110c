"""Decoded trace events -> model objects, and the whole trace -> `model.trace.Trace`.

`Builder.model_events` decides what each event becomes, whichever reader decoded it (see
decode.py): the fast reader's structs and the `PyEvent`s made from event dicts have the same
attributes. Repeated strings and shape tuples are shared, so a million `aten::add` cost one
string. `Builder.finish` sorts the events into a Trace, with the steps, devices and
gpuprof_nb's own entries read from the top-level keys.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any, TypeVar

try:
    import msgspec
except ImportError:  # optional at run time (decode.py reads without it)
    msgspec = None  # type: ignore[assignment]

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.cells import cells_of
from gpuprof_nb.io.guards import describe
from gpuprof_nb.io.modules import compile_log_of, module_capture_of
from gpuprof_nb.io.samples import samples_of
from gpuprof_nb.io.trace.decode import (
    ARGS_TYPES,
    HOW_TO_EXPORT,
    NO_ARGS,
    PyEvent,
    Raw,
    args_of,
)
from gpuprof_nb.io.utilisation import utilisation_of
from gpuprof_nb.model.build import fast_maker as _maker
from gpuprof_nb.model.trace import (
    Collective,
    DeviceInfo,
    DistributedInfo,
    GpuAnnotation,
    Kernel,
    MemoryEvent,
    Op,
    RuntimeCall,
    Step,
    SyncEvent,
    Trace,
)

T = TypeVar("T")

_STEP_NAME = re.compile(r"ProfilerStep#(\d+)$")
# What a wrongly typed field (a list as pid, a dict as ts, ...) raises on the per-event path.
_FIELD_ERRORS = (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError)

# Category -> what it becomes. Anything else is skipped (but still widens the window).
_OP_KINDS = {
    "cpu_op": "op",
    "Operator": "op",
    "user_annotation": "annotation",
    "python_function": "python",
}
_KERNEL_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    # MTIA's device events (compute jobs and dma_request copies, told apart by name below).
    "mtia_ccp_events": "kernel",
}
_MTIA = "mtia_ccp_events"
# A device event of a category not named above counts as device activity when it carries a
# stream (as HolisticTraceAnalysis reads them); annotations drawn on a device's timeline do
# not run anything.
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
# Category -> (which list, kind): one lookup per event decides where it goes.
_OPS, _RUNTIME, _KERNELS, _SYNCS, _GPU_ANNOTATIONS = range(5)
_ROUTE: dict[str, tuple[int, Any]] = {
    **{cat: (_OPS, kind) for cat, kind in _OP_KINDS.items()},
    **{cat: (_RUNTIME, None) for cat in _RUNTIME_CATS},
    **{cat: (_KERNELS, kind) for cat, kind in _KERNEL_KINDS.items()},
    "cuda_sync": (_SYNCS, None),
    "gpu_user_annotation": (_GPU_ANNOTATIONS, None),
}
# Top-level keys only torch.profiler (Kineto) and gpuprof_nb write: a trace with one of them
# is PyTorch's even when it holds no event we model (a cell that ran no torch op).
_TORCH_KEYS = frozenset(
    {
        "schemaVersion",
        "deviceProperties",
        "computeProperties",
        "distributedInfo",
        "traceName",
        "baseTimeNanoseconds",
        "record_shapes",
        "gpuprof_nb",
    }
)
# Pseudo-processes holding the profiler's own summary spans, not the workload.
_SUMMARY_PIDS = frozenset({"Traces", "Spans"})
_MISSING = object()

# Event times are microseconds: since the epoch (about 1.7e15 today) or since the profiler
# started. Past this (about 3,000 years) a time is damage, and would make windows of inf.
MAX_TIME_US = 1e17
# Nesting of shape args ([[dims of one tensor], ...], one more level for tensor lists).
_MAX_SHAPE_DEPTH = 4
# A tensor dimension, stride, grid or block size beyond this is not a real one.
_MAX_DIM = 2**50
# Inputs of one op (a list of thousands of tensors is real; millions are not).
_MAX_SHAPE_ITEMS = 100_000


# --------------------------------------------------------------------------------------------
# event -> model objects


_new_op = _maker(Op)
_new_kernel = _maker(Kernel)
_new_runtime = _maker(RuntimeCall)
_new_sync = _maker(SyncEvent)
_new_gpu_annotation = _maker(GpuAnnotation)
_new_memory = _maker(MemoryEvent)


def _host_id(value: Any) -> int | str:
    """Thread/process ids: ints stay ints, digit strings become ints, other strings stay."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        return int(value) if value.isdigit() else value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return str(value)


def _text_of(value: Any) -> str:
    """A non-string item of a list of strings (input types, call stack) as text: a scalar's
    repr, else a short description (never the repr of a nested or huge value)."""
    if value is None or type(value) in (int, float, bool):
        return describe(value)
    return f"<{describe(value)}>"


def _opt_int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def _collective(args: Any) -> Collective | None:
    """The collective a kernel's args describe (NCCL/RCCL kernels), or None."""
    name = args.coll_name
    if not isinstance(name, str):
        return None
    dtype = args.coll_dtype
    return Collective(
        name,
        _opt_int(args.coll_in_nelems),
        _opt_int(args.coll_out_nelems),
        _opt_int(args.coll_group_size),
        dtype if isinstance(dtype, str) else None,
    )


def _stream_of(stream: Any, tid: Any) -> int:
    """The stream of a device event: its args' stream, else the tid ('stream 7' or 7); -1 if
    none."""
    number = _opt_int(stream)
    if number is not None:
        return number
    if isinstance(tid, str) and tid.startswith("stream "):
        parsed = _opt_int(tid[7:].strip())
        if parsed is not None:
            return parsed
    parsed = _opt_int(tid)
    return parsed if parsed is not None else -1


class _OddShape(Exception):
    """A shape arg no tensor has: nested too deep, or holding what is not a size."""


def _tuplify(value: list[Any], depth: int = 1) -> tuple[Any, ...]:
    """Nested lists of sizes -> nested tuples (hashable, immutable). Raises _OddShape past
    _MAX_SHAPE_DEPTH levels, or for anything but ints in 0.._MAX_DIM (negative, a float, a
    string, a dict, a size past any tensor's)."""
    if depth > _MAX_SHAPE_DEPTH or len(value) > _MAX_SHAPE_ITEMS:
        raise _OddShape
    out: list[Any] = []
    bits = dims = 0
    for v in value:
        if type(v) is list:
            out.append(_tuplify(v, depth + 1))
        elif type(v) is int and 0 <= v <= _MAX_DIM:
            out.append(v)
            bits += v.bit_length()
            dims += 1
        else:
            raise _OddShape
    # A tensor has at most 64 dimensions, and the product of its sizes (its elements, what
    # the FLOP formulas multiply) must stay a float.
    if dims > 64 or bits > 900:
        raise _OddShape
    return tuple(out)


class Builder:
    """Turns events one at a time into model objects; `finish` sorts them into a Trace.
    Repeated strings and shape tuples are shared, so a million `aten::add` cost one string."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.ops: list[Op] = []
        self.kernels: list[Kernel] = []
        self.runtime: list[RuntimeCall] = []
        self.syncs: list[SyncEvent] = []
        self.gpu_annotations: list[GpuAnnotation] = []
        self.memory: list[MemoryEvent] = []
        self.lo = math.inf
        self.hi = -math.inf
        self.negative_durations = 0
        self.odd_shapes = 0
        self.event_count = 0
        self._shared: dict[Any, Any] = {}
        self._str_tuples: dict[Any, tuple[str, ...]] = {}
        # JSON text of a nested arg (fast reader) -> its converted, shared value.
        self._raw_shapes: dict[bytes, Any] = {}
        self._raw_strings: dict[bytes, Any] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _fail(self, index: int, what: str) -> TraceFormatError:
        return TraceFormatError(
            f"{self.source}: event {index} {what} (a truncated or hand-edited trace?); "
            f"re-export it with prof.export_chrome_trace(path)."
        )

    def _share(self, value: Any) -> Any:
        """Return one shared instance of an equal, hashable value (tuples of shapes, ...)."""
        return self._shared.setdefault(value, value)

    def _shared_tuple(self, value: Any) -> Any:
        """Nested lists of sizes -> nested tuples, one shared instance per distinct value;
        None (counted in odd_shapes, said in the load warnings) for a value no tensor has
        (see _tuplify): its op then has no shape, rather than an absurd FLOP count."""
        if type(value) is not list:
            return None
        try:
            key = _tuplify(value)
        except _OddShape:
            self.odd_shapes += 1
            return None
        return self._shared.setdefault(key, key)

    def _shape(self, value: Any) -> Any:
        """A shape arg (input dims or strides, a kernel's grid or block) -> _shared_tuple of
        it, through _nested; a repeated JSON text from the fast reader is looked up here."""
        if type(value) is Raw:
            hit = self._raw_shapes.get(bytes(value), _MISSING)
            if hit is not _MISSING:
                return hit
        return self._nested(self._raw_shapes, self._shared_tuple, value)

    def _strings(self, value: Any) -> Any:
        """A strings arg (input types, concrete inputs, call stack) -> _str_tuple of it,
        through _nested; a repeated JSON text from the fast reader is looked up here."""
        if type(value) is Raw:
            hit = self._raw_strings.get(bytes(value), _MISSING)
            if hit is not _MISSING:
                return hit
        return self._nested(self._raw_strings, self._str_tuple, value)

    @staticmethod
    def _nested(cache: dict[bytes, Any], convert: Any, value: Any) -> Any:
        """A nested arg (shapes, strides, grid, block with convert=_shared_tuple; input types,
        concrete inputs, call stack with convert=_str_tuple), as JSON text from the fast
        reader or already decoded -> convert(value). Each distinct JSON text is decoded and
        converted once, kept in `cache`."""
        if type(value) is Raw:
            key = bytes(value)
            hit = cache.get(key, _MISSING)
            if hit is _MISSING:
                hit = cache[key] = convert(msgspec.json.decode(key))
            return hit
        if type(value) is list and msgspec is not None:
            # An event dict's list (trace_from_dict): keyed by its JSON text too, which tells
            # 1 from 1.0 and true, so each distinct value is checked and converted once.
            try:
                key = msgspec.json.encode(value)
            except Exception:  # noqa: BLE001 - what JSON cannot hold is converted as is
                return convert(value)
            hit = cache.get(key, _MISSING)
            if hit is _MISSING:
                hit = cache[key] = convert(value)
            return hit
        return convert(value)

    def _str_tuple(self, value: Any) -> tuple[str, ...] | None:
        """Strings (a list of them, or one joined with ';') -> a shared tuple of interned
        strings. Results for all-string input are cached by the input itself: input types
        and call stacks repeat across millions of ops."""
        kind = type(value)
        raw: Any = tuple(value) if kind is list else value if kind is str else None
        if raw is not None:
            try:
                hit = self._str_tuples.get(raw)
            except TypeError:  # a list inside: unhashable, not all strings anyway
                raw = None
            else:
                if hit is not None:
                    return hit
        result: tuple[str, ...]
        if isinstance(value, list):
            result = self._share(
                tuple([sys.intern(v) if isinstance(v, str) else _text_of(v) for v in value])
            )
        elif isinstance(value, str):
            # Some exporters join the stack with ';'.
            result = self._share(tuple(sys.intern(p) for p in value.split(";") if p))
        else:
            return None
        # Only all-string keys: (1,) == (True,) as dict keys, but they convert differently.
        if raw is not None and (kind is str or all(type(v) is str for v in value)):
            self._str_tuples[raw] = result
        return result

    # -- the per-event hot path -------------------------------------------------------------

    def add(self, event: Any, index: int) -> None:
        """Model one event dict (`index`: its position in traceEvents, for messages and ties)."""
        if type(event) is not dict:
            if not isinstance(event, Mapping):
                raise self._fail(index, f"is a {type(event).__name__}, not a JSON object")
            event = dict(event)
        get = event.get
        try:
            args = get("args")
            fields = PyEvent(
                get("ph"),
                get("name"),
                get("cat"),
                get("ts"),
                get("dur"),
                get("pid"),
                get("tid"),
                None if args is None else args_of(args),
            )
        except _FIELD_ERRORS as exc:
            raise self._odd_field(index, exc) from exc
        self.model_events([fields], index)

    def _odd_field(self, index: int, exc: Exception) -> TraceFormatError:
        # e.g. a list where a pid or category should be: unhashable, not comparable.
        return self._fail(index, f"has a field of an unexpected type ({exc})")

    def add_events(self, events: list[Any], first_index: int) -> None:
        """Model the fast reader's decoded structs, numbered from `first_index`."""
        self.model_events(events, first_index)

    def model_events(self, events: list[Any], first_index: int) -> None:
        """Model events numbered from `first_index`: the fast reader's decoded structs or
        `PyEvent`s made from event dicts (fields None where an event lacks one). The one place
        that decides what an event becomes, whichever reader decoded it: an instant widens
        the window (a '[memory]' one is an allocator event: _memory_event); a complete ('X')
        event is checked, widens the window, and goes by its category (_ROUTE) to the step
        that makes its model object (_op, _runtime_call, _kernel, _sync, _gpu_annotation);
        other phases ('M' metadata, with unrelated early times, flows, counters) are nothing
        to model.

        It stays one function of about 90 lines, for speed: it runs once per event of a trace
        that may hold millions, so what every event needs (the phase, the time checks, the
        window, the route) is inlined here with the window and counters in locals, and a
        step is called only for an event it models, each from its own call site (one the
        interpreter specialises)."""
        self.event_count += len(events)
        # Bound per call, not stored on self: bound methods kept on the builder would make a
        # reference cycle.
        op, runtime_call, kernel = self._op, self._runtime_call, self._kernel
        memory_event = self._memory_event
        route = _ROUTE
        summary_pids = _SUMMARY_PIDS
        args_types = ARGS_TYPES
        intern = sys.intern
        lo, hi = self.lo, self.hi
        negative = 0
        index = first_index
        try:
            for index, e in enumerate(events, first_index):  # noqa: B007 - read in except
                ph = e.ph
                if ph != "X":
                    if ph == "i" or ph == "I":
                        pid = e.pid
                        if pid in summary_pids:
                            continue
                        ts = e.ts
                        t = type(ts)
                        if (t is not float and t is not int) or ts - ts != 0:
                            raise self._fail(
                                index, f"({e.name!r}) has no numeric 'ts' (got {ts!r})"
                            )
                        if ts < lo:
                            lo = ts
                        if ts > hi:
                            hi = ts
                        if e.name == "[memory]":
                            memory_event(e, index, ts, pid)
                    continue
                ts = e.ts
                dur = e.dur
                t = type(ts)
                if (t is not float and t is not int) or ts - ts != 0:
                    raise self._fail(index, f"({e.name!r}) has no numeric 'ts' (got {ts!r})")
                t = type(dur)
                if (t is not float and t is not int) or dur - dur != 0:
                    raise self._fail(index, f"({e.name!r}) has no numeric 'dur' (got {dur!r})")
                if dur < 0:
                    negative += 1
                    dur = 0
                cat = e.cat
                pid = e.pid
                if cat == "Trace" or pid in summary_pids:
                    continue
                if ts < lo:
                    lo = ts
                end = ts + dur
                if end > hi:
                    hi = end
                where = route.get(cat)
                if where is None:
                    args = e.args
                    if (
                        args is None
                        or type(args) not in args_types
                        or args.stream is None
                        or (type(cat) is str and "annotation" in cat)
                    ):
                        continue  # a category not modelled: it only widens the window
                    where = _KERNELS, "kernel"
                name = e.name
                name = intern(name) if type(name) is str else str(name)
                start = ts if type(ts) is float else float(ts)
                dur_f = dur if type(dur) is float else float(dur)
                tid = e.tid
                args = e.args
                if args is not None and type(args) not in args_types:
                    args = None  # not a JSON object: no args the model reads
                code, kind = where
                if code == _OPS:
                    op(index, cat, name, kind, start, dur_f, pid, tid, args)
                elif code == _RUNTIME:
                    runtime_call(index, name, start, dur_f, pid, tid, args)
                elif code == _KERNELS:
                    kernel(index, cat, name, kind, start, dur_f, pid, tid, args)
                elif code == _SYNCS:
                    self._sync(index, name, start, dur_f, pid, args)
                else:
                    self._gpu_annotation(index, name, start, dur_f, pid, tid, args)
        except _FIELD_ERRORS as exc:
            raise self._odd_field(index, exc) from exc
        finally:
            self.lo, self.hi = lo, hi
            self.negative_durations += negative

    # -- the steps: one event's model object ------------------------------------------------
    # Each takes the event's checked fields it needs: its index, category, interned name, kind
    # (from _ROUTE), start and duration (floats), pid and tid as given, and its args (an
    # ARGS_TYPES object, or None where it has none).

    def _memory_event(self, e: Any, index: int, ts: Any, pid: Any) -> None:
        """Append the MemoryEvent of a '[memory]' instant (an allocator event) whose args say
        how many bytes; ignore it otherwise."""
        args = e.args
        if args is None or type(args) not in ARGS_TYPES:
            return
        nbytes = args.mem_bytes
        if type(nbytes) is not int:
            nbytes = _opt_int(nbytes)
            if nbytes is None:
                return
        device_type = args.device_type
        if type(device_type) is not int:
            device_type = _opt_int(device_type)
        device_id = args.device_id
        if type(device_id) is not int:
            device_id = _opt_int(device_id)
        addr = args.addr
        if type(addr) is not int and addr is not None:
            addr = _opt_int(addr)
        allocated = args.total_allocated
        if type(allocated) is not int and allocated is not None:
            allocated = _opt_int(allocated)
        reserved = args.total_reserved
        if type(reserved) is not int and reserved is not None:
            reserved = _opt_int(reserved)
        tid = e.tid
        self.memory.append(
            _new_memory(
                ts if type(ts) is float else float(ts),
                nbytes,
                device_type if device_type is not None else -1,
                device_id if device_id is not None else -1,
                addr,
                allocated,
                reserved,
                pid if type(pid) is int else _host_id(pid),
                tid if type(tid) is int else _host_id(tid),
            )
        )

    def _op(
        self,
        index: int,
        cat: Any,
        name: str,
        kind: str,
        start: float,
        dur: float,
        pid: Any,
        tid: Any,
        args: Any,
    ) -> None:
        """Append the Op of a host-side event (cpu_op, user_annotation, python_function and
        their 2021 spellings). Long only in its parts: it runs once per host event, so each
        optional argument is tested inline before a helper is called, and the Op's 15
        fields are given one a line."""
        if type(pid) is not int:
            pid = _host_id(pid)
        if type(tid) is not int:
            tid = _host_id(tid)
        if kind == "op" and (
            name.startswith("ProfilerStep#")
            or (cat == "Operator" and name.startswith("Optimizer."))
        ):
            # 2021 traces recorded record_function scopes as Operator; a step marker is an
            # annotation whatever category an exporter gives it.
            kind = "annotation"
        if args is None:
            external = dims = in_types = strides = concrete = seq = fwd = stack = None
        else:
            external = args.external_id
            if external is None:
                external = args.external_id_2021
            if external is not None and type(external) is not int:
                external = _opt_int(external)
            # Most of these are absent from most events: test before calling a helper.
            dims = args.input_dims
            if dims is not None:
                dims = self._shape(dims)
            if dims is None:
                dims = args.input_dims_2021
                if dims is not None:
                    dims = self._shape(dims)
            in_types = args.input_types
            if in_types is not None:
                in_types = self._strings(in_types)
            strides = args.input_strides
            if strides is not None:
                strides = self._shape(strides)
            if strides is None:
                strides = args.input_strides_2021
                if strides is not None:
                    strides = self._shape(strides)
            concrete = args.concrete_inputs
            if concrete is not None:
                concrete = self._strings(concrete)
            seq = args.sequence_number
            if seq is not None and type(seq) is not int:
                seq = _opt_int(seq)
            fwd = args.fwd_thread_id
            if fwd is not None and type(fwd) is not int:
                fwd = _opt_int(fwd)
            stack = args.call_stack
            if stack is not None:
                stack = self._strings(stack)
        self.ops.append(
            _new_op(
                name,
                kind,
                start,
                dur,
                pid,
                tid,
                external,
                dims,
                in_types,
                strides,
                concrete,
                seq,
                fwd,
                stack,
                index,
            )
        )

    def _runtime_call(
        self,
        index: int,
        name: str,
        start: float,
        dur: float,
        pid: Any,
        tid: Any,
        args: Any,
    ) -> None:
        """Append the RuntimeCall of a CUDA/HIP runtime or driver call."""
        if args is None:
            args = NO_ARGS
        if type(pid) is not int:
            pid = _host_id(pid)
        if type(tid) is not int:
            tid = _host_id(tid)
        external = args.external_id
        if external is None:
            external = args.external_id_2021
        corr = args.correlation
        self.runtime.append(
            _new_runtime(
                name,
                start,
                dur,
                pid,
                tid,
                corr if type(corr) is int else _opt_int(corr),
                external if type(external) is int else _opt_int(external),
                index,
            )
        )

    def _kernel(
        self,
        index: int,
        cat: Any,
        name: str,
        kind: str,
        start: float,
        dur: float,
        pid: Any,
        tid: Any,
        args: Any,
    ) -> None:
        """Append the Kernel of a device activity: a kernel, copy or set (kind), or an event
        of another category that names a stream."""
        if args is None:
            args = NO_ARGS
        if cat == _MTIA and name.startswith("dma"):
            kind = "memcpy"  # MTIA's dma_request: a copy
        device = args.device
        if type(device) is not int:
            device = _opt_int(device)
            if device is None:
                device = _opt_int(pid)
        stream = args.stream
        if type(stream) is not int:
            stream = _stream_of(stream, tid)
        external = args.external_id
        if external is None:
            external = args.external_id_2021
        corr = args.correlation
        # Two per kernel: _shape's cache hit inlined.
        grid = args.grid
        if grid is not None:
            hit = self._raw_shapes.get(bytes(grid), _MISSING) if type(grid) is Raw else _MISSING
            grid = self._shape(grid) if hit is _MISSING else hit
        block = args.block
        if block is not None:
            hit = self._raw_shapes.get(bytes(block), _MISSING) if type(block) is Raw else _MISSING
            block = self._shape(block) if hit is _MISSING else hit
        self.kernels.append(
            _new_kernel(
                name,
                kind,
                start,
                dur,
                device if device is not None else -1,
                stream,
                corr if type(corr) is int else _opt_int(corr),
                external if type(external) is int else _opt_int(external),
                _opt_int(args.nbytes) if kind != "kernel" else None,
                grid,
                block,
                index,
                _collective(args) if args.coll_name is not None else None,
            )
        )

    def _sync(
        self,
        index: int,
        name: str,
        start: float,
        dur: float,
        pid: Any,
        args: Any,
    ) -> None:
        """Append the SyncEvent of a host-side sync (cuda_sync)."""
        if args is None:
            args = NO_ARGS
        device = _opt_int(args.device)
        if device is None:
            device = _opt_int(pid)
        stream = _opt_int(args.stream)
        on_stream = _opt_int(args.wait_on_stream)
        record = _opt_int(args.wait_on_event_record)
        self.syncs.append(
            _new_sync(
                name,
                start,
                dur,
                device if device is not None else -1,
                stream if stream is not None else -1,
                _opt_int(args.correlation),
                index,
                on_stream if on_stream is not None and on_stream >= 0 else None,
                record if record is not None and record >= 0 else None,
            )
        )

    def _gpu_annotation(
        self,
        index: int,
        name: str,
        start: float,
        dur: float,
        pid: Any,
        tid: Any,
        args: Any,
    ) -> None:
        """Append the GpuAnnotation of a record_function range on the device's timeline."""
        if args is None:
            args = NO_ARGS
        device = _opt_int(pid)
        external = args.external_id
        self.gpu_annotations.append(
            _new_gpu_annotation(
                name,
                start,
                dur,
                device if device is not None else -1,
                _stream_of(None, tid),
                external if type(external) is int else _opt_int(external),
                index,
            )
        )

    # -- whole trace ------------------------------------------------------------------------

    def finish(self, top: Mapping[str, Any], source_stat: tuple[int, int] | None = None) -> Trace:
        if self.lo > self.hi:
            what = (
                "has no events at all"
                if self.event_count == 0
                else f"has {self.event_count} events but none with a time span (only metadata)"
            )
            raise TraceFormatError(
                f"{self.source}: empty trace: it {what}; profile at least one step "
                f"(check the profiler schedule's active steps) and export again."
            )
        if not (-MAX_TIME_US <= self.lo and self.hi <= MAX_TIME_US):
            raise self._fail(self._far_event(), f"has a time beyond ±{MAX_TIME_US:g} us")
        if not (self.ops or self.kernels or self.runtime or self.syncs or self.memory) and not (
            _TORCH_KEYS & top.keys()
        ):
            raise TraceFormatError(
                f"{self.source}: this is not a PyTorch trace: none of its {self.event_count:,} "
                "events is one torch.profiler records (categories cpu_op, user_annotation, "
                "python_function, kernel, gpu_memcpy, cuda_runtime, ...). A Chrome, Perfetto or "
                f"other tool's trace cannot be analysed here; {HOW_TO_EXPORT}."
            )
        # Each list was appended in file order and sorting is stable, so sorting by start
        # alone leaves ties in file order: the same as sorting by (start, index), cheaper.
        by_start = attrgetter("start_us")
        ops = sorted(self.ops, key=by_start)
        kernels = sorted(self.kernels, key=by_start)
        runtime = sorted(self.runtime, key=by_start)
        syncs = sorted(self.syncs, key=by_start)
        memory = sorted(self.memory, key=attrgetter("ts_us"))
        warnings: list[str] = []
        if self.negative_durations:
            warnings.append(
                f"{self.negative_durations} events had negative durations; clamped to 0 us."
            )
        if self.odd_shapes:
            warnings.append(
                "some input shapes, strides, grids or blocks are not sizes any tensor or "
                "kernel has (negative, not integers, beyond 2**50, or nested too deep); they "
                "were left out, so those ops' FLOPs and bytes are not estimated."
            )
        schema = top.get("schemaVersion")
        # gpuprof_nb's own samples ride along with the trace: a malformed entry costs its
        # Hotspots or utilisation strip (said in the warnings), never the trace.
        samples = _own_entry(lambda: samples_of(top, self.source), "line samples", warnings)
        utilisation = _own_entry(lambda: utilisation_of(top), "utilisation samples", warnings)
        modules = _own_entry(
            lambda: module_capture_of(top, self.source), "module records", warnings
        )
        compiled = _own_entry(lambda: compile_log_of(top, self.source), "compile records", warnings)
        return Trace(
            source=self.source,
            ops=tuple(ops),
            kernels=tuple(kernels),
            runtime=tuple(runtime),
            syncs=tuple(syncs),
            memory=tuple(memory),
            steps=_find_steps(ops),
            devices=_devices(top),
            distributed=_distributed(top.get("distributedInfo")),
            bounds_us=(float(self.lo), float(self.hi)),
            schema_version=schema if type(schema) is int else None,
            metadata=dict(top),
            load_warnings=tuple(warnings),
            cells=cells_of(top),
            samples=samples,
            utilisation=utilisation,
            modules=modules,
            compile_log=compiled,
            source_stat=source_stat,
            gpu_annotations=tuple(sorted(self.gpu_annotations, key=by_start)),
        )

    def _far_event(self) -> int:
        """The index of the first event whose time is beyond MAX_TIME_US (-1 when only an
        event the model does not keep has one)."""
        far = [
            e.index
            for group in (self.ops, self.kernels, self.runtime, self.syncs)
            for e in group
            if not -MAX_TIME_US <= e.start_us <= MAX_TIME_US
            or not e.start_us + e.dur_us <= MAX_TIME_US
        ]
        return min(far, default=-1)


def _own_entry(read: Callable[[], T], what: str, warnings: list[str]) -> T | None:
    """Return read() (gpuprof_nb's samples kept with the trace), or None with a warning
    naming what was wrong when the entry is malformed."""
    try:
        return read()
    except TraceFormatError as exc:
        warnings.append(f"{exc}; the {what} were left out")
        return None
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        warnings.append(f"gpuprof_nb's {what} are malformed ({type(exc).__name__}); left out")
        return None


def _find_steps(ops: list[Op]) -> tuple[Step, ...]:
    """Steps from host-side `ProfilerStep#N` annotations (numbered N; an N seen twice spans
    both). Without them, from `Optimizer.step#...` annotations: a step runs from the end of one
    optimizer step to the end of the next (so k optimizer steps give k-1 steps, numbered 1..k-1
    by the optimizer step that closes them). Only the most frequent optimizer annotation name is
    used, so two optimizers stepping in the same iteration do not split it."""
    spans: dict[int, tuple[float, float]] = {}
    for op in ops:
        if op.kind != "annotation":
            continue
        match = _STEP_NAME.match(op.name)
        if match is None:
            continue
        number = int(match.group(1))
        old = spans.get(number)
        spans[number] = (
            (op.start_us, op.end_us)
            if old is None
            else (min(old[0], op.start_us), max(old[1], op.end_us))
        )
    if spans:
        return tuple(
            Step(n, f"ProfilerStep#{n}", s, e)
            for n, (s, e) in sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0]))
        )
    optimizer = [o for o in ops if o.kind == "annotation" and o.name.startswith("Optimizer.step#")]
    if len(optimizer) < 2:
        return ()
    counts = Counter(o.name for o in optimizer)
    name = min(counts, key=lambda n: (-counts[n], n))
    ends = sorted(o.end_us for o in optimizer if o.name == name)
    return tuple(Step(i, name, ends[i - 1], ends[i]) for i in range(1, len(ends)))


def _devices(top: Mapping[str, Any]) -> tuple[DeviceInfo, ...]:
    props = top.get("deviceProperties")
    old_style = False
    if not isinstance(props, list):
        props = top.get("computeProperties")
        old_style = True
    if not isinstance(props, list):
        return ()
    out = []
    for position, p in enumerate(props):
        if not isinstance(p, Mapping):
            continue
        index = _opt_int(p.get("id"))
        major = _opt_int(p.get("major" if old_style else "computeMajor"))
        minor = _opt_int(p.get("minor" if old_style else "computeMinor"))
        name = p.get("name")
        out.append(
            DeviceInfo(
                index=index if index is not None else position,
                name=name if isinstance(name, str) else "",
                total_memory_bytes=_opt_int(p.get("totalGlobalMem")),
                compute_capability=(major, minor)
                if major is not None and minor is not None
                else None,
                num_sms=_opt_int(p.get("multiProcessorCount" if old_style else "numSms")),
            )
        )
    return tuple(out)


def _distributed(info: Any) -> DistributedInfo | None:
    if not isinstance(info, Mapping):
        return None
    backend = info.get("backend")
    return DistributedInfo(
        rank=_opt_int(info.get("rank")),
        world_size=_opt_int(info.get("world_size")),
        backend=backend if isinstance(backend, str) else None,
    )
