"""What several analyses derive from one trace, computed once per trace.

A `TraceIndex` holds them: `analyze` makes one per report and passes it to every analysis
(the diagnosis rules get it in their Context), so a report's tabs and rules share the op and
kernel columns, the ids and the top-level ops instead of each rebuilding them. An analysis
called on a Trace alone makes its own (`index_of`). `memo(index, key, compute)` computes a
value the first time it is asked for. Values kept are shared: they are tuples or read-only
arrays, never mutated by callers. The trace itself stays as it was read: nothing is stored
on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import compress, repeat
from operator import attrgetter
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gpuprof_nb.analysis.classify import kernel_name_class
from gpuprof_nb.model.trace import Kernel, Trace

T = TypeVar("T")
_START, _DUR, _INDEX = attrgetter("start_us"), attrgetter("dur_us"), attrgetter("index")
_KIND, _DEVICE, _NAME = attrgetter("kind"), attrgetter("device"), attrgetter("name")
_INPUT_DIMS = attrgetter("input_dims")
_THREAD = attrgetter("pid", "tid")  # (pid, tid) as one tuple


class TraceIndex:
    """What the analyses derive from one trace and share, each value computed once (see the
    module docstring). `trace` is the trace it indexes."""

    __slots__ = ("trace", "_values")

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._values: dict[Hashable, Any] = {}

    def peek(self, key: Hashable) -> Any:
        """Return the value kept for `key` when an analysis computed it, else None (what the
        roofline found for MFU and the module rules, when the roofline was computed)."""
        return self._values.get(key)


def index_of(trace: Trace | TraceIndex) -> TraceIndex:
    """Return `trace` when it is an index already, else a new index of it."""
    return trace if isinstance(trace, TraceIndex) else TraceIndex(trace)


def memo(index: TraceIndex, key: Hashable, compute: Callable[[], T]) -> T:
    """Return the index's value for `key`, computing it with compute() the first time."""
    store = index._values
    try:
        return store[key]  # type: ignore[no-any-return]
    except KeyError:
        value = store[key] = compute()
        return value


def op_names(index: TraceIndex) -> frozenset[str]:
    """Return the distinct names in index.trace.ops (a few thousand at most), once: tests on names
    then run per name, not per op."""
    return memo(index, "op_names", lambda: frozenset(map(_NAME, index.trace.ops)))


def runtime_names(index: TraceIndex) -> frozenset[str]:
    """Return the distinct names in index.trace.runtime, once (a few dozen)."""
    return memo(index, "runtime_names", lambda: frozenset(map(_NAME, index.trace.runtime)))


def op_kinds(index: TraceIndex) -> list[str]:
    """Return each op's kind, in index.trace.ops' order (computed once)."""
    return memo(index, "op_kinds", lambda: list(map(_KIND, index.trace.ops)))


def op_kind_array(index: TraceIndex) -> np.ndarray:
    """Return op_kinds as an object array (read-only), to compare all at once (each still
    by str ==), once."""
    return memo(index, "op_kind_array", lambda: frozen(np.array(op_kinds(index), dtype=object)))


def frozen(a: np.ndarray) -> np.ndarray:
    """Return `a` marked read-only (a shared array no caller may change)."""
    a.flags.writeable = False
    return a


class OpColumns:
    """The trace's torch ops (kind "op", in trace order) as columns."""

    __slots__ = (
        "ops",
        "positions",
        "start",
        "dur",
        "end",
        "index",
        "raw_thread",
        "raw_threads",
        "thread",
        "thread_keys",
        "external_id",
        "has_external_id",
    )

    def __init__(self, index: TraceIndex) -> None:
        every = index.trace.ops
        is_op = op_kind_array(index) == "op"
        ops = tuple(compress(every, is_op.tolist()))
        n = len(ops)
        self.ops = ops
        # Where each one sits in trace.ops.
        self.positions = frozen(np.flatnonzero(is_op))
        self.start = frozen(np.fromiter(map(_START, ops), dtype=float, count=n))
        self.dur = frozen(np.fromiter(map(_DUR, ops), dtype=float, count=n))
        # start + dur, the same sum as Op.end_us.
        self.end = frozen(self.start + self.dur)
        self.index = frozen(np.fromiter(map(_INDEX, ops), dtype=np.int64, count=n))
        # Each op's (pid, tid) as recorded: a number, and the distinct pairs it indexes.
        pairs, raw_thread = codes_of(map(_THREAD, ops), n)
        self.raw_thread = frozen(raw_thread)
        self.raw_threads: tuple[tuple[Any, Any], ...] = tuple(pairs)
        # Each op's thread keyed by its ids as text (ids that print alike are one thread),
        # numbered by the rank of that key, and the keys in order.
        key_of = [(str(p), str(t)) for p, t in self.raw_threads]
        keys = sorted(set(key_of))
        rank = {k: r for r, k in enumerate(keys)}
        self.thread = frozen(
            np.array([rank[k] for k in key_of], dtype=np.intp)[self.raw_thread]
            if n
            else np.zeros(0, dtype=np.intp)
        )
        self.thread_keys: tuple[tuple[str, str], ...] = tuple(keys)
        ext, has_ext = ids_of(ops, "external_id")
        self.external_id, self.has_external_id = frozen(ext), frozen(has_ext)


class _Codes(dict[Any, int]):
    """Each key's code: the number of distinct keys before its first lookup (a miss adds
    it). Looked up through map(codes.__getitem__, ...), a hit stays in C: no Python frame
    per value, one hash per value."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


def codes_of(values: Iterable[Hashable], count: int) -> tuple[list[Any], np.ndarray]:
    """Return the `count` values' distinct ones, in order of first appearance, and each
    value's index into them. (One hash per value, looked up in C: faster than a generator
    around dict.setdefault (a Python frame per value) and than dict.fromkeys then a lookup
    per value (two hashes each, and a tuple's hash is not kept).)"""
    code_of = _Codes()
    codes = np.fromiter(map(code_of.__getitem__, values), dtype=np.intp, count=count)
    return list(code_of), codes


def op_columns(index: TraceIndex) -> OpColumns:
    """Return the trace's torch ops as columns (computed once per trace)."""
    return memo(index, "op_columns", lambda: OpColumns(index))


class OtherOpColumns:
    """The trace's other ops (not torch ops: record_function ranges, ProfilerStep#
    annotations, Python functions), in trace order, as columns: what the activity window,
    the critical path's host lanes, the hotspots and the module breakdown read of them."""

    __slots__ = ("ops", "positions", "start", "dur", "end", "is_python", "is_annotation")

    def __init__(self, index: TraceIndex) -> None:
        every = index.trace.ops
        others = np.ones(len(every), dtype=bool)
        others[op_columns(index).positions] = False
        self.positions = frozen(np.flatnonzero(others))
        ops = tuple(compress(every, others.tolist()))
        n = len(ops)
        self.ops = ops
        self.start = frozen(np.fromiter(map(_START, ops), dtype=float, count=n))
        self.dur = frozen(np.fromiter(map(_DUR, ops), dtype=float, count=n))
        self.end = frozen(self.start + self.dur)  # the same sum as Op.end_us
        kinds = op_kind_array(index)[self.positions]
        self.is_python = frozen(kinds == "python")
        self.is_annotation = frozen(kinds == "annotation")


def other_op_columns(index: TraceIndex) -> OtherOpColumns:
    """Return the trace's ops other than torch ops as columns (computed once per trace)."""
    return memo(index, "other_op_columns", lambda: OtherOpColumns(index))


class PythonEvents:
    """The trace's python_function events (kind "python", in trace order) as columns: the
    hotspots' call tree and the module breakdown's nn.Module events both read them, so they
    are built once per trace (python_events)."""

    __slots__ = ("ops", "start", "dur", "names", "name_code")

    def __init__(self, index: TraceIndex) -> None:
        other = other_op_columns(index)  # python_function events are among them
        ops = tuple(compress(other.ops, other.is_python.tolist()))
        n = len(ops)
        self.ops = ops
        self.start = frozen(other.start[other.is_python])
        self.dur = frozen(other.dur[other.is_python])
        # Each event's name as an index into the distinct names (in order of first
        # appearance): tests on names then run per name, not per event.
        names, codes = codes_of(map(_NAME, ops), n)
        self.names: tuple[str, ...] = tuple(names)
        self.name_code = frozen(codes)

    def named(self, test: Callable[[str], bool]) -> np.ndarray:
        """Mask of the events whose name passes `test` (asked once per distinct name)."""
        passes = np.fromiter(map(test, self.names), dtype=bool, count=len(self.names))
        return passes[self.name_code] if len(self.name_code) else np.zeros(0, dtype=bool)


def python_events(index: TraceIndex) -> PythonEvents:
    """Return the trace's python_function events as columns (computed once per trace)."""
    return memo(index, "python_event_columns", lambda: PythonEvents(index))


def op_input_dims(index: TraceIndex) -> list[Any]:
    """Return each of op_columns' ops' input_dims (None where not recorded), once."""
    return memo(index, "op_input_dims", lambda: list(map(_INPUT_DIMS, op_columns(index).ops)))


def op_name_codes(index: TraceIndex) -> tuple[tuple[str, ...], np.ndarray]:
    """Return the distinct names of op_columns' ops, in order of first appearance, and each
    op's name as an index into them (computed once per trace)."""

    def compute() -> tuple[tuple[str, ...], np.ndarray]:
        ops = op_columns(index).ops
        names, codes = codes_of(map(_NAME, ops), len(ops))
        return tuple(names), frozen(codes)

    return memo(index, "op_name_codes", compute)


# Device activity kinds as codes (KernelColumns.kind).
KERNEL_KINDS = ("kernel", "memcpy", "memset")
# Kernel classes as codes (analysis/classify.kernel_class).
KERNEL_CLASSES = ("copy", "comm", "gemm", "elementwise", "wait")


class KernelColumns:
    """A sequence of kernels, memcpys and memsets as columns, in its order."""

    __slots__ = ("kernels", "start", "dur", "end", "kind", "is_kernel", "device", "cls")

    def __init__(self, kernels: Sequence[Kernel]) -> None:
        n = len(kernels)
        self.kernels = kernels
        self.start = frozen(np.fromiter(map(_START, kernels), dtype=float, count=n))
        self.dur = frozen(np.fromiter(map(_DUR, kernels), dtype=float, count=n))
        self.end = frozen(self.start + self.dur)  # the same sum as Kernel.end_us
        # Kinds as codes (KERNEL_KINDS; anything else: their count), and the device of each.
        kinds = {k: i for i, k in enumerate(KERNEL_KINDS)}
        self.kind = frozen(
            np.fromiter(
                map(kinds.get, map(_KIND, kernels), repeat(len(kinds))), dtype=np.int8, count=n
            )
        )
        self.is_kernel = frozen(self.kind == 0)
        self.device = frozen(np.fromiter(map(_DEVICE, kernels), dtype=np.int64, count=n))
        # kernel_class: "copy" for what is not a kernel, else its name's class (each distinct
        # name classified once).
        code = {c: i for i, c in enumerate(KERNEL_CLASSES)}
        names, name_code = codes_of(map(_NAME, kernels), n)
        by_name = np.array([code[kernel_name_class(name)] for name in names], dtype=np.int8)
        cls = by_name[name_code] if n else np.zeros(0, dtype=np.int8)
        cls[~self.is_kernel] = code["copy"]
        self.cls = frozen(cls)

    def of_class(self, name: str) -> np.ndarray:
        """Mask of the kernels of one class ('comm', 'gemm', 'elementwise', 'wait', 'copy')."""
        return self.cls == KERNEL_CLASSES.index(name)  # type: ignore[no-any-return]


def kernel_columns(
    index: TraceIndex, kernels: Sequence[Kernel] | None = None, key: Hashable = None
) -> KernelColumns:
    """Return columns of index.trace.kernels, or of `kernels`, a selection of them named by `key`
    (the kernels of one device), computed once each."""
    every = memo(index, "kernel_columns", lambda: KernelColumns(index.trace.kernels))
    if kernels is None or len(kernels) == len(index.trace.kernels):
        return every  # the selection holds them all
    return memo(index, ("kernel_columns", key), lambda: KernelColumns(kernels))


_NO_ID = int(np.iinfo(np.int64).min)  # stands for None (an id of this value is hashed: see ids)


def ids(values: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """Return ids (correlation, External id) as int64, and the mask of the present ones.

    An id outside int64 (a damaged or hand-made trace) stands as its Python hash, the same
    for the same id wherever it appears, so ids still match across kernels, calls and ops."""
    listed = values if isinstance(values, list) else list(values)
    arr: np.ndarray | None
    try:
        arr = np.array([_NO_ID if v is None else v for v in listed], dtype=np.int64)
    except OverflowError:
        arr = None
    if arr is None or int(np.count_nonzero(arr == _NO_ID)) != listed.count(None):
        arr = np.array(
            [_NO_ID if v is None else v if -(2**63) < v < 2**63 else hash(v) for v in listed],
            dtype=np.int64,
        )
    return arr, arr != _NO_ID


def ids_of(items: Sequence[Any], attr: str) -> tuple[np.ndarray, np.ndarray]:
    """ids() of each item's `attr`: in one pass over the items when every id is a present
    int64 (the usual case), else as ids() reads the list of them."""
    get = attrgetter(attr)
    try:
        arr = np.fromiter(map(get, items), dtype=np.int64, count=len(items))
    except (TypeError, OverflowError):  # a missing id (None), or one outside int64
        return ids(list(map(get, items)))
    if (arr == _NO_ID).any():
        return ids(arr.tolist())
    return arr, np.ones(len(arr), dtype=bool)


def lookup(keys: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Return values[k] where keys[k] == wanted (keys sorted and unique), else -1."""
    if not len(keys):
        return np.full(len(wanted), -1, dtype=np.intp)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return np.where(keys[at] == wanted, values[at], -1)


def distinct(values: np.ndarray) -> np.ndarray:
    """Return np.unique(values): the distinct values, sorted, NaNs as one. Found by a sort:
    np.unique without return_index/return_inverse asks np.ma whether the array is masked,
    and the first such call imports numpy.ma (about 6 ms, a tenth of a report's analysis)."""
    s = np.sort(np.asarray(values).ravel())
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    if s.dtype.kind in "fc":
        nan = np.isnan(s)
        keep[1:] &= ~(nan[1:] & nan[:-1])
    return s[keep]


def median(values: np.ndarray) -> float:
    """Return float(np.median(values)) of a 1-D array (nan when empty or when a value is
    nan), found by a sort: np.median asks np.ma whether its result is masked, which imports
    numpy.ma on the first call (see distinct)."""
    s = np.sort(np.asarray(values, dtype=float))
    n = len(s)
    if not n or np.isnan(s[-1]):
        return float("nan")
    mid = n // 2
    if n % 2:
        return float(s[mid])
    # np.median's mean of the two middle values: their sum, halved.
    return float((s[mid - 1] + s[mid]) / 2.0)


def percentile(values: np.ndarray, q: float) -> float:
    """Return float(np.percentile(values, q)) of a non-empty 1-D array, q in [0, 100] (nan
    when a value is nan): numpy's default linear interpolation between the sorted values,
    step for step, found by a sort (np.percentile's partition asks np.unique, which imports
    numpy.ma on the first call: see distinct)."""
    s = np.sort(np.asarray(values, dtype=float))
    n = len(s)
    if not n or np.isnan(s[-1]):
        return float("nan")
    at = (n - 1) * (q / 100)
    if at >= n - 1:
        # numpy takes the last value twice, its weight counted from index -1.
        a = b = float(s[-1])
        t = at + 1
    else:
        below = math.floor(at)
        a, b = float(s[below]), float(s[below + 1])
        t = at - below
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def lex_order(keys: Sequence[np.ndarray], lead: int = 2) -> npt.NDArray[np.intp]:
    """Return np.lexsort(keys): the order by the last key, ties by the one before it and so
    on, then by position. The same order, found faster on a trace's columns: np.lexsort
    sorts the whole array once per key, and a key in no order (durations, ends) costs tens
    of times what a nearly sorted one (threads, starts) does. Here the `lead` last keys are
    sorted by stable argsorts, then only the rows tied on all of them by the other keys.
    Ties are as the sorts see them: equal values, NaN with NaN."""
    if len(keys) <= lead:
        return np.lexsort(keys)
    minor, major = keys[:-lead], keys[-lead:]
    order = np.argsort(major[0], kind="stable")
    for key in major[1:]:
        order = order[np.argsort(key[order], kind="stable")]
    n = len(order)
    if n < 2:
        return order
    # tied[i]: row i + 1 (in that order) ties with row i on every leading key.
    tied = np.ones(n - 1, dtype=bool)
    for key in major:
        v = key[order]
        same = v[1:] == v[:-1]
        if v.dtype.kind in "fc":
            nan = np.isnan(v)
            same |= nan[1:] & nan[:-1]
        tied &= same
    if not tied.any():
        return order
    # Each run of tied rows (in place, in the order of their positions: the sorts are
    # stable) sorted by the other keys, its number leading so the runs keep their places.
    run = np.cumsum(np.concatenate(([True], ~tied)))
    in_run = np.zeros(n, dtype=bool)
    in_run[1:] = tied
    in_run[:-1] |= tied
    rows = np.flatnonzero(in_run)
    sub = order[rows]
    order[rows] = sub[np.lexsort((*(key[sub] for key in minor), run[rows]))]
    return order


def kernel_ids(index: TraceIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return index.trace.kernels' (correlation ids, present, External ids, present), once."""

    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        corr, has_corr = ids_of(index.trace.kernels, "correlation")
        ext, has_ext = ids_of(index.trace.kernels, "external_id")
        return frozen(corr), frozen(has_corr), frozen(ext), frozen(has_ext)

    return memo(index, "kernel_ids", compute)


def runtime_correlations(index: TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return index.trace.runtime's (correlation ids, present), once."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        corr, has = ids_of(index.trace.runtime, "correlation")
        return frozen(corr), frozen(has)

    return memo(index, "runtime_correlations", compute)


def runtime_external_ids(index: TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return index.trace.runtime's (External ids, present), once."""

    def compute() -> tuple[np.ndarray, np.ndarray]:
        ext, has = ids_of(index.trace.runtime, "external_id")
        return frozen(ext), frozen(has)

    return memo(index, "runtime_external_ids", compute)


def runtime_threads(index: TraceIndex) -> tuple[np.ndarray, tuple[tuple[Any, Any], ...]]:
    """Return each runtime call's (pid, tid) as a code, and the distinct pairs the codes
    index, in order of first appearance (computed once)."""

    def compute() -> tuple[np.ndarray, tuple[tuple[Any, Any], ...]]:
        runtime = index.trace.runtime
        pairs, codes = codes_of(map(_THREAD, runtime), len(runtime))
        return frozen(codes), tuple(pairs)

    return memo(index, "runtime_threads", compute)


def runtime_starts(index: TraceIndex) -> np.ndarray:
    """Return index.trace.runtime's start times, once."""
    return memo(
        index,
        "runtime_starts",
        lambda: frozen(
            np.fromiter(
                map(_START, index.trace.runtime), dtype=float, count=len(index.trace.runtime)
            )
        ),
    )


def first_call_of(index: TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return (correlation ids, sorted and unique; the position in index.trace.runtime of the first
    call recorded with each), once."""
    return memo(index, "first_call_of", lambda: _call_of(index, last=False))


def last_call_of(index: TraceIndex) -> tuple[np.ndarray, np.ndarray]:
    """Return (correlation ids, sorted and unique; the position in index.trace.runtime of the last
    call recorded with each), once."""
    return memo(index, "last_call_of", lambda: _call_of(index, last=True))


def _call_of(index: TraceIndex, *, last: bool) -> tuple[np.ndarray, np.ndarray]:
    corr, has = runtime_correlations(index)
    pos = np.flatnonzero(has)
    if last:
        pos = pos[::-1]  # np.unique keeps each id's first position: the last call, reversed
    keys, at = np.unique(corr[pos], return_index=True)
    return frozen(keys), frozen(pos[at])
