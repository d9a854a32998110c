"""What several analyses derive from one trace, computed once per trace.

`memo(trace, key, compute)` keeps the value in `Trace.derived`, so a report's tabs and rules
share the top-level ops, the op tree and the kernel columns instead of each rebuilding them.
Values kept there are shared: they are tuples or read-only arrays, never mutated by callers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from gpuprof_nb.analysis.classify import kernel_class
from gpuprof_nb.model.trace import Kernel, Trace

T = TypeVar("T")


def memo(trace: Trace, key: Hashable, compute: Callable[[], T]) -> T:
    """Return trace's value for `key`, computing it with compute() the first time."""
    store: dict[Any, Any] = trace.derived
    try:
        return store[key]  # type: ignore[no-any-return]
    except KeyError:
        value = store[key] = compute()
        return value


def frozen(a: np.ndarray) -> np.ndarray:
    """Return `a` marked read-only (a shared array no caller may change)."""
    a.flags.writeable = False
    return a


class OpColumns:
    """The trace's torch ops (kind "op", in trace order) as columns."""

    __slots__ = ("ops", "positions", "start", "dur", "end", "index", "pid", "tid", "thread",
                 "thread_keys")

    def __init__(self, trace: Trace) -> None:
        positions = [i for i, o in enumerate(trace.ops) if o.kind == "op"]
        every = trace.ops
        ops = tuple([every[i] for i in positions])
        self.ops = ops
        # Where each one sits in trace.ops.
        self.positions = frozen(np.array(positions, dtype=np.intp))
        self.start = frozen(np.array([o.start_us for o in ops], dtype=float))
        self.dur = frozen(np.array([o.dur_us for o in ops], dtype=float))
        # start + dur, the same sum as Op.end_us.
        self.end = frozen(self.start + self.dur)
        self.index = frozen(np.array([o.index for o in ops], dtype=np.int64))
        self.pid: tuple[Any, ...] = tuple([o.pid for o in ops])
        self.tid: tuple[Any, ...] = tuple([o.tid for o in ops])
        thread, keys = thread_ranks(self.pid, self.tid)
        # Each op's thread, numbered by the rank of its key (see thread_ranks), and the keys.
        self.thread = frozen(thread)
        self.thread_keys: tuple[tuple[str, str], ...] = tuple(keys)


def op_columns(trace: Trace) -> OpColumns:
    """Return the trace's torch ops as columns (computed once per trace)."""
    return memo(trace, "op_columns", lambda: OpColumns(trace))


def thread_ranks(pids: Sequence[Any], tids: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    """Number each (pid, tid) by the rank of its key as text, (str(pid), str(tid)): ids that
    print alike are one thread. Return the numbers and the sorted keys."""
    raw = list(zip(pids, tids, strict=True))
    key_of = {t: (str(t[0]), str(t[1])) for t in set(raw)}
    keys = sorted(set(key_of.values()))
    rank = {k: r for r, k in enumerate(keys)}
    rank_of = {t: rank[k] for t, k in key_of.items()}
    return np.fromiter(map(rank_of.__getitem__, raw), dtype=np.intp, count=len(raw)), keys


# Kernel classes as codes (analysis/classify.kernel_class).
KERNEL_CLASSES = ("copy", "comm", "gemm", "elementwise")


class KernelColumns:
    """A sequence of kernels, memcpys and memsets as columns, in its order."""

    __slots__ = ("kernels", "start", "dur", "end", "is_kernel", "cls")

    def __init__(self, kernels: Sequence[Kernel]) -> None:
        self.kernels = kernels
        self.start = frozen(np.array([k.start_us for k in kernels], dtype=float))
        self.dur = frozen(np.array([k.dur_us for k in kernels], dtype=float))
        self.end = frozen(self.start + self.dur)  # the same sum as Kernel.end_us
        self.is_kernel = frozen(np.array([k.kind == "kernel" for k in kernels], dtype=bool))
        code = {c: i for i, c in enumerate(KERNEL_CLASSES)}
        self.cls = frozen(np.fromiter((code[kernel_class(k)] for k in kernels),
                                      dtype=np.int8, count=len(kernels)))

    def of_class(self, name: str) -> np.ndarray:
        """Mask of the kernels of one class ('comm', 'gemm', 'elementwise', 'copy')."""
        return self.cls == KERNEL_CLASSES.index(name)  # type: ignore[no-any-return]


def kernel_columns(trace: Trace, kernels: Sequence[Kernel], key: Hashable) -> KernelColumns:
    """Return columns of `kernels` (a selection of trace.kernels named by `key`), once."""
    return memo(trace, ("kernel_columns", key), lambda: KernelColumns(kernels))
