"""Which modules to checkpoint so a training step fits a memory budget with the least
recompute time: candidates, savings and recomputation read from the recorded history and
its step record (the roles of analysis/fit.py), an exact knapsack over the module tree, and
a replay of the history to check the chosen set. Pure functions, no torch.

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

from gpuprof_nb.analysis.fit import (
    ACTIVATIONS,
    _entry_of,
    _overhead,
    _Roles,
    _roles,
)
from gpuprof_nb.analysis.memory import _Replay, choose_device
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.arguments import describe
from gpuprof_nb.model.memory import MemorySnapshot
from gpuprof_nb.model.step import StepRecord
from gpuprof_nb.results.fit import BatchFit, CheckpointPlan, PlanModule, check_budget

# Headroom a plan leaves under the budget (see plan_checkpointing).
PLAN_MARGIN = 0.04


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
    kids = _candidate_tree(cands)
    inf = math.inf
    choice: dict[int, tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]] = {}

    def solve(v: int) -> np.ndarray:
        acc = np.full(steps + 1, inf)
        acc[0] = 0.0
        trail: list[tuple[int, np.ndarray, np.ndarray]] = []
        for c in kids.get(v, []):
            acc, left, right = _merge_at_least(acc, solve(c), steps)
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


def _candidate_tree(cands: Sequence[_Candidate]) -> dict[int, list[int]]:
    """Return each candidate's children in the module tree (-1: the roots'), in candidate
    order: a candidate's parent is the nearest one whose path is a prefix of its own."""
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
    return kids


def _merge_at_least(
    f: np.ndarray, g: np.ndarray, steps: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return the least cost of reaching at least k steps (k = 0..steps) from two disjoint
    subtrees with least costs f and g per reach, and for each k the reaches taken from f and
    from g."""
    inf = math.inf
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
    budget_bytes = _whole_budget(budget_bytes)
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
    sizes, unmatched = _sizes_at(rep, fit, batch_size)
    before = float(sum(b[1] for b in rep.before_end_blocks))
    overhead = fit.overhead_bytes if fit is not None else _overhead(roles)
    room = budget_bytes - overhead
    base = _base(roles, sizes, unmatched, before)
    baseline = _simulate(base, sizes, rep, [])
    cands = _plan_candidates(roles)
    notes = [
        f"Planned to {(1 - PLAN_MARGIN) * 100:.0f}% of the budget: the replayed "
        "recomputation is an estimate (within 3% of the measured peak on CPU runs)."
    ]
    if overhead:
        notes.append(
            f"The peaks are allocated bytes; they are held against the budget less the "
            f"allocator's overhead measured at the recorded peak ({overhead:,} B)."
        )
    chosen: list[int] = []
    fits = baseline <= room
    peak = baseline
    if not fits and cands:
        # Replaying the recomputation came within 3% of the measured peak on CPU runs (the
        # recomputed forward's own allocations are only approximated): plan to a margin.
        target = room * (1.0 - PLAN_MARGIN)
        chosen, peak = _choose(base, sizes, rep, cands, baseline, target)
        fits = peak <= target
        if not fits and chosen:
            chosen, peak = _only_what_lowers(base, sizes, rep, cands, chosen, peak)
    elif not fits:
        notes.append("No module keeps activations that checkpointing would free.")
    if not fits:
        notes.append(
            "Checkpointing cannot bring this step under the budget: the rest of the peak is "
            "parameters, gradients, optimizer state and what is live outside the modules."
        )
    modules = _plan_modules(cands, chosen, sizes)
    record = roles.record
    forward = sum(
        record.calls[i].forward_us
        for i in record.root_calls
        if math.isfinite(record.calls[i].forward_us)
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


def _plan_modules(
    cands: Sequence[_Candidate], chosen: Sequence[int], sizes: np.ndarray
) -> tuple[PlanModule, ...]:
    """Return the chosen candidates as the plan's modules."""
    return tuple(
        PlanModule(
            path=cands[i].path,
            type_name=cands[i].type_name,
            saved_bytes=int(round(cands[i].saved_bytes(sizes))),
            recompute_us=cands[i].recompute_us,
            calls=len(cands[i].saved),
        )
        for i in chosen
    )


def _whole_budget(budget_bytes: int) -> int:
    """Return the budget checked: a whole number of bytes (check_budget's rules)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)):
        raise GpuprofError(
            f"budget_bytes must be a whole number of bytes, got {describe(budget_bytes)}"
        )
    return check_budget(budget_bytes)


def _sizes_at(
    rep: _Replay, fit: BatchFit | None, batch_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Return the bytes of each allocation and of each unmatched block at `batch_size`
    (predicted with `fit`), or as recorded without one; negative predictions are 0."""
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
    return np.maximum(sizes, 0.0), unmatched


def _choose(
    base: _Base,
    sizes: np.ndarray,
    rep: _Replay,
    cands: Sequence[_Candidate],
    baseline: float,
    target: float,
) -> tuple[list[int], float]:
    """Return the candidates to checkpoint to bring the baseline peak to `target` bytes,
    and the peak replayed with them: the knapsack on each one's own gain, asking for more
    while the replay misses the target (at most 8 rounds); all the outermost ones when even
    they fall short."""
    # What each one takes off the peak on its own: no more than it frees, and nothing
    # when its recomputation lands where the peak is (the last block before backward).
    gains = [
        max(min(c.saved_bytes(sizes), baseline - _simulate(base, sizes, rep, [c])), 0.0)
        for c in cands
    ]
    need = baseline - target
    chosen: list[int] = []
    peak = baseline
    for _ in range(8):
        picked = _knapsack(cands, gains, need)
        if picked is None:
            # Even all of them together fall short: keep the most that can be saved.
            chosen = _outermost(cands)
            peak = _simulate(base, sizes, rep, [cands[i] for i in chosen])
            break
        chosen = picked
        peak = _simulate(base, sizes, rep, [cands[i] for i in picked])
        if peak <= target:
            break
        # What the additive gains missed (recomputation spikes, a peak elsewhere):
        # ask for that much more.
        need += peak - target
    return chosen, peak


def _outermost(cands: Sequence[_Candidate]) -> list[int]:
    """Return the candidates inside no other one, in order."""
    top = set(range(len(cands)))
    for i in range(len(cands)):
        for j in range(len(cands)):
            if i != j and cands[i].path.startswith(cands[j].path + "."):
                top.discard(i)
    return sorted(top)


def _only_what_lowers(
    base: _Base,
    sizes: np.ndarray,
    rep: _Replay,
    cands: Sequence[_Candidate],
    chosen: list[int],
    peak: float,
) -> tuple[list[int], float]:
    """Short of the budget anyway: return the chosen candidates less those that do not
    lower the peak (recomputing a module whose activations are not live at the peak costs
    time for nothing), dropping the dearest first, and the peak without them."""
    for i in sorted(chosen, key=lambda i: -cands[i].recompute_us):
        trial = [j for j in chosen if j != i]
        lower = _simulate(base, sizes, rep, [cands[j] for j in trial])
        if lower <= peak:
            chosen, peak = trial, lower
    return chosen, peak
