"""Trace files and dicts -> Trace: opening the file (a regular file, gzip or not, read
through the guards), choosing the decoder, handing the events to the builder; and writing
or copying a trace file.

The decoder: msgspec's typed batches (`EVENT_DECODER`, `DICT_EVENTS`) where msgspec is
installed, with the standard-library reader for what they refuse; only the standard-library
reader without it (the package docstring says why both).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

from gpuprof_nb.errors import GpuprofError, TraceFormatError
from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.io.guards import (
    GzipGuard,
    check_writable,
    open_for_writing,
    open_regular,
)
from gpuprof_nb.io.trace.build import Builder
from gpuprof_nb.io.trace.decode import (
    DICT_EVENTS,
    EVENT_DECODER,
    HOW_TO_EXPORT,
    StreamParser,
    convert_events,
)
from gpuprof_nb.model.trace import Trace

# gzip traces are decompressed with ISA-L (python-isal) where it is installed: the same bytes
# as the standard library's zlib, several times faster, where zlib took a large share of a
# gzip trace's load (benchmarks/RESULTS.md, "Measurements behind design choices", M1);
# without it, the standard library's gzip.
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

_GZIP_MAGIC = b"\x1f\x8b"
_WHAT = "a trace written by torch.profiler's export_chrome_trace (.json or .json.gz)"


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
            f"{HOW_TO_EXPORT}."
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
        reader = cast(BinaryIO, _Reader(stream, source))
        builder = Builder(source)
        with gc_paused():
            top = StreamParser(reader, source, batches=EVENT_DECODER).parse(builder)
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
                f"{keys}); {HOW_TO_EXPORT}."
            )
        events = d["traceEvents"]
        top = {k: v for k, v in d.items() if k != "traceEvents"}
    else:
        raise TraceFormatError(
            f"{source}: expected a trace dict with a 'traceEvents' list, got "
            f"{type(d).__name__}; {HOW_TO_EXPORT}."
        )
    if not isinstance(events, list | tuple):
        raise TraceFormatError(
            f"{source}: 'traceEvents' is a {type(events).__name__}, not a list; {HOW_TO_EXPORT}."
        )
    builder = Builder(source)
    with gc_paused():
        # Every event dict into a light struct in one C call where msgspec is installed;
        # events it cannot convert go through the per-event path, which says which.
        converted = None if DICT_EVENTS is None else convert_events(events, DICT_EVENTS)
        if converted is not None:
            builder.model_events(converted, 0)
        else:
            add = builder.add
            for index, event in enumerate(events):
                add(event, index)
        return builder.finish(top)


class _Reader:
    """The file's bytes for the stream parser: what goes wrong reading them (a truncated or
    corrupt gzip stream, an unreadable file) raised as TraceFormatError."""

    def __init__(self, stream: Any, source: str) -> None:
        self._read = stream.read
        self._source = source

    def read(self, n: int) -> bytes:
        try:
            data: bytes = self._read(n)
        except EOFError as exc:
            raise TraceFormatError(
                f"{self._source}: the gzip stream ends early (truncated? an interrupted copy "
                f"or download); copy or export the trace again."
            ) from exc
        except _GZIP_ERRORS as exc:
            raise TraceFormatError(
                f"{self._source}: cannot decompress it ({exc}); the gzip data is corrupt "
                f"(truncated?); export the trace again."
            ) from exc
        return data


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
