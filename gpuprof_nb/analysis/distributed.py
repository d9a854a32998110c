"""A distributed run, rank by rank: `summarize_rank` boils one rank's trace down to a compact
RankSummary (what a worker sends back), and `combine` reads the summaries together: who waits
for whom, the collectives, the run's diagnosis. Pure functions; gpuprof_nb/session/distributed.py
runs them over many trace files on an executor. docs/distributed.md says how stragglers are found.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuprof_nb.analysis import thresholds as th
from gpuprof_nb.analysis.classify import is_host_collective, kernel_name_class
from gpuprof_nb.analysis.derived import TraceIndex, index_of
from gpuprof_nb.analysis.fixes import FIXES
from gpuprof_nb.analysis.intervals import (
    Interval,
    clip_intervals,
    intersect_intervals,
    merge_intervals,
    union_length,
)
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.analysis.rules import severity_of
from gpuprof_nb.analysis.timeline import chosen_device, device_kernels, top_level_ops
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Kernel, Step, Trace
from gpuprof_nb.results.diagnosis import Diagnosis, Finding, FindingKind
from gpuprof_nb.results.distributed import CollectiveRow, RankRow, RankSummary, RunReport
from gpuprof_nb.results.invariants import rounded_share

# Rank numbers in file names: rank-3, rank_3, rank3, worker3, worker-3.
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d{1,7})(?!\d)", re.IGNORECASE)
# More ranks than any run has had (the largest jobs run tens of thousands): a rank or world
# size past this in a trace is damage, and would make `range(world)` loops run for ever.
MAX_RANKS = 2**20
# Collective calls of one kind matched across the ranks (plenty to tell who waits).
MAX_MATCHED_CALLS = 100_000
# Host ranges that carry a collective's real duration (c10d:: ops only enqueue the work).
_HOST_CALL_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:")
# Bytes per element of the dtypes NCCL kernel args name.
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "char": 1,
    "byte": 1,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "short": 2,
    "int16": 2,
}
# What each link carries per byte of the message, by collective (NCCL's bus bandwidth).
_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


def rank_from_name(name: str) -> int | None:
    """Return the rank a trace file's name gives (`rank-3.json.gz`, `worker3.pt.trace.json`),
    or None."""
    found = _RANK_IN_NAME.findall(Path(name).name)
    return int(found[-1]) if found else None


def rank_ranges(ranks: Sequence[int]) -> str:
    """Return sorted ranks as ranges: [0, 2, 3, 4, 7] -> '0, 2-4, 7'."""
    parts: list[str] = []
    for r in sorted(set(ranks)):
        if parts and r == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def collective_kind(name: str) -> str:
    """Return a collective's kind from a kernel or host-range name: `allreduce` for
    `ncclKernel_AllReduce_RING_LL_Sum_float(...)`, `gloo:all_reduce` or `nccl:all_reduce`."""
    n = name.lower().split("(", 1)[0]
    for prefix in (
        "nccldevkernel_",
        "ncclkernel_",
        "rcclkernel_",
        "nccl:",
        "gloo:",
        "mpi:",
        "ucc:",
        "c10d::",
    ):
        if n.startswith(prefix):
            n = n[len(prefix) :]
            break
    if name.lower().startswith(("nccl", "rccl")) and "kernel" in name.lower():
        n = n.split("_", 1)[0]
    n = n.replace("_", "").removesuffix("base")
    return n.rstrip("_") or name


def _collective_bytes(kernel: Kernel) -> int | None:
    c = kernel.collective
    if c is None or c.in_nelems is None or c.dtype is None:
        return None
    size = _DTYPE_BYTES.get(c.dtype.lower())
    return c.in_nelems * size if size is not None else None


def summarize_rank(
    trace: Trace | TraceIndex,
    source: str,
    rank: int | None = None,
    *,
    ceilings: DeviceSpec | None = None,
    timing: TimingStats | None = None,
) -> RankSummary:
    """Return one rank's RankSummary from its trace (see RankSummary for the numbers). The
    rank is `rank`, else the trace's distributedInfo, else the file name's. `ceilings` and
    `timing` are what its analysis takes (analysis/report.py: analyze)."""
    ix = index_of(trace)
    trace = ix.trace
    dist = trace.distributed
    rank = _checked_rank(trace, source, rank)
    report = analyze(ix, ceilings, timing=timing)
    timeline = report.timeline
    lo, hi = (timeline.start_us, timeline.end_us) if timeline is not None else trace.bounds_us
    steps = trace.steps
    device, _ = chosen_device(ix)
    if device is not None:
        names = report.summary.device_names if report.summary is not None else ()
        comm = _device_comm(ix, device, lo, hi, ", ".join(names) or f"device {device}")
    else:
        comm = _host_comm(ix, lo, hi)
    calls = comm.calls
    comm_us = union_length(comm.comm_spans)
    overlap_spans = intersect_intervals(comm.comm_spans, comm.compute_spans)
    overlap = union_length(overlap_spans)
    step_compute = _per_step(comm.compute_spans, steps)
    step_comm = _per_step(comm.comm_spans, steps)
    step_exposed = tuple(
        c - o for c, o in zip(step_comm, _per_step(overlap_spans, steps), strict=True)
    )
    breakdown = timeline.breakdown if timeline is not None else None
    findings = report.diagnosis.findings if report.diagnosis is not None else ()
    return RankSummary(
        rank=rank,
        source=source,
        world_size=dist.world_size if dist is not None else None,
        device=comm.label,
        on_device=device is not None,
        steps=len(steps),
        median_step_us=statistics.median(s.dur_us for s in steps) if steps else None,
        window_us=hi - lo,
        busy_us=timeline.busy_us if timeline is not None else 0.0,
        compute_us=union_length(comm.compute_spans),
        comm_us=comm_us,
        exposed_comm_us=comm_us - overlap,
        idle_us=tuple(breakdown.us_by_category().items()) if breakdown is not None else (),
        step_compute_us=step_compute,
        collective_calls=_by_kind(calls),
        collective_bytes=tuple(sorted(comm.sizes.items())),
        collective_groups=tuple(sorted(comm.groups.items())),
        top_findings=tuple(f.kind for f in findings[:3]),
        steps_us=sum(s.dur_us for s in steps),
        step_comm_us=step_comm,
        step_exposed_comm_us=step_exposed,
        collective_in_step=_collectives_in_step(calls, steps),
    )


def _checked_rank(trace: Trace, source: str, rank: int | None) -> int:
    """Return the rank: `rank`, else the trace's distributedInfo's, else the file name's.
    Raises GpuprofError when there is none, or it (or the world size) is not a real run's."""
    dist = trace.distributed
    if rank is None:
        rank = dist.rank if dist is not None and dist.rank is not None else rank_from_name(source)
    if rank is None:
        raise GpuprofError(
            f"{source}: no rank in the trace (distributedInfo) or its name "
            "(rank-3, worker3); rename the file or pass Trace objects in order"
        )
    world = dist.world_size if dist is not None else None
    if not 0 <= rank < MAX_RANKS or (world is not None and not 0 <= rank < world):
        raise GpuprofError(
            f"{source}: rank {rank} is not a rank of a run"
            + (f" of world size {world}" if world is not None else "")
            + "; the trace's distributedInfo (or its file name) is damaged"
        )
    if world is not None and not 1 <= world <= MAX_RANKS:
        raise GpuprofError(
            f"{source}: world size {world} is not a real run's; the trace's distributedInfo "
            "is damaged"
        )
    return rank


@dataclass
class _Comm:
    """One rank's communication and compute within the window: merged spans of each, the
    collective calls (start, kind, duration), bytes and group size per kind, and what ran
    them (the device's name, or "cpu")."""

    comm_spans: list[Interval]
    compute_spans: list[Interval]
    calls: list[tuple[float, str, float]]
    sizes: dict[str, int]
    groups: dict[str, int]
    label: str


def _device_comm(ix: TraceIndex, device: int, lo: float, hi: float, label: str) -> _Comm:
    """Return the communication of a GPU rank: its communication kernels on `device`."""
    calls: list[tuple[float, str, float]] = []
    sizes: dict[str, int] = defaultdict(int)
    groups: dict[str, int] = {}
    kernels = [k for k in device_kernels(ix, device) if k.kind == "kernel"]
    comm = [k for k in kernels if kernel_name_class(k.name) == "comm"]
    compute = [k for k in kernels if kernel_name_class(k.name) != "comm"]
    comm_spans = _spans(((k.start_us, k.end_us) for k in comm), lo, hi)
    compute_spans = _spans(((k.start_us, k.end_us) for k in compute), lo, hi)
    for k in comm:
        kind = collective_kind(k.collective.name if k.collective else k.name)
        calls.append((k.start_us, kind, k.dur_us))
        nbytes = _collective_bytes(k)
        if nbytes is not None:
            sizes[kind] += nbytes
        if k.collective is not None and k.collective.group_size:
            groups[kind] = max(groups.get(kind, 0), k.collective.group_size)
    return _Comm(comm_spans, compute_spans, calls, sizes, groups, label)


def _host_comm(ix: TraceIndex, lo: float, hi: float) -> _Comm:
    """Return the communication of a CPU rank: its host collective ops, against the other
    top-level ops."""
    host = [o for o in ix.trace.ops if is_host_collective(o.name)]
    comm_spans = _spans(((o.start_us, o.end_us) for o in host), lo, hi)
    compute_spans = _spans(
        ((o.start_us, o.end_us) for o in top_level_ops(ix) if not is_host_collective(o.name)),
        lo,
        hi,
    )
    calls = [
        (o.start_us, collective_kind(o.name), o.dur_us)
        for o in host
        if o.name.lower().startswith(_HOST_CALL_PREFIXES)
    ]
    return _Comm(comm_spans, compute_spans, calls, defaultdict(int), {}, "cpu")


def _per_step(spans: list[Interval], steps: Sequence[Step]) -> tuple[float, ...]:
    """Return the time the (merged) spans cover within each step."""
    return tuple(union_length(clip_intervals(spans, s.start_us, s.end_us)) for s in steps)


def _collectives_in_step(
    calls: list[tuple[float, str, float]], steps: Sequence[Step]
) -> tuple[tuple[str, tuple[bool, ...]], ...]:
    """Return, per kind of collective, whether each of its calls (in time order) started
    inside a step."""
    starts = sorted((s.start_us, s.end_us) for s in steps)
    in_step: dict[str, list[bool]] = defaultdict(list)
    for start, kind, _ in sorted(calls):
        at = bisect.bisect_right(starts, (start, float("inf"))) - 1
        in_step[kind].append(at >= 0 and starts[at][0] <= start < starts[at][1])
    return tuple((kind, tuple(v)) for kind, v in sorted(in_step.items()))


def _by_kind(calls: list[tuple[float, str, float]]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """(kind, durations in time order) for each kind of collective call."""
    out: dict[str, list[float]] = defaultdict(list)
    for _, kind, dur in sorted(calls):
        out[kind].append(dur)
    return tuple((kind, tuple(durs)) for kind, durs in sorted(out.items()))


def _spans(pairs: object, lo: float, hi: float) -> list[Interval]:
    return merge_intervals(clip_intervals(pairs, lo, hi))  # type: ignore[arg-type]


def combine(summaries: Sequence[RankSummary]) -> RunReport:
    """Return the run's report from its ranks' summaries: the rank table with each rank's
    wait, the stragglers, the collectives and the diagnosis. Raises GpuprofError for ranks of
    different runs (world sizes disagree) or a rank given twice."""
    failures = tuple(f"{s.source}: {s.error}" for s in summaries if s.error)
    ok = sorted((s for s in summaries if not s.error), key=lambda s: s.rank)
    notes: list[str] = []
    if not ok:
        raise GpuprofError(
            "no rank could be read: " + "; ".join(failures)
            if failures
            else "no rank summaries to combine"
        )
    sizes = {s.world_size for s in ok if s.world_size is not None}
    if len(sizes) > 1:
        by_size = defaultdict(list)
        for s in ok:
            by_size[s.world_size].append(Path(s.source).name)
        raise GpuprofError(
            "these traces come from different runs (world sizes disagree): "
            + "; ".join(
                f"world size {k}: {', '.join(v)}"
                for k, v in sorted(by_size.items(), key=lambda kv: str(kv[0]))
            )
        )
    seen: dict[int, str] = {}
    for s in ok:
        if s.rank in seen:
            raise GpuprofError(
                f"rank {s.rank} is given twice: {seen[s.rank]} and {s.source}; "
                "keep one trace per rank"
            )
        seen[s.rank] = s.source
    world = sizes.pop() if sizes else None
    if world is not None:
        missing = sorted(set(range(world)) - set(seen))
        if missing:
            notes.append(
                f"{len(missing)} of {world} ranks are missing ({rank_ranges(missing)})"
                ": the numbers are of the ranks given"
            )
    if failures:
        notes.append(
            f"{len(failures)} rank(s) could not be read and are left out: " + "; ".join(failures)
        )
    waits = _waits(ok, notes)
    if len(ok) > 1 and waits.calls < th.STRAGGLER_MIN_MATCHED_CALLS:
        notes.append(
            f"{waits.calls} collective calls are matched across the ranks: too few "
            "to tell who waits for whom"
        )
    rows = tuple(_row(s, waits.wait[s.rank] if waits.calls else None) for s in ok)
    stragglers = _stragglers(ok, waits)
    collectives = _collectives(ok, world)
    diagnosis = _diagnosis(ok, rows, stragglers, waits, notes)
    return RunReport(
        ranks=rows,
        stragglers=stragglers,
        collectives=collectives,
        diagnosis=diagnosis,
        world_size=world,
        failures=failures,
        notes=tuple(notes),
        step_compute_us=tuple((s.rank, s.step_compute_us) for s in ok),
    )


def _steps_covered(s: RankSummary) -> float:
    """How many steps a figure over the whole window covers: the annotated steps, or the
    window in median steps where the window holds more than they do."""
    if not s.steps:
        return 0.0
    if s.median_step_us and s.window_us > s.steps_us:
        return max(float(s.steps), s.window_us / s.median_step_us)
    return float(s.steps)


def _compute_per_step(s: RankSummary) -> float | None:
    """Compute per step: what the steps hold over their number (the whole window's compute
    over the steps it covers, for a summary without per-step figures)."""
    if not s.steps:
        return None
    if len(s.step_compute_us) == s.steps:
        return sum(s.step_compute_us) / s.steps
    return s.compute_us / _steps_covered(s)


def _row(s: RankSummary, wait: float | None) -> RankRow:
    return RankRow(
        rank=s.rank,
        device=s.device,
        steps=s.steps,
        median_step_us=s.median_step_us,
        busy_us=s.busy_us,
        compute_us=s.compute_us,
        comm_us=s.comm_us,
        exposed_comm_us=s.exposed_comm_us,
        wait_us=wait,
        compute_per_step_us=_compute_per_step(s),
        idle_us=s.idle_us,
        source=s.source,
    )


@dataclass
class _Waits:
    """What matching the collective calls across ranks found (see `_waits`)."""

    wait: dict[int, float]  # per rank: time in collectives beyond the last arriver's
    blame: dict[int, float]  # per rank: the waiting it caused its peers, when it came last
    lead: dict[int, list[float]]  # per rank, per call: the others' median time minus its own
    matched: list[dict[int, float]] = field(default_factory=list)  # per call: rank -> time
    calls: int = 0  # calls matched on every rank
    # Of blame, the waiting inside the waiting rank's steps: {late rank: {peer: us}}; and
    # whether every rank said which of its calls lie in its steps.
    blame_in_steps: dict[int, dict[int, float]] = field(default_factory=dict)
    flagged: bool = False
    # Per rank, its waiting (as `wait`) inside its own steps.
    wait_in_steps: dict[int, float] = field(default_factory=dict)


def _waits(ranks: Sequence[RankSummary], notes: list[str]) -> _Waits:
    """Match each kind of collective call by its order on every rank. A call ends on every
    rank together, so the rank whose call took least arrived last and its peers waited for
    it: each rank's wait is its time beyond that one's. Only durations are used, never
    timestamps, so the ranks' clocks need not agree."""
    per_kind: dict[str, dict[int, list[float]]] = defaultdict(dict)
    flags: dict[str, dict[int, tuple[bool, ...]]] = defaultdict(dict)
    for s in ranks:
        for kind, durs in s.collective_calls:
            per_kind[kind][s.rank] = list(durs)
        for kind, marks in s.collective_in_step:
            flags[kind][s.rank] = marks
    out = _Waits(
        {s.rank: 0.0 for s in ranks}, {s.rank: 0.0 for s in ranks}, {s.rank: [] for s in ranks}
    )
    out.flagged = all(
        len(flags.get(kind, {}).get(r, ())) == len(v)
        for kind, by_rank in per_kind.items()
        for r, v in by_rank.items()
    )
    out.blame_in_steps = {s.rank: defaultdict(float) for s in ranks}
    out.wait_in_steps = {s.rank: 0.0 for s in ranks}
    for kind, by_rank in sorted(per_kind.items()):
        if len(by_rank) < max(2, len(ranks)):
            continue
        counts = {len(v) for v in by_rank.values()}
        n = min(counts)
        if len(counts) > 1:
            notes.append(
                f"ranks recorded different numbers of {kind} calls "
                f"({min(counts)} to {max(counts)}): the first {n} are matched"
            )
        if n > MAX_MATCHED_CALLS:
            # Memory and time stay bounded whatever a rank recorded.
            notes.append(
                f"{n:,} {kind} calls per rank: the first {MAX_MATCHED_CALLS:,} are matched"
            )
            n = MAX_MATCHED_CALLS
        for i in range(n):
            call = {r: v[i] for r, v in by_rank.items()}
            last = min(call, key=lambda r: (call[r], r))
            for r, d in call.items():
                out.wait[r] += d - call[last]
                out.blame[last] += d - call[last]
                out.lead[r].append(_lead(call, r))
                # The wait counts toward per-step figures where it lies in the waiting
                # rank's own steps (all of it without the marks: then divided by the steps
                # the whole window covers).
                if not out.flagged or flags[kind][r][i]:
                    out.blame_in_steps[last][r] += d - call[last]
                    out.wait_in_steps[r] += d - call[last]
            out.matched.append(call)
            out.calls += 1
    return out


def _lead(call: dict[int, float], rank: int) -> float:
    """The median time of `rank`'s peers in one call minus its own."""
    return statistics.median(d for q, d in call.items() if q != rank) - call[rank]


def _noise_without(waits: _Waits, rank: int) -> float | None:
    """How far arrival order moves by chance in this run, leaving `rank` out: the median
    size of the other ranks' leads over each other (None with fewer than 2 others)."""
    sizes = [
        abs(_lead(rest, q))
        for call in waits.matched
        for rest in [{q: d for q, d in call.items() if q != rank}]
        if len(rest) >= 2
        for q in rest
    ]
    return statistics.median(sizes) if sizes else None


def _stragglers(ranks: Sequence[RankSummary], waits: _Waits) -> tuple[int, ...]:
    """The ranks the others wait for, the largest lead first (docs/distributed.md): a rank
    whose collective calls are shorter than its peers' median in most calls
    (STRAGGLER_MIN_LEAD_CALLS), by a median of STRAGGLER_MIN_WAIT_SHARE of a step or more,
    and (with 3 ranks or more) by STRAGGLER_MIN_LEAD_OVER_NOISE times the other ranks'
    typical lead over each other (how much arrival order moves by chance in this run)."""
    steps = [s.median_step_us for s in ranks if s.median_step_us]
    if len(ranks) < 2 or waits.calls < th.STRAGGLER_MIN_MATCHED_CALLS or not steps:
        return ()
    step_us = statistics.median(steps)
    leads = {r: statistics.median(v) for r, v in waits.lead.items() if v}
    out = []
    for r, v in waits.lead.items():
        if (
            not v
            or sum(x > 0 for x in v) < th.STRAGGLER_MIN_LEAD_CALLS * len(v)
            or leads[r] < th.STRAGGLER_MIN_WAIT_SHARE * step_us
        ):
            continue
        noise = _noise_without(waits, r)
        if noise is not None and leads[r] < th.STRAGGLER_MIN_LEAD_OVER_NOISE * noise:
            continue
        out.append(r)
    return tuple(sorted(out, key=lambda r: (-leads[r], r)))


def _collectives(ranks: Sequence[RankSummary], world: int | None) -> tuple[CollectiveRow, ...]:
    calls: dict[str, int] = defaultdict(int)
    time: dict[str, float] = defaultdict(float)
    present: dict[str, set[int]] = defaultdict(set)
    nbytes: dict[str, int] = defaultdict(int)
    group: dict[str, int] = {}
    for s in ranks:
        for kind, durs in s.collective_calls:
            calls[kind] += len(durs)
            time[kind] += sum(durs)
            present[kind].add(s.rank)
        for kind, total in s.collective_bytes:
            nbytes[kind] += total
        for kind, members in s.collective_groups:
            group[kind] = max(group.get(kind, 0), members)
    rows = []
    for kind in calls:
        moved = nbytes.get(kind)
        algbw = moved / (time[kind] * 1e-6) if moved and time[kind] > 0 else None
        n = group.get(kind) or world or len(ranks)  # the group's size, where recorded
        factor = _BUS_FACTOR[kind](n) if kind in _BUS_FACTOR and n > 1 else 1.0
        rows.append(
            CollectiveRow(
                name=kind,
                calls=calls[kind],
                ranks=len(present[kind]),
                time_us=time[kind],
                bytes=moved or None,
                algbw_bytes_per_s=algbw,
                busbw_bytes_per_s=algbw * factor if algbw is not None else None,
            )
        )
    rows.sort(key=lambda r: (-r.time_us, r.name))
    return tuple(rows)


def _finding(kind: FindingKind, title: str, share: float, evidence: dict[str, float]) -> Finding:
    share = rounded_share(max(0.0, share))
    return Finding(kind, severity_of(share), title, evidence, FIXES[kind], share)


def _per_step_share(s: RankSummary, us_in_steps: float, flagged: bool) -> float:
    """`us_in_steps` of rank `s` as a share of its step time: over the time of its steps
    when the figure counts only what they hold, else over the steps the window covers."""
    if flagged and s.steps_us > 0:
        return min(us_in_steps / s.steps_us, 1.0)
    covered = _steps_covered(s)
    step = s.median_step_us or 0.0
    return min(us_in_steps / (covered * step), 1.0) if covered and step > 0 else 0.0


def _straggler_finding(
    ranks: Sequence[RankSummary],
    r: int,
    waits: _Waits,
    per_step: dict[int, float],
) -> Finding:
    """What rank r's peers wait for it, per step: their waiting inside their own steps over
    those steps (or over the steps the window covers), and as a share of their step time
    (each peer's own, averaged): at most a whole step."""
    peers = [s for s in ranks if s.rank != r]
    by_peer = waits.blame_in_steps.get(r, {})
    per_peer_step = [
        by_peer.get(s.rank, 0.0) / (s.steps if waits.flagged else _steps_covered(s))
        for s in peers
        if s.steps
    ]
    peers_wait = statistics.mean(per_peer_step) if per_peer_step else 0.0
    share = (
        statistics.mean(_per_step_share(s, by_peer.get(s.rank, 0.0), waits.flagged) for s in peers)
        if peers
        else 0.0
    )
    mine = per_step.get(r)
    median_compute = statistics.median(per_step.values()) if per_step else None
    ratio = mine / median_compute if mine is not None and median_compute else None
    if ratio is None:
        why = ""
    elif ratio >= 1 + th.LOAD_IMBALANCE_MIN_SPREAD:
        why = f"; its compute per step is {ratio:.2f}x the median rank's"
    else:
        why = (
            f"; its compute per step is about the median rank's ({ratio:.2f}x), so it is "
            "late for another reason: look at what it does outside torch ops"
        )
    return _finding(
        "straggler",
        f"Rank {r} holds the others back: they wait for it {peers_wait / 1e3:.3g} ms per "
        f"step at collectives ({share * 100:.0f}% of a step){why}",
        share,
        {
            "straggler_rank_count": float(r),
            "peers_wait_per_step_us": peers_wait,
            "peers_wait_step_fraction": share,
            **({"compute_per_step_us": mine} if mine is not None else {}),
            **(
                {"median_compute_per_step_us": median_compute} if median_compute is not None else {}
            ),
        },
    )


def _imbalance_finding(per_step: dict[int, float], step_us: float) -> Finding | None:
    median_compute = statistics.median(per_step.values())
    spread = (max(per_step.values()) - min(per_step.values())) / median_compute
    if spread < th.LOAD_IMBALANCE_MIN_SPREAD:
        return None
    busiest = max(per_step, key=lambda k: (per_step[k], -k))
    idlest = min(per_step, key=lambda k: (per_step[k], k))
    # Of a step: the busiest rank's compute beyond the median's, over the longer of a step
    # and that rank's compute per step (a rank cannot compute more than its step holds).
    return _finding(
        "load_imbalance",
        f"Compute per step differs by {spread * 100:.0f}% of the median across ranks "
        f"(rank {busiest}: {per_step[busiest] / 1e3:.3g} ms, rank {idlest}: "
        f"{per_step[idlest] / 1e3:.3g} ms)",
        (per_step[busiest] - median_compute) / max(step_us, per_step[busiest]),
        {
            "compute_spread_ratio": spread,
            "max_compute_per_step_us": per_step[busiest],
            "min_compute_per_step_us": per_step[idlest],
            "median_compute_per_step_us": median_compute,
        },
    )


def _communication_finding(
    ranks: Sequence[RankSummary], waits: _Waits, step_us: float
) -> Finding | None:
    """Collectives across ranks: their time and overlap per step, what each step holds
    (the whole window's over the steps it covers, for summaries without per-step figures);
    the share is the exposed time less the waiting for peers (that belongs to the straggler
    or imbalance, not the transfers), of each rank's own step time."""
    comm = [s for s in ranks if s.comm_us > 0 and s.steps]
    if not comm:
        return None

    def held(s: RankSummary) -> tuple[float, float, float, float]:
        """(comm, exposed, waiting, steps) in the steps, or over the window's steps."""
        wait_all = waits.wait.get(s.rank, 0.0) if waits.calls else 0.0
        if len(s.step_comm_us) == s.steps and len(s.step_exposed_comm_us) == s.steps:
            comm_us, exposed = sum(s.step_comm_us), sum(s.step_exposed_comm_us)
            wait = waits.wait_in_steps.get(s.rank, 0.0) if waits.calls else 0.0
            return comm_us, exposed, min(wait, exposed), float(s.steps)
        return s.comm_us, s.exposed_comm_us, min(wait_all, s.exposed_comm_us), _steps_covered(s)

    parts = {s.rank: held(s) for s in comm}
    total = statistics.mean(c / n for c, _, _, n in parts.values())
    exposed = statistics.mean(e / n for _, e, _, n in parts.values())
    wait = statistics.mean(w / n for _, _, w, n in parts.values())
    overlap = 1 - exposed / total if total > 0 else 0.0
    waiting = f", and {wait / total * 100:.0f}% is waiting for other ranks" if wait else ""
    flagged = all(len(s.step_comm_us) == s.steps for s in comm)
    of_step = statistics.mean(_per_step_share(s, parts[s.rank][0], flagged) for s in comm)
    share = statistics.mean(
        _per_step_share(s, parts[s.rank][1] - parts[s.rank][2], flagged) for s in comm
    )
    return _finding(
        "communication",
        f"Collectives take {of_step * 100:.0f}% of a step on average across ranks; "
        f"{overlap * 100:.0f}% of it overlaps compute{waiting}",
        share,
        {
            "communication_step_fraction": of_step,
            "communication_per_step_us": total,
            "exposed_communication_per_step_us": exposed,
            "waiting_for_peers_per_step_us": wait,
            "overlap_with_compute_fraction": overlap,
            "ranks_with_collectives_count": float(len(comm)),
        },
    )


def _diagnosis(
    ranks: Sequence[RankSummary],
    rows: Sequence[RankRow],
    stragglers: Sequence[int],
    waits: _Waits,
    notes: list[str],
) -> Diagnosis:
    """The run's findings: the first straggler, a load imbalance that is not just that
    straggler, and the collectives' exposed time; each rank's own first finding counted."""
    findings: list[Finding | None] = []
    step_us = statistics.median([s.median_step_us for s in ranks if s.median_step_us] or [0.0])
    per_step = {r.rank: r.compute_per_step_us for r in rows if r.compute_per_step_us is not None}
    if step_us > 0:
        if stragglers:
            findings.append(_straggler_finding(ranks, stragglers[0], waits, per_step))
        busiest = max(per_step, key=lambda k: (per_step[k], -k)) if per_step else None
        if (
            len(per_step) >= 2
            and statistics.median(per_step.values()) > 0
            and busiest not in stragglers[:1]
        ):
            findings.append(_imbalance_finding(per_step, step_us))
        findings.append(_communication_finding(ranks, waits, step_us))
    tops: dict[str, int] = defaultdict(int)
    for s in ranks:
        if s.top_findings:
            tops[s.top_findings[0]] += 1
    for kind, count in sorted(tops.items(), key=lambda kv: (-kv[1], kv[0])):
        notes.append(f"{count} of {len(ranks)} ranks: {kind} is the first finding")
    kept = sorted((f for f in findings if f is not None), key=lambda f: (-f.share, f.kind))
    reported = tuple(f for f in kept if f.share >= th.MIN_REPORT_SHARE)
    serious = [f for f in reported if f.severity in ("high", "medium")]
    if serious:
        verdict = f"Main bottleneck across ranks: {serious[0].kind} - {serious[0].title}"
    else:
        verdict = (
            f"Balanced: no rank holds the others back and no cross-rank problem worth "
            f"{th.SEVERITY_MEDIUM_SHARE * 100:.0f}% of a step (see each rank's own "
            "findings below)"
        )
    return Diagnosis(findings=reported, verdict=verdict, considered=tuple(kept), notes=tuple(notes))
