"""Chrome/Kineto trace JSON (torch.profiler `export_chrome_trace`) -> `model.trace.Trace`.

Every format quirk lives here, so analysis sees one shape:

- 2021 Kineto traces: capitalised categories (`Operator`, `Runtime`, `Kernel`, `Memcpy`,
  `Memset`), GPU thread ids like `"stream 7"`, lowercase `'external id'`, `computeProperties`
  instead of `deviceProperties`, and `ProfilerStep#N` / `Optimizer.step#...` recorded as
  `Operator` (they become annotations here, as in newer traces).
- Current traces: `cpu_op`, `user_annotation`, `python_function`, `cuda_runtime`,
  `cuda_driver`, `kernel`, `gpu_memcpy`, `gpu_memset`, `cuda_sync`, `[memory]` instants.
- AMD/ROCm: hip* calls under `cuda_runtime`, the GPU's pid as device, kernel args with `kind`.
- Host thread ids given as digit strings (`"24572"`) become ints, so one thread has one key.
- `gpu_user_annotation` events (record_function ranges on the device's timeline: pid is
  the device, tid the stream) become `Trace.gpu_annotations`.
- Categories we do not model (flows, `fwdbwd`, `cuda_profiler_range`, MTIA runtime events,
  ...) are skipped, but their timed events still count for `window_us`.

Files are decoded incrementally from a buffer read in chunks, and each event becomes a slotted
model object at once, so peak memory is the model plus a chunk's worth of events rather than
every event dict (what `json.load` would build). With msgspec installed, the runs of whole
events in the buffer are decoded in one call each into light structs that hold only the fields
the model reads, args included (only the keys in _ARG_KEYS; nested ones such as shapes and
call stacks stay JSON text, converted once per distinct text), about 2x faster than
`json.load` (benchmarks/json_choice.py has the measurements); the standard-library reader,
one event at a time, handles the rest: what msgspec refuses (NaN, bad JSON, with located
error messages), and everything when msgspec is missing.
Both feed the same event loop (`_Builder._model`).

Negative durations (seen in truncated Kineto exports) are clamped to 0 and counted in
`Trace.load_warnings`; they never make an interval run backwards.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import json
import math
import os
import re
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, Union, cast

try:
    import msgspec
except ImportError:  # optional at run time: the standard library reader does the same work
    msgspec = None  # type: ignore[assignment]

from gpuprof_nb.errors import GpuprofError, TraceFormatError
from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.io.cells import cells_of
from gpuprof_nb.io.guards import (
    GzipGuard,
    check_writable,
    describe,
    open_for_writing,
    open_regular,
)
from gpuprof_nb.io.modules import compile_log_of, module_capture_of
from gpuprof_nb.io.samples import samples_of
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

# gzip traces are decompressed with ISA-L (python-isal) where it is installed: the same bytes
# as the standard library's zlib, about 3x faster (a third of a 21 MB trace's load went to
# zlib); without it, the standard library's gzip.
_GZIP_ERRORS: tuple[type[BaseException], ...] = (gzip.BadGzipFile, zlib.error, OSError)
_gzip_file: Callable[..., Any]
try:
    from isal import igzip, isal_zlib
except ImportError:  # optional at run time
    _gzip_file = gzip.GzipFile
else:
    _gzip_file = igzip.GzipFile
    # isal's stub declares its error class as an instance of Exception.
    _GZIP_ERRORS = (*_GZIP_ERRORS, cast("type[BaseException]", isal_zlib.error))

__all__ = ["load_trace", "trace_from_dict"]

_CHUNK_CHARS = 1 << 18  # 256 Ki characters per read (and per msgspec batch); see _batches
_GZIP_MAGIC = b"\x1f\x8b"
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
# A flat flow event written ph-first (as Kineto does), with the ',' after it. A third of a
# GPU trace's events are flows; skipping them undecoded saves that share of the parse. Any
# other layout simply does not match and is decoded as usual.
_FLOW = re.compile(
    r'\{[ \t\n\r]*"ph"[ \t\n\r]*:[ \t\n\r]*"[sft]"'
    r'(?:[^{}"\[\]]|"(?:[^"\\]|\\.)*")*\}[ \t\n\r]*,[ \t\n\r]*'
)
# After the '}' that closes an event: the ',' and the '{' of the next one (see _batches).
_NEXT_EVENT = re.compile(r"[ \t\n\r]*,[ \t\n\r]*\{")
# msgspec's words for JSON that ended before the text did, with the byte where it ended.
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
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

_HOW_TO_EXPORT = (
    "export it with torch.profiler's prof.export_chrome_trace(path) "
    "(or on_trace_ready=tensorboard_trace_handler)"
)
_WHAT = "a trace written by torch.profiler's export_chrome_trace (.json or .json.gz)"
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
# public API


def load_trace(
    path: str | os.PathLike[str], capture: str | os.PathLike[str] | None = None
) -> Trace:
    """Return the Trace read from a Chrome/Kineto trace file (`.json` or gzip, detected by its
    magic bytes, whatever the name says). Times in the result are microseconds. With
    `capture`, the trace of a CUDA/HIP graph's capture: the graph launches' replayed kernels
    are attributed to the captured ops (io/graph_capture.py).

    Raises TraceFormatError (naming the file, what is wrong and what to do) for anything that
    is not a readable torch.profiler trace.
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TraceFormatError(
            f"load_trace expects the path of a trace file, got {type(path).__name__}; "
            f"{_HOW_TO_EXPORT}."
        )
    if capture is not None:
        from gpuprof_nb.io.graph_capture import merge_capture

        return merge_capture(load_trace(path), load_trace(capture))
    source = os.fsdecode(os.fspath(path))
    raw, st = open_regular(source, what=_WHAT, error=TraceFormatError)
    try:
        magic = raw.read(2)
        raw.seek(0)
        stream: Any = (
            GzipGuard(raw, _gzip_file, source, TraceFormatError) if magic == _GZIP_MAGIC else raw
        )
        builder = _Builder(source)
        with gc_paused():
            top = _StreamParser(stream, source, gzipped=magic == _GZIP_MAGIC).parse(builder)
            return builder.finish(top, source_stat=(st.st_size, st.st_mtime_ns))
    finally:
        raw.close()


def trace_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> Trace:
    """Return the Trace held in an already-parsed trace dict (as `json.load` of a Chrome
    trace would give, or as live capture builds it). Times are microseconds."""
    if isinstance(d, list):
        events: Any = d
        top: dict[str, Any] = {}
    elif isinstance(d, Mapping):
        if "traceEvents" not in d:
            keys = ", ".join(sorted(map(str, d))[:8]) or "none"
            raise TraceFormatError(
                f"{source}: not a profiler trace: no 'traceEvents' list (top-level keys: "
                f"{keys}); {_HOW_TO_EXPORT}."
            )
        events = d["traceEvents"]
        top = {k: v for k, v in d.items() if k != "traceEvents"}
    else:
        raise TraceFormatError(
            f"{source}: expected a trace dict with a 'traceEvents' list, got "
            f"{type(d).__name__}; {_HOW_TO_EXPORT}."
        )
    if not isinstance(events, list | tuple):
        raise TraceFormatError(
            f"{source}: 'traceEvents' is a {type(events).__name__}, not a list; {_HOW_TO_EXPORT}."
        )
    builder = _Builder(source)
    with gc_paused():
        converted = None
        if _DICT_EVENTS is not None:
            # Every event dict into a light struct in one C call (keys the model does not
            # read are skipped there); events it cannot convert (not a dict, an args key
            # that is not a string) go through the per-event path, which says which.
            try:
                converted = msgspec.convert(events, _DICT_EVENTS)
            except msgspec.ValidationError:
                converted = None
        if converted is not None:
            builder._model(converted, 0)
        else:
            add = builder.add
            for index, event in enumerate(events):
                add(event, index)
        return builder.finish(top)


# The args the model reads: attribute name -> the key in a trace event's "args". Two spellings
# of one key (2021 traces write 'external id', 'Input dims') are two attributes.
_ARG_KEYS = {
    "external_id": "External id",
    "external_id_2021": "external id",
    "input_dims": "Input Dims",
    "input_dims_2021": "Input dims",
    "input_types": "Input type",
    "input_strides": "Input Strides",
    "input_strides_2021": "Input strides",
    "concrete_inputs": "Concrete Inputs",
    "sequence_number": "Sequence number",
    "fwd_thread_id": "Fwd thread id",
    "call_stack": "Call stack",
    "correlation": "correlation",
    "device": "device",
    "stream": "stream",
    "grid": "grid",
    "block": "block",
    "nbytes": "bytes",
    "mem_bytes": "Bytes",
    "device_type": "Device Type",
    "device_id": "Device Id",
    "addr": "Addr",
    "total_allocated": "Total Allocated",
    "total_reserved": "Total Reserved",
    "coll_name": "Collective name",
    "coll_in_nelems": "In msg nelems",
    "coll_out_nelems": "Out msg nelems",
    "coll_group_size": "Group size",
    "coll_dtype": "dtype",
    "wait_on_stream": "wait_on_stream",
    "wait_on_event_record": "wait_on_cuda_event_record_corr_id",
}
# The nested ones (lists of shapes, types, stack frames): repeated across thousands of ops,
# so the fast reader keeps their JSON text (msgspec.Raw) and converts each distinct text once.
_NESTED_ARGS = frozenset(
    {
        "input_dims",
        "input_dims_2021",
        "input_types",
        "input_strides",
        "input_strides_2021",
        "concrete_inputs",
        "call_stack",
        "grid",
        "block",
    }
)


class _PyArgs:
    """The args the model reads, from an args dict (None where absent): what the per-event
    reader and `trace_from_dict` use when msgspec is missing. Same attributes as _Args."""

    __slots__ = tuple(_ARG_KEYS)

    def __init__(self, args: Mapping[str, Any]) -> None:
        get = args.get
        for attr, key in _ARG_KEYS.items():
            setattr(self, attr, get(key))


def _args_types() -> tuple[Any, Any, Any, Any, Any]:
    """Return (decoder of a JSON array of events, its args struct, struct for an args dict,
    Raw type, the type `msgspec.convert` turns a list of event dicts into).

    The decoder reads events into light structs holding only the fields the model reads
    (None where an event lacks one); their args into a struct of the keys in _ARG_KEYS, the
    nested ones kept as JSON text (args that are not an object decode as they are, and are
    then ignored, as the per-event reader ignores them). Without msgspec: (None, a type
    nothing has, _PyArgs, another type nothing has)."""
    if msgspec is None:
        return None, type("_NoArgs", (), {}), _PyArgs, type("_NoRaw", (), {}), None

    # Built with defstruct, so no annotation has to be resolved by module name; gc=False: the
    # structs hold no cycles and live for one batch.
    def args_struct(name: str, nested: Any) -> Any:
        return msgspec.defstruct(
            name,
            [(a, nested if a in _NESTED_ARGS else Any, None) for a in _ARG_KEYS],
            rename=_ARG_KEYS,
            gc=False,
        )

    def event_fields(args: Any) -> list[Any]:
        fields: list[Any] = [(f, Any, None) for f in ("name", "cat", "ts", "dur", "pid", "tid")]
        fields.append(("args", args | None | list | str | int | float | bool, None))
        return fields

    raw_args = args_struct("_Args", msgspec.Raw)
    parsed_args = args_struct("_ParsedArgs", Any)
    # The file's events: one struct per phase, told apart by "ph" (a tagged union; "ph" is
    # a class attribute, read as on any event). Flow arrows (a third of a GPU trace's
    # events) keep no field: nothing of theirs is modelled, so nothing is built. A phase
    # not listed fails the batch, which the per-event loop then reads.
    phases = []
    for ph in _PHASES:
        fields = [] if ph in _FLOW_PHASES else event_fields(raw_args)
        phases.append(
            msgspec.defstruct(
                f"_Event_{ord(ph)}", fields, tag_field="ph", tag=ph, namespace={"ph": ph}, gc=False
            )
        )
    dict_event = msgspec.defstruct(
        "_DictEvent", [("ph", Any, None), *event_fields(parsed_args)], gc=False
    )
    listed: Any = list  # the types below are built at run time
    return (
        msgspec.json.Decoder(listed[Union[tuple(phases)]]),  # noqa: UP007
        raw_args,
        parsed_args,
        msgspec.Raw,
        listed[dict_event],
    )


# Every phase of the Chrome trace event format; the flow phases ('s', 't', 'f').
_PHASES = tuple("BEXiICbneMstfPONDR()Vv")
_FLOW_PHASES = frozenset("stf")


_EVENT_DECODER, _RAW_ARGS, _ARGS_STRUCT, _Raw, _DICT_EVENTS = _args_types()
_ARGS_TYPES = frozenset({_RAW_ARGS, _ARGS_STRUCT, _PyArgs})
_NO_ARGS = _PyArgs({})


class _PyEvent:
    """An event dict's fields, for the per-event reader and `trace_from_dict` (the fast
    reader's _Event struct has the same attributes)."""

    __slots__ = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "args")

    def __init__(
        self, ph: Any, name: Any, cat: Any, ts: Any, dur: Any, pid: Any, tid: Any, args: Any
    ) -> None:
        self.ph = ph
        self.name = name
        self.cat = cat
        self.ts = ts
        self.dur = dur
        self.pid = pid
        self.tid = tid
        self.args = args


def _args_of(args: Any) -> Any:
    """An event's args dict -> the args object the model reads (None for anything that is not
    a dict)."""
    if type(args) is not dict:
        if not isinstance(args, Mapping):
            return None
        args = dict(args)
    if _ARGS_STRUCT is _PyArgs:
        return _PyArgs(args)
    try:
        return msgspec.convert(args, _ARGS_STRUCT)
    except msgspec.ValidationError:  # a key that is not a string (never in JSON)
        return _PyArgs(args)


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


class _Builder:
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

    @staticmethod
    def _nested(cache: dict[bytes, Any], convert: Any, value: Any) -> Any:
        """A nested arg (shapes, strides, grid, block with convert=_shared_tuple; input types,
        concrete inputs, call stack with convert=_str_tuple), as JSON text from the fast
        reader or already decoded -> convert(value). Each distinct JSON text is decoded and
        converted once, kept in `cache`."""
        if type(value) is _Raw:
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
            fields = _PyEvent(
                get("ph"),
                get("name"),
                get("cat"),
                get("ts"),
                get("dur"),
                get("pid"),
                get("tid"),
                None if args is None else _args_of(args),
            )
        except _FIELD_ERRORS as exc:
            raise self._odd_field(index, exc) from exc
        self._model([fields], index)

    def _odd_field(self, index: int, exc: Exception) -> TraceFormatError:
        # e.g. a list where a pid or category should be: unhashable, not comparable.
        return self._fail(index, f"has a field of an unexpected type ({exc})")

    def add_events(self, events: list[Any], first_index: int) -> None:
        """Model the fast reader's decoded `_Event` structs, numbered from `first_index`."""
        self._model(events, first_index)

    def _model(self, events: list[Any], first_index: int) -> None:
        """Model events numbered from `first_index`: the fast reader's decoded `_Event` structs
        or `_PyEvent`s made from event dicts (fields None where an event lacks one). The one
        place that decides what an event becomes, whichever reader decoded it.

        This loop runs once per event of a trace that may hold millions, so it is one loop
        with everything inlined: helpers are called only for what most events lack (nested
        args, ids that are not ints), and the window and counters live in locals."""
        self.event_count += len(events)
        ops_append = self.ops.append
        runtime_append = self.runtime.append
        kernels_append = self.kernels.append
        memory_append = self.memory.append
        new_memory = _new_memory
        route = _ROUTE
        summary_pids = _SUMMARY_PIDS
        args_types = _ARGS_TYPES
        intern = sys.intern
        new_op = _new_op
        # Bound per call, not stored on self: a partial of a bound method kept on the builder
        # would make a reference cycle.
        shape = functools.partial(self._nested, self._raw_shapes, self._shared_tuple)
        strings = functools.partial(self._nested, self._raw_strings, self._str_tuple)
        # A kernel's grid and block: shape(), its cache hit inlined (two per kernel).
        shapes_get = self._raw_shapes.get
        raw_type = _Raw
        missing = _MISSING
        lo, hi = self.lo, self.hi
        negative = 0
        index = first_index
        try:
            for index, e in enumerate(events, first_index):  # noqa: B007 - read in except
                ph = e.ph
                if ph != "X":
                    if ph == "i" or ph == "I":
                        # An instant widens the window; a '[memory]' one is an allocator
                        # event (inlined: a GPU trace holds hundreds of thousands).
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
                        args = e.args
                        if e.name != "[memory]" or args is None or type(args) not in args_types:
                            continue
                        nbytes = args.mem_bytes
                        if type(nbytes) is not int:
                            nbytes = _opt_int(nbytes)
                            if nbytes is None:
                                continue
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
                        memory_append(
                            new_memory(
                                ts if t is float else float(ts),
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
                    # 'M' metadata (unrelated early ts), 's'/'f' flows, counters: nothing to
                    # model.
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
                    if type(pid) is not int:
                        pid = _host_id(pid)
                    if type(tid) is not int:
                        tid = _host_id(tid)
                    if kind == "op" and (
                        name.startswith("ProfilerStep#")
                        or (cat == "Operator" and name.startswith("Optimizer."))
                    ):
                        # 2021 traces recorded record_function scopes as Operator; a step
                        # marker is an annotation whatever category an exporter gives it.
                        kind = "annotation"
                    if args is None:
                        ops_append(
                            new_op(
                                name,
                                kind,
                                start,
                                dur_f,
                                pid,
                                tid,
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                                None,
                                index,
                            )
                        )
                        continue
                    external = args.external_id
                    if external is None:
                        external = args.external_id_2021
                    if external is not None and type(external) is not int:
                        external = _opt_int(external)
                    # Most of these are absent from most events: test before calling a helper.
                    dims = args.input_dims
                    if dims is not None:
                        dims = shape(dims)
                    if dims is None:
                        dims = args.input_dims_2021
                        if dims is not None:
                            dims = shape(dims)
                    in_types = args.input_types
                    if in_types is not None:
                        in_types = strings(in_types)
                    strides = args.input_strides
                    if strides is not None:
                        strides = shape(strides)
                    if strides is None:
                        strides = args.input_strides_2021
                        if strides is not None:
                            strides = shape(strides)
                    concrete = args.concrete_inputs
                    if concrete is not None:
                        concrete = strings(concrete)
                    seq = args.sequence_number
                    if seq is not None and type(seq) is not int:
                        seq = _opt_int(seq)
                    fwd = args.fwd_thread_id
                    if fwd is not None and type(fwd) is not int:
                        fwd = _opt_int(fwd)
                    stack = args.call_stack
                    if stack is not None:
                        stack = strings(stack)
                    ops_append(
                        new_op(
                            name,
                            kind,
                            start,
                            dur_f,
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
                    continue

                if args is None:
                    args = _NO_ARGS
                if code == _RUNTIME:
                    if type(pid) is not int:
                        pid = _host_id(pid)
                    if type(tid) is not int:
                        tid = _host_id(tid)
                    external = args.external_id
                    if external is None:
                        external = args.external_id_2021
                    corr = args.correlation
                    runtime_append(
                        _new_runtime(
                            name,
                            start,
                            dur_f,
                            pid,
                            tid,
                            corr if type(corr) is int else _opt_int(corr),
                            external if type(external) is int else _opt_int(external),
                            index,
                        )
                    )
                elif code == _KERNELS:
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
                    grid = args.grid
                    if grid is not None:
                        hit = (
                            shapes_get(bytes(grid), missing) if type(grid) is raw_type else missing
                        )
                        grid = shape(grid) if hit is missing else hit
                    block = args.block
                    if block is not None:
                        hit = (
                            shapes_get(bytes(block), missing)
                            if type(block) is raw_type
                            else missing
                        )
                        block = shape(block) if hit is missing else hit
                    kernels_append(
                        _new_kernel(
                            name,
                            kind,
                            start,
                            dur_f,
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
                elif code == _SYNCS:  # a host-side sync event
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
                            dur_f,
                            device if device is not None else -1,
                            stream if stream is not None else -1,
                            _opt_int(args.correlation),
                            index,
                            on_stream if on_stream is not None and on_stream >= 0 else None,
                            record if record is not None and record >= 0 else None,
                        )
                    )
                else:  # a record_function range on the device's timeline
                    device = _opt_int(pid)
                    external = args.external_id
                    self.gpu_annotations.append(
                        _new_gpu_annotation(
                            name,
                            start,
                            dur_f,
                            device if device is not None else -1,
                            _stream_of(None, tid),
                            external if type(external) is int else _opt_int(external),
                            index,
                        )
                    )
        except _FIELD_ERRORS as exc:
            raise self._odd_field(index, exc) from exc
        finally:
            self.lo, self.hi = lo, hi
            self.negative_durations += negative

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
                f"other tool's trace cannot be analysed here; {_HOW_TO_EXPORT}."
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
            window_us=(float(self.lo), float(self.hi)),
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


# --------------------------------------------------------------------------------------------
# incremental JSON reading


class _NeedMore(Exception):
    """The buffer ends inside a value: read more and try again."""


class _StreamParser:
    """Reads `{"traceEvents": [ev, ev, ...], other keys}` from a byte stream in chunks,
    feeding each event to the builder as soon as it is decoded. Also accepts Chrome's bare
    JSON-array form (`[ev, ev, ...]`)."""

    def __init__(self, stream: BinaryIO, source: str, *, gzipped: bool) -> None:
        self.stream = stream
        self.source = source
        self.gzipped = gzipped
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
        self.buf = ""
        self.pos = 0
        self.dropped = 0  # characters consumed and discarded before buf[0]
        self.eof = False
        self.first_read = True

    # -- low level ----------------------------------------------------------------------------

    def _read(self, at_least: int = 0) -> None:
        """Append at least one more chunk of text to the buffer (dropping what was consumed)."""
        if self.eof:
            raise _NeedMore
        try:
            data = self.stream.read(max(at_least, _CHUNK_CHARS))
        except EOFError as exc:
            raise TraceFormatError(
                f"{self.source}: the gzip stream ends early (truncated? an interrupted copy or "
                f"download); copy or export the trace again."
            ) from exc
        except _GZIP_ERRORS as exc:
            raise TraceFormatError(
                f"{self.source}: cannot decompress it ({exc}); the gzip data is corrupt "
                f"(truncated?); export the trace again."
            ) from exc
        if self.first_read:
            self.first_read = False
            if data.startswith(codecs.BOM_UTF8):
                data = data[len(codecs.BOM_UTF8) :]
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{self.source}: not a text JSON file (invalid UTF-8 near byte {exc.start} of a "
                f"chunk); is it a binary file? {_HOW_TO_EXPORT}."
            ) from exc
        if not data:
            self.eof = True
        self.dropped += self.pos
        self.buf = self.buf[self.pos :] + text
        self.pos = 0

    def _skip_ws(self) -> str:
        """Return the next non-whitespace character (reading more as needed), '' at the end."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                return ""
            self._read()

    def _value(self) -> Any:
        """Decode the JSON value at the cursor, reading more text when it is cut off."""
        want = _CHUNK_CHARS
        self._skip_ws()
        while True:
            try:
                value, end = self.scan(self.buf, self.pos)
            except StopIteration as stop:
                # A value cut by the chunk end ('tr' of 'true', or an object cut right after
                # a ':') fails this way too: only the end of the file makes it an error, or
                # junk with the buffer going on well past it (see below).
                if not self.eof and stop.value + 16 >= len(self.buf):
                    self._more(want)
                    want *= 2
                    continue
                raise self._syntax("expected a JSON value", stop.value) from None
            except json.JSONDecodeError as exc:
                # An error well before the buffer's end is not a cut: more text cannot mend
                # it (NUL padding, binary junk), so it is said at once, not after reading
                # the whole file. A string still open may just be long.
                cut = exc.pos + 16 >= len(self.buf) or exc.msg.startswith("Unterminated")
                if not self.eof and cut:
                    self._more(want)
                    want *= 2  # doubling keeps a huge value linear, not quadratic
                    continue
                raise self._syntax(exc.msg, exc.pos) from None
            except RecursionError:
                raise self._syntax("nesting too deep") from None
            except ValueError as exc:  # an integer of more than 4300 digits
                raise self._syntax(f"a number too long to read ({str(exc)[:60]})") from None
            # A number at the very end of the buffer may continue in the next chunk.
            if end >= len(self.buf) and not self.eof:
                self._more(want)
                continue
            self.pos = end
            return value

    def _more(self, want: int) -> None:
        try:
            self._read(want)
        except _NeedMore:
            pass

    def _syntax(self, what: str, at: int | None = None) -> TraceFormatError:
        at = self.pos if at is None else at
        if self.eof and ("Unterminated" in what or at >= len(self.buf.rstrip()) - 1):
            return TraceFormatError(
                f"{self.source}: the JSON ends in the middle of a value (truncated? an "
                f"interrupted export or copy); export the trace again."
            )
        snippet = self.buf[max(at - 30, 0) : at + 30].replace("\n", " ")
        return TraceFormatError(
            f"{self.source}: not valid JSON ({what}) at character {self.dropped + at}, near "
            f"{snippet!r}; {_HOW_TO_EXPORT}."
        )

    def _expect(self, chars: str, where: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise TraceFormatError(
                f"{self.source}: the JSON ends early {where} (truncated?); export the trace again."
            )
        if c not in chars:
            raise self._syntax(f"expected {' or '.join(repr(x) for x in chars)} {where}")
        self.pos += 1
        return c

    # -- structure ----------------------------------------------------------------------------

    def parse(self, builder: _Builder) -> dict[str, Any]:
        first = self._skip_ws()
        if first == "":
            raise TraceFormatError(f"{self.source}: the file is empty; {_HOW_TO_EXPORT}.")
        if first == "[":
            self.pos += 1
            self._events(builder, top_level=True)
            self._end()
            return {}
        if first != "{":
            start = self.buf[self.pos : self.pos + 20]
            raise TraceFormatError(
                f"{self.source}: not a JSON trace (it starts with {start!r}); {_HOW_TO_EXPORT}."
            )
        self.pos += 1
        top: dict[str, Any] = {}
        seen_events = False
        if self._skip_ws() == "}":
            self.pos += 1
        else:
            while True:
                if self._skip_ws() != '"':
                    self._expect('"', "for a key of the top-level object")
                key = self._value()
                self._expect(":", f"after the key {key!r}")
                if key == "traceEvents" and self._skip_ws() == "[":
                    self.pos += 1
                    self._events(builder, top_level=False)
                    seen_events = True
                else:
                    top[key] = self._value()
                if self._expect(",}", "between top-level entries") == "}":
                    break
        self._end()
        if not seen_events:
            if "traceEvents" in top:
                raise TraceFormatError(
                    f"{self.source}: 'traceEvents' is a {type(top['traceEvents']).__name__}, "
                    f"not a list; {_HOW_TO_EXPORT}."
                )
            keys = ", ".join(sorted(top)[:8]) or "none"
            raise TraceFormatError(
                f"{self.source}: not a profiler trace: no 'traceEvents' list (top-level keys: "
                f"{keys}); {_HOW_TO_EXPORT}."
            )
        return top

    def _events(self, builder: _Builder, *, top_level: bool) -> None:
        add = builder.add
        index = 0
        if self._skip_ws() == "]":
            self.pos += 1
            return
        if top_level:
            first = self._value()
            if not isinstance(first, dict):
                raise self._not_events(first)
            add(first, 0)
            index = 1
            if self._expect(",]", "between events") == "]":
                return
        # With msgspec, runs of whole events are decoded a chunk at a time (_batches). What it
        # leaves (the last event, a bad stretch) goes through the loop below: one C-level
        # decode and one regex per event while the buffer holds whole events; anything unusual
        # (chunk end, ']', bad JSON) takes the slow path, which says where the JSON is wrong.
        fast = _EVENT_DECODER
        scan = self.scan
        sep = _SEP.match
        flow = _FLOW.match
        decode_error = json.JSONDecodeError
        while True:
            if fast is not None:
                index = self._batches(fast, builder, index)
            buf = self.buf
            pos = _WS.match(buf, self.pos).end()  # type: ignore[union-attr]
            cut = False
            try:
                while True:
                    skip = flow(buf, pos)
                    if skip is not None:
                        # A flow arrow ('s'/'f'/'t'): nothing to model, so not even decoded.
                        pos = skip.end()
                        index += 1
                        builder.event_count += 1
                        continue
                    event, end = scan(buf, pos)
                    add(event, index)
                    index += 1
                    m = sep(buf, end)
                    if m is None:
                        break
                    pos = m.end()
            except (StopIteration, decode_error, RecursionError, ValueError):
                # The value at `pos` is cut by the chunk end, or is bad JSON, or nests too
                # deep for the C scanner, or holds a number too long to convert: the slow
                # path below says which, and where.
                cut = True
            if cut:
                self.pos = pos
                add(self._value(), index)
                index += 1
            else:
                self.pos = end  # after a whole event, but no ',' in the buffer yet
            if self._expect(",]", "between events") == "]":
                return

    def _batches(self, decoder: Any, builder: _Builder, index: int) -> int:
        """Model whole events from the cursor on, many per msgspec call, until the buffer holds
        no whole event or a decode fails; return the index of the next event.

        Each call decodes the text from the cursor (an event's '{') to a '}' followed by ',{',
        as one JSON array of objects. Only a split between two events can decode: a '}' inside
        a string leaves the string open, one closing a nested object leaves its event open. So
        success proves the split, and a failure (a bad cut, NaN, bad JSON, an event that is not
        an object) leaves the stretch to the per-event loop, with its exact error messages.
        """
        while True:
            if len(self.buf) - self.pos < _CHUNK_CHARS and not self.eof:
                self._read()
            buf = self.buf
            start = _WS.match(buf, self.pos).end()  # type: ignore[union-attr]
            cut = self._last_event_end(buf, start, len(buf))
            if cut < 0:
                return index
            try:
                events = decoder.decode("[" + buf[start:cut] + "]")
            except (msgspec.DecodeError, RecursionError) as exc:
                # The array may close inside the stretch, with objects after it (a saved
                # report's own keys hold '}, {' too): cut again before where it closed.
                cut = self._before_array_end(buf, start, cut, exc)
                if cut < 0:
                    return index
                try:
                    events = decoder.decode("[" + buf[start:cut] + "]")
                except (msgspec.DecodeError, RecursionError):
                    return index
            builder.add_events(events, index)
            index += len(events)
            self.pos = _SEP.match(buf, cut).end()  # type: ignore[union-attr]

    @classmethod
    def _before_array_end(cls, buf: str, start: int, cut: int, exc: BaseException) -> int:
        """After the stretch `buf[start:cut]` failed to decode: when msgspec says a whole
        array ended early ('trailing characters', at a byte of "[" + stretch + "]"), the
        events' array closed there; return the last event end before it, else -1."""
        m = _TRAILING.search(str(exc))
        if m is None:
            return -1
        text = "[" + buf[start:cut] + "]"
        closed = len(text.encode()[: int(m.group(1))].decode(errors="ignore"))
        return cls._last_event_end(buf, start, start + closed - 2)

    @staticmethod
    def _last_event_end(buf: str, start: int, end: int) -> int:
        """Return the position just after the last '}' in `buf[start:end]` that is followed by
        ',' and '{' (the likely end of an event), or -1. Gives up after a few hundred '}'
        (one huge event): the per-event loop reads it."""
        for _ in range(256):
            brace = buf.rfind("}", start, end)
            if brace < 0:
                return -1
            if _NEXT_EVENT.match(buf, brace + 1):
                return brace + 1
            end = brace
        return -1

    def _not_events(self, first: Any) -> TraceFormatError:
        if (
            isinstance(first, list)
            and len(first) == 4
            and all(isinstance(v, int | float) for v in first[:1])
            and isinstance(first[1], int)
        ):
            return TraceFormatError(
                f"{self.source}: this looks like export_memory_timeline output (a list of "
                f"[ts, action, bytes, category] rows), not a trace; load it with a memory "
                f"tool, or pass the Chrome trace from prof.export_chrome_trace(path)."
            )
        return TraceFormatError(
            f"{self.source}: a JSON list of {type(first).__name__}s, not of trace events; "
            f"{_HOW_TO_EXPORT}."
        )

    def _end(self) -> None:
        if self._skip_ws() != "":
            raise self._syntax("extra data after the trace")


def save_trace_dict(trace: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a Chrome trace dict as JSON (gzip when the name ends in .gz), creating the
    parent folder; return the path written. A path that is not a regular file (a FIFO, a
    directory, a device) is refused before anything is opened."""
    target = Path(path)
    try:
        check_writable(target, what="the trace", error=GpuprofError)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_for_writing(target, what="the trace", error=GpuprofError) as raw:
            if target.name.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb") as packed:
                    _dump(trace, packed)
            else:
                _dump(trace, raw)
    except OSError as exc:
        raise GpuprofError(f"cannot write the trace to {target}: {exc}") from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise GpuprofError(
            f"cannot write the trace to {target}: it holds a value JSON cannot store "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    return target


def _dump(trace: dict[str, Any], out: Any) -> None:
    writer = codecs.getwriter("utf-8")(out, "surrogatepass")
    json.dump(trace, writer)
    writer.flush()


def copy_trace_file(source: str, target: Path) -> None:
    """Copy a trace file as JSON (gzip when `target` ends in .gz), decompressing or
    compressing on the way, in chunks: memory stays small whatever the trace's size."""
    raw, _ = open_regular(source, what=_WHAT, error=TraceFormatError)
    with raw:
        gz = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: Any = GzipGuard(raw, _gzip_file, source, TraceFormatError) if gz else raw

        def read() -> bytes:
            try:
                chunk: bytes = stream.read(1 << 20)
            except (EOFError, *_GZIP_ERRORS) as exc:  # type: ignore[misc]
                raise TraceFormatError(f"{source}: gzip data is corrupt ({exc})") from exc
            return chunk

        check_writable(target, what="the trace", error=GpuprofError)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_for_writing(target, what="the trace", error=GpuprofError) as out:
                sink: Any = (
                    gzip.GzipFile(fileobj=out, mode="wb") if target.name.endswith(".gz") else out
                )
                try:
                    while chunk := read():
                        sink.write(chunk)
                finally:
                    if sink is not out:
                        sink.close()
        except OSError as exc:
            raise GpuprofError(f"cannot write the trace to {target}: {exc}") from exc
