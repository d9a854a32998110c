"""Will it fit: memory by category at the peak, the peak at other batch sizes, and which
modules to checkpoint under a budget. Pure functions on MemorySnapshot and its step record
(model/step.py); numpy over the history's columns, no object per entry.

Roles. Every allocation the history holds, and every block live before it began, gets one
category (results/fit.CATEGORIES):
- storages the step record tagged (parameters and buffers, gradients, optimizer state) are
  what the tag says, for the allocation live at that address when the tag was taken;
- an untagged allocation made between a model's forward call and the moment backward
  reached that model's output, and still live then, is an activation (saved for backward,
  or an output backward needs); it belongs to the innermost module running when it was
  made (`(outside modules)`: the loss and other code between the calls);
- one made before a forward phase and live when it began is an input (the batch);
- every other allocation made during the recording is a temporary; a block live before
  recording that no tag names is "other".
Without a step record, the categories PyTorch's memory profiler gave the CPU fallback's
allocations are used instead (torch.profiler._memory_profiler), else everything is "other".

Batch size. With two recordings at two batch sizes (`fit_batch_size`), each allocation of
the first is matched to its counterpart in the second: same stack, same module path, same
rank among the allocations sharing both. A matched allocation's size is a line in the batch
size through its two sizes; the history of the recorded run replayed with those sizes gives
the level after every entry as a line in B, and the predicted peak is the highest. Blocks
the run freed that the run before it left behind (the last activations a variable still
held) are matched by address to that run's leftovers and grown like this run's own.
Allocations matched in one run only keep their size and widen the interval.

Checkpointing. Checkpointing a module frees the activations its forward allocated (its
output excepted: the next module keeps it) when the forward returns, and allocates them
again just before backward first frees one of them (the recomputation). The plan replays the
history with those changes, so the peak it reports is the new history's highest point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuprof_nb.analysis.memory import (
    _group,
    _Replay,
    _replay,
    choose_device,
    stack_sites,
)
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.step import StepRecord
from gpuprof_nb.results.fit import (
    CATEGORIES,
    BatchFit,
    CategoryBytes,
    CheckpointPlan,
    MemoryByCategory,
    ModuleBytes,
    PlanModule,
)
from gpuprof_nb.results.memory import Site

PARAMETERS, GRADIENTS, OPTIMIZER, INPUTS, ACTIVATIONS, TEMPORARIES, OTHER = range(7)
_TAG_CODE = {"parameter": PARAMETERS, "buffer": PARAMETERS, "gradient": GRADIENTS}
_TAG_CODE["optimizer_state"] = OPTIMIZER
# When two tags name one storage, the more specific wins: rank by category code.
_RANK_OF_CODE = np.zeros(7, dtype=np.int64)
_RANK_OF_CODE[[PARAMETERS, GRADIENTS, OPTIMIZER]] = (1, 2, 3)
_TORCH_CODE = {
    "parameter": PARAMETERS,
    "gradient": GRADIENTS,
    "optimizer_state": OPTIMIZER,
    "input": INPUTS,
    "activation": ACTIVATIONS,
    "temporary": TEMPORARIES,
    "autograd_detail": TEMPORARIES,
}
OUTSIDE = "(outside modules)"
# The CUDA caching allocator rounds every block up to a multiple of 512 bytes.
CUDA_ROUNDING = 512
# Headroom a plan leaves under the budget (see plan_checkpointing).
PLAN_MARGIN = 0.04


# ---------------------------------------------------------------------------------------
# Roles of the recorded allocations


@dataclass(frozen=True, slots=True, eq=False)
class _Roles:
    """One device's replay with the role of every allocation and pre-recording block."""

    rep: _Replay
    record: StepRecord | None
    category: np.ndarray  # per recorded allocation (rep order): category code
    owner: np.ndarray  # per recorded allocation: index into record.calls, -1: none
    before_category: np.ndarray  # per rep.before_end_blocks
    unmatched_category: np.ndarray  # per rep.unmatched_idx
    phases: tuple[tuple[int, int], ...]  # (start entry, backward entry) per forward phase
    method: str
    sites: tuple[Site, ...]


def _entry_of(rep: _Replay, record: StepRecord, positions: np.ndarray) -> np.ndarray:
    """Return the history index of each position's next allocation (n at the end)."""
    n_allocs = len(rep.alloc_idx)
    # A history that lost its oldest entries lost their allocations too.
    k = np.asarray(positions, dtype=np.int64) - max(record.allocations - n_allocs, 0)
    out = np.full(len(k), rep.n, dtype=np.int64)
    inside = (k >= 0) & (k < n_allocs)
    out[inside] = rep.alloc_idx[k[inside]]
    out[k < 0] = 0
    return out


def _previous_entry(rep: _Replay, record: StepRecord, positions: np.ndarray) -> np.ndarray:
    """Return the history index of each position's last allocation before it (-1: none)."""
    n_allocs = len(rep.alloc_idx)
    k = np.asarray(positions, dtype=np.int64) - max(record.allocations - n_allocs, 0) - 1
    out = np.full(len(k), -1, dtype=np.int64)
    inside = (k >= 0) & (k < n_allocs)
    out[inside] = rep.alloc_idx[k[inside]]
    out[k >= n_allocs] = rep.alloc_idx[-1] if n_allocs else -1
    return out


def _resolve_tags(rep: _Replay, record: StepRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the tag category code per recorded allocation, per pre-recording block live
    at the end and per unmatched free (-1: untagged)."""
    n_alloc = len(rep.alloc_idx)
    alloc_tag = np.full(n_alloc, -1, dtype=np.int64)
    before_tag = np.full(len(rep.before_end_blocks), -1, dtype=np.int64)
    unmatched_tag = np.full(len(rep.unmatched_idx), -1, dtype=np.int64)
    if not record.tags:
        return alloc_tag, before_tag, unmatched_tag
    t_addr = np.array([t.address for t in record.tags], dtype=np.int64)
    t_code = np.array([_TAG_CODE[t.category] for t in record.tags], dtype=np.int64)
    t_pos = np.array([t.at for t in record.tags], dtype=np.int64)
    t_entry = _entry_of(rep, record, t_pos)
    t_prev = _previous_entry(rep, record, t_pos)
    # The allocation live at a tag's address when it was taken is the last one made there
    # before the tag's position: sort allocations and tags together by (address, entry),
    # a tag before an allocation at the same entry, and carry the last allocation forward.
    n_tag = len(t_addr)
    addr = np.concatenate([rep.alloc_addr, t_addr])
    when = np.concatenate([rep.alloc_idx, t_entry])
    kind = np.concatenate([np.ones(n_alloc, np.int8), np.zeros(n_tag, np.int8)])
    order = np.lexsort((kind, when, addr))
    is_alloc = order < n_alloc
    last = np.where(is_alloc, np.arange(len(order)), -1)
    last = np.maximum.accumulate(last)
    tag_rows = np.flatnonzero(~is_alloc)
    found = last[tag_rows]
    tag_of_row = order[tag_rows] - n_alloc
    cand = np.full(n_tag, -1, dtype=np.int64)
    ok = found >= 0
    alloc_j = np.where(ok, order[np.maximum(found, 0)], -1)
    same_addr = ok & (rep.alloc_addr[np.maximum(alloc_j, 0)] == t_addr[tag_of_row])
    live = same_addr & (rep.close_idx[np.maximum(alloc_j, 0)] > t_prev[tag_of_row])
    cand[tag_of_row[live]] = alloc_j[live]
    rank = _RANK_OF_CODE[t_code]
    hit = cand >= 0
    _scatter_best(alloc_tag, cand[hit], t_code[hit], rank[hit])
    # Tags no recorded allocation explains name a block live since before recording: one
    # still live at the end, else the first block freed at that address, if the tag was
    # taken before that free.
    rest = np.flatnonzero(~hit)
    before_addr = np.array([blk[0] for blk in rep.before_end_blocks], dtype=np.int64)
    b_order = np.argsort(before_addr, kind="stable")
    b_sorted = before_addr[b_order]
    at = np.searchsorted(b_sorted, t_addr[rest])
    inside = at < len(b_sorted)
    is_before = np.zeros(len(rest), dtype=bool)
    is_before[inside] = b_sorted[at[inside]] == t_addr[rest][inside]
    _scatter_best(
        before_tag,
        b_order[at[is_before]],
        t_code[rest[is_before]],
        rank[rest[is_before]],
    )
    rest = rest[~is_before]
    u_addr, u_first = np.unique(rep.unmatched_addr, return_index=True)
    at = np.searchsorted(u_addr, t_addr[rest])
    inside = at < len(u_addr)
    same = np.zeros(len(rest), dtype=bool)
    same[inside] = u_addr[at[inside]] == t_addr[rest][inside]
    u = np.where(same, u_first[np.minimum(at, max(len(u_first) - 1, 0))], 0) if len(u_first) else at
    ok = same & (rep.unmatched_idx[u] > t_prev[rest]) if len(u_first) else same
    _scatter_best(unmatched_tag, u[ok], t_code[rest[ok]], rank[rest[ok]])
    return alloc_tag, before_tag, unmatched_tag


def _scatter_best(out: np.ndarray, index: np.ndarray, code: np.ndarray, rank: np.ndarray) -> None:
    """Write into out[index] the code of the highest rank among the tags at each index."""
    if not len(index):
        return
    order = np.lexsort((rank, index))
    idx = index[order]
    last = np.ones(len(idx), dtype=bool)
    last[:-1] = idx[1:] != idx[:-1]
    out[idx[last]] = code[order][last]


def _owners(rep: _Replay, record: StepRecord) -> np.ndarray:
    """Return, per recorded allocation, the innermost module call running when it was
    made (-1: none)."""
    owner = np.full(len(rep.alloc_idx), -1, dtype=np.int64)
    if not record.calls:
        return owner
    enter = _entry_of(rep, record, np.array([c.enter for c in record.calls]))
    exits = np.array([c.exit for c in record.calls], dtype=np.int64)
    leave = np.where(exits >= 0, _entry_of(rep, record, np.maximum(exits, 0)), rep.n)
    depth = np.array([c.depth for c in record.calls], dtype=np.int64)
    # The calls of one depth do not overlap and come in order: each allocation's call at
    # that depth is the last one that began at or before it, if it has not returned. Deeper
    # ones are written last.
    for d in np.unique(depth).tolist():
        mine = np.flatnonzero(depth == d)
        k = np.searchsorted(enter[mine], rep.alloc_idx, side="right") - 1
        ok = k >= 0
        call = mine[np.maximum(k, 0)]
        ok &= rep.alloc_idx < leave[call]
        owner[ok] = call[ok]
    return owner


def _phases(rep: _Replay, record: StepRecord) -> tuple[tuple[int, int], ...]:
    """Return (start, backward) history indices of each forward phase: root calls whose
    output backward reached, overlapping ones merged (a loss module called after the
    model), backward starting at the earliest of them."""
    roots = record.root_calls
    spans = []
    for k, i in enumerate(roots):
        if k < len(record.backward) and record.backward[k] >= 0:
            spans.append((record.calls[i].enter, record.backward[k]))
    if not spans:
        return ()
    start = _entry_of(rep, record, np.array([s[0] for s in spans]))
    back = _entry_of(rep, record, np.array([s[1] for s in spans]))
    merged: list[list[int]] = []
    for s, b in sorted(zip(start.tolist(), back.tolist(), strict=True)):
        if merged and s < merged[-1][1]:
            merged[-1][1] = min(merged[-1][1], b)
        else:
            merged.append([s, b])
    return tuple((s, b) for s, b in merged)


def _roles(snapshot: MemorySnapshot, device: int, *, categories: bool = True) -> _Roles:
    """The replay with every allocation's role; without `categories` only the owners
    (what matching two recordings needs), everything else "other"."""
    sites, site_of_stack = stack_sites(snapshot)
    rep = _replay(snapshot, device, site_of_stack)
    record = snapshot.step
    n_alloc = len(rep.alloc_idx)
    owner = np.full(n_alloc, -1, dtype=np.int64)
    if not categories:
        if record is not None:
            owner = _owners(rep, record)
        return _Roles(
            rep=rep,
            record=record,
            category=np.full(n_alloc, OTHER, dtype=np.int64),
            owner=owner,
            before_category=np.full(len(rep.before_end_blocks), OTHER, dtype=np.int64),
            unmatched_category=np.full(len(rep.unmatched_idx), OTHER, dtype=np.int64),
            phases=(),
            method="owners only",
            sites=sites,
        )
    if record is not None and (record.tags or record.calls):
        alloc_tag, before_cat, unmatched_cat = _resolve_tags(rep, record)
        owner = _owners(rep, record)
        phases = _phases(rep, record)
        category = np.full(n_alloc, TEMPORARIES, dtype=np.int64)
        if phases:
            # Phases are disjoint and in order: each allocation's is the last that began
            # at or before it.
            p_start = np.array([p[0] for p in phases], dtype=np.int64)
            p_back = np.array([p[1] for p in phases], dtype=np.int64)
            k = np.searchsorted(p_start, rep.alloc_idx, side="right") - 1
            inside = k >= 0
            back_of = np.where(inside, p_back[np.maximum(k, 0)], -1)
            made = inside & (rep.alloc_idx < back_of)
            category[made & (rep.close_idx >= back_of)] = ACTIVATIONS
            # Inputs: made before the next phase began and live when it did.
            nxt = k + 1
            has = nxt < len(p_start)
            start_of = np.where(has, p_start[np.minimum(nxt, len(p_start) - 1)], rep.n)
            is_input = has & (rep.close_idx > start_of) & (category != ACTIVATIONS)
            category[is_input] = INPUTS
        tagged = alloc_tag >= 0
        category[tagged] = alloc_tag[tagged]
        before_cat = np.where(before_cat >= 0, before_cat, OTHER)
        unmatched_cat = np.where(unmatched_cat >= 0, unmatched_cat, OTHER)
        method = "step record"
    else:
        record = None
        phases = ()
        names = snapshot.categories
        codes = np.array([_TORCH_CODE.get(c, -1) for c in names] + [-1], dtype=np.int64)
        known = codes[rep.alloc_category.astype(np.int64)]  # -1 indexes the trailing -1
        if (known >= 0).any():
            category = np.where(
                known >= 0, known, np.where(rep.close_idx < rep.n, TEMPORARIES, OTHER)
            )
            method = "PyTorch's memory profiler"
        else:
            category = np.full(n_alloc, OTHER, dtype=np.int64)
            method = "none"
        before_cat = np.full(len(rep.before_end_blocks), OTHER, dtype=np.int64)
        unmatched_cat = np.full(len(rep.unmatched_idx), OTHER, dtype=np.int64)
    return _Roles(
        rep=rep,
        record=record,
        category=category,
        owner=owner,
        before_category=before_cat,
        unmatched_category=unmatched_cat,
        phases=phases,
        method=method,
        sites=sites,
    )


# ---------------------------------------------------------------------------------------
# Memory by category


def _peak_index(rep: _Replay) -> int:
    """The entry after which the most memory was live (-1: before the first entry)."""
    if not rep.n:
        return -1
    start = int(rep.before_end_bytes + rep.unmatched_size.sum())
    top = int(np.argmax(rep.active))
    return -1 if start > rep.active[top] else top


def _live_at(roles: _Roles, point: int) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the recorded allocations and of the unmatched frees live after entry
    `point` (every block live at the end is live throughout)."""
    rep = roles.rep
    live = (rep.alloc_idx <= point) & (rep.close_idx > point)
    return live, rep.unmatched_idx > point


def _module_label(record: StepRecord | None, call: int) -> tuple[str, str]:
    if record is None or call < 0:
        return OUTSIDE, ""
    c = record.calls[call]
    if c.path:
        return c.path, c.type_name
    root = record.roots[c.root]
    return f"{root.name or '(model)'} (its own forward)", c.type_name


def memory_by_category(
    snapshot: MemorySnapshot, *, device: int | None = None, peak_index: int | None = None
) -> MemoryByCategory | None:
    """Return the peak split into categories (they add up to the active bytes at the peak),
    the allocator's overhead above it, and the activations by module and by site; None
    when nothing in the snapshot tells tensors apart (a CUDA snapshot without a step
    record). `peak_index`: the history entry to split (default: the highest)."""
    if device is None:
        device = choose_device(snapshot)
    roles = _roles(snapshot, device)
    if roles.method == "none":
        return None
    return _by_category(roles, peak_index)


def _by_category(roles: _Roles, peak_index: int | None) -> MemoryByCategory:
    rep = roles.rep
    point = _peak_index(rep) if peak_index is None else peak_index
    live, unfreed = _live_at(roles, point)
    before_sizes = np.array([b[1] for b in rep.before_end_blocks], dtype=np.int64)
    cats = np.concatenate(
        [roles.category[live], roles.before_category, roles.unmatched_category[unfreed]]
    ).astype(np.int64)
    sizes = np.concatenate(
        [rep.alloc_size[live], before_sizes, rep.unmatched_size[unfreed]]
    ).astype(np.int64)
    per = np.bincount(cats, weights=sizes, minlength=len(CATEGORIES)).astype(np.int64)
    count = np.bincount(cats, minlength=len(CATEGORIES))
    total = int(sizes.sum())
    rows = tuple(
        CategoryBytes(name, int(per[k]), int(count[k]), float(per[k]) / total if total else 0.0)
        for k, name in enumerate(CATEGORIES)
    )
    overhead = None
    if rep.reserved is not None and rep.n:
        at = max(point, 0)
        overhead = max(int(rep.reserved[at]) - int(rep.active[at]) if point >= 0 else 0, 0)
    act = live & (roles.category == ACTIVATIONS)
    act_total = int(rep.alloc_size[act].sum())
    by_module: dict[tuple[str, str], list[int]] = {}
    for j, size in zip(np.flatnonzero(act).tolist(), rep.alloc_size[act].tolist(), strict=True):
        key = _module_label(roles.record, int(roles.owner[j]))
        row = by_module.setdefault(key, [0, 0])
        row[0] += size
        row[1] += 1
    modules = tuple(
        ModuleBytes(p, t, b, n, b / act_total if act_total else 0.0)
        for (p, t), (b, n) in sorted(by_module.items(), key=lambda kv: (-kv[1][0], kv[0][0]))
    )
    by_site = _group(
        roles.sites,
        rep.alloc_site[act].astype(np.int64),
        rep.alloc_size[act].astype(np.int64),
        [""] * int(act.sum()),
        act_total,
    )
    notes = []
    if roles.method == "PyTorch's memory profiler":
        notes.append(
            "No step record (modules and optimizer steps): categories are the ones PyTorch's "
            "memory profiler gave the allocations; blocks live before the cell are 'other'."
        )
    x = float(rep.x[max(point, 0)]) if rep.n else 0.0
    return MemoryByCategory(
        peak_bytes=total,
        peak_x=x,
        time_unit=rep.time_unit,
        categories=rows,
        allocator_overhead_bytes=overhead,
        activations_by_module=modules[:30],
        activations_by_site=by_site,
        method=roles.method,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------
# Lines in the batch size


def _candidates(levels_fixed: np.ndarray, levels_scaling: np.ndarray) -> np.ndarray:
    """Return the indices of the lines that can be highest for some B >= 0: the upper
    right of (scaling, fixed), each point not beaten on both."""
    # Ties in scaling may keep a dominated line too: a few more candidates, never fewer.
    order = np.argsort(-levels_scaling, kind="stable")
    best = np.maximum.accumulate(levels_fixed[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = levels_fixed[order][1:] > best[:-1]
    return np.sort(order[keep])


def _levels(
    rep: _Replay,
    alloc_parts: Sequence[np.ndarray],
    unmatched_parts: Sequence[np.ndarray],
    before_parts: Sequence[np.ndarray],
) -> list[np.ndarray]:
    """Replay the history with per-allocation quantities: return, per quantity, its level
    before the first entry followed by the level after each entry."""
    out = []
    n = rep.n
    closed = rep.close_idx < n
    for a, u, b in zip(alloc_parts, unmatched_parts, before_parts, strict=True):
        # bincount sums repeated indices (the last entry may close several blocks).
        delta = np.bincount(rep.alloc_idx, weights=a, minlength=n)[:n]
        delta -= np.bincount(rep.close_idx[closed], weights=a[closed], minlength=n)[:n]
        delta -= np.bincount(rep.unmatched_idx, weights=u, minlength=n)[:n]
        start = float(b.sum() + u.sum())
        out.append(np.concatenate(([start], start + np.cumsum(delta))))
    return out


def _stack_keys(snapshot: MemorySnapshot, table: dict[tuple[object, ...], int]) -> np.ndarray:
    """Return a key per stack index (+1 for 'none'), equal for equal frames across
    snapshots."""
    keys = np.zeros(len(snapshot.stacks) + 1, dtype=np.int64)
    keys[0] = table.setdefault((), len(table))
    for i, stack in enumerate(snapshot.stacks):
        frames = []
        for j in stack:
            f = snapshot.frames[j]
            # Frames from the recording on out are whoever ran it, which may differ
            # between the two recordings (another line of a script).
            if "gpuprof_nb/capture/" in f.filename.replace("\\", "/"):
                break
            frames.append((f.filename, f.line, f.name))
        keys[i + 1] = table.setdefault(tuple(frames), len(table))
    return keys


def _alloc_keys(
    snapshot: MemorySnapshot,
    roles: _Roles,
    device: int,
    stacks: dict[tuple[object, ...], int],
    paths: dict[str, int],
) -> np.ndarray:
    trace = snapshot.trace(device)
    stack_key = _stack_keys(snapshot, stacks)
    stack = trace.stack[roles.rep.alloc_idx] if trace is not None else np.zeros(0, np.int32)
    key = stack_key[stack.astype(np.int64) + 1]
    if roles.record is not None and roles.record.calls:
        call_path = np.array(
            [paths.setdefault(c.path, len(paths)) for c in roles.record.calls] + [-1],
            dtype=np.int64,
        )
        path = call_path[roles.owner]  # -1 indexes the trailing -1
    else:
        path = np.full(len(key), -1, dtype=np.int64)
    out: np.ndarray = key * 1_000_003 + (path + 1)
    return out


def _ranked(keys: np.ndarray) -> np.ndarray:
    """Return key * 2**22 + (rank of each element among the equal keys before it)."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    first = np.ones(len(k), dtype=bool)
    first[1:] = k[1:] != k[:-1]
    starts = np.flatnonzero(first)
    rank = np.arange(len(k)) - np.repeat(starts, np.diff(np.append(starts, len(k))))
    out = np.empty(len(k), dtype=np.int64)
    out[order] = (k % (2**40)) * (2**22) + rank
    return out


def _match(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return, per element of a, the index of the equal element of b (-1: none)."""
    out = np.full(len(a), -1, dtype=np.int64)
    _, ia, ib = np.intersect1d(a, b, assume_unique=True, return_indices=True)
    out[ia] = ib
    return out


def _fit_from_parts(
    roles: _Roles,
    *,
    fixed: Sequence[np.ndarray],
    scaling: Sequence[np.ndarray],
    uncertain: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the candidate lines (fixed, scaling, uncertain bytes) of a replay."""
    rep = roles.rep
    lf, ls, lu = (_levels(rep, [p[0]], [p[1]], [p[2]])[0] for p in (fixed, scaling, uncertain))
    # The peak of any positive sizes is right after an allocation that a free (or the end)
    # follows, or before the first entry.
    if rep.n:
        is_alloc = np.zeros(rep.n, dtype=bool)
        is_alloc[rep.alloc_idx] = True
        top = np.ones(rep.n, dtype=bool)
        top[:-1] = ~is_alloc[1:]
        points = np.concatenate(([0], np.flatnonzero(top) + 1))
    else:
        points = np.array([0])
    keep = points[_candidates(lf[points], ls[points])]
    return lf[keep], ls[keep], lu[keep]


def _rounding(roles: _Roles, snapshot: MemorySnapshot) -> int:
    if snapshot.source == "cpu-profiler":
        return 0
    rep = roles.rep
    live, unfreed = _live_at(roles, _peak_index(rep))
    blocks = int(live.sum() + unfreed.sum()) + len(rep.before_end_blocks)
    return blocks * CUDA_ROUNDING


def _overhead(roles: _Roles) -> int:
    rep = roles.rep
    point = _peak_index(rep)
    if rep.reserved is None or not rep.n or point < 0:
        return 0
    return max(int(rep.reserved[point]) - int(rep.active[point]), 0)


def _measured_peak(rep: _Replay) -> int:
    start = int(rep.before_end_bytes + rep.unmatched_size.sum())
    return max(int(rep.active.max()) if rep.n else start, start)


def fit_from_categories(
    snapshot: MemorySnapshot, *, device: int | None = None, batch_size: int | None = None
) -> BatchFit | None:
    """Return a BatchFit from one recording: activations, inputs and the temporaries of
    forward and backward (outside optimizer steps) assumed to grow in proportion to the
    batch, the rest fixed; the temporaries' growth is the interval. None when nothing
    tells tensors apart."""
    if device is None:
        device = choose_device(snapshot)
    roles = _roles(snapshot, device)
    if roles.method == "none":
        return None
    return _category_fit(roles, snapshot, batch_size)


def _in_optimizer_steps(roles: _Roles) -> np.ndarray:
    rep = roles.rep
    inside = np.zeros(len(rep.alloc_idx), dtype=bool)
    record = roles.record
    if record is None or not record.optimizer_steps:
        return inside
    for start, end in record.optimizer_steps:
        a, b = _entry_of(rep, record, np.array([start, end if end >= 0 else start]))
        b = b if end >= 0 else rep.n
        inside |= (rep.alloc_idx >= a) & (rep.alloc_idx < b)
    return inside


def _category_fit(roles: _Roles, snapshot: MemorySnapshot, batch_size: int | None) -> BatchFit:
    rep = roles.rep
    size = rep.alloc_size.astype(np.float64)
    cat = roles.category
    grows = (cat == ACTIVATIONS) | (cat == INPUTS)
    temp = (cat == TEMPORARIES) & ~_in_optimizer_steps(roles)
    scaling = np.where(grows | temp, size, 0.0)
    fixed = size - scaling
    uncertain = np.where(temp, size, 0.0)
    un = rep.unmatched_size.astype(np.float64)
    before = np.array([b[1] for b in rep.before_end_blocks], dtype=np.float64)
    zeros_u, zeros_b = np.zeros(len(un)), np.zeros(len(before))
    lf, ls, lu = _fit_from_parts(
        roles,
        fixed=(fixed, un, before),
        scaling=(scaling, zeros_u, zeros_b),
        uncertain=(uncertain, zeros_u, zeros_b),
    )
    return BatchFit(
        method="categories",
        batch_size=batch_size,
        other_batch_size=None,
        variable=roles.record.batch_variable if roles.record else "",
        fixed_bytes=lf,
        scaling_bytes=ls,
        uncertain_bytes=lu,
        measured_peak_bytes=_measured_peak(rep),
        other_measured_peak_bytes=None,
        relative_error=0.0,
        overhead_bytes=_overhead(roles),
        rounding_bytes=_rounding(roles, snapshot),
        matched_share=0.0,
        alloc_scaling=scaling,
        unmatched_fixed=un,
        unmatched_scaling=zeros_u,
        notes=(
            "Predicted from one recording: which parts grow with the batch is assumed from "
            "their categories, not measured.",
        ),
    )


def fit_batch_size(
    snapshot: MemorySnapshot,
    batch_size: int,
    other: MemorySnapshot,
    other_batch_size: int,
    *,
    device: int | None = None,
    variable: str = "",
) -> BatchFit:
    """Return the BatchFit measured from two recordings of the same cell at two batch
    sizes (`other` recorded just before `snapshot` lets the blocks it left behind be
    matched too). Raises GpuprofError when the batch sizes are equal or not positive."""
    for name, b in (("batch_size", batch_size), ("other_batch_size", other_batch_size)):
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise GpuprofError(f"{name} must be a whole number >= 1, got {b!r}")
    if batch_size == other_batch_size:
        raise GpuprofError(
            f"the two recordings have the same batch size ({batch_size}): nothing tells "
            "what grows with it; record the second at another size"
        )
    if device is None:
        device = choose_device(snapshot)
    other_device = device if device in other.devices else choose_device(other)
    main = _roles(snapshot, device)
    prev = _roles(other, other_device, categories=False)
    stacks: dict[tuple[object, ...], int] = {}
    paths: dict[str, int] = {}
    key_main = _alloc_keys(snapshot, main, device, stacks, paths)
    key_prev = _alloc_keys(other, prev, other_device, stacks, paths)
    code_main, code_prev = _ranked(key_main), _ranked(key_prev)
    partner = _match(code_main, code_prev)
    rep, rep_o = main.rep, prev.rep
    size = rep.alloc_size.astype(np.float64)
    matched = partner >= 0
    size_o = np.where(matched, rep_o.alloc_size[np.maximum(partner, 0)], size).astype(np.float64)
    # Bytes per sample times the recorded batch: the part that scales with B / batch_size.
    per_sample = (size - size_o) / (batch_size - other_batch_size)
    scaling = per_sample * batch_size
    fixed = size - scaling
    uncertain = np.where(matched, 0.0, size)

    # Blocks freed during this run that the other run left behind: grown like the leftover
    # of the same allocation at the end of this run.
    un_size = rep.unmatched_size.astype(np.float64)
    un_fixed, un_scaling = un_size.copy(), np.zeros(len(un_size))
    un_uncertain = un_size.copy()
    left_o = np.flatnonzero(rep_o.close_idx >= rep_o.n)
    left_m = np.flatnonzero(rep.close_idx >= rep.n)
    if len(left_o) and len(left_m) and len(un_size):
        by_addr = {
            a: j for a, j in zip(rep_o.alloc_addr[left_o].tolist(), left_o.tolist(), strict=True)
        }
        left_code_o = dict(zip(left_o.tolist(), _ranked(key_prev[left_o]).tolist(), strict=True))
        left_code_m = dict(zip(_ranked(key_main[left_m]).tolist(), left_m.tolist(), strict=True))
        for u, a in enumerate(rep.unmatched_addr.tolist()):
            j = by_addr.get(a)
            if j is None:
                continue
            m = left_code_m.get(left_code_o[j])
            if m is None:
                continue
            s_m, s_o = float(rep.alloc_size[m]), float(rep_o.alloc_size[j])
            slope = (s_m - s_o) / (batch_size - other_batch_size)
            un_scaling[u] = slope * batch_size
            un_fixed[u] = s_m - un_scaling[u]
            # Predicted at its size in a steady run at B; right after a run at the recorded
            # size it is that size instead: the difference is this times |B/b - 1|.
            un_uncertain[u] = abs(un_scaling[u])
    before = np.array([b[1] for b in rep.before_end_blocks], dtype=np.float64)
    zeros_b = np.zeros(len(before))
    lf, ls, lu = _fit_from_parts(
        main,
        fixed=(fixed, un_fixed, before),
        scaling=(scaling, un_scaling, zeros_b),
        uncertain=(uncertain, un_uncertain, zeros_b),
    )
    measured_o = _measured_peak(rep_o)
    x_o = other_batch_size / batch_size
    predicted_o = float((lf + ls * x_o).max())
    error = abs(predicted_o - measured_o) / measured_o if measured_o else 0.0
    total = float(size.sum())
    share = float(size[matched].sum()) / total if total else 1.0
    notes = []
    if share < 0.95:
        notes.append(
            f"Only {share * 100:.0f}% of the allocated bytes were matched between the two "
            "runs (the cell did different work at the two batch sizes?): the rest keeps "
            "its recorded size, and the interval says how much that could matter."
        )
    if (size == size_o)[matched].all() and matched.any():
        notes.append(
            f"Every matched allocation had the same size at {other_batch_size} as at "
            f"{batch_size}: the cell does not seem to read {variable or 'the batch size'} "
            "(define the batch from it, e.g. x = torch.randn(batch_size, ...))."
        )
    return BatchFit(
        method="two runs",
        batch_size=int(batch_size),
        other_batch_size=int(other_batch_size),
        variable=variable,
        fixed_bytes=lf,
        scaling_bytes=ls,
        uncertain_bytes=lu,
        measured_peak_bytes=_measured_peak(rep),
        other_measured_peak_bytes=measured_o,
        relative_error=error,
        overhead_bytes=_overhead(main),
        rounding_bytes=_rounding(main, snapshot),
        matched_share=share,
        alloc_scaling=scaling,
        unmatched_fixed=un_fixed,
        unmatched_scaling=un_scaling,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------
# Budgets


# ---------------------------------------------------------------------------------------
# Checkpointing plan


@dataclass(frozen=True, slots=True, eq=False)
class _Candidate:
    """A module path the plan may checkpoint; per call of it: the history index where its
    forward returned, where backward first frees what it kept (the recomputation point),
    the allocations it kept, and the transient of recomputing it (its temporaries' peak
    and its output)."""

    path: str
    type_name: str
    calls: tuple[int, ...]
    leave: tuple[int, ...]
    recompute_at: tuple[int, ...]
    saved: tuple[np.ndarray, ...]
    transient: tuple[np.ndarray, ...]  # allocations made and freed inside each call
    outputs: tuple[np.ndarray, ...]
    recompute_us: float

    def saved_bytes(self, sizes: np.ndarray) -> float:
        return float(sum(sizes[s].sum() for s in self.saved))


def _call_tree(record: StepRecord) -> np.ndarray:
    """Return each call's parent call (-1 for a root call)."""
    parent = np.full(len(record.calls), -1, dtype=np.int64)
    open_calls: list[int] = []
    for i, c in enumerate(record.calls):
        while open_calls and record.calls[open_calls[-1]].depth >= c.depth:
            open_calls.pop()
        parent[i] = open_calls[-1] if open_calls and c.depth > 0 else -1
        open_calls.append(i)
    return parent


def _plan_candidates(roles: _Roles) -> list[_Candidate]:
    rep, record = roles.rep, roles.record
    if record is None or not roles.phases or not record.calls:
        return []
    calls = record.calls
    exits = np.array([c.exit for c in calls], dtype=np.int64)
    leave = np.where(exits >= 0, _entry_of(rep, record, np.maximum(exits, 0)), rep.n)
    parent = _call_tree(record)
    under: dict[int, list[int]] = {}
    for j in range(len(rep.alloc_idx)):
        c = int(roles.owner[j])
        while c >= 0:
            under.setdefault(c, []).append(j)
            c = int(parent[c])
    by_path: dict[str, list[int]] = {}
    for i, call in enumerate(calls):
        if call.depth > 0 and call.exit >= 0 and call.path and not call.path.startswith("<"):
            by_path.setdefault(call.path, []).append(i)
    out = []
    for path, idx in sorted(by_path.items()):
        saved, temps, outs, leaves, at = [], [], [], [], []
        us = 0.0
        for i in idx:
            mine = np.array(under.get(i, ()), dtype=np.int64)
            outputs = {a for a, _ in calls[i].outputs}
            is_out = np.array([a in outputs for a in rep.alloc_addr[mine].tolist()], dtype=bool)
            kept = (rep.close_idx[mine] > leave[i]) & ~is_out
            keep = mine[kept & (roles.category[mine] == ACTIVATIONS)]
            if not len(keep):
                continue
            saved.append(keep)
            temps.append(mine[rep.close_idx[mine] <= leave[i]])
            outs.append(mine[is_out & (rep.close_idx[mine] > leave[i])])
            leaves.append(int(min(leave[i], max(rep.n - 1, 0))))
            at.append(max(int(rep.close_idx[keep].min()) - 1, leaves[-1]))
            us += calls[i].forward_us if math.isfinite(calls[i].forward_us) else 0.0
        if saved:
            out.append(
                _Candidate(
                    path=path,
                    type_name=calls[idx[0]].type_name,
                    calls=tuple(idx),
                    leave=tuple(leaves),
                    recompute_at=tuple(at),
                    saved=tuple(saved),
                    transient=tuple(temps),
                    outputs=tuple(outs),
                    recompute_us=us,
                )
            )
    return out


def _temporaries_peak(rep: _Replay, sizes: np.ndarray, temps: np.ndarray) -> float:
    """The most bytes of `temps` (allocations made and freed inside one call) live at once."""
    if not len(temps):
        return 0.0
    points = np.concatenate([rep.alloc_idx[temps], rep.close_idx[temps]])
    signs = np.concatenate([sizes[temps], -sizes[temps]])
    order = np.lexsort((signs, points))  # frees before allocations at one entry
    return float(max(np.cumsum(signs[order]).max(), 0.0))


@dataclass(frozen=True, slots=True, eq=False)
class _Base:
    """The history's deltas at given sizes, before any checkpointing."""

    delta: np.ndarray
    start: float


def _base(roles: _Roles, sizes: np.ndarray, unmatched: np.ndarray, before: float) -> _Base:
    rep = roles.rep
    n = rep.n
    delta = np.zeros(max(n, 1), dtype=np.float64)
    np.add.at(delta, rep.alloc_idx, sizes)
    shut = rep.close_idx < n
    np.subtract.at(delta, rep.close_idx[shut], sizes[shut])
    np.subtract.at(delta, rep.unmatched_idx, unmatched)
    return _Base(delta, before + float(unmatched.sum()))


def _simulate(base: _Base, sizes: np.ndarray, rep: _Replay, chosen: Sequence[_Candidate]) -> float:
    """Return the peak of the history replayed with `chosen` checkpointed: what each call
    kept is freed when its forward returns and allocated again at the recomputation point
    (with the call's temporaries and output for that moment), then freed as before."""
    delta = base.delta.copy()
    n = len(delta)
    for cand in chosen:
        for k in range(len(cand.saved)):
            kept = float(sizes[cand.saved[k]].sum())
            leave, at = cand.leave[k], cand.recompute_at[k]
            delta[leave] -= kept
            spike = _temporaries_peak(rep, sizes, cand.transient[k]) + float(
                sizes[cand.outputs[k]].sum()
            )
            delta[at] += kept + spike
            if at + 1 < n:
                delta[at + 1] -= spike
    levels = base.start + np.cumsum(delta)
    return float(max(base.start, levels.max()))


def _knapsack(
    cands: Sequence[_Candidate], gains: Sequence[float], need: float, steps: int = 256
) -> list[int] | None:
    """Return the candidates (no one inside another) with the least recompute time whose
    gains add up to at least `need` bytes; None when even all of them fall short.

    Exact dynamic programme over the module tree, on gains floored to 1/steps of `need`
    (so a chosen set never claims more than it saves)."""
    if need <= 0:
        return []
    unit = need / steps
    weight = [min(steps, int(g // unit)) for g in gains]
    cost = [c.recompute_us for c in cands]
    # The tree: a candidate's parent is the nearest one whose path is a prefix of its own.
    paths = [c.path for c in cands]
    parent = [-1] * len(cands)
    for i, p in enumerate(paths):
        best = -1
        for j, q in enumerate(paths):
            if j != i and p.startswith(q + ".") and (best < 0 or len(q) > len(paths[best])):
                best = j
        parent[i] = best
    kids: dict[int, list[int]] = {}
    for i, up in enumerate(parent):
        kids.setdefault(up, []).append(i)
    inf = math.inf
    choice: dict[int, tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]] = {}

    def merge(f: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        total = f[:, None] + g[None, :]
        reach = np.minimum(np.add.outer(np.arange(steps + 1), np.arange(steps + 1)), steps)
        flat, where = total.ravel(), reach.ravel()
        order = np.lexsort((flat, where))
        first = np.ones(len(order), dtype=bool)
        first[1:] = where[order][1:] != where[order][:-1]
        best = np.full(steps + 1, inf)
        arg = np.zeros(steps + 1, dtype=np.int64)
        best[where[order][first]] = flat[order][first]
        arg[where[order][first]] = order[first]
        # "At least k": the best of every reach >= k.
        out = np.full(steps + 1, inf)
        out_arg = np.zeros(steps + 1, dtype=np.int64)
        run, run_arg = inf, 0
        for k in range(steps, -1, -1):
            if best[k] < run:
                run, run_arg = best[k], arg[k]
            out[k], out_arg[k] = run, run_arg
        return out, out_arg // (steps + 1), out_arg % (steps + 1)

    def solve(v: int) -> np.ndarray:
        acc = np.full(steps + 1, inf)
        acc[0] = 0.0
        trail: list[tuple[int, np.ndarray, np.ndarray]] = []
        for c in kids.get(v, []):
            acc, left, right = merge(acc, solve(c))
            trail.append((c, left, right))
        take = np.full(steps + 1, False)
        if v >= 0:
            own = np.full(steps + 1, inf)
            own[: weight[v] + 1] = cost[v]
            take = own < acc
            acc = np.where(take, own, acc)
        choice[v] = (take, trail)
        return acc

    result = solve(-1)
    if not math.isfinite(result[steps]):
        return None
    chosen: list[int] = []

    def back(v: int, k: int) -> None:
        take, trail = choice[v]
        if v >= 0 and take[k]:
            chosen.append(v)
            return
        for c, left, right in reversed(trail):
            back(c, int(right[k]))
            k = int(left[k])

    back(-1, steps)
    return sorted(chosen)


def plan_code(root: str, paths: Sequence[str]) -> str:
    """Return the code that checkpoints `paths` of the model bound to `root`."""
    names = ",\n    ".join(repr(p) for p in paths)
    return (
        "import functools\n"
        "from torch.utils.checkpoint import checkpoint\n"
        "\n"
        "def checkpointed(module):\n"
        '    """Recompute this module\'s activations in backward instead of keeping them."""\n'
        "    forward = module.forward\n"
        "\n"
        "    @functools.wraps(forward)\n"
        "    def run(*args, **kwargs):\n"
        "        return checkpoint(forward, *args, use_reentrant=False, **kwargs)\n"
        "\n"
        "    module.forward = run\n"
        "    return module\n"
        "\n"
        f"for name in [\n    {names},\n]:\n"
        f"    checkpointed({root}.get_submodule(name))\n"
    )


def plan_checkpointing(
    snapshot: MemorySnapshot,
    budget_bytes: int,
    *,
    fit: BatchFit | None = None,
    batch_size: int | None = None,
    device: int | None = None,
) -> CheckpointPlan:
    """Return which modules to checkpoint so the step's peak (at `batch_size`, predicted
    with `fit`; default the recorded one) fits `budget_bytes` with the least recompute
    time. Raises GpuprofError when the snapshot has no step record with a backward."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)):
        raise GpuprofError(f"budget_bytes must be a whole number of bytes, got {budget_bytes!r}")
    if budget_bytes <= 0:
        raise GpuprofError(f"budget_bytes must be more than 0, got {budget_bytes}")
    if device is None:
        device = choose_device(snapshot)
    roles = _roles(snapshot, device)
    if roles.record is None or not roles.phases:
        raise GpuprofError(
            "no checkpointing plan: the recording has no module calls followed by a "
            "backward pass (record a training step with %%memsnap, with its model an "
            "nn.Module called in the cell)"
        )
    rep = roles.rep
    sizes = rep.alloc_size.astype(np.float64)
    unmatched = rep.unmatched_size.astype(np.float64)
    if batch_size is not None:
        if fit is None:
            raise GpuprofError("a plan at another batch_size needs the report's fit")
        x, _ = fit._scale(batch_size, None)
        if (
            fit.alloc_scaling is None
            or fit.unmatched_fixed is None
            or fit.unmatched_scaling is None
            or len(fit.alloc_scaling) != len(sizes)
            or len(fit.unmatched_fixed) != len(unmatched)
        ):
            raise GpuprofError("the fit given was not made from this snapshot")
        sizes = sizes + fit.alloc_scaling * (x - 1.0)
        unmatched = fit.unmatched_fixed + fit.unmatched_scaling * x
    sizes = np.maximum(sizes, 0.0)
    before = float(sum(b[1] for b in rep.before_end_blocks))
    overhead = fit.overhead_bytes if fit is not None else _overhead(roles)
    room = budget_bytes - overhead
    base = _base(roles, sizes, unmatched, before)
    baseline = _simulate(base, sizes, rep, [])
    cands = _plan_candidates(roles)
    notes: list[str] = []
    notes.append(
        f"Planned to {(1 - PLAN_MARGIN) * 100:.0f}% of the budget: the replayed "
        "recomputation is an estimate (within 3% of the measured peak on CPU runs)."
    )
    if overhead:
        notes.append(
            f"The peaks are allocated bytes; they are held against the budget less the "
            f"allocator's overhead measured at the recorded peak ({overhead:,} B)."
        )
    chosen: list[int] = []
    fits = baseline <= room
    peak = baseline
    # Replaying the recomputation came within 3% of the measured peak on CPU runs (the
    # recomputed forward's own allocations are only approximated): plan to a margin.
    target = room * (1.0 - PLAN_MARGIN)
    if not fits and cands:
        gains = [c.saved_bytes(sizes) for c in cands]
        need = baseline - target
        for _ in range(8):
            picked = _knapsack(cands, gains, need)
            if picked is None:
                # Even all of them together fall short: keep the most that can be saved.
                top = set(range(len(cands)))
                for i in range(len(cands)):
                    for j in range(len(cands)):
                        if i != j and cands[i].path.startswith(cands[j].path + "."):
                            top.discard(i)
                picked = sorted(top)
                chosen = picked
                peak = _simulate(base, sizes, rep, [cands[i] for i in picked])
                break
            chosen = picked
            peak = _simulate(base, sizes, rep, [cands[i] for i in picked])
            if peak <= target:
                break
            # What the additive gains missed (recomputation spikes, a peak elsewhere):
            # ask for that much more.
            need += peak - target
        fits = peak <= target
        if not fits and chosen:
            # Short of the budget anyway: keep only what lowers the peak (recomputing a
            # module whose activations are not live at the peak costs time for nothing),
            # dropping the dearest first.
            for i in sorted(chosen, key=lambda i: -cands[i].recompute_us):
                trial = [j for j in chosen if j != i]
                lower = _simulate(base, sizes, rep, [cands[j] for j in trial])
                if lower <= peak:
                    chosen, peak = trial, lower
    elif not fits:
        notes.append("No module keeps activations that checkpointing would free.")
    if not fits:
        notes.append(
            "Checkpointing cannot bring this step under the budget: the rest of the peak is "
            "parameters, gradients, optimizer state and what is live outside the modules."
        )
    modules = tuple(
        PlanModule(
            path=cands[i].path,
            type_name=cands[i].type_name,
            saved_bytes=int(round(cands[i].saved_bytes(sizes))),
            recompute_us=cands[i].recompute_us,
            calls=len(cands[i].saved),
        )
        for i in chosen
    )
    record = roles.record
    root_calls = record.root_calls
    forward = sum(
        record.calls[i].forward_us for i in root_calls if math.isfinite(record.calls[i].forward_us)
    )
    root = next((r.name for r in record.roots if r.name), "") or "model"
    return CheckpointPlan(
        budget_bytes=int(budget_bytes),
        batch_size=batch_size if batch_size is not None else (fit.batch_size if fit else None),
        baseline_peak_bytes=int(round(baseline)),
        predicted_peak_bytes=int(round(peak)),
        modules=modules,
        recompute_us=float(sum(m.recompute_us for m in modules)),
        forward_us=float(forward),
        fits=bool(fits),
        solver="exact tree knapsack on bytes saved (1/256 steps of what must go), "
        "checked by replaying the history",
        code=plan_code(root, [m.path for m in modules]) if modules else "",
        candidates=len(cands),
        notes=tuple(notes),
    )


def categories_and_fit(
    snapshot: MemorySnapshot, *, device: int | None = None, peak_index: int | None = None
) -> tuple[MemoryByCategory | None, BatchFit | None]:
    """Return memory_by_category and fit_from_categories of one device in one replay
    (both None when nothing tells tensors apart). The fit knows its batch size when the
    step record does."""
    if device is None:
        device = choose_device(snapshot)
    roles = _roles(snapshot, device)
    if roles.method == "none":
        return None, None
    batch = roles.record.batch_size if roles.record is not None else None
    return _by_category(roles, peak_index), _category_fit(roles, snapshot, batch)
