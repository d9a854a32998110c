"""A distributed run read rank by rank (analysis/distributed.py): each rank's numbers against a
plain-JSON computation, who waits for whom, the collectives, and what goes wrong."""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from _paths import SHARED_TRACES

from gpuprof_nb.analysis.distributed import (
    collective_kind,
    combine,
    rank_from_name,
    rank_ranges,
)
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.results.distributed import RankSummary
from gpuprof_nb.session.distributed import summarize_path

DATA = Path(__file__).resolve().parents[1] / "data"
SHARED = SHARED_TRACES / "hta" / "tests" / "data"
GLOO = DATA / "gloo_run"
SLOW_RANK = 1  # tests/data/gloo_run/README.md: slow_rank1 was recorded with --slow-rank 1
NCCL_TRACES = [
    DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz",
    DATA / "a100_nccl" / "nccl_data.json.gz",
    *(
        SHARED / name
        for name in (
            "trace_filter/sampled_rank-1.json.gz",
            "negative_queue_length_values_check/rank0.json.gz",
            "df_index_resolver/df_index_resolver.json.gz",
        )
    ),
]
NCCL_TRACES = [p for p in NCCL_TRACES if p.exists()]


# --- an independent computation from the raw JSON ------------------------------------------


def _events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _union(spans, lo=float("-inf"), hi=float("inf")) -> float:
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo))
    total, cur = 0.0, None
    for s, e in clipped:
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


def _intersection(a, b) -> float:
    """Length of (union of a) intersected with (union of b): |A| + |B| - |A or B|."""
    return _union(a) + _union(b) - _union(list(a) + list(b))


def _span(e: dict) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _gpu_numbers(path: Path) -> dict[str, float]:
    """Busy: the union of kernels, memcpys and memsets; comm: of NCCL kernels; exposed: comm
    less its overlap with the other kernels (one GPU in these traces)."""
    ev = _events(path)
    gpu = [_span(e) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    comm = [_span(e) for e in kernels if "nccl" in e["name"].lower()]
    compute = [_span(e) for e in kernels if "nccl" not in e["name"].lower()]
    return {
        "busy": _union(gpu),
        "comm": _union(comm),
        "compute": _union(compute),
        "exposed": _union(comm) - _intersection(comm, compute),
    }


def _cpu_numbers(path: Path) -> dict[str, float]:
    """On CPU, from the first recorded op or annotation to the end of the last (the
    profiler's own span left out): busy is the union of torch ops; comm of gloo ranges and
    c10d ops; compute of the torch ops neither collectives nor inside one on their thread."""
    ev = _events(path)
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    recorded = [
        _span(e)
        for e in ev
        if e.get("cat") in ("cpu_op", "user_annotation")
        and not e["name"].startswith("PyTorch Profiler")
    ]
    lo, hi = min(s for s, _ in recorded), max(e for _, e in recorded)
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    coll = [e for e in ev if e["name"].startswith(("gloo:", "c10d::"))]

    def inside(e: dict) -> bool:
        return any(
            c["tid"] == e["tid"] and c["ts"] <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"]
            for c in coll
        )

    compute = [_span(e) for e in ops if e not in coll and not inside(e)]
    comm = [_span(e) for e in coll]
    clip = [(max(s, lo), min(e, hi)) for s, e in comm if min(e, hi) > max(s, lo)]
    clip_compute = [(max(s, lo), min(e, hi)) for s, e in compute if min(e, hi) > max(s, lo)]
    return {
        "busy": _union([_span(e) for e in ops], lo, hi),
        "comm": _union(comm, lo, hi),
        "compute": _union(compute, lo, hi),
        "exposed": _union(clip) - _intersection(clip, clip_compute),
        "steps": len(steps),
        "step_median": statistics.median(e["dur"] for e in steps),
        "gloo_calls": sum(e["name"].startswith("gloo:") for e in ev),
    }


# --- per-rank numbers -------------------------------------------------------------------------


@pytest.mark.parametrize("path", NCCL_TRACES, ids=lambda p: p.name)
def test_nccl_rank_numbers_match_the_raw_json(path):
    s = summarize_path(str(path))
    want = _gpu_numbers(path)
    assert not s.error and s.on_device
    assert s.busy_us == pytest.approx(want["busy"], rel=1e-9)
    assert s.comm_us == pytest.approx(want["comm"], rel=1e-9) and s.comm_us > 0
    assert s.compute_us == pytest.approx(want["compute"], rel=1e-9)
    assert s.exposed_comm_us == pytest.approx(want["exposed"], rel=1e-9, abs=1e-6)
    calls = sum(len(d) for _, d in s.collective_calls)
    assert calls == sum(
        1 for e in _events(path) if e.get("cat") == "kernel" and "nccl" in e["name"].lower()
    )


@pytest.mark.parametrize("run", ["slow_rank1", "balanced"])
def test_gloo_rank_numbers_match_the_raw_json(run):
    for path in sorted((GLOO / run).glob("rank-*.json.gz")):
        s = summarize_path(str(path))
        want = _cpu_numbers(path)
        assert not s.error and not s.on_device and s.device == "cpu"
        assert s.rank == int(path.name.split("-")[1].split(".")[0]) and s.world_size == 4
        assert s.busy_us == pytest.approx(want["busy"], rel=1e-9)
        assert s.comm_us == pytest.approx(want["comm"], rel=1e-9) and s.comm_us > 0
        assert s.compute_us == pytest.approx(want["compute"], rel=1e-9)
        assert s.exposed_comm_us == pytest.approx(want["exposed"], rel=1e-9, abs=1e-6)
        assert s.steps == want["steps"] and s.median_step_us == pytest.approx(want["step_median"])
        assert sum(s.step_compute_us) == pytest.approx(s.compute_us, rel=1e-6)
        assert sum(len(d) for _, d in s.collective_calls) == want["gloo_calls"]


def test_message_bytes_and_bus_bandwidth_from_nccl_args():
    path = DATA / "a100_nccl" / "nccl_data.json.gz"
    kernels = [e for e in _events(path) if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    sizes = {"float": 4, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "int8": 1}
    report = combine([summarize_path(str(path))])
    assert {c.name for c in report.collectives} == {"allreduce", "broadcast"}
    for row in report.collectives:
        mine = [e for e in kernels if e["args"]["Collective name"] == row.name]
        want_bytes = sum(
            e["args"]["In msg nelems"] * sizes[e["args"]["dtype"].lower()] for e in mine
        )
        want_time = sum(e["dur"] for e in mine)
        assert row.calls == len(mine) and row.ranks == 1
        assert row.bytes == want_bytes and row.time_us == pytest.approx(want_time)
        assert row.algbw_bytes_per_s == pytest.approx(want_bytes / (want_time * 1e-6))
        # The kernels' group has 2 ranks: an all-reduce's links carry 2(n-1)/n of the
        # message (1x for n=2), a broadcast's the message itself.
        assert row.busbw_bytes_per_s == pytest.approx(row.algbw_bytes_per_s)
    assert report.collectives[0].name == "allreduce"  # most time first


def test_bus_bandwidth_scales_with_the_group():
    s = summarize_path(str(DATA / "a100_nccl" / "nccl_data.json.gz"))
    eight = replace(s, collective_groups=(("allreduce", 8), ("broadcast", 8)))
    rows = {c.name: c for c in combine([eight]).collectives}
    assert rows["allreduce"].busbw_bytes_per_s == pytest.approx(
        rows["allreduce"].algbw_bytes_per_s * 2 * 7 / 8
    )
    assert rows["broadcast"].busbw_bytes_per_s == pytest.approx(rows["broadcast"].algbw_bytes_per_s)


# --- the run: stragglers and findings -----------------------------------------------------


def _run(name: str):
    return combine([summarize_path(str(p)) for p in sorted((GLOO / name).glob("*.json.gz"))])


def test_the_planted_slow_rank_comes_first():
    report = _run("slow_rank1")
    assert report.stragglers[:1] == (SLOW_RANK,)
    kinds = [f.kind for f in report.diagnosis.findings]
    assert "straggler" in kinds
    finding = report.diagnosis.findings[kinds.index("straggler")]
    assert finding.evidence["straggler_rank_count"] == SLOW_RANK
    assert f"Rank {SLOW_RANK} holds the others back" in finding.title
    assert report.diagnosis.findings[0].kind == "straggler"
    # Its peers wait, it does not: its wait is the least.
    waits = {r.rank: r.wait_us for r in report.ranks}
    assert min(waits, key=waits.get) == SLOW_RANK


def test_the_balanced_twin_names_no_straggler():
    report = _run("balanced")
    assert report.stragglers == ()
    assert report.diagnosis.findings[0].kind != "straggler"
    assert "straggler" not in {f.kind for f in report.diagnosis.considered}


def test_shared_two_rank_nccl_run():
    paths = [
        DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz",
        SHARED / "trace_filter" / "sampled_rank-1.json.gz",
    ]
    if not paths[1].exists():
        pytest.skip("../shared/traces is not here")
    report = combine([summarize_path(str(p)) for p in paths])
    assert [r.rank for r in report.ranks] == [0, 1]
    # Their distributedInfo says 128 ranks: the other 126 are named missing, in ranges.
    assert any("126 of 128 ranks are missing (2-127)" in n for n in report.notes)
    assert {c.name for c in report.collectives} and all(r.comm_us > 0 for r in report.ranks)
    assert all(r.wait_us is not None for r in report.ranks)


# --- who waits for whom, on summaries made by hand ---------------------------------------


def _summary(
    rank: int,
    calls: list[float],
    *,
    world: int | None = 3,
    compute: float = 10.0,
    step: float = 100.0,
    steps: int = 10,
    source: str = "",
) -> RankSummary:
    return RankSummary(
        rank=rank,
        source=source or f"rank-{rank}.json",
        world_size=world,
        device="cpu",
        steps=steps,
        median_step_us=step,
        compute_us=compute * steps,
        comm_us=sum(calls),
        exposed_comm_us=sum(calls),
        step_compute_us=(compute,) * steps,
        collective_calls=(("allreduce", tuple(calls)),),
    )


def test_waits_are_time_beyond_the_last_arrival():
    # Three calls: rank 2 is shortest (arrives last) in each.
    runs = [
        _summary(0, [30.0, 40.0, 35.0]),
        _summary(1, [20.0, 50.0, 25.0]),
        _summary(2, [5.0, 10.0, 5.0]),
    ]
    report = combine(runs)
    waits = {r.rank: r.wait_us for r in report.ranks}
    assert waits == {0: 25 + 30 + 30, 1: 15 + 40 + 20, 2: 0}
    assert report.stragglers == (2,)


def test_the_straggler_finding_counts_what_the_peers_wait():
    runs = [
        _summary(0, [30.0, 40.0, 35.0], compute=10.0),
        _summary(1, [20.0, 50.0, 25.0], compute=10.0),
        _summary(2, [5.0, 10.0, 5.0], compute=30.0),
    ]
    (f,) = [f for f in combine(runs).diagnosis.findings if f.kind == "straggler"]
    # Beyond rank 2's call: (25 + 15) + (30 + 40) + (30 + 20) us, over 2 peers and 10 steps.
    assert f.evidence["peers_wait_per_step_us"] == pytest.approx(160 / 2 / 10)
    assert f.share == pytest.approx(8 / 100)
    assert f.evidence["compute_per_step_us"] == 30.0
    assert f.evidence["median_compute_per_step_us"] == 10.0
    assert "3.00x the median rank's" in f.title


def test_clocks_do_not_matter():
    # Durations only: shifting one rank's timestamps changes nothing. Summaries carry no
    # timestamps at all, so the same summaries give the same report whatever the clocks.
    runs = [
        _summary(0, [30.0, 40.0, 35.0, 33.0]),
        _summary(1, [31.0, 41.0, 30.0, 38.0]),
        _summary(2, [35.0, 32.0, 36.0, 34.0]),
    ]
    assert combine(runs).stragglers == ()  # no rank shorter in most calls


def test_a_small_lead_is_not_a_straggler():
    # Rank 2 is always shortest, but by 1 us in a 100 us step: below the 5% bar.
    runs = [_summary(0, [30.0] * 4), _summary(1, [30.0] * 4), _summary(2, [29.0] * 4)]
    assert combine(runs).stragglers == ()


def test_too_few_calls_say_so():
    runs = [_summary(0, [30.0, 30.0]), _summary(1, [30.0, 30.0]), _summary(2, [1.0, 1.0])]
    report = combine(runs)
    assert report.stragglers == ()
    assert any("too few to tell who waits for whom" in n for n in report.notes)


def test_load_imbalance_without_a_straggler():
    runs = [
        _summary(0, [30.0] * 4, compute=10.0),
        _summary(1, [30.0] * 4, compute=20.0),
        _summary(2, [30.0] * 4, compute=12.0),
    ]
    report = combine(runs)
    (imbalance,) = [f for f in report.diagnosis.findings if f.kind == "load_imbalance"]
    assert imbalance.evidence["compute_spread_ratio"] == pytest.approx((20 - 10) / 12)
    assert imbalance.share == pytest.approx((20 - 12) / 100)


def test_per_rank_first_findings_are_counted():
    runs = [
        replace(_summary(r, [30.0] * 4), top_findings=(kind,))
        for r, kind in enumerate(["dataloader", "dataloader", "host_sync"])
    ]
    notes = combine(runs).diagnosis.notes
    assert "2 of 3 ranks: dataloader is the first finding" in notes
    assert "1 of 3 ranks: host_sync is the first finding" in notes


# --- bad input -----------------------------------------------------------------------------


def test_world_sizes_disagree():
    runs = [
        _summary(0, [1.0], world=2, source="a/rank-0.json"),
        _summary(1, [1.0], world=4, source="b/rank-1.json"),
    ]
    with pytest.raises(
        GpuprofError,
        match=r"different runs.*world size 2: rank-0\.json; "
        r"world size 4: rank-1\.json",
    ):
        combine(runs)


def test_duplicate_ranks_name_both_files():
    runs = [_summary(0, [1.0], source="x/rank-0.json"), _summary(0, [1.0], source="y/worker0.json")]
    with pytest.raises(
        GpuprofError,
        match=r"rank 0 is given twice: x/rank-0\.json and "
        r"y/worker0\.json",
    ):
        combine(runs)


def test_missing_and_unreadable_ranks_are_named(tmp_path):
    bad = tmp_path / "rank-1.json"
    bad.write_text("{not json")
    failed = summarize_path(str(bad))
    assert failed.rank == 1 and "rank-1.json" in failed.source and failed.error
    report = combine([_summary(0, [30.0] * 3, world=4), failed, _summary(3, [30.0] * 3, world=4)])
    assert [r.rank for r in report.ranks] == [0, 3]
    assert report.failures and str(bad) in report.failures[0]
    assert any("2 of 4 ranks are missing (1-2)" in n for n in report.notes)
    assert any("could not be read" in n for n in report.notes)


def test_no_rank_readable(tmp_path):
    bad = tmp_path / "rank-0.json"
    bad.write_text("[]")
    with pytest.raises(GpuprofError, match="no rank could be read"):
        combine([summarize_path(str(bad))])


def test_names_and_kinds():
    assert rank_from_name("run/rank-3.json.gz") == 3
    assert rank_from_name("worker12.pt.trace.json") == 12
    assert rank_from_name("host_rank_7.1712.pt.trace.json") == 7
    assert rank_from_name("trace.json") is None
    assert collective_kind("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == "allreduce"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)") == "reducescatter"
    assert collective_kind("ncclDevKernel_AllGather_RING_LL(x)") == "allgather"
    assert collective_kind("gloo:all_reduce") == "allreduce"
    assert collective_kind("c10d::allreduce_") == "allreduce"
    assert collective_kind("c10d::_allgather_base_") == "allgather"
    assert rank_ranges([4, 0, 2, 3, 7]) == "0, 2-4, 7"


# --- per-step figures over the steps their numerator covers (issue 32) -----------------------


def _few_steps(rank: int, calls: list[float], in_step: list[bool] | None) -> RankSummary:
    """A rank that annotated 2 steps of 100 us but ran collectives over a 2 ms window."""
    base = _summary(rank, calls, steps=2, step=100.0, compute=10.0)
    extra = {}
    if in_step is not None:
        extra = {
            "collective_in_step": (("allreduce", tuple(in_step)),),
            "steps_us": 200.0,
            "step_comm_us": (sum(c for c, i in zip(calls, in_step, strict=True) if i) / 2,) * 2,
            "step_exposed_comm_us": (sum(c for c, i in zip(calls, in_step, strict=True) if i) / 2,)
            * 2,
        }
    return replace(base, window_us=2000.0, comm_us=sum(calls), exposed_comm_us=sum(calls), **extra)


@pytest.mark.parametrize("marked", [True, False], ids=["calls-marked", "window-only"])
def test_no_figure_passes_a_whole_step_when_the_steps_hold_few_calls(marked: bool) -> None:
    """Collectives all over a 2 ms window, but only 2 steps of 100 us annotated: the peers'
    wait was summed over every call and divided by the 2 steps ("128% of a step"). Now it
    counts the calls inside the steps (or divides by the steps the window covers)."""
    from gpuprof_nb.results.invariants import impossible, step_percents

    calls_slow = [5.0] * 20
    calls_peer = [60.0] * 20
    in_step = [k in (3, 12) for k in range(20)] if marked else None
    runs = [
        _few_steps(0, calls_peer, in_step),
        _few_steps(1, calls_peer, in_step),
        _few_steps(2, calls_slow, in_step),
    ]
    report = combine(runs)
    assert report.stragglers == (2,)
    straggler = report.diagnosis.finding("straggler")
    assert straggler is not None
    for f in report.diagnosis.considered:
        assert 0.0 <= f.share <= 1.0, f
        assert all(p <= 100 for p in step_percents(f.title)), f.title
    assert impossible(report) == []
    wait = straggler.evidence["peers_wait_per_step_us"]
    if marked:
        # 2 calls in the steps, 55 us beyond rank 2's each, over 2 steps.
        assert wait == pytest.approx(55.0)
        assert straggler.evidence["peers_wait_step_fraction"] == pytest.approx(110 / 200)
    else:
        # All 20 calls over the 2000 / 100 = 20 steps the window covers.
        assert wait == pytest.approx(55.0)
        assert straggler.evidence["peers_wait_step_fraction"] == pytest.approx(1100 / 2000)
    comm = report.diagnosis.finding("communication")
    assert comm is None or comm.evidence["communication_step_fraction"] <= 1.0


def test_summaries_mark_the_calls_inside_steps() -> None:
    """A real gloo run: each call is marked in or out of a step, and the per-step comm adds
    up to no more than the steps hold."""
    paths = sorted(GLOO.rglob("*.json.gz"))
    assert paths
    for path in paths:
        s = summarize_path(str(path))
        assert not s.error, s.error
        marks = dict(s.collective_in_step)
        for kind, durs in s.collective_calls:
            assert len(marks[kind]) == len(durs)
        assert len(s.step_comm_us) == s.steps == len(s.step_exposed_comm_us)
        assert sum(s.step_comm_us) <= s.steps_us + 1e-6
        assert all(
            e <= c + 1e-6 for e, c in zip(s.step_exposed_comm_us, s.step_comm_us, strict=True)
        )
