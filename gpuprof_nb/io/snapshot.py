"""Memory snapshot pickles and dicts -> MemorySnapshot, through a restricted unpickler.

Reads what `torch.cuda.memory._dump_snapshot` wrote from 2023 on: a dict with `segments`
(each with `blocks`) and `device_traces` (one list of entries per device), optional
`allocator_settings` and `external_annotations`; with or without `time_us` per entry;
empty or ring-buffer-truncated histories; segments-only snapshots; the older block layout
with `history` instead of `frames`. The unpickler refuses every class and function a
pickle names, so loading a snapshot never runs code from it.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import pickle
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuprof_nb.errors import SnapshotFormatError
from gpuprof_nb.io.cells import cells_of
from gpuprof_nb.io.gcpause import gc_paused
from gpuprof_nb.model.memory import (
    ACTION_CODE,
    ACTIONS,
    OOM,
    OTHER,
    Block,
    DeviceTrace,
    Frame,
    MemorySnapshot,
    Segment,
)

# Top-level key under which gpuprof_nb keeps its own facts (step starts, source, notes) in
# a saved pickle; PyTorch's viewer ignores keys it does not know.
EXTRA_KEY = "gpuprof_nb"

# A pickle may reference one list or dict from many places through its memo (two to five
# bytes a reference), so a file of a few KB can unpickle into millions of history entries
# or blocks. A snapshot torch wrote spends 60-140 bytes on each entry or block (measured
# on tests/data/snapshots, a pickled 64 MB training history, and torch's own layout with
# shared frame lists); a file that yields more than one per MIN_BYTES_PER_ITEM bytes, past
# a small allowance for hand-made files, repeats containers by reference and is refused.
MIN_BYTES_PER_ITEM = 8
FREE_ITEMS = 100_000
# Frame lists longer than this are cached by identity (see _StackTable.stack_of).
_LONG_STACK = 32


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers and scalars: any global a pickle
    names (a class, a function such as os.system) is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotFormatError(
            f"the pickle names class {module}.{name}; refused, never executed. A memory "
            "snapshot holds only dicts, lists, strings and numbers: this file is not one "
            "(or was altered); re-dump it with torch.cuda.memory._dump_snapshot."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotFormatError(
            "the pickle refers to a persistent object; refused. A memory snapshot holds "
            "only plain containers and scalars."
        )


def _unpickle(stream: Any, where: str) -> tuple[Any, int]:  # any binary file object
    """Return the unpickled object and the pickle bytes it was read from (after gzip)."""
    try:
        data = _RestrictedUnpickler(stream).load()
        return data, stream.tell()
    except SnapshotFormatError as e:
        raise SnapshotFormatError(f"{where}: {e}") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        MemoryError,
        OSError,
        UnicodeDecodeError,
        zlib.error,
    ) as e:
        raise SnapshotFormatError(
            f"{where}: not a readable pickle ({type(e).__name__}: {e}); is the file "
            "truncated? Dump it again with torch.cuda.memory._dump_snapshot(path)."
        ) from None


def load_snapshot(source: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> MemorySnapshot:
    """Return the MemorySnapshot in a pickle file (optionally gzipped), pickle bytes, or an
    already-unpickled snapshot dict. Raises SnapshotFormatError on anything else."""
    with gc_paused():
        return _load_snapshot(source)


def _load_snapshot(source: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> MemorySnapshot:
    if isinstance(source, Mapping):
        return snapshot_from_dict(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
        # gzip is read through the same guarded unpickling as a file, so damaged
        # compressed bytes give a SnapshotFormatError too.
        stream: io.BufferedIOBase = (
            gzip.GzipFile(fileobj=io.BytesIO(raw)) if raw[:2] == b"\x1f\x8b" else io.BytesIO(raw)
        )
        data, n_bytes = _unpickle(stream, "snapshot bytes")
        return _snapshot_from_dict(data, "snapshot bytes", n_bytes)
    path = Path(source)
    where = str(path)
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
    except OSError as e:
        raise SnapshotFormatError(
            f"{where}: cannot open ({e.strerror or e}); pass the path of a pickle written "
            "by torch.cuda.memory._dump_snapshot or %%memsnap --save."
        ) from None
    opener = gzip.open if gz else open
    with opener(path, "rb") as f:
        data, n_bytes = _unpickle(f, where)
    return _snapshot_from_dict(data, where, n_bytes)


class _StackTable:
    """Interns frames and stacks. The allocator symbolises each distinct frame once and
    pickling keeps that sharing, so a stack is named by its frames' identities (a key built
    in C) before falling back to their content; a content key merges equal stacks."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.frames: list[Frame] = []
        self.stacks: list[tuple[int, ...]] = []
        self._frame_index: dict[tuple[str, int, str], int] = {}
        self._stack_index: dict[tuple[int, ...], int] = {}
        self._frame_by_id: dict[int, int] = {}
        self._by_id_key: dict[tuple[int, ...], int] = {}
        self._by_list: dict[int, int] = {}
        self._keep: list[Any] = []  # keeps cached objects alive so their ids stay unique

    def stack_of(self, frames: Any) -> int:
        if not frames:
            return -1
        if type(frames) is not list and (
            not isinstance(frames, Sequence) or isinstance(frames, (str, bytes))
        ):
            raise SnapshotFormatError(
                f"{self.where}: 'frames' is a {type(frames).__name__}, expected a list of "
                "{filename, line, name} dicts"
            )
        # A hostile pickle can name one long list from millions of entries: a long list
        # seen before costs one lookup, so the work stays within the pickle's size (short
        # ones are cheaper to key than to cache, and entries are bounded in number).
        long = len(frames) > _LONG_STACK
        if long:
            index = self._by_list.get(id(frames), -1)
            if index >= 0:
                return index
        # Newer allocators build a fresh list per entry but share the frame dicts in it, so
        # the tuple of the frames' identities names the stack; building it runs in C. Every
        # list and frame seen is kept alive (self._keep), so an identity is never reused.
        id_key = tuple(map(id, frames))
        index = self._by_id_key.get(id_key, -1)
        if index < 0:
            key = tuple(self._frame_of(f) for f in frames)
            index = self._stack_index.get(key, -1)
            if index < 0:
                index = len(self.stacks)
                self.stacks.append(key)
                self._stack_index[key] = index
            self._by_id_key[id_key] = index
        if long:
            self._by_list[id(frames)] = index
            self._keep.append(frames)
        return index

    def _frame_of(self, f: Any) -> int:
        # Frame dicts are shared between stacks (the allocator symbolises each distinct
        # frame once and pickling keeps the sharing), so identity hits are the common case.
        hit = self._frame_by_id.get(id(f))
        if hit is not None:
            return hit
        index = self._frame_of_content(f)
        self._frame_by_id[id(f)] = index
        self._keep.append(f)
        return index

    def _frame_of_content(self, f: Any) -> int:
        if not isinstance(f, Mapping):
            raise SnapshotFormatError(
                f"{self.where}: a frame is a {type(f).__name__}, expected a dict with "
                "filename, line and name"
            )
        line = f.get("line", 0)
        key = (
            str(f.get("filename", "??")),
            int(line) if isinstance(line, int) else 0,
            str(f.get("name", "??")),
        )
        index = self._frame_index.get(key)
        if index is None:
            index = len(self.frames)
            self.frames.append(Frame(*key))
            self._frame_index[key] = index
        return index


def _int(value: Any, what: str, where: str, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotFormatError(
            f"{where}: {what} is {value!r} ({type(value).__name__}), expected an integer"
        )
    if not -(2**63) <= value < 2**63:
        raise SnapshotFormatError(f"{where}: {what} is {value}, out of the 64-bit range")
    return value


# No device holds this much (the largest hold a few hundred GB): a history entry or block of
# more bytes is damage, not an allocation. An `oom` entry is exempt: it records what the
# program asked for, and a request can be absurd (that is why it failed).
MAX_BYTES = 2**48


def _size_problem(size: int) -> str | None:
    """Return why `size` cannot be the bytes of a block or history entry, or None."""
    if size < 0:
        return f"is {size}, a negative number of bytes"
    if size > MAX_BYTES:
        return f"is {size:,} bytes, more than any device holds ({MAX_BYTES:,})"
    return None


def _check_sizes(size: np.ndarray, action: np.ndarray, here: str) -> None:
    """Raise SnapshotFormatError naming the first history entry whose 'size' is negative, or
    beyond MAX_BYTES on an entry other than `oom`."""
    bad = (size < 0) | ((size > MAX_BYTES) & (action != OOM))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SnapshotFormatError(
            f"{here}[{i}]: 'size' {_size_problem(int(size[i]))}; the snapshot is damaged "
            "(dump it again with torch.cuda.memory._dump_snapshot)"
        )


def _checked_size(value: Any, what: str, where: str, default: int = 0) -> int:
    """Return a block or segment size in bytes, or raise SnapshotFormatError naming it."""
    size = _int(value, what, where, default)
    problem = _size_problem(size)
    if problem is not None:
        raise SnapshotFormatError(f"{where}: {what} {problem}; the snapshot is damaged")
    return size


def _segment(seg: Any, i: int, where: str, table: _StackTable) -> Segment:
    here = f"{where}: segments[{i}]"
    if not isinstance(seg, Mapping):
        raise SnapshotFormatError(f"{here} is a {type(seg).__name__}, expected a dict")
    raw_blocks = seg.get("blocks") or []
    if not isinstance(raw_blocks, Sequence):
        raise SnapshotFormatError(f"{here}: 'blocks' is not a list")
    seg_addr = _int(seg.get("address"), "'address'", here)
    blocks = []
    offset = seg_addr
    for j, b in enumerate(raw_blocks):
        bhere = f"{here}.blocks[{j}]"
        if not isinstance(b, Mapping):
            raise SnapshotFormatError(f"{bhere} is a {type(b).__name__}, expected a dict")
        size = _checked_size(b.get("size"), "'size'", bhere)
        if "frames" in b:
            frames = b.get("frames")
            requested = b.get("requested_size", size)
        else:
            # Snapshots before PyTorch 2.1 kept the allocation's frames and requested size
            # in the block's first history record.
            history = b.get("history") or [{}]
            first = history[0] if isinstance(history, Sequence) and history else {}
            first = first if isinstance(first, Mapping) else {}
            frames = first.get("frames")
            requested = first.get("real_size", b.get("requested_size", size))
        # Block addresses are optional in old and profiler-made snapshots: blocks tile
        # the segment in order, so the running offset recovers them.
        addr = _int(b.get("address"), "'address'", bhere, default=offset)
        blocks.append(
            Block(
                address=addr,
                size=size,
                requested_size=_checked_size(requested, "'requested_size'", bhere, size),
                state=str(b.get("state", "inactive")),
                stack=table.stack_of(frames),
            )
        )
        offset = addr + size
    total = _checked_size(seg.get("total_size"), "'total_size'", here, sum(b.size for b in blocks))
    active = [b for b in blocks if b.is_active]
    return Segment(
        device=_int(seg.get("device"), "'device'", here),
        address=seg_addr,
        total_size=total,
        allocated_size=_checked_size(
            seg.get("allocated_size"),
            "'allocated_size'",
            here,
            sum(b.size for b in active if b.state == "active_allocated"),
        ),
        active_size=_checked_size(
            seg.get("active_size"), "'active_size'", here, sum(b.size for b in active)
        ),
        stream=_int(seg.get("stream"), "'stream'", here),
        segment_type=str(seg.get("segment_type", "large" if total > 2**20 else "small")),
        blocks=tuple(blocks),
    )


def _column(values: list[Any], dtype: Any, field: str, here: str) -> np.ndarray:
    try:
        return np.array(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError):
        for i, v in enumerate(values):
            try:
                np.array([v], dtype=dtype)
            except (TypeError, ValueError, OverflowError):
                raise SnapshotFormatError(
                    f"{here}[{i}]: '{field}' is {v!r}, expected a number"
                ) from None
        raise SnapshotFormatError(f"{here}: column '{field}' is not numeric") from None


def _device_trace(
    device: int, entries: Any, where: str, table: _StackTable, categories: dict[str, int]
) -> DeviceTrace:
    here = f"{where}: device_traces[{device}]"
    if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
        raise SnapshotFormatError(f"{here} is a {type(entries).__name__}, expected a list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise SnapshotFormatError(f"{here}[{i}] is a {type(e).__name__}, expected a dict")
    code = ACTION_CODE
    try:
        action = np.array([code.get(e.get("action"), OTHER) for e in entries], dtype=np.int8)
    except TypeError:  # an unhashable 'action' somewhere: it counts as an unknown one
        action = np.array(
            [
                code.get(a, OTHER) if isinstance(a := e.get("action"), str) else OTHER
                for e in entries
            ],
            dtype=np.int8,
        )
    addr = _column([e.get("addr") or 0 for e in entries], np.int64, "addr", here)
    size = _column([e.get("size") or 0 for e in entries], np.int64, "size", here)
    _check_sizes(size, action, here)
    stream = _column([e.get("stream") or 0 for e in entries], np.int64, "stream", here)
    stack = np.array([table.stack_of(e.get("frames")) for e in entries], dtype=np.int32)
    time_us: np.ndarray | None = None
    if any("time_us" in e for e in entries):
        time_us = _column(
            [e.get("time_us", math.nan) for e in entries], np.float64, "time_us", here
        )
    device_free = np.full(len(entries), -1, dtype=np.int64)
    for i in np.flatnonzero(action == OOM).tolist():
        device_free[i] = _int(entries[i].get("device_free"), "'device_free'", f"{here}[{i}]", -1)
    category = np.full(len(entries), -1, dtype=np.int16)
    if any("category" in e for e in entries):
        for i, e in enumerate(entries):
            name = e.get("category")
            if name is not None:
                category[i] = categories.setdefault(str(name), len(categories))
    return DeviceTrace(
        device=device,
        action=action,
        addr=addr,
        size=size,
        stream=stream,
        stack=stack,
        time_us=time_us,
        device_free=device_free,
        category=category,
    )


def snapshot_from_dict(data: Any, *, where: str = "snapshot") -> MemorySnapshot:
    """Return the MemorySnapshot for an unpickled snapshot dict (see module docstring).
    Raises SnapshotFormatError, naming the place, when the dict is not a snapshot."""
    with gc_paused():
        return _snapshot_from_dict(data, where)


def _check_expansion(
    raw_segments: Sequence[Any],
    raw_traces: Sequence[Any],
    step_starts: Any,
    n_bytes: int,
    where: str,
) -> None:
    """Raise SnapshotFormatError when `n_bytes` of pickle unpickled into more entries,
    blocks, segments, devices and step marks than a real snapshot of that size can hold
    (see MIN_BYTES_PER_ITEM). Counts only list lengths, before anything is built."""

    def lengths(items: Any) -> int:
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
            return 0
        return sum(
            len(x) for x in items if isinstance(x, Sequence) and not isinstance(x, (str, bytes))
        )

    counts = {
        "history entries": lengths(raw_traces),
        "blocks": lengths([s.get("blocks") for s in raw_segments if isinstance(s, Mapping)]),
        "segments": len(raw_segments),
        "device traces": len(raw_traces),
        "step marks": lengths(step_starts),
    }
    limit = FREE_ITEMS + n_bytes // MIN_BYTES_PER_ITEM
    if sum(counts.values()) > limit:
        found = ", ".join(f"{n:,} {what}" for what, n in counts.items() if n)
        raise SnapshotFormatError(
            f"{where}: {n_bytes:,} bytes of pickle unpickle into {found}, more than the "
            f"{limit:,} items a real snapshot of that size can hold (at least "
            f"{MIN_BYTES_PER_ITEM} bytes each): the file repeats the same lists by "
            "reference, and expanding them would exhaust memory. Refused. Load a snapshot "
            "written by torch.cuda.memory._dump_snapshot or %%memsnap --save."
        )


def _snapshot_from_dict(data: Any, where: str, n_bytes: int | None = None) -> MemorySnapshot:
    """`n_bytes`: the pickle size the dict came from (None for a dict passed in as is,
    which is not checked for expansion: it is already in memory)."""
    if not isinstance(data, Mapping):
        raise SnapshotFormatError(
            f"{where}: top level is a {type(data).__name__}, expected the dict that "
            "torch.cuda.memory._snapshot() returns (with 'segments' and 'device_traces')"
        )
    if "segments" not in data and "device_traces" not in data:
        raise SnapshotFormatError(
            f"{where}: neither 'segments' nor 'device_traces' present (keys: "
            f"{sorted(map(str, data))[:8]}); this is not a CUDA memory snapshot"
        )
    raw_segments = data.get("segments") or []
    raw_traces = data.get("device_traces") or []
    if not isinstance(raw_segments, Sequence) or not isinstance(raw_traces, Sequence):
        raise SnapshotFormatError(f"{where}: 'segments' and 'device_traces' must be lists")
    extra = data.get(EXTRA_KEY)
    extra = extra if isinstance(extra, Mapping) else {}
    if n_bytes is not None:
        _check_expansion(raw_segments, raw_traces, extra.get("step_starts"), n_bytes, where)
    table = _StackTable(where)
    segments = tuple(_segment(s, i, where, table) for i, s in enumerate(raw_segments))
    categories: dict[str, int] = {}
    traces = tuple(
        _device_trace(d, entries, where, table, categories) for d, entries in enumerate(raw_traces)
    )
    notes = extra.get("notes", ())
    notes = notes if isinstance(notes, (list, tuple)) else ()
    settings = data.get("allocator_settings")
    try:
        step_starts = tuple(tuple(int(i) for i in dev) for dev in extra.get("step_starts", ()))
    except (TypeError, ValueError):
        step_starts = ()
    return MemorySnapshot(
        segments=segments,
        traces=traces,
        frames=tuple(table.frames),
        stacks=tuple(table.stacks),
        categories=tuple(sorted(categories, key=categories.__getitem__)),
        allocator_settings=dict(settings) if isinstance(settings, Mapping) else {},
        source=str(extra.get("source", "cuda")),
        step_starts=step_starts,
        # Repeats dropped: one long note referenced many times would otherwise be shown
        # that many times.
        notes=tuple(dict.fromkeys(n for n in notes if isinstance(n, str))),
        cells=cells_of(data),
        exact_lines=extra.get("exact_lines") is True,
    )


def _frames_out(
    snapshot: MemorySnapshot, stack: int, cache: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    if stack < 0:
        return []
    hit = cache.get(stack)
    if hit is None:
        hit = [
            {"filename": f.filename, "line": f.line, "name": f.name}
            for f in (snapshot.frames[i] for i in snapshot.stacks[stack])
        ]
        cache[stack] = hit
    return hit


def snapshot_to_dict(snapshot: MemorySnapshot) -> dict[str, Any]:
    """Return the snapshot as the dict torch.cuda.memory._snapshot() returns, which
    PyTorch's memory_viz reads once pickled (plus gpuprof_nb's own key, ignored there)."""
    cache: dict[int, list[dict[str, Any]]] = {}
    segments = [
        {
            "device": s.device,
            "address": s.address,
            "total_size": s.total_size,
            "allocated_size": s.allocated_size,
            "active_size": s.active_size,
            "requested_size": sum(b.requested_size for b in s.blocks if b.is_active),
            "stream": s.stream,
            "segment_type": s.segment_type,
            "segment_pool_id": (0, 0),
            "blocks": [
                {
                    "address": b.address,
                    "size": b.size,
                    "requested_size": b.requested_size,
                    "state": b.state,
                    "frames": _frames_out(snapshot, b.stack, cache),
                }
                for b in s.blocks
            ],
        }
        for s in snapshot.segments
    ]
    n_devices = max([t.device + 1 for t in snapshot.traces] or [0])
    device_traces: list[list[dict[str, Any]]] = [[] for _ in range(n_devices)]
    for t in snapshot.traces:
        out = device_traces[t.device]
        for i in range(t.n_events):
            a = int(t.action[i])
            entry: dict[str, Any] = {
                "action": ACTIONS[a],
                "addr": int(t.addr[i]),
                "size": int(t.size[i]),
                "stream": int(t.stream[i]),
                "frames": _frames_out(snapshot, int(t.stack[i]), cache),
            }
            if t.time_us is not None and not math.isnan(t.time_us[i]):
                entry["time_us"] = int(t.time_us[i])
            if a == OOM:
                entry["device_free"] = int(t.device_free[i])
                del entry["addr"]
            if t.category[i] >= 0:
                entry["category"] = snapshot.categories[int(t.category[i])]
            out.append(entry)
    data: dict[str, Any] = {"segments": segments, "device_traces": device_traces}
    if snapshot.allocator_settings:
        data["allocator_settings"] = dict(snapshot.allocator_settings)
    data[EXTRA_KEY] = {
        "source": snapshot.source,
        "step_starts": [list(s) for s in snapshot.step_starts],
        "notes": list(snapshot.notes),
        "cells": dict(snapshot.cells),
    }
    if snapshot.exact_lines:
        data[EXTRA_KEY]["exact_lines"] = True
    return data


def save_snapshot(
    snapshot: MemorySnapshot | Mapping[str, Any], path: str | os.PathLike[str]
) -> Path:
    """Write the snapshot as a pickle PyTorch's memory_viz opens; return the path."""
    data = snapshot_to_dict(snapshot) if isinstance(snapshot, MemorySnapshot) else snapshot
    out = Path(path)
    with open(out, "wb") as f:
        pickle.dump(data, f, protocol=4)
    return out
