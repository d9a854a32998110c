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
(The checkpointing plan, built on the same roles, is analysis/plan.py.)
"""

from __future__ import annotations

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
    MemoryByCategory,
    ModuleBytes,
    check_batch_size,
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
    close = rep.close_idx[closed]
    for a, u, b in zip(alloc_parts, unmatched_parts, before_parts, strict=True):
        # One allocation or unmatched free per entry; bincount sums the closes (the last
        # entry may close several blocks).
        delta = -np.bincount(close, weights=a[closed], minlength=n)[:n]
        delta[rep.alloc_idx] += a
        delta[rep.unmatched_idx] -= u
        start = float(b.sum() + u.sum())
        out.append(np.concatenate(([start], start + np.cumsum(delta))))
    return out


def _stack_keys(
    snapshot: MemorySnapshot, table: dict[tuple[object, ...], int], *, coarse: bool = False
) -> np.ndarray:
    """Return a key per stack index (+1 for 'none'), equal for equal frames across
    snapshots. Frames from the recording machinery on out are cut (whoever ran it may
    differ between the recordings: another line of a script), and a notebook cell's file
    name counts as one name (the same code recorded from two cells). `coarse`: the
    innermost frame only."""
    keys = np.zeros(len(snapshot.stacks) + 1, dtype=np.int64)
    keys[0] = table.setdefault((), len(table))
    cells = snapshot.cells
    for i, stack in enumerate(snapshot.stacks):
        frames: list[tuple[str, int, str]] = []
        for j in stack[:1] if coarse else stack:
            f = snapshot.frames[j]
            name = f.file.replace("\\", "/")
            if "gpuprof_nb/capture/" in name:
                break
            if name in cells or name.startswith("<ipython-input-"):
                name = "<cell>"
            frames.append((name, f.line, f.function))
        keys[i + 1] = table.setdefault(tuple(frames), len(table))
    return keys


def _alloc_keys(
    snapshot: MemorySnapshot,
    roles: _Roles,
    device: int,
    stacks: dict[tuple[object, ...], int],
    paths: dict[str, int],
    *,
    coarse: bool = False,
) -> np.ndarray:
    trace = snapshot.trace(device)
    stack_key = _stack_keys(snapshot, stacks, coarse=coarse)
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


def _share(rep: _Replay, partner: np.ndarray) -> float:
    """The share of the allocated bytes that have a partner."""
    total = float(rep.alloc_size.sum())
    return float(rep.alloc_size[partner >= 0].sum()) / total if total else 1.0


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
    batch_size = check_batch_size(batch_size, "batch_size")
    other_batch_size = check_batch_size(other_batch_size, "other_batch_size")
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
    rep, rep_o = main.rep, prev.rep
    key_main, key_prev, partner = _pair_allocations(
        (snapshot, main, device), (other, prev, other_device)
    )
    size = rep.alloc_size.astype(np.float64)
    matched = partner >= 0
    size_o = np.where(matched, rep_o.alloc_size[np.maximum(partner, 0)], size).astype(np.float64)
    # Bytes per sample times the recorded batch: the part that scales with B / batch_size.
    per_sample = (size - size_o) / (batch_size - other_batch_size)
    scaling = per_sample * batch_size
    fixed = size - scaling
    uncertain = np.where(matched, 0.0, size)
    un_fixed, un_scaling, un_uncertain = _unmatched_growth(
        rep, rep_o, key_main, key_prev, batch_size, other_batch_size
    )
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
    same_sizes = bool((size == size_o)[matched].all() and matched.any())
    notes = _two_run_notes(share, same_sizes, batch_size, other_batch_size, variable)
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


# One recording to pair: its snapshot, its roles, the device read.
_Side = tuple[MemorySnapshot, _Roles, int]


def _pair_allocations(main: _Side, other: _Side) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the allocation keys of both recordings and each allocation's partner in the
    other one (-1: none): matched on the whole stack, or on the allocating frame and the
    module alone when that pairs more of the bytes and the whole stacks pair under 90%."""
    stacks: dict[tuple[object, ...], int] = {}
    paths: dict[str, int] = {}
    (snapshot, roles, device), (snapshot_o, roles_o, device_o) = main, other
    rep = roles.rep
    key_main = _alloc_keys(snapshot, roles, device, stacks, paths)
    key_prev = _alloc_keys(snapshot_o, roles_o, device_o, stacks, paths)
    partner = _match(_ranked(key_main), _ranked(key_prev))
    if _share(rep, partner) < 0.9:
        # The stacks differ (two scripts, two notebook sessions): match on the allocating
        # frame and the module alone, if that pairs more.
        coarse_main = _alloc_keys(snapshot, roles, device, stacks, paths, coarse=True)
        coarse_prev = _alloc_keys(snapshot_o, roles_o, device_o, stacks, paths, coarse=True)
        coarse = _match(_ranked(coarse_main), _ranked(coarse_prev))
        if _share(rep, coarse) > _share(rep, partner):
            key_main, key_prev, partner = coarse_main, coarse_prev, coarse
    return key_main, key_prev, partner


def _unmatched_growth(
    rep: _Replay,
    rep_o: _Replay,
    key_main: np.ndarray,
    key_prev: np.ndarray,
    batch_size: int,
    other_batch_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the fixed, scaling and uncertain bytes of the blocks freed during this run
    that were allocated before it: those the other run left behind grow like the leftover
    of the same allocation at the end of this run; the others keep their size, uncertain."""
    un_size = rep.unmatched_size.astype(np.float64)
    un_fixed, un_scaling = un_size.copy(), np.zeros(len(un_size))
    un_uncertain = un_size.copy()
    left_o = np.flatnonzero(rep_o.close_idx >= rep_o.n)
    left_m = np.flatnonzero(rep.close_idx >= rep.n)
    if not (len(left_o) and len(left_m) and len(un_size)):
        return un_fixed, un_scaling, un_uncertain
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
    return un_fixed, un_scaling, un_uncertain


def _two_run_notes(
    share: float, same_sizes: bool, batch_size: int, other_batch_size: int, variable: str
) -> list[str]:
    """Return the notes of a fit from two runs: few bytes matched, or none of the matched
    allocations changed size with the batch."""
    notes = []
    if share < 0.95:
        notes.append(
            f"Only {share * 100:.0f}% of the allocated bytes were matched between the two "
            "runs (the cell did different work at the two batch sizes?): the rest keeps "
            "its recorded size, and the interval says how much that could matter."
        )
    if same_sizes:
        notes.append(
            f"Every matched allocation had the same size at {other_batch_size} as at "
            f"{batch_size}: the cell does not seem to read {variable or 'the batch size'} "
            "(define the batch from it, e.g. x = torch.randn(batch_size, ...))."
        )
    return notes


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
