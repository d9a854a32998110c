"""Trace JSON text -> event objects: the JSON decoder (msgspec), its fallback (the standard
library's) and the stream reader that drives both (why both: the package docstring).

- The event types: `EVENT_DECODER` (msgspec, or None without it) decodes a JSON array of
  events into light structs holding only the fields the model reads, their args into a
  struct of the keys in _ARG_KEYS (nested ones kept as JSON text, `Raw`); `PyEvent` and
  `args_of` make the same attributes from an event dict, for the standard-library reader
  and for `trace_from_dict`.
- `StreamParser` reads `{"traceEvents": [...], other keys}` from a byte stream in chunks:
  runs of whole events go to `EVENT_DECODER` a batch at a time (`_batches`), the rest one
  event at a time through the standard library's scanner, which also gives the located
  error messages. Events go to an `EventSink` (build.Builder) as soon as they are decoded.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import Any, BinaryIO, Protocol, Union

try:
    import msgspec
except ImportError:  # optional at run time: the standard library reader does the same work
    msgspec = None  # type: ignore[assignment]

from gpuprof_nb.errors import TraceFormatError

HOW_TO_EXPORT = (
    "export it with torch.profiler's prof.export_chrome_trace(path) "
    "(or on_trace_ready=tensorboard_trace_handler)"
)

CHUNK_CHARS = 1 << 18  # 256 Ki characters per read (and per msgspec batch); see _batches
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


# --------------------------------------------------------------------------------------------
# the decoded events

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


EVENT_DECODER, _RAW_ARGS, _ARGS_STRUCT, Raw, DICT_EVENTS = _args_types()
ARGS_TYPES = frozenset({_RAW_ARGS, _ARGS_STRUCT, _PyArgs})
NO_ARGS = _PyArgs({})


class PyEvent:
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


def args_of(args: Any) -> Any:
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


def convert_events(events: Any, target: Any) -> list[Any] | None:
    """Every event dict of `events` converted into the light struct of `target` (DICT_EVENTS)
    in one C call, keys the model does not read skipped there; None where one cannot be (not a
    dict, an args key that is not a string): the per-event path then says which."""
    try:
        converted: list[Any] = msgspec.convert(events, target)
    except msgspec.ValidationError:
        return None
    return converted


# --------------------------------------------------------------------------------------------
# incremental JSON reading


class EventSink(Protocol):
    """Where the stream reader puts what it decodes (build.Builder)."""

    event_count: int

    def add(self, event: Any, index: int) -> None:
        """Model one event dict (`index`: its position in traceEvents)."""

    def add_events(self, events: list[Any], first_index: int) -> None:
        """Model a batch of EVENT_DECODER's structs, numbered from `first_index`."""


class _NeedMore(Exception):
    """The buffer ends inside a value: read more and try again."""


class StreamParser:
    """Reads `{"traceEvents": [ev, ev, ...], other keys}` from a byte stream in chunks,
    feeding each event to the builder as soon as it is decoded. Also accepts Chrome's bare
    JSON-array form (`[ev, ev, ...]`). With `batches` (EVENT_DECODER), runs of whole events
    are decoded by it; without (None), every event by the standard library's scanner.

    `stream.read` raises TraceFormatError for what goes wrong below the text (a corrupt or
    truncated gzip stream, a gzip bomb: load.py's reader says which)."""

    def __init__(self, stream: BinaryIO, source: str, *, batches: Any) -> None:
        self.stream = stream
        self.source = source
        self.batches = batches
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
        data = self.stream.read(max(at_least, CHUNK_CHARS))
        if self.first_read:
            self.first_read = False
            if data.startswith(codecs.BOM_UTF8):
                data = data[len(codecs.BOM_UTF8) :]
        try:
            text = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                f"{self.source}: not a text JSON file (invalid UTF-8 near byte {exc.start} of a "
                f"chunk); is it a binary file? {HOW_TO_EXPORT}."
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
        want = CHUNK_CHARS
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
            f"{snippet!r}; {HOW_TO_EXPORT}."
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

    def parse(self, builder: EventSink) -> dict[str, Any]:
        first = self._skip_ws()
        if first == "":
            raise TraceFormatError(f"{self.source}: the file is empty; {HOW_TO_EXPORT}.")
        if first == "[":
            self.pos += 1
            self._events(builder, top_level=True)
            self._end()
            return {}
        if first != "{":
            start = self.buf[self.pos : self.pos + 20]
            raise TraceFormatError(
                f"{self.source}: not a JSON trace (it starts with {start!r}); {HOW_TO_EXPORT}."
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
                    f"not a list; {HOW_TO_EXPORT}."
                )
            keys = ", ".join(sorted(top)[:8]) or "none"
            raise TraceFormatError(
                f"{self.source}: not a profiler trace: no 'traceEvents' list (top-level keys: "
                f"{keys}); {HOW_TO_EXPORT}."
            )
        return top

    def _events(self, builder: EventSink, *, top_level: bool) -> None:
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
        fast = self.batches
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

    def _batches(self, decoder: Any, builder: EventSink, index: int) -> int:
        """Model whole events from the cursor on, many per msgspec call, until the buffer holds
        no whole event or a decode fails; return the index of the next event.

        Each call decodes the text from the cursor (an event's '{') to a '}' followed by ',{',
        as one JSON array of objects. Only a split between two events can decode: a '}' inside
        a string leaves the string open, one closing a nested object leaves its event open. So
        success proves the split, and a failure (a bad cut, NaN, bad JSON, an event that is not
        an object) leaves the stretch to the per-event loop, with its exact error messages.
        """
        while True:
            if len(self.buf) - self.pos < CHUNK_CHARS and not self.eof:
                self._read()
            buf = self.buf
            start = _WS.match(buf, self.pos).end()  # type: ignore[union-attr]
            cut = self._last_event_end(buf, start, len(buf))
            if cut < 0:
                return index
            try:
                events = decoder.decode("".join(("[", buf[start:cut], "]")))
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
            f"{HOW_TO_EXPORT}."
        )

    def _end(self) -> None:
        if self._skip_ws() != "":
            raise self._syntax("extra data after the trace")
