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
import mmap
import os
import pickle
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuprof_nb.errors import GpuprofError, SnapshotFormatError
from gpuprof_nb.gcpause import gc_paused
from gpuprof_nb.io.cells import cells_of
from gpuprof_nb.io.guards import (
    GzipGuard,
    describe,
    nesting_depth,
    open_for_writing,
    open_regular,
)
from gpuprof_nb.io.safe_pickle import unpickle
from gpuprof_nb.io.steprecord import (
    STEP_KEY,
    step_record_items,
    step_record_of,
    step_record_to_dict,
)
from gpuprof_nb.model.frames import Frame
from gpuprof_nb.model.memory import (
    ACTION_CODE,
    ACTIONS,
    OOM,
    OTHER,
    Block,
    DeviceTrace,
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


def load_snapshot(source: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> MemorySnapshot:
    """Return the MemorySnapshot in a pickle file (optionally gzipped), pickle bytes, or an
    already-unpickled snapshot dict. Raises SnapshotFormatError on anything else."""
    with gc_paused():
        return _load_snapshot(source)


_WHAT = "a pickle written by torch.cuda.memory._dump_snapshot or %%memsnap --save"


def _load_snapshot(source: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> MemorySnapshot:
    if isinstance(source, Mapping):
        return snapshot_from_dict(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        raw = bytes(source)
        where = "snapshot bytes"
        if raw[:2] == b"\x1f\x8b":
            raw = _gunzip(io.BytesIO(raw), where)
        if not raw:
            raise SnapshotFormatError(f"{where}: empty; pass the bytes of {_WHAT}")
        data = unpickle(raw, where)
        return _snapshot_from_dict(data, where, len(raw))
    if not isinstance(source, (str, os.PathLike)):
        raise SnapshotFormatError(
            f"load_snapshot expects a file path, pickle bytes or a snapshot dict, got "
            f"{type(source).__name__}; pass the path of {_WHAT}."
        )
    where = os.fsdecode(os.fspath(source))
    f, st = open_regular(where, what=_WHAT, error=SnapshotFormatError)
    with f:
        if st.st_size == 0:
            raise SnapshotFormatError(f"{where}: the file is empty; pass the path of {_WHAT}.")
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            raw = _gunzip(f, where)
            data = unpickle(raw, where)
            n_bytes = len(raw)
        else:
            # Scanned through a read-only map of the file (no copy in memory), then
            # unpickled from the file itself.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                data = unpickle(mapped, where, stream=f)
            n_bytes = st.st_size
    return _snapshot_from_dict(data, where, n_bytes)


def _gunzip(raw: Any, where: str) -> bytes:
    """Return the decompressed bytes of a gzip stream, bounded (io/guards.GzipGuard)."""
    guard = GzipGuard(raw, gzip.GzipFile, where, SnapshotFormatError)
    try:
        return guard.read()
    except (OSError, EOFError, zlib.error) as e:
        raise SnapshotFormatError(
            f"{where}: the gzip data is damaged or cut short ({type(e).__name__}: "
            f"{str(e)[:120]}); copy or dump the snapshot again."
        ) from None


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
        filename = f.get("filename", "??")
        name = f.get("name", "??")
        line = f.get("line")
        for field, value in (("filename", filename), ("name", name)):
            if type(value) is not str:
                raise SnapshotFormatError(
                    f"{self.where}: a frame's '{field}' is {describe(value)}, expected a "
                    "string; the snapshot is damaged (dump it again with "
                    "torch.cuda.memory._dump_snapshot)"
                )
        if line is None:
            line = 0
        elif type(line) is not int or not 0 <= line < 2**31:
            raise SnapshotFormatError(
                f"{self.where}: a frame's 'line' is {describe(line)}, expected a line number"
            )
        key = (filename, line, name)
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
            f"{where}: {what} is {describe(value)} ({type(value).__name__}), expected an integer"
        )
    if not -(2**63) <= value < 2**63:
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, out of the 64-bit range")
    return value


def _index(value: Any, what: str, where: str, default: int = 0) -> int:
    """An integer that cannot be negative (a device, an address, a stream)."""
    number = _int(value, what, where, default)
    if number < 0:
        raise SnapshotFormatError(
            f"{where}: {what} is {number}, expected 0 or more; the snapshot is damaged"
        )
    return number


def _text(value: Any, what: str, where: str, default: str) -> str:
    if value is None:
        return default
    if type(value) is not str:
        raise SnapshotFormatError(f"{where}: {what} is {describe(value)}, expected a string")
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


def _check_negative(column: np.ndarray, field: str, here: str) -> None:
    """Raise SnapshotFormatError naming the first entry whose `field` is negative."""
    bad = column < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SnapshotFormatError(
            f"{here}[{i}]: '{field}' is {int(column[i])}, expected 0 or more; the snapshot is "
            "damaged (dump it again with torch.cuda.memory._dump_snapshot)"
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
    raw_blocks = seg.get("blocks")
    if raw_blocks is None:
        raw_blocks = []
    if not isinstance(raw_blocks, (list, tuple)):
        raise SnapshotFormatError(f"{here}: 'blocks' is {describe(raw_blocks)}, not a list")
    seg_addr = _index(seg.get("address"), "'address'", here)
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
            first = history[0] if isinstance(history, (list, tuple)) and history else {}
            first = first if isinstance(first, Mapping) else {}
            frames = first.get("frames")
            requested = first.get("real_size", b.get("requested_size", size))
        # Block addresses are optional in old and profiler-made snapshots: blocks tile
        # the segment in order, so the running offset recovers them.
        addr = _index(b.get("address"), "'address'", bhere, default=offset)
        blocks.append(
            Block(
                address=addr,
                size=size,
                requested_size=_checked_size(requested, "'requested_size'", bhere, size),
                state=_text(b.get("state"), "'state'", bhere, "inactive"),
                stack=table.stack_of(frames),
            )
        )
        offset = addr + size
    total = _checked_size(seg.get("total_size"), "'total_size'", here, sum(b.size for b in blocks))
    active = [b for b in blocks if b.is_active]
    return Segment(
        device=_index(seg.get("device"), "'device'", here),
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
        stream=_index(seg.get("stream"), "'stream'", here),
        segment_type=_text(
            seg.get("segment_type"), "'segment_type'", here, "large" if total > 2**20 else "small"
        ),
        blocks=tuple(blocks),
    )


def _column(
    values: list[Any], field: str, here: str, *, floats: bool = False, default: Any = 0
) -> np.ndarray:
    """Return one history field as an array: int64, or float64 with `floats` (times). Only
    what the format holds is taken: ints (and finite floats with `floats`); None (or an
    absent key) is `default`. A bool, a string, a float where an int belongs, a container
    or an out-of-range number is refused, naming the entry: coercing it would be silently
    wrong."""
    kinds = set(map(type, values))
    if floats and float in kinds:
        for i, v in enumerate(values):
            if type(v) is float and not math.isfinite(v):
                raise SnapshotFormatError(
                    f"{here}[{i}]: '{field}' is {v!r}, not a finite number; the snapshot is "
                    "damaged (dump it again with torch.cuda.memory._dump_snapshot)"
                )
    if type(None) in kinds:
        values = [default if v is None else v for v in values]
        kinds.discard(type(None))
        kinds.add(type(default))
    allowed = {int, float} if floats else {int}
    if not kinds <= allowed:
        for i, v in enumerate(values):
            if type(v) not in allowed:
                expected = "a number" if floats else "an integer"
                raise SnapshotFormatError(
                    f"{here}[{i}]: '{field}' is {describe(v)}, expected {expected}; the "
                    "snapshot is damaged (dump it again with torch.cuda.memory._dump_snapshot)"
                )
    try:
        # Through int64 even for times: an integer past 64 bits is damage, not a time.
        column = np.array(values, dtype=np.int64) if int in kinds and not floats else None
        if floats:
            if int in kinds:
                np.array([v for v in values if type(v) is int], dtype=np.int64)
            column = np.array(values, dtype=np.float64)
    except OverflowError:
        for i, v in enumerate(values):
            if type(v) is int and not -(2**63) <= v < 2**63:
                raise SnapshotFormatError(
                    f"{here}[{i}]: '{field}' is {describe(v)}, out of the 64-bit range"
                ) from None
        raise SnapshotFormatError(f"{here}: column '{field}' is out of range") from None
    if column is None:
        column = np.array(values, dtype=np.int64)
    return column


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
    names = [e.get("action") for e in entries]
    # Checked before any lookup: hashing a value nested a million deep overflows the C stack.
    if not set(map(type, names)) <= {str}:
        for i, a in enumerate(names):
            if type(a) is not str:
                raise SnapshotFormatError(
                    f"{here}[{i}]: 'action' is {describe(a)}, expected a string such as "
                    "'alloc'; the snapshot is damaged (dump it again with "
                    "torch.cuda.memory._dump_snapshot)"
                )
    action = np.array([code.get(a, OTHER) for a in names], dtype=np.int8)
    addr = _column([e.get("addr") for e in entries], "addr", here)
    size = _column([e.get("size") for e in entries], "size", here)
    _check_sizes(size, action, here)
    _check_negative(addr, "addr", here)
    stream = _column([e.get("stream") for e in entries], "stream", here)
    _check_negative(stream, "stream", here)
    stack = np.array([table.stack_of(e.get("frames")) for e in entries], dtype=np.int32)
    time_us: np.ndarray | None = None
    if any("time_us" in e for e in entries):
        time_us = _column(
            [e.get("time_us") for e in entries], "time_us", here, floats=True, default=math.nan
        )
    device_free = np.full(len(entries), -1, dtype=np.int64)
    for i in np.flatnonzero(action == OOM).tolist():
        device_free[i] = _int(entries[i].get("device_free"), "'device_free'", f"{here}[{i}]", -1)
    category = np.full(len(entries), -1, dtype=np.int16)
    if any("category" in e for e in entries):
        for i, e in enumerate(entries):
            name = e.get("category")
            if name is not None:
                category[i] = categories.setdefault(
                    _text(name, "'category'", f"{here}[{i}]", ""), len(categories)
                )
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


def snapshot_from_dict(
    data: Any,
    *,
    where: str = "snapshot",
    name_cells: Callable[[Iterable[str]], Mapping[str, int]] | None = None,
) -> MemorySnapshot:
    """Return the MemorySnapshot for an unpickled snapshot dict (see module docstring).
    Raises SnapshotFormatError, naming the place, when the dict is not a snapshot.
    `name_cells` (a live recording's) maps the frames' file names that are notebook cells
    to their execution numbers, added to the cells the dict keeps."""
    with gc_paused():
        return _snapshot_from_dict(data, where, name_cells=name_cells)


def _check_expansion(
    raw_segments: Sequence[Any],
    raw_traces: Sequence[Any],
    extra: Mapping[str, Any],
    n_bytes: int,
    where: str,
) -> None:
    """Raise SnapshotFormatError when `n_bytes` of pickle unpickled into more entries,
    blocks, segments, devices, step marks and step record values than a real snapshot of
    that size can hold (see MIN_BYTES_PER_ITEM). Counts only list lengths, before anything
    is built."""

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
        "step marks": lengths(extra.get("step_starts")),
        "step record values": step_record_items(extra),
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


def _snapshot_from_dict(
    data: Any,
    where: str,
    n_bytes: int | None = None,
    name_cells: Callable[[Iterable[str]], Mapping[str, int]] | None = None,
) -> MemorySnapshot:
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
            f"{_some_keys(data)}); this is not a CUDA memory snapshot"
        )
    raw_segments = data.get("segments")
    raw_traces = data.get("device_traces")
    raw_segments = [] if raw_segments is None else raw_segments
    raw_traces = [] if raw_traces is None else raw_traces
    if not isinstance(raw_segments, (list, tuple)) or not isinstance(raw_traces, (list, tuple)):
        raise SnapshotFormatError(
            f"{where}: 'segments' and 'device_traces' must be lists (got "
            f"{describe(raw_segments)} and {describe(raw_traces)})"
        )
    extra = data.get(EXTRA_KEY)
    extra = extra if isinstance(extra, Mapping) else {}
    if n_bytes is not None:
        _check_expansion(raw_segments, raw_traces, extra, n_bytes, where)
    table = _StackTable(where)
    segments = tuple(_segment(s, i, where, table) for i, s in enumerate(raw_segments))
    categories: dict[str, int] = {}
    traces = tuple(
        _device_trace(d, entries, where, table, categories) for d, entries in enumerate(raw_traces)
    )
    notes = extra.get("notes", ())
    notes = list(notes) if isinstance(notes, (list, tuple)) else []
    step_starts = _step_starts(extra.get("step_starts"), notes)
    settings = _settings(data.get("allocator_settings"), notes)
    source = extra.get("source", "cuda")
    cells = cells_of(data)
    if name_cells is not None:
        cells.update(name_cells(f.file for f in table.frames))
    return MemorySnapshot(
        segments=segments,
        traces=traces,
        frames=tuple(table.frames),
        stacks=tuple(table.stacks),
        categories=tuple(sorted(categories, key=categories.__getitem__)),
        allocator_settings=settings,
        source=source if isinstance(source, str) and len(source) < 100 else "cuda",
        step_starts=step_starts,
        # Repeats dropped: one long note referenced many times would otherwise be shown
        # that many times.
        notes=tuple(dict.fromkeys(n for n in notes if isinstance(n, str))),
        cells=cells,
        step=step_record_of(extra, where),
        exact_lines=extra.get("exact_lines") is True,
    )


def _some_keys(data: Mapping[Any, Any]) -> list[str]:
    """The first few keys of a dict, for a message (keys of any type, safely shown)."""
    return sorted(k if isinstance(k, str) else describe(k) for k in list(data)[:50])[:8]


def _step_starts(value: Any, notes: list[str]) -> tuple[tuple[int, ...], ...]:
    """gpuprof_nb's own step starts (entry indices per device); malformed ones are dropped
    with a note, since the history reads without them."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)) and all(
        isinstance(dev, (list, tuple)) and all(type(i) is int and 0 <= i < 2**63 for i in dev)
        for dev in value
    ):
        return tuple(tuple(dev) for dev in value)
    notes.append(
        "the snapshot's step starts (gpuprof_nb's own key) are malformed and were left out: "
        "runs of a --repeat recording are not told apart"
    )
    return ()


def _settings(value: Any, notes: list[str]) -> dict[str, Any]:
    """The allocator settings, as recorded: a dict of named values (numbers, strings, or
    small dicts of them such as roundup_power2_divisions); a value nested deeper than any
    setting is left out with a note."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        out = {k: v for k, v in value.items() if type(k) is str and nesting_depth(v, 3) <= 3}
        if len(out) == len(value):
            return out
        notes.append(
            f"{len(value) - len(out)} allocator setting(s) were not named values (nested "
            "too deep, or a key that is not a string) and were left out"
        )
        return out
    notes.append(f"'allocator_settings' is {describe(value)}, not a dict; left out")
    return {}


def _frames_out(
    snapshot: MemorySnapshot, stack: int, cache: dict[int, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    if stack < 0:
        return []
    hit = cache.get(stack)
    if hit is None:
        hit = [
            {"filename": f.file, "line": f.line, "name": f.function}
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
    if snapshot.step is not None:
        data[EXTRA_KEY][STEP_KEY] = step_record_to_dict(snapshot.step)
    if snapshot.exact_lines:
        data[EXTRA_KEY]["exact_lines"] = True
    return data


def save_snapshot(
    snapshot: MemorySnapshot | Mapping[str, Any], path: str | os.PathLike[str]
) -> Path:
    """Write the snapshot as a pickle PyTorch's memory_viz opens; return the path."""
    data = snapshot_to_dict(snapshot) if isinstance(snapshot, MemorySnapshot) else snapshot
    out = Path(path)
    what = "the snapshot"
    with open_for_writing(out, what=what, error=GpuprofError) as f:
        try:
            pickle.dump(data, f, protocol=4)
        except (pickle.PicklingError, TypeError, ValueError, RecursionError) as e:
            raise GpuprofError(
                f"cannot write {what} to {out}: it holds a value a pickle cannot store "
                f"({type(e).__name__}: {str(e)[:200]})"
            ) from None
    return out
