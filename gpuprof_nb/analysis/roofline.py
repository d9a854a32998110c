"""Roofline of a trace: per op group FLOPs, bytes, intensity, achieved rates, the roof that
applies and how far below it each group ran. Pure: Trace (+ DeviceSpec) in, Roofline out.

Time attribution never counts an op twice. The op that launched a kernel is found through the
kernel's External id (else its runtime call); the kernel's time goes to the *anchor*: the
outermost op on that op's ancestor chain that has a FLOP/byte formula (aten::conv2d, not its
aten::cudnn_convolution child; aten::linear, not its aten::addmm). On a trace without device
activity the anchor's own (inclusive) CPU time is used instead.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any

import numpy as np

from gpuprof_nb.analysis.classify import op_class
from gpuprof_nb.analysis.derived import (
    OpColumns,
    TraceIndex,
    codes_of,
    distinct,
    index_of,
    kernel_columns,
    kernel_ids,
    last_call_of,
    lex_order,
    lookup,
    memo,
    op_columns,
    op_input_dims,
    op_name_codes,
    runtime_external_ids,
    runtime_starts,
    runtime_threads,
)
from gpuprof_nb.analysis.flops import COPY_WRAPPERS, OpCost, has_formula, op_cost
from gpuprof_nb.analysis.intervals import nearest_open_before, tree_depths
from gpuprof_nb.analysis.timeline import unrecorded_launches
from gpuprof_nb.model.device import DeviceSpec, lookup_device_spec
from gpuprof_nb.model.trace import Op, Trace
from gpuprof_nb.results.roofline import (
    MATMUL_CATEGORIES,
    DataMovement,
    Roofline,
    RooflinePoint,
    Unmodelled,
)

_EPS_US = 1e-3  # Kineto float timestamps carry ns digits; nesting tolerates that rounding.
# How many asks for an op's children are answered by a scan before the children of every
# op are sorted out once: each scan reads all nested ops once, the sort costs many scans.
_CHILD_SCANS = 64


# ---------------------------------------------------------------- op tree


class _Tree:
    """Host ops nested per (pid, tid) by their intervals. The arrays are built at once; the
    lists and dicts that only some traces need (CPU-only traces, copy wrappers, launches
    without an op of their id) on first use."""

    def __init__(self, cols: OpColumns) -> None:
        self.cols = cols
        self.ops = cols.ops
        n = len(self.ops)
        # Threads keyed by their ids as text (ids that print alike are one thread).
        thread, keys = cols.thread, cols.thread_keys
        starts, durs, ends = cols.start, cols.dur, cols.end
        # Per thread: (start, longer first, file order, position) order.
        order = lex_order((np.arange(n), cols.index, -durs, starts, thread))
        self.order_arr = order
        self._bounds = np.searchsorted(thread[order], np.arange(len(keys) + 1)).tolist()
        self.start_arr, self.dur_arr, self.end_arr = starts, durs, ends
        # An op's parent is the nearest op before it on its thread that ends no earlier
        # (within rounding): what a stack of open ops finds, for all ops at once.
        sorted_ends = ends[order]
        bounds = self._bounds
        first_of_thread = np.repeat(np.array(bounds[:-1], dtype=np.intp), np.diff(bounds))
        found = nearest_open_before(sorted_ends + _EPS_US, sorted_ends, first_of_thread)
        has = found >= 0
        self._kids = order[has]
        self._parents = order[found[has]]
        self.parent_arr = np.full(n, -1, dtype=np.intp)
        self.parent_arr[self._kids] = self._parents
        self._levels: list[np.ndarray] | None = None
        self._scans_left = _CHILD_SCANS

    @cached_property
    def order(self) -> list[int]:
        return self.order_arr.tolist()  # type: ignore[no-any-return]

    @cached_property
    def parent(self) -> list[int | None]:
        """Each op's parent (an index into ops), None for a top-level op."""
        return [None if p < 0 else p for p in self.parent_arr.tolist()]

    @cached_property
    def _by_parent(self) -> tuple[list[int], list[int]]:
        """(parents, children) of every nested op, sorted by parent; each parent's children
        in (start, longer first, file order) order."""
        by = np.argsort(self._parents, kind="stable")
        return self._parents[by].tolist(), self._kids[by].tolist()

    def children_of(self, i: int) -> list[int]:
        """The ops directly inside op i, in (start, longer first, file order) order."""
        if self._scans_left:
            # A few asks (a trace with few copy wrappers) are answered by a scan of the
            # nested ops, which are in that order already: cheaper than sorting them all.
            self._scans_left -= 1
            return self._kids[self._parents == i].tolist()  # type: ignore[no-any-return]
        parents, kids = self._by_parent
        a = bisect.bisect_left(parents, i)
        return kids[a : bisect.bisect_right(parents, i, a)]

    @cached_property
    def _sorted_starts(self) -> np.ndarray:
        return self.start_arr[self.order_arr]

    @cached_property
    def _thread_of(self) -> dict[tuple[str, str], int]:
        return {k: r for r, k in enumerate(self.cols.thread_keys)}

    def thread(self, key: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
        """One thread's ops in the tree's order and their starts (both empty for a thread
        with no op), as slices of the tree's arrays."""
        r = self._thread_of.get(key)
        if r is None:
            return self.order_arr[:0], self._sorted_starts[:0]
        lo, hi = self._bounds[r], self._bounds[r + 1]
        return self.order_arr[lo:hi], self._sorted_starts[lo:hi]

    def levels(self) -> list[np.ndarray]:
        """Return the ops by depth (roots first), each level in the tree's order."""
        if self._levels is None:
            depth = tree_depths(self.parent_arr)
            order = self.order_arr
            by_depth = order[np.argsort(depth[order], kind="stable")]
            counts = np.bincount(depth, minlength=1).tolist()
            cuts = np.cumsum([0, *counts]).tolist()
            self._levels = [by_depth[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        return self._levels


# ---------------------------------------------------------------- roofs


def _choose_roof(cost: OpCost, device: DeviceSpec, kernel_names: Iterable[str]) -> str | None:
    """Return the compute roof for an op: tensor-core roof for GEMM-class ops by dtype,
    the vector roof otherwise."""
    if device.kind == "cpu":
        return "fp64" if cost.dtype == "fp64" and device.fp64_flops_per_s else "fp32"
    if cost.category in MATMUL_CATEGORIES:
        if cost.dtype in ("bf16", "fp16") and device.peak_flops_per_s(cost.dtype):
            return cost.dtype
        if cost.dtype.startswith("fp8"):
            # No fp8 peaks in the table: the 16-bit tensor roof is the nearest lower bound.
            for roof in ("bf16", "fp16"):
                if device.peak_flops_per_s(roof):
                    return roof
        if cost.dtype == "fp32" and device.tf32_flops_per_s:
            # cuDNN convolutions default to TF32 (torch.backends.cudnn.allow_tf32); matmuls
            # only when enabled, which the kernel name then shows.
            if cost.category == "conv" or any("tf32" in k.lower() for k in kernel_names):
                return "tf32"
    if cost.dtype == "fp64" and device.fp64_flops_per_s:
        return "fp64"
    return "fp32" if device.fp32_flops_per_s else None


def _make_point(
    name: str,
    shapes: str,
    calls: int,
    flops: int,
    nbytes: int,
    time_us: float,
    cost: OpCost,
    device: DeviceSpec | None,
    roof: str | None,
    op_name: str,
) -> RooflinePoint:
    intensity = flops / nbytes if nbytes else None
    seconds = time_us * 1e-6
    achieved_f = flops / seconds if seconds > 0 else None
    achieved_b = nbytes / seconds if seconds > 0 else None
    peak = device.peak_flops_per_s(roof) if device is not None and roof else None
    bw = device.bandwidth_bytes_per_s if device is not None else None
    attainable = bound = fraction = None
    if peak and bw and intensity is not None:
        attainable = min(peak, intensity * bw)
        bound = "memory" if intensity * bw < peak else "compute"
        fraction = achieved_f / attainable if achieved_f is not None else None
    return RooflinePoint(
        name=name,
        shapes=shapes,
        calls=calls,
        flops=flops,
        bytes_moved=nbytes,
        intensity_flop_per_byte=intensity,
        time_us=time_us,
        achieved_flops_per_s=achieved_f,
        achieved_bytes_per_s=achieved_b,
        roof=roof if peak else None,
        peak_flops_per_s=peak,
        roof_flops_per_s=attainable,
        bound=bound,
        fraction_of_roof=fraction,
        above_roof=fraction is not None and fraction > 1.0,
        flop_source=cost.flop_source,
        bytes_model=cost.bytes_model,
        dtype=cost.dtype,
        category=cost.category,
        op_name=op_name,
    )


def _shapes(op: Op) -> str:
    """Return the tensor input shapes of an op as '788x768, 768x768'."""
    dims = op.input_dims or ()
    parts = []
    for d in dims:
        if isinstance(d, (list, tuple)) and d and all(isinstance(x, int) for x in d):
            parts.append("x".join(str(x) for x in d))
    return ", ".join(parts)


# Words that name a host processor, not a GPU: "cpu", "Intel(R) Xeon(R) ...", "AMD EPYC 7763",
# "AWS Graviton3" (a model number may follow the family name with no space).
_CPU_NAME = re.compile(
    r"\bcpu\b|\b(?:xeon|epyc|ryzen|threadripper|core i[3579]|graviton|neoverse|apple m\d)"
    r"|core\(tm\)",
    flags=re.IGNORECASE,
)


def _check_device_name(trace: Trace, device: str) -> None:
    """Raise ValueError when the device name and the trace are of different kinds: a name
    picks datasheet GPU ceilings, which would be drawn over CPU times on a CPU-only trace, and
    a CPU's name has no GPU ceilings for a trace whose times are kernel times."""
    if not trace.has_device_activity:
        spec = lookup_device_spec(device)
        what = (
            f"the GPU {spec.name} ({spec.kind})"
            if spec is not None
            else "a device name, which only selects datasheet GPU ceilings"
        )
        raise ValueError(
            f"compute_roofline: device={device!r} is {what}, but this is a CPU trace (no "
            "kernels: its times are CPU times). Leave device= out to get FLOPs, bytes and "
            "intensity without roofs, or pass CPU ceilings measured on this machine with "
            "gpuprof_nb.measure_ceilings(); for GPU roofs, profile the code on the GPU."
        )
    if _CPU_NAME.search(device) and lookup_device_spec(device) is None:
        gpus = ", ".join(d.name for d in trace.devices) or "a GPU the trace does not name"
        raise ValueError(
            f"compute_roofline: device={device!r} names a CPU, but this is a GPU trace "
            f"({len(trace.kernels)} device activities on {gpus}: its times are kernel times). "
            "Leave device= out to use the trace's GPU, or pass that GPU's name (e.g. "
            "'NVIDIA H100') or its ceilings from gpuprof_nb.measure_ceilings() run on it."
        )


def _resolve_device(trace: Trace, device: DeviceSpec | str | None) -> tuple[DeviceSpec | None, str]:
    """Return the ceilings to use and a sentence saying where they came from."""
    on_device = trace.has_device_activity
    if isinstance(device, DeviceSpec):
        if on_device and device.kind == "cpu" or not on_device and device.kind != "cpu":
            basis = "GPU" if on_device else "CPU"
            return None, (
                f"ceilings of {device.name} ({device.kind}) do not fit this {basis} "
                "trace; roofs left out"
            )
        origin = "measured" if device.measured else "datasheet"
        return device, f"ceilings: {device.name}, {origin} ({device.source})"
    if isinstance(device, str):
        _check_device_name(trace, device)
        spec = lookup_device_spec(device)
        if spec is None:
            return None, (
                f"unknown GPU {device!r}: no datasheet row and no measured ceilings; "
                "run gpuprof_nb.measure_ceilings() on it and pass the result"
            )
        return spec, f"ceilings: {spec.name}, datasheet ({spec.source})"
    if not on_device:
        launched = len(unrecorded_launches(trace))
        if launched:
            return None, (
                f"GPU kernels not recorded ({launched} calls queued GPU work, but "
                "the trace has no kernel events): no device times to place ops "
                "against the GPU's roofs; host-side FLOPs, bytes and intensity "
                "only. Record kernels (ProfilerActivity.CUDA) to get the roofline"
            )
        return None, (
            "CPU trace: FLOPs, bytes and intensity only; pass CPU ceilings from "
            "gpuprof_nb.measure_ceilings() to draw roofs"
        )
    if not trace.devices:
        return None, (
            "the trace names no device (no deviceProperties); pass device= a GPU "
            "name or gpuprof_nb.measure_ceilings()"
        )
    info = trace.devices[0]
    spec = lookup_device_spec(info.name, info.total_memory_bytes)
    if spec is None:
        return None, (
            f"unknown GPU {info.name!r}: no datasheet row and no measured ceilings; "
            "run gpuprof_nb.measure_ceilings() on it and pass the result"
        )
    return spec, f"ceilings: {spec.name}, datasheet ({spec.source})"


# ---------------------------------------------------------------- main entry


@dataclass
class _Acc:
    calls: int = 0
    flops: int = 0
    bytes_moved: int = 0
    time_us: float = 0.0


# Each costed anchor: its position in the op columns, its cost, its time (microseconds).
Anchor = tuple[int, OpCost | None, float]


def roofline_anchors(ix: TraceIndex) -> tuple[Anchor, ...]:
    """Return the ops the roofline costed (its anchors) as `compute_roofline` left them in
    the index: what MFU and the per-module bounds read (analysis/mfu.py,
    analysis/model_rules.py). Empty when the roofline was not computed on this index."""
    anchors: tuple[Anchor, ...] | None = ix.peek("roofline_anchors")
    return anchors or ()


def compute_roofline(trace: Trace | TraceIndex, device: DeviceSpec | str | None = None) -> Roofline:
    """Return the roofline of the trace: FLOPs (count), bytes, intensity (FLOP/byte),
    achieved FLOP/s and bytes/s per op group, against `device`'s ceilings (a DeviceSpec, a
    GPU name, or None: the trace's first deviceProperties entry via the datasheet table).
    Raises ValueError for a device name of the wrong kind: any name on a CPU-only trace, a
    CPU's name on a GPU trace."""
    ix = index_of(trace)
    trace = ix.trace
    spec, device_note = _resolve_device(trace, device)
    tree = _Tree(op_columns(ix))
    cost = _Costs(tree)
    costable = _costable(ix, len(tree.ops))
    anchor = _anchors(ix, tree, cost, costable)
    on_device = trace.has_device_activity
    if on_device:
        times = _device_times(ix, tree, anchor, cost, costable)
    else:
        times = _host_times(tree, anchor)
    anchor_time = times.anchor_time
    anchors = np.fromiter(anchor_time, dtype=np.intp, count=len(anchor_time))
    calls = cost.calls_of(anchors)
    costs = list(map(cost.call_cost.__getitem__, calls.tolist()))
    # Each costed anchor (its position in the op columns), its cost and time: what MFU and
    # the per-module bounds read (analysis/mfu.py, analysis/model_rules.py).
    memo(
        ix,
        "roofline_anchors",
        lambda: tuple(zip(anchors.tolist(), costs, anchor_time.values(), strict=True)),
    )
    groups = _group_anchors(ix, tree.ops, times, cost, anchors, calls)
    points, moves, kpoints = _group_points(groups, spec)

    def by_time(x: Any) -> tuple[float, str, str]:
        return (-x.time_us, x.name, x.shapes)

    points.sort(key=by_time)
    kpoints.sort(key=by_time)
    moves.sort(key=by_time)
    unmod = sorted(
        (Unmodelled(n, a.calls, a.time_us) for n, a in times.unmodelled.items()),
        key=lambda u: (-u.time_us, u.name),
    )
    has_dims = any(op_input_dims(ix))  # tree.ops are op_columns' ops
    note = _roofline_note(device_note, has_dims, points, moves, times.total_us, on_device)
    return Roofline(
        points=tuple(points),
        data_movement=tuple(moves),
        device=spec,
        note=note,
        kernel_points=tuple(kpoints),
        unmodelled=tuple(unmod),
        time_basis="device" if on_device else "cpu",
        total_time_us=times.total_us,
    )


_UNSET: Any = object()
_TYPES, _CONCRETE = attrgetter("input_types"), attrgetter("concrete_inputs")
_NAME = attrgetter("name")


class _Costs:
    """Each op's cost (an OpCost, or None), computed on first use: `costs(i)`.

    A training loop repeats the same calls step after step: an op's cost depends only on
    its name and recorded inputs, so each distinct call is costed once. The inputs are keyed
    by identity: the loader shares equal recorded inputs (one tuple for all equal shapes),
    so hashing them, nested tuples walked each time, would buy nothing; inputs equal but not
    shared are only costed once more each."""

    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.ops = tree.ops
        self.known: list[Any] = [_UNSET] * len(self.ops)  # each op's cost, once computed
        self.by_call: dict[tuple[Any, ...], Any] = {}
        # Ops numbered by call: ops of one number share one cost (`call_cost`); -1 for an op
        # not numbered yet. have_cost numbers the ops it asks about per distinct call,
        # `calls_of` any other op on its own: the anchors are then grouped per number.
        self.call_id = np.full(len(self.ops), -1, dtype=np.intp)
        self.call_cost: list[OpCost | None] = []

    def have_cost(self, ix: TraceIndex, ops: np.ndarray) -> np.ndarray:
        """Return, for each of `ops` (positions of ops that are not copy wrappers), whether
        it has a cost, as many calls of `self` would, with one op_cost per distinct call.
        The ops are grouped by their call key with array sorts rather than one dictionary
        lookup each: a trace holds thousands of calls of a few dozen kinds. Each group's
        cost is kept under its call key, so later calls of `self` find it."""
        n = len(ops)
        if not n:
            return np.zeros(0, dtype=bool)
        positions = ops.tolist()
        chosen = list(map(self.ops.__getitem__, positions))
        dims = op_input_dims(ix)
        # The call key's parts: the name's code and the recorded inputs' identities. A trace
        # recorded without shapes has None for all of them: no identity is then read.
        parts = [op_name_codes(ix)[1][ops]]
        for values in (
            list(map(dims.__getitem__, positions)),
            list(map(_TYPES, chosen)),
            list(map(_CONCRETE, chosen)),
        ):
            if values.count(None) < n:
                parts.insert(0, np.fromiter(map(id, values), dtype=np.int64, count=n))
        order = lex_order(parts)
        # The first op of each distinct key, in that order, and each op's key as a number.
        same = np.ones(n - 1, dtype=bool)
        for part in parts:
            p = part[order]
            same &= p[1:] == p[:-1]
        first = np.concatenate(([True], ~same))
        group = np.cumsum(first) - 1
        has = np.zeros(int(group[-1]) + 1, dtype=bool)
        base = len(self.call_cost)
        for g, k in enumerate(ops[order[first]].tolist()):
            op = self.ops[k]
            call = (op.name, id(op.input_dims), id(op.input_types), id(op.concrete_inputs))
            c = self.by_call.get(call, _UNSET)
            if c is _UNSET:
                c = self.by_call[call] = op_cost(op)
            has[g] = c is not None
            self.call_cost.append(c)
        self.call_id[ops[order]] = base + group
        out = np.empty(n, dtype=bool)
        out[order] = has[group]
        return out

    def calls_of(self, ops: np.ndarray) -> np.ndarray:
        """Return the call number of each of `ops` (positions), numbering on its own each
        op that have_cost did not ask about: its cost is `self`'s."""
        ids = self.call_id[ops]
        for r in np.flatnonzero(ids < 0).tolist():
            i = int(ops[r])
            c = self(i)
            if self.call_id[i] < 0:  # the same op may be asked twice
                self.call_id[i] = len(self.call_cost)
                self.call_cost.append(c)
            ids[r] = self.call_id[i]
        return ids  # type: ignore[no-any-return]

    def __call__(self, i: int) -> OpCost | None:
        c = self.known[i]
        if c is _UNSET:
            self.known[i] = None  # guards against cycles from malformed nesting
            op = self.ops[i]
            if op.name in COPY_WRAPPERS:
                c = op_cost(op)
                if c is None:
                    c = self._wrapper_cost(i)  # depends on the op's children, not its call
            else:
                call = (op.name, id(op.input_dims), id(op.input_types), id(op.concrete_inputs))
                c = self.by_call.get(call, _UNSET)
                if c is _UNSET:
                    c = self.by_call[call] = op_cost(op)
            self.known[i] = c
        return c  # type: ignore[no-any-return]

    def _wrapper_cost(self, i: int) -> OpCost | None:
        """A copy wrapper costs what its outermost costed descendants cost; nothing if
        none."""
        found: list[OpCost] = []
        tree = self.tree
        stack = list(tree.children_of(i))
        while stack:
            j = stack.pop()
            c = self(j)
            if c is not None:
                found.append(c)
            else:
                stack.extend(tree.children_of(j))
        if not found:
            return None
        return OpCost(
            sum(c.flops for c in found),
            sum(c.bytes_moved for c in found),
            found[0].category,
            found[0].dtype,
            found[0].flop_source,
            found[0].bytes_model + " (through its copy child)",
        )


def _costable(ix: TraceIndex, n_ops: int) -> np.ndarray:
    """Return, per op, whether it can have a cost: only names with a formula, or copy
    wrappers, can."""
    if not n_ops:
        return np.zeros(0, dtype=bool)
    distinct, name_codes = op_name_codes(ix)
    return np.array(  # type: ignore[no-any-return]
        [has_formula(name) or name in COPY_WRAPPERS for name in distinct], dtype=bool
    )[name_codes]


def _anchors(ix: TraceIndex, tree: _Tree, cost: _Costs, costable: np.ndarray) -> np.ndarray:
    """Return each op's anchor (an index into ops, -1 for none): its outermost
    ancestor-or-self with a cost. Level by level from the roots: an op inherits its parent's
    anchor, else is its own when it has a cost."""
    n = len(tree.ops)
    anchor = np.full(n, -1, dtype=np.intp)
    if not n:
        return anchor
    # Where an op may anchor (no ancestor has a cost), a copy wrapper is costed on its own
    # (its cost is its children's); the other ops of a level at once, per distinct call.
    names, name_code = op_name_codes(ix)
    wrapper = np.array([name in COPY_WRAPPERS for name in names], dtype=bool)[name_code]
    plain = costable & ~wrapper
    wrapper &= costable
    # A wrapper with no formula of its own and no costable op under it costs nothing (its
    # cost is its costed descendants'): only the others are walked.
    formula = np.array([has_formula(name) for name in names], dtype=bool)[name_code]
    walk = wrapper & (formula | _costable_below(tree, costable))
    for level in tree.levels():
        inherited = np.where(
            tree.parent_arr[level] >= 0, anchor[np.maximum(tree.parent_arr[level], 0)], -1
        )
        anchor[level] = inherited
        free = level[inherited < 0]
        asked = free[plain[free]]
        found = asked[cost.have_cost(ix, asked)]
        anchor[found] = found
        found_w = [i for i in free[walk[free]].tolist() if cost(i) is not None]
        anchor[found_w] = found_w
    return anchor


def _costable_below(tree: _Tree, costable: np.ndarray) -> np.ndarray:
    """Return, per op, whether some op under it (a descendant) is costable."""
    below = np.zeros(len(costable), dtype=bool)
    parent = tree.parent_arr
    for level in reversed(tree.levels()):  # the deepest first: a level's answers are final
        up = level[(parent[level] >= 0) & (costable[level] | below[level])]
        below[parent[up]] = True
    return below


@dataclass
class _Times:
    """Where the roofline's time went: per anchor, its time (microseconds) and, on a device
    trace, its kernels (`kernel_ix`: positions in trace.kernels in their order, `kernel_anchor`
    the anchor of each; both empty on a host trace); the time of no anchor by label; the
    whole time."""

    anchor_time: dict[int, float]
    unmodelled: dict[str, _Acc]
    total_us: float
    kernel_ix: np.ndarray
    kernel_anchor: np.ndarray


def _device_times(
    ix: TraceIndex, tree: _Tree, anchor: np.ndarray, cost: _Costs, costable: np.ndarray
) -> _Times:
    """Return the kernel time of each anchor, and of the kernels of no anchor by their
    owner's name (or kind)."""
    ops = tree.ops
    k_dur = kernel_columns(ix).dur
    total_us = sum(k_dur.tolist())
    owner = _kernel_owners(ix, tree)
    k_anchor = np.where(owner >= 0, anchor[np.maximum(owner, 0)], -1) if len(ops) else owner
    if len(ops):
        _gemm_points_only_gemms(ix, tree, owner, k_anchor, cost, costable)
    unmodelled = _unplaced_kernels(ix, owner, k_anchor, k_dur)
    # The others, per anchor (in anchor order): their time (bincount adds one by one in
    # kernel order, as `+=` in a loop).
    anchor_time: dict[int, float] = {}
    placed = np.flatnonzero(k_anchor >= 0)
    if len(placed):
        sums = np.bincount(k_anchor[placed], weights=k_dur[placed])
        heads = distinct(k_anchor[placed])
        anchor_time = dict(zip(heads.tolist(), sums[heads].tolist(), strict=True))
    return _Times(anchor_time, unmodelled, total_us, placed, k_anchor[placed])


def _unplaced_kernels(
    ix: TraceIndex, owner: np.ndarray, k_anchor: np.ndarray, k_dur: np.ndarray
) -> dict[str, _Acc]:
    """Return the kernels of no anchor, by their owner's name (or kind): counts and times
    per label (bincount adds the times one by one in kernel order, as `+=` in a loop)."""
    unmodelled: dict[str, _Acc] = {}
    missed = np.flatnonzero(k_anchor < 0)
    if not len(missed):
        return unmodelled
    device_work = ix.trace.kernels
    op_names_, name_code = op_name_codes(ix)
    label_of = {name: code for code, name in enumerate(op_names_)}
    missed_owner = owner[missed]
    label = np.where(
        missed_owner >= 0, name_code[np.maximum(missed_owner, 0)] if len(name_code) else -1, -1
    )
    for j in np.flatnonzero(missed_owner < 0).tolist():  # no op: by kind
        kind = f"({device_work[int(missed[j])].kind} without op)"
        label[j] = label_of.setdefault(kind, len(label_of))
    label_calls = np.bincount(label, minlength=len(label_of)).tolist()
    label_us = np.bincount(label, weights=k_dur[missed], minlength=len(label_of)).tolist()
    for name, code in label_of.items():
        if label_calls[code]:
            unmodelled[name] = _Acc(calls=label_calls[code], time_us=label_us[code])
    return unmodelled


def _host_times(tree: _Tree, anchor: np.ndarray) -> _Times:
    """Return, on a trace without device activity, each anchor's own (inclusive) CPU time,
    and the top-level ops with no anchor in or under them by name."""
    ops = tree.ops
    unmodelled: dict[str, _Acc] = {}
    anchor_of: list[int | None] = [None if a < 0 else a for a in anchor.tolist()]
    total_us = 0.0
    for i in tree.order:
        if tree.parent[i] is not None:
            continue
        total_us += ops[i].dur_us
        if anchor_of[i] is None and not _has_anchor_below(i, tree, anchor_of):
            acc = unmodelled.setdefault(ops[i].name, _Acc())
            acc.calls += 1
            acc.time_us += ops[i].dur_us
    anchor_time = {i: ops[i].dur_us for i, a in enumerate(anchor_of) if a == i}
    none = np.zeros(0, dtype=np.intp)
    return _Times(anchor_time, unmodelled, total_us, none, none)


# An op group: (op name, input shapes, dtype).
_GroupKey = tuple[str, str, str]


@dataclass
class _Groups:
    """The costed anchors summed per op group, and per (kernel, group) for anchors that
    launched exactly one kernel. `kernel_names(key)` gives the names of the kernels (not
    memcpys or memsets) the group's anchors launched, read only when a roof needs them."""

    acc: dict[_GroupKey, _Acc]
    cost: dict[_GroupKey, OpCost]
    kernel_names: Callable[[_GroupKey], Iterable[str]]
    host_copy: set[_GroupKey]
    kernels: dict[tuple[str, str, str, str], _Acc]


def _first_seen(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return, for an integer array, the position of each distinct value's first occurrence
    (in order of first appearance) and each value's number in that order."""
    n = len(values)
    if not n:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    order = np.argsort(values, kind="stable")
    s = values[order]
    start = np.empty(n, dtype=bool)
    start[0] = True
    np.not_equal(s[1:], s[:-1], out=start[1:])
    firsts = order[start]  # the stable sort keeps each value's first occurrence first
    rank = np.argsort(firsts)
    label = np.empty(len(rank), dtype=np.intp)
    label[rank] = np.arange(len(rank))
    codes = np.empty(n, dtype=np.intp)
    codes[order] = label[np.cumsum(start) - 1]
    return firsts[rank], codes


def _sum_costs(
    groups: np.ndarray, calls: np.ndarray, call_cost: list[Any], n: int
) -> tuple[list[Any], list[Any]]:
    """Return the FLOPs and bytes of the items summed per group (`groups[i]`, below `n`),
    item i costing `call_cost[calls[i]]`: as `+=` in item order would. With int counts
    (exact in any order) as count x cost per distinct (group, call); otherwise one by one."""
    flops: list[Any] = [0] * n
    nbytes: list[Any] = [0] * n
    width = len(call_cost) + 1
    firsts, _ = _first_seen(groups * width + calls)
    pairs = (groups[firsts] * width + calls[firsts]).tolist()
    costs = [call_cost[p % width] for p in pairs]
    if all(type(c.flops) is int and type(c.bytes_moved) is int for c in costs):
        counts = np.bincount(groups * width + calls).tolist()
        for p, c in zip(pairs, costs, strict=True):
            g = p // width
            flops[g] += counts[p] * c.flops
            nbytes[g] += counts[p] * c.bytes_moved
        return flops, nbytes
    for g, k in zip(groups.tolist(), calls.tolist(), strict=True):
        flops[g] += call_cost[k].flops
        nbytes[g] += call_cost[k].bytes_moved
    return flops, nbytes


def _group_anchors(
    ix: TraceIndex,
    ops: Sequence[Op],
    times: _Times,
    cost: _Costs,
    anchors: np.ndarray,
    calls: np.ndarray,
) -> _Groups:
    """Return the anchors with a cost and some time, summed per (name, shapes, dtype), in
    anchor order. `anchors` are times.anchor_time's, `calls` their call numbers (_Costs):
    anchors of one call share a group, so each call is keyed once."""
    acc: dict[_GroupKey, _Acc] = {}
    g = _Groups(acc, {}, lambda key: (), set(), {})
    call_cost = cost.call_cost
    t = np.fromiter(times.anchor_time.values(), dtype=float, count=len(anchors))
    if len(anchors) > 1 and bool(np.any(anchors[1:] < anchors[:-1])):
        by = np.argsort(anchors, kind="stable")
        anchors, calls, t = anchors[by], calls[by], t[by]
    priced = np.array([c is not None for c in call_cost], dtype=bool)
    keep = priced[calls] & ~(t <= 0) if len(calls) else np.zeros(0, dtype=bool)
    a_kept, c_kept, t_kept = anchors[keep], calls[keep], t[keep]
    if not len(a_kept):
        return g
    # Each call's group, in order of first appearance: the groups come out in anchor order.
    firsts, call_rank = _first_seen(c_kept)
    group_of_call = np.empty(len(firsts), dtype=np.intp)
    keys: dict[_GroupKey, int] = {}
    shapes_of: dict[Any, str] = {}  # recorded shapes repeat: each is written out once
    for r, (a, k) in enumerate(zip(a_kept[firsts].tolist(), c_kept[firsts].tolist(), strict=True)):
        op = ops[a]
        c = call_cost[k]
        try:
            shapes = shapes_of[op.input_dims]
        except KeyError:
            shapes = shapes_of[op.input_dims] = _shapes(op)
        except TypeError:  # unhashable shapes: written out each time
            shapes = _shapes(op)
        key = (op.name, shapes, c.dtype)
        if key not in keys:
            keys[key] = len(keys)
            g.cost[key] = c
        group_of_call[r] = keys[key]
    group = group_of_call[call_rank]
    n = len(keys)
    # bincount adds the times one by one in anchor order, as `+=` in a loop.
    calls_n = np.bincount(group, minlength=n).tolist()
    time_us = np.bincount(group, weights=t_kept, minlength=n).tolist()
    flops, nbytes = _sum_costs(group, c_kept, call_cost, n)
    key_list = list(keys)
    for i, key in enumerate(key_list):
        acc[key] = _Acc(calls_n[i], flops[i], nbytes[i], time_us[i])
    if not len(times.kernel_ix):
        return g
    # The kernels of the kept anchors, and each one's group.
    group_of_op = np.full(len(ops), -1, dtype=np.intp)
    group_of_op[a_kept] = group
    k_ix, k_anchor = times.kernel_ix, times.kernel_anchor
    k_group = group_of_op[k_anchor]
    kind = kernel_columns(ix).kind[k_ix]
    device_work = ix.trace.kernels
    for r in np.flatnonzero((k_group >= 0) & (kind == 1)).tolist():  # memcpys
        if _is_host_device(device_work[int(k_ix[r])].name):
            g.host_copy.add(key_list[int(k_group[r])])

    def kernel_names(key: _GroupKey) -> Iterator[str]:
        # A generator: the kernels are found only when a roof reads their names.
        for i in k_ix[(k_group == keys[key]) & (kind == 0)].tolist():
            yield device_work[i].name

    g.kernel_names = kernel_names
    # Anchors that launched exactly one kernel (not a memcpy or memset), per (kernel, group).
    launched = np.bincount(k_anchor, minlength=len(ops))
    only = np.full(len(ops), -1, dtype=np.intp)
    only[k_anchor] = k_ix  # the kernel of an anchor with one
    single = launched[a_kept] == 1
    s_kernel = only[a_kept[single]]
    is_kernel = kernel_columns(ix).kind[s_kernel] == 0
    s_kernel = s_kernel[is_kernel]
    if not len(s_kernel):
        return g
    s_group, s_call = group[single][is_kernel], c_kept[single][is_kernel]
    s_list = s_kernel.tolist()
    names, name_code = codes_of(map(_NAME, map(device_work.__getitem__, s_list)), len(s_list))
    k_firsts, k_code = _first_seen(name_code * n + s_group)
    m = len(k_firsts)
    k_calls = np.bincount(k_code, minlength=m).tolist()
    k_time = np.bincount(k_code, weights=kernel_columns(ix).dur[s_kernel], minlength=m).tolist()
    k_flops, k_bytes = _sum_costs(k_code, s_call, call_cost, m)
    for j, (nc, gi) in enumerate(
        zip(name_code[k_firsts].tolist(), s_group[k_firsts].tolist(), strict=True)
    ):
        kernel_key = (names[nc], *key_list[gi])
        g.kernels[kernel_key] = _Acc(k_calls[j], k_flops[j], k_bytes[j], k_time[j])
    return g


def _group_points(
    g: _Groups, spec: DeviceSpec | None
) -> tuple[list[RooflinePoint], list[DataMovement], list[RooflinePoint]]:
    """Return (points, data movements, kernel points) of the groups, unsorted: a group with
    no FLOPs is a data movement, the others points against their roof."""
    points: list[RooflinePoint] = []
    moves: list[DataMovement] = []
    group_roof: dict[_GroupKey, str | None] = {}
    for key, acc in g.acc.items():
        c = g.cost[key]
        if c.flops == 0:
            moves.append(_data_movement(key, acc, c, spec, key in g.host_copy))
            continue
        roof = _choose_roof(c, spec, g.kernel_names(key)) if spec is not None else None
        group_roof[key] = roof
        points.append(
            _make_point(
                key[0],
                key[1],
                acc.calls,
                acc.flops,
                acc.bytes_moved,
                acc.time_us,
                c,
                spec,
                roof,
                key[0],
            )
        )
    kpoints = [
        _make_point(
            kkey[0],
            kkey[2],
            acc.calls,
            acc.flops,
            acc.bytes_moved,
            acc.time_us,
            g.cost[kkey[1:]],
            spec,
            group_roof[kkey[1:]],
            kkey[1],
        )
        for kkey, acc in g.kernels.items()
        if kkey[1:] in group_roof
    ]
    return points, moves, kpoints


def _data_movement(
    key: _GroupKey, acc: _Acc, c: OpCost, spec: DeviceSpec | None, host: bool
) -> DataMovement:
    """Return a group with no FLOPs as a data movement; a copy between host and device is
    not held against the device's bandwidth."""
    bw = spec.bandwidth_bytes_per_s if spec is not None else None
    rate = acc.bytes_moved / (acc.time_us * 1e-6) if acc.time_us > 0 else None
    return DataMovement(
        name=key[0],
        shapes=key[1],
        calls=acc.calls,
        bytes_moved=acc.bytes_moved,
        time_us=acc.time_us,
        achieved_bytes_per_s=rate,
        fraction_of_bandwidth=rate / bw if rate is not None and bw and not host else None,
        bytes_model=c.bytes_model,
        dtype=c.dtype,
        category=c.category,
        direction="host-device" if host else "device",
    )


def _roofline_note(
    device_note: str,
    has_dims: bool,
    points: list[RooflinePoint],
    moves: list[DataMovement],
    total_us: float,
    on_device: bool,
) -> str:
    """Return the roofline's note: where the ceilings came from, what share of the time the
    formulas cover, and what may be wrong (`has_dims`: some op carries Input Dims)."""
    notes = [device_note]
    if not has_dims:
        notes.append("no op carries Input Dims: record with record_shapes=True to get FLOPs")
    if total_us:
        covered = (sum(p.time_us for p in points) + sum(d.time_us for d in moves)) / total_us
        basis = "device" if on_device else "CPU"
        notes.append(f"{covered * 100:.1f}% of {basis} time is in ops with a FLOP/byte formula")
    if any(p.above_roof for p in points):
        notes.append(
            "points above the roof: bytes overcounted for cache-resident data, "
            "or ceilings below the real ones"
        )
    return "; ".join(notes)


def _gemm_points_only_gemms(
    ix: TraceIndex,
    tree: _Tree,
    owner: np.ndarray,
    k_anchor: np.ndarray,
    cost: _Costs,
    costable: np.ndarray,
) -> None:
    """Give a matmul-family anchor (aten::matmul, aten::linear, a convolution) only the
    kernels of its GEMMs. The copies, contiguous calls, casts and bias adds it launched
    through such ops under it go to the outermost costed op between that is not itself a
    matmul (aten::copy_ as a data movement, aten::add_ as a memory-bound point), or to no
    anchor (unmodelled, by their op's name) when none is costed. `k_anchor` is updated in
    place. Without this a matmul's point ran at 1/3.7 of its GEMM kernel's rate on an H100
    trace: its time included the copies that made its inputs contiguous."""
    placed = np.flatnonzero((k_anchor >= 0) & (owner >= 0) & (owner != k_anchor))
    if not len(placed):
        return
    # Whether each anchor is of the matmul family: per call (_Costs), not per anchor.
    heads = distinct(k_anchor[placed])
    calls = cost.calls_of(heads)
    family = np.array(
        [c is not None and c.category in MATMUL_CATEGORIES for c in cost.call_cost], dtype=bool
    )
    matmul = np.zeros(len(tree.ops), dtype=bool)
    matmul[heads] = family[calls]
    # Only kernels of ops known to be something else move: copies (copy_, contiguous,
    # clone, to), casts and elementwise ops (the bias add). A library's own convolution or
    # matmul op (miopen_convolution, an accelerator's bmm), named or not, keeps its kernels.
    names, codes = op_name_codes(ix)
    other_name = np.array(
        [op_class(n) in ("elementwise", "cast") or n in COPY_WRAPPERS for n in names], dtype=bool
    )
    other_op = other_name[codes] if len(codes) else np.zeros(0, dtype=bool)
    parent = tree.parent_arr
    moving = placed[matmul[k_anchor[placed]] & other_op[owner[placed]]]
    for i, a, o in zip(
        moving.tolist(), k_anchor[moving].tolist(), owner[moving].tolist(), strict=True
    ):
        # The ops from the owner up to (not including) the anchor, innermost first.
        chain = []
        x = o
        while x >= 0 and x != a:
            chain.append(x)
            x = int(parent[x])
        if x != a:
            continue  # not under the anchor after all (malformed nesting): leave it
        # Not another matmul-family op on the way (aten::convolution under aten::conv2d):
        # that would price the copy as a GEMM.
        outer = [
            y
            for y in reversed(chain)
            if costable[y] and (c := cost(y)) is not None and c.category not in MATMUL_CATEGORIES
        ]
        k_anchor[i] = outer[0] if outer else -1


def _is_host_device(name: str) -> bool:
    """True for a memcpy between host and device ('Memcpy HtoD (Pageable -> Device)')."""
    return any(tag in name for tag in ("HtoD", "DtoH", "Host", "Pageable", "Pinned"))


def _has_anchor_below(i: int, tree: _Tree, anchor_of: list[int | None]) -> bool:
    stack = list(tree.children_of(i))
    while stack:
        j = stack.pop()
        if anchor_of[j] is not None:
            return True
        stack.extend(tree.children_of(j))
    return False


def _kernel_owners(trace: Trace | TraceIndex, tree: _Tree) -> np.ndarray:
    """Return, per kernel of trace.kernels, the index (in tree.ops) of the innermost op that
    launched it, -1 for none: by External id, else through the runtime call with the same
    correlation id."""
    ix = index_of(trace)
    op_ids, op_has = tree.cols.external_id, tree.cols.has_external_id
    # Several ops may share an id in old traces: keep the innermost (shortest; then the one
    # starting last; then the first in the file).
    pos = np.flatnonzero(op_has)
    order = lex_order((pos, -tree.start_arr[pos], tree.dur_arr[pos], op_ids[pos]), lead=1)
    ext_keys, ext_ops = op_ids[pos][order], pos[order]
    first = np.ones(len(ext_keys), dtype=bool)
    first[1:] = ext_keys[1:] != ext_keys[:-1]
    ext_keys, ext_ops = ext_keys[first], ext_ops[first]

    k_corr, k_has_corr, k_ext, k_has_ext = kernel_ids(ix)
    owner = np.where(k_has_ext, lookup(ext_keys, ext_ops, k_ext), -1)
    # Then the runtime call with the kernel's correlation id (the last one recorded with it).
    corr_keys, corr_calls = last_call_of(ix)
    need = np.flatnonzero((owner < 0) & k_has_corr)
    call = lookup(corr_keys, corr_calls, k_corr[need])
    need, call = need[call >= 0], call[call >= 0]
    r_ext, r_has_ext = runtime_external_ids(ix)
    c_ext, c_has_ext = r_ext[call], r_has_ext[call]
    by_call_id = np.where(c_has_ext, lookup(ext_keys, ext_ops, c_ext), -1)
    owner[need] = by_call_id
    # Calls with no op of their id: the innermost op open on their thread at their start.
    # Their threads keyed as the tree keys them (ids as text), each distinct pair once.
    unowned = by_call_id < 0
    pending, pending_calls = need[unowned], call[unowned]
    all_codes, pairs = runtime_threads(ix)
    codes = all_codes[pending_calls]
    key_codes: dict[tuple[str, str], list[int]] = {}
    for code in distinct(codes).tolist():
        pid, tid = pairs[code]
        key_codes.setdefault((str(pid), str(tid)), []).append(code)
    call_starts = runtime_starts(ix)[pending_calls]
    for key, in_key in key_codes.items():
        idx, starts = tree.thread(key)
        if not len(idx):
            continue
        mine = np.flatnonzero(np.isin(codes, in_key))
        t = call_starts[mine]
        at = np.searchsorted(starts, t + _EPS_US, side="right") - 1
        cur = np.where(at >= 0, idx[np.maximum(at, 0)], -1)
        # Up the ancestors while the op ended before the call.
        while True:
            live = np.flatnonzero(cur >= 0)
            live = live[tree.end_arr[cur[live]] + _EPS_US < t[live]]
            if not len(live):
                break
            cur[live] = tree.parent_arr[cur[live]]
        owner[pending[mine]] = cur
    return owner
