"""Smoke tests for benchmarks/: the scripts run on tiny inputs and their generators write
what they claim. No timing asserts (benchmarks are not tests)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.measure import run_child  # noqa: E402
from benchmarks.snapshot_analysis import write_synthetic_snapshot  # noqa: E402
from benchmarks.trace_analysis import replicate_trace  # noqa: E402

DATA = REPO / "tests" / "data"


def _small_traces(n: int) -> list[Path]:
    """The n smallest real GPU traces copied into tests/data (skip when none are there)."""
    found = sorted(
        (p for p in DATA.rglob("*.json.gz") if "memory_timeline" not in p.name),
        key=lambda p: p.stat().st_size,
    )
    with_kernels = [p for p in found if b'"kernel"' in gzip.decompress(p.read_bytes())]
    if len(with_kernels) < n:
        pytest.skip("needs real traces with kernels under tests/data")
    return with_kernels[:n]


def _small_trace_with_steps() -> Path:
    """The smallest real GPU trace in tests/data with kernels and ProfilerStep#N steps."""
    for path in sorted(DATA.rglob("*.json.gz"), key=lambda p: p.stat().st_size):
        raw = gzip.decompress(path.read_bytes())
        if b'"kernel"' in raw and b"ProfilerStep#" in raw:
            return path
    pytest.skip("needs a real trace with kernels and steps under tests/data")


def _doc(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _events(path: Path) -> list[dict]:
    return _doc(path)["traceEvents"]


def test_replicated_trace_shifts_time_and_ids(tmp_path: Path) -> None:
    source = _small_trace_with_steps()
    original = _events(source)
    timed = [e for e in original if e.get("ph") != "M"]
    # The target is the whole file: the header and metadata once, then 3 copies at least.
    out = replicate_trace(
        source, tmp_path / "big.json", len(json.dumps(_doc(source))) + 3 * len(json.dumps(timed))
    )
    events = _events(out)
    copies = [e for e in events if e.get("ph") != "M"]
    assert len(copies) >= 3 * len(timed)
    # The copy k of event i is event i shifted by k spans, with ids offset by k id-steps.
    first, second = copies[: len(timed)], copies[len(timed) : 2 * len(timed)]
    # The same events by name, but for the steps: the second copy's are numbered after the
    # first's, as one longer run would number them.
    step = re.compile(r"ProfilerStep#(\d+)$")
    numbers = [int(m.group(1)) for e in first if (m := step.match(str(e.get("name"))))]
    assert numbers, "the source trace has ProfilerStep annotations"
    count = max(numbers) - min(numbers) + 1

    def renumbered(name: str) -> str:
        m = step.match(name)
        return f"ProfilerStep#{int(m.group(1)) + count}" if m else name

    assert [renumbered(e["name"]) for e in first] == [e["name"] for e in second]
    shifts = {b["ts"] - a["ts"] for a, b in zip(first, second, strict=True) if "ts" in a}
    assert len(shifts) == 1 and shifts.pop() > 0
    corr = [
        e["args"]["correlation"]
        for e in copies
        if e.get("cat") == "kernel" and "correlation" in e.get("args", {})
    ]
    assert len(corr) == len(set(corr)), "correlation ids must stay unique across copies"
    # Independent count: kernels in the source times the full copies written.
    full = len(copies) // len(timed)
    kernels_src = sum(1 for e in timed if e.get("cat") == "kernel")
    kernels_out = sum(1 for e in copies[: full * len(timed)] if e.get("cat") == "kernel")
    assert kernels_out == full * kernels_src


def test_replicated_trace_loads_with_gpuprof(tmp_path: Path) -> None:
    from gpuprof_nb.io.trace import load_trace

    source = _small_trace_with_steps()
    events = _events(source)
    timed = [e for e in events if e.get("ph") != "M"]
    out = replicate_trace(
        source, tmp_path / "big.json", len(json.dumps(_doc(source))) + 2 * len(json.dumps(timed))
    )
    expected = sum(1 for e in _events(out) if e.get("ph") == "X" and e.get("cat") == "kernel")
    trace, source_trace = load_trace(out), load_trace(source)
    assert len(trace.kernels) == expected
    # Each copy's steps are steps of their own, as long as the source's.
    assert len(trace.steps) >= 2 * len(source_trace.steps) > 0
    assert len({s.number for s in trace.steps}) == len(trace.steps)
    durations = [s.dur_us for s in source_trace.steps]
    assert [s.dur_us for s in trace.steps[: 2 * len(durations)]] == pytest.approx(durations * 2)


def _replay(entries: list[dict]) -> tuple[int, int, set[int]]:
    """Independent replay: (peak live bytes, final live bytes, live addresses)."""
    live: dict[int, int] = {}
    now = peak = 0
    for e in entries:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            now += e["size"]
            peak = max(peak, now)
        elif e["action"] == "free_completed":
            now -= live.pop(e["addr"])
    return peak, now, set(live)


def test_synthetic_snapshot_is_consistent(tmp_path: Path) -> None:
    path = write_synthetic_snapshot(tmp_path / "s.pickle", 300_000)
    with open(path, "rb") as fh:
        snap = pickle.load(fh)
    assert set(snap) >= {"segments", "device_traces"}
    entries = snap["device_traces"][0]
    assert entries and all(
        set(e) == {"action", "addr", "size", "stream", "time_us", "frames"} for e in entries
    )
    times = [e["time_us"] for e in entries]
    assert times == sorted(times)
    frame = entries[1]["frames"][0]
    assert set(frame) == {"filename", "line", "name"}
    _, final, live_addrs = _replay(entries)
    blocks = [b for s in snap["segments"] for b in s["blocks"]]
    active = {b["address"]: b["size"] for b in blocks if b["state"] == "active_allocated"}
    # What the history left live is exactly what the segments show as allocated, plus
    # the parameters allocated before recording (absent from the history).
    assert live_addrs <= set(active)
    params = {a: s for a, s in active.items() if a not in live_addrs}
    assert sum(active.values()) - sum(params.values()) == final
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(
            b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"
        )


def test_synthetic_snapshot_peak_matches_gpuprof(tmp_path: Path) -> None:
    from gpuprof_nb.analysis.memory import analyze_snapshot
    from gpuprof_nb.io.snapshot import load_snapshot

    path = write_synthetic_snapshot(tmp_path / "s.pickle", 200_000)
    with open(path, "rb") as fh:
        snap = pickle.load(fh)
    peak, _, live_addrs = _replay(snap["device_traces"][0])
    params = sum(
        b["size"]
        for s in snap["segments"]
        for b in s["blocks"]
        if b["state"] == "active_allocated" and b["address"] not in live_addrs
    )
    result = analyze_snapshot(load_snapshot(path))
    assert result.timeline.peak_bytes == peak + params


def test_child_reports_work_and_memory(tmp_path: Path) -> None:
    source = _small_traces(1)[0]
    run = run_child(sys.executable, "json-floor", str(source), cap_bytes=4 * 2**30)
    assert run.facts["events"] == len(_events(source))
    assert run.peak_rss_bytes >= run.baseline_rss_bytes > 0
    assert run.seconds >= 0


def test_child_failure_is_reported_not_raised_as_crash(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RuntimeError, match="exit 1"):
        run_child(sys.executable, "json-floor", str(bad), cap_bytes=4 * 2**30)


def test_run_quick_writes_results(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for p in _small_traces(2):
        shutil.copy(p, traces / p.name)
    out = tmp_path / "RESULTS.md"
    env = dict(os.environ, KINETO_LOG_LEVEL="6", MPLBACKEND="Agg")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "overhead,accuracy,traces,json,snapshots,training,samplers,modules,lines,gcpause",
            "--traces-dir",
            str(traces),
            "--hta-python",
            str(tmp_path / "no-hta"),
            "--big-trace-mb",
            "1",
            "--big-snapshot-mb",
            "1",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for title in (
        "1. Overhead",
        "2. Timing accuracy",
        "3. Trace analysis",
        "JSON library choice",
        "4. Snapshot analysis",
        "10. %%gpuprofile on a real training cell",
        "11. Samplers beside the profiled run",
        "13. Module ranges beside the profiled run",
        "16. Exact line events against the line sampler",
        "17. The garbage collector paused while loading",
    ):
        assert f"## {title}" in text
    assert "This comparison failed" not in text
    assert "| cell | variant | profiled run | vs none | cell thread off the CPU, added |" in text
    assert "cell thread kept off the CPU, added to the profiled run (worst cell)" in text
    assert "HTA venv not available" in text
    for p in traces.iterdir():
        assert f"`{p.name}`" in text
    # Section 1 has the %%timeit column and its target; section 3 shows gpuprof_nb's stages;
    # section 10 shows what the magic adds after the profiled run.
    assert "%%timeit (same runs)" in text
    assert "--timing-only fixed cost per cell vs %%timeit (same runs), worst workload" in text
    assert "| gpuprof_nb load | analyze | display | (analyze + display) / load |" in text
    assert "what the magic adds after the profiled run, share of that run" in text
    for stage in ("export", "load", "analyze", "display"):
        assert f"| {stage} | " in text


@pytest.mark.slow
def test_notebook_weight_counts_outputs() -> None:
    from benchmarks.notebook_weight import MEASURED, cell_weight, execute_notebook

    nb = execute_notebook(timeout_s=300)
    for index in MEASURED:
        weight = cell_weight(nb, index)
        # Independent: the JSON of the cell's outputs alone is part of what the cell adds.
        outputs_json = len(json.dumps(nb.cells[index].outputs))
        assert weight["in_cell"] >= outputs_json * 0.9
        assert weight["total"] > 0


def test_reuse_reads_the_sections_and_targets_of_an_earlier_results_file() -> None:
    """--reuse on a fresh clone (no benchmarks/.cache) keeps the sections RESULTS.md holds:
    read back, they render to the same text."""
    from benchmarks.config import BenchConfig, Section, Target
    from benchmarks.run import render_results, sections_in_results

    cfg = BenchConfig(traces_dir=REPO, cache_dir=REPO, hta_python=None)
    made = [
        Section(
            "1. A",
            "body | with a pipe\n\n| t | x |\n|---|---|",
            (Target("speed", "2.0x", ">= 1x", True), Target("mem", "1 MB", "< 2", None)),
        ),
        Section("B", "no targets here"),
        Section("2. C", "text", (Target("x", "3", "5", False),)),
    ]
    text = render_results(cfg, made, "cmd", 1.0)
    again = sections_in_results(text)
    assert list(again) == ["1. A", "B", "2. C"]
    assert [again[s.title] for s in made] == made


def test_a_rewrite_keeps_the_hand_written_sections_of_the_results_file() -> None:
    """The hand-written sections (HAND_WRITTEN) of the file run.py rewrites come back as they
    are, after the comparisons; RESULTS.md's own parse back and render to the same text."""
    from benchmarks.config import BenchConfig, Section
    from benchmarks.run import HAND_WRITTEN, hand_written_sections, render_results

    cfg = BenchConfig(traces_dir=REPO, cache_dir=REPO, hta_python=None)
    hand = Section(HAND_WRITTEN[0], "Why.\n\n| id | measured |\n|---|---|\n| M1 | 3x |")
    before = render_results(cfg, [Section("1. A", "text"), hand], "cmd", 1.0)
    assert hand_written_sections(before) == [hand]
    after = render_results(cfg, [Section("1. A", "new"), *hand_written_sections(before)], "c", 1)
    assert after.endswith(f"## {hand.title}\n\n{hand.markdown}\n")
    assert f'hand-written section "{hand.title}"' in after
    assert "hand-written" not in render_results(cfg, [Section("1. A", "text")], "cmd", 1.0)
    results = (REPO / "benchmarks" / "RESULTS.md").read_text()
    kept = hand_written_sections(results)
    assert [s.title for s in kept] == list(HAND_WRITTEN)
    assert all(f"## {s.title}\n\n{s.markdown}\n" in results for s in kept)


def test_distributed_run_copies_rewrite_the_rank(tmp_path: Path) -> None:
    from benchmarks.distributed_runs import write_run

    source = DATA / "a100_nccl" / "nccl_data.json.gz"
    out = write_run(source, tmp_path / "run", 3)
    docs = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]
    assert [d["distributedInfo"]["rank"] for d in docs] == [0, 1, 2]
    assert {d["distributedInfo"]["world_size"] for d in docs} == {3}
    assert all(d["traceEvents"] == _events(source) for d in docs)
    # Both worker counts and the coordinator's memory come back from the child.
    run = run_child(sys.executable, "gpuprof-run-2", str(out), cap_bytes=4 * 2**30)
    assert run.facts["ranks"] == 3 and run.facts["failures"] == 0
    assert len(set(run.facts["busy_us"])) == 1  # the same trace three times
    assert run.facts["coordinator_peak_rss_bytes"] >= run.baseline_rss_bytes > 0


def test_child_runs_gpuprof_end_to_end(tmp_path: Path) -> None:
    """The gpuprof-trace child times load_trace, analyze and the displayed bundle, one stage
    each, and the stages add up to its time."""
    source = _small_traces(1)[0]
    run = run_child(sys.executable, "gpuprof-trace", str(source), cap_bytes=4 * 2**30)
    assert list(run.stages) == ["load", "analyze", "display"]
    assert run.seconds == pytest.approx(sum(run.stages.values()))
    kernels = sum(1 for e in _events(source) if e.get("cat") == "kernel" and e.get("ph") == "X")
    assert run.facts["kernels"] == kernels
    assert run.facts["bundle_chars"]["text/html"] > 0
    assert run.facts["bundle_chars"]["text/plain"] > 0


def _outcome(label: str, stages: list[dict[str, float]]) -> object:
    from benchmarks.measure import Outcome, Run

    return Outcome(label, tuple(Run(sum(s.values()), 100, 10, s) for s in stages))


def test_trace_targets_judge_end_to_end_speed_and_what_follows_the_load() -> None:
    from benchmarks import trace_analysis as ta

    def row(
        mb: int, ours: list[dict[str, float]], hta: list[float], big: bool = False
    ) -> dict[str, object]:
        r = {
            "path": Path(f"t{mb}.json"),
            "bytes": mb * 2**20,
            "big": big,
            "ours": _outcome("gpuprof_nb", ours),
            "hta": _outcome("HTA", [{"load": h} for h in hta]),
            "floor": _outcome("json.load", [{"json.load": 1.0} for _ in hta]),
        }
        r.update(
            speedup=ta._time_ratio(r["hta"], r["ours"]),
            vs_floor=ta._time_ratio(r["ours"], r["floor"]),
            mem_ratio=1.0,
            after_load=ta._after_load_ratio(r["ours"]),
        )
        return r

    fast = row(10, [{"load": 0.5, "analyze": 0.2, "display": 0.1}] * 3, [6.0] * 3)
    # Per run: (0.3 + 0.2) / 0.4 = 1.25 after the load; HTA 2.4 s / 0.9 s = 2.67x.
    slow = row(20, [{"load": 0.4, "analyze": 0.3, "display": 0.2}] * 3, [2.4] * 3)
    small = row(1, [{"load": 0.1, "analyze": 1.0, "display": 1.0}], [0.1])  # not judged
    big = row(1024, [{"load": 10.0, "analyze": 4.0, "display": 1.0}], [120.0], big=True)
    targets = {t.name: t for t in ta._targets([fast, slow, small], [big])}
    speed = targets["end-to-end speed vs HTA (traces >= 5 MB, worst)"]
    assert speed.met is False and speed.measured.startswith("2.67x") and "t20" in speed.measured
    large = targets["end-to-end speed vs HTA on the large trace (1024 MB)"]
    assert large.met is False and large.measured.startswith("8.00x")
    after = targets["analysis + display vs load time (traces >= 5 MB, worst)"]
    assert after.met is False and after.measured.startswith("1.25x")
    assert targets["every real trace analysed"].met is True
    # The stage table lists every judged trace (>= 5 MB), the large one included.
    table = "\n".join(
        ta._stage_table(
            [fast, slow, small, big],
            ta.BenchConfig(traces_dir=Path("."), cache_dir=Path("."), hta_python=None),
        )
    )
    assert "`t10.json`" in table and "`t20.json`" in table and "`t1024.json`" in table
    assert "`t1.json`" not in table
    met = {t.name: t.met for t in ta._targets([fast], [])}
    assert met["end-to-end speed vs HTA (traces >= 5 MB, worst)"] is True  # 7.5x
    assert met["analysis + display vs load time (traces >= 5 MB, worst)"] is True  # 0.6x


def test_overhead_targets_judge_2_percent_from_20_ms_and_timing_only_against_timeit() -> None:
    from benchmarks import overhead as oh

    def timings(bare: float, timeit: list[float], timing: list[float]) -> object:
        n = len(timing)
        cells = {
            label: [bare] * n
            for label in (
                oh.BARE,
                oh.PRINTED,
                oh.FLOOR,
                oh.TIMING_QUIET,
                oh.HAND,
                oh.FULL,
                oh.FULL_QUIET,
            )
        }
        cells[oh.TIMEIT] = [bare + x for x in timeit]
        cells[oh.TIMING] = [bare + x for x in timing]
        return oh.Timings(cells, cells, 4, "--warmup 1 --number 1")

    long_cell = timings(0.040, [0.0005] * 8, [0.0004] * 8)  # +1.0%, less than %%timeit
    short_cell = timings(0.009, [0.0003] * 8, [0.0006] * 8)  # +6.7%, more than %%timeit
    two = oh._timing_targets({"long": long_cell, "short": short_cell})
    assert [t.met for t in two] == [True, None]
    assert "20 ms or more" in two[0].name and "not judged" in two[1].measured
    worst = oh._timeit_target({"long": long_cell, "short": short_cell})
    assert worst.met is False and worst.measured.startswith("short:")
    assert oh._timeit_target({"long": long_cell}).met is True


def test_training_cell_stages_come_from_the_hooked_calls() -> None:
    from benchmarks.training_cell import _call

    ms = 1_000_000
    cell = {
        "start": 0,
        "end": 300 * ms,
        "events": [
            ("profiler enter", 100 * ms, 102 * ms),
            ("profiler exit", 202 * ms, 210 * ms),
            ("load", 220 * ms, 240 * ms),
            ("analyze", 245 * ms, 275 * ms),
            ("display", 280 * ms, 290 * ms),
        ],
    }
    call = _call(cell)
    assert call.before_s == pytest.approx(0.100)
    assert call.profiled_s == pytest.approx(0.100)  # 102 -> 202 ms
    assert call.stages["export"] == pytest.approx(0.018)  # 202 -> 220 ms
    assert call.stages["load"] == pytest.approx(0.020)
    assert call.stages["analyze"] == pytest.approx(0.030)
    assert call.stages["display"] == pytest.approx(0.010)
    assert call.after_s == pytest.approx(0.098)  # 202 -> 300 ms
    assert call.stages["other"] == pytest.approx(0.020)


def test_samplers_leave_pyinstrument_out_when_it_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Section 11 runs without pyinstrument: its variants are left out, with a note and an
    unjudged target row instead."""
    from benchmarks import samplers

    monkeypatch.setitem(sys.modules, "pyinstrument", None)  # import raises ImportError
    assert samplers.pyinstrument_version() is None
    variants = samplers._variants()
    assert samplers.NONE in variants
    assert not set(samplers.PYI_INTERVALS) & set(variants)
    blocks = samplers._blocks(variants)
    assert samplers.NONE in blocks[samplers.JUDGED_BLOCK]
    assert samplers.NONE in blocks[samplers.INFO_BLOCK]
    cells = {
        "cell": {
            "blocks": {
                block: {"inner": {v: [1] for v in labels}, "pyfunc": {}}
                for block, labels in blocks.items()
            },
            "bare": {},
        }
    }
    assert "pyinstrument is not installed" in samplers._pyinstrument_lines(cells)[0]
    (row,) = samplers._pyinstrument_targets(cells, {})
    assert row.met is None and "not installed" in row.measured


def test_off_cpu_added_is_per_round_over_the_reference_run() -> None:
    from benchmarks import samplers

    cells = {
        "off_cpu": {samplers.NONE: [10, 20, 5], "x": [15, 20, 1]},
        "inner": {samplers.NONE: [100, 200, 50]},
    }
    assert samplers._off_cpu_added(cells, "x") == pytest.approx([0.05, 0.0, -0.08])


def test_samplers_split_the_variants_into_a_judged_an_informational_and_a_default_block() -> None:
    from benchmarks import samplers as sm
    from benchmarks.config import BenchConfig

    every = [
        sm.NONE,
        sm.LINE_SIGNAL,
        sm.LINE_THREAD,
        sm.UTIL_10,
        sm.UTIL_20,
        sm.BOTH,
        sm.IDLE,
        sm.ALARM,
        sm.PYI_1,
        sm.PYI_3,
    ]
    blocks = sm._blocks(every)
    assert list(blocks) == [sm.JUDGED_BLOCK, sm.INFO_BLOCK, sm.DEFAULT_BLOCK]
    assert blocks[sm.JUDGED_BLOCK] == [sm.NONE, sm.LINE_SIGNAL, sm.UTIL_20, sm.BOTH]
    assert blocks[sm.INFO_BLOCK] == [
        sm.NONE,
        sm.LINE_THREAD,
        sm.UTIL_10,
        sm.IDLE,
        sm.ALARM,
        sm.PYI_1,
        sm.PYI_3,
    ]
    # The magic's default mode: the utilisation sampler alone, profiled without stacks.
    assert blocks[sm.DEFAULT_BLOCK] == [sm.NONE, sm.UTIL_20]
    assert [sm._stack(b) for b in blocks] == [True, True, False]
    # Where signal mode is impossible, the thread-mode line sampler is the judged one.
    no_signal = sm._blocks(v for v in every if v not in (sm.LINE_SIGNAL, sm.ALARM))
    assert no_signal[sm.JUDGED_BLOCK] == [sm.NONE, sm.LINE_THREAD, sm.UTIL_20, sm.BOTH]
    assert sm.LINE_THREAD not in no_signal[sm.INFO_BLOCK]
    assert no_signal[sm.DEFAULT_BLOCK] == [sm.NONE, sm.UTIL_20]
    # No default-mode block without the utilisation sampler every 20 ms.
    assert sm.DEFAULT_BLOCK not in sm._blocks(v for v in every if v != sm.UTIL_20)
    # A full run's profiled calls per cell: the two --stack blocks stay about the 10
    # variants x 11 rounds of before the split; the default-mode block adds 2 x 41 = 82
    # (~10 min more in all, most of it the tiny-ops cell's ~6 s calls).
    assert sm.JUDGED_ROUNDS > 11 > sm.INFO_ROUNDS >= 4
    assert abs(4 * sm.JUDGED_ROUNDS + 7 * sm.INFO_ROUNDS - 110) <= 5
    assert sm.DEFAULT_ROUNDS == 41 > 2 * sm.JUDGED_ROUNDS
    assert 4 * sm.JUDGED_ROUNDS + 7 * sm.INFO_ROUNDS + 2 * sm.DEFAULT_ROUNDS == 193
    # The informational rounds are spread among the judged ones, not bunched at one end.
    order = sm._schedule(19, 5, 0)
    assert order.count(sm.JUDGED_BLOCK) == 19 and order.count(sm.INFO_BLOCK) == 5
    spots = [k for k, block in enumerate(order) if block == sm.INFO_BLOCK]
    assert spots[0] > 0 and spots[-1] < len(order) - 1
    assert max(b - a for a, b in zip(spots, spots[1:], strict=False)) <= 6
    assert sm._schedule(3, 0, 0) == [sm.JUDGED_BLOCK] * 3
    assert sm._schedule(1, 1, 0).count(sm.INFO_BLOCK) == 1
    # With the default-mode rounds too: each count exact, the same order every time, and
    # both blocks' rounds spread among the judged ones.
    order = sm._schedule(19, 5, 41)
    assert order == sm._schedule(19, 5, 41)
    assert [order.count(b) for b in blocks] == [19, 5, 41]
    judged_at = [k for k, block in enumerate(order) if block == sm.JUDGED_BLOCK]
    gaps = list(zip([-1, *judged_at], [*judged_at, len(order)], strict=True))
    for block in (sm.INFO_BLOCK, sm.DEFAULT_BLOCK):
        spots = [k for k, b in enumerate(order) if b == block]
        # How many before the first judged round, between each two, after the last.
        between = [sum(1 for k in spots if a < k < b) for a, b in gaps]
        assert max(between) - min(between) <= 2, (block, between)
        assert max(between) <= 3, (block, between)
    info_at = [k for k, b in enumerate(order) if b == sm.INFO_BLOCK]
    assert judged_at[0] < info_at[0] and info_at[-1] < judged_at[-1]
    assert sm._schedule(1, 1, 1) == [sm.JUDGED_BLOCK, sm.INFO_BLOCK, sm.DEFAULT_BLOCK]
    assert sm._schedule(2, 0, 4).count(sm.DEFAULT_BLOCK) == 4

    def cfg(quick: bool, repeats: int) -> BenchConfig:
        return BenchConfig(
            traces_dir=Path("."), cache_dir=Path("."), hta_python=None, quick=quick, repeats=repeats
        )

    assert sm._round_counts(cfg(False, 3)) == (sm.JUDGED_ROUNDS, sm.INFO_ROUNDS, sm.DEFAULT_ROUNDS)
    assert sm._round_counts(cfg(True, 1)) == (1, 1, 1)
    assert sm._round_counts(cfg(True, 2)) == (2, 2, 2)


def test_samplers_section_runs_each_block_its_rounds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """measure_cells with the profiled and bare calls stubbed: every judged variant runs in
    the judged block's rounds, the others in the informational block's (none in both), and
    none and the utilisation sampler every 20 ms again in the default-mode block's, profiled
    with stack=False (the others with stack=True), each after one untimed call; the
    section's rows say how many rounds each has, the line sampler's target reads from the
    judged block and the utilisation sampler's from the default-mode block, its judged-block
    rows (with --stack) shown as informational targets."""
    from benchmarks import samplers as sm
    from benchmarks.config import BenchConfig

    every = [
        sm.NONE,
        sm.LINE_SIGNAL,
        sm.LINE_THREAD,
        sm.UTIL_10,
        sm.UTIL_20,
        sm.BOTH,
        sm.IDLE,
        sm.ALARM,
        sm.PYI_1,
        sm.PYI_3,
    ]
    # Run inside the profiler (ns): +2% for the line sampler, +1% for the utilisation
    # sampler, +3% for both (+2% on top of the utilisation sampler alone), +5% for the rest;
    # in default mode (no stacks) +0.5% for the utilisation sampler, whose cell thread is
    # kept off the CPU +0.3% of the run longer there (+0% with stacks).
    inner_ns = {sm.NONE: 100_000, sm.LINE_SIGNAL: 102_000, sm.UTIL_20: 101_000, sm.BOTH: 103_020}
    calls: list[tuple[str, bool | None]] = []  # (variant, stack); stack None: a bare run

    def fake_call(code: object, ns: object, samplers: list, stack: bool = True) -> tuple:
        label = samplers[0][1] if samplers else sm.NONE
        calls.append((label, stack))
        records = {key: {"ts_us": [1.0, 2.0], "notes": ["noted"]} for key, _ in samplers}
        default_util = not stack and label == sm.UTIL_20
        return (
            100_500 if default_util else inner_ns.get(label, 105_000),
            200_000,
            records,
            (10, 4 if samplers else 8),
            1_300 if default_util else 1_000,
        )

    def fake_bare_call(code: object, ns: object, samplers: list) -> tuple:
        calls.append(("bare: " + (samplers[0][1] if samplers else sm.NONE), None))
        return 100_000, {}

    monkeypatch.setattr(
        sm,
        "_variants",
        lambda: {
            label: (lambda code, label=label: [] if label == sm.NONE else [("samples", label)])
            for label in every
        },
    )
    monkeypatch.setattr(sm, "_call", fake_call)
    monkeypatch.setattr(sm, "_bare_call", fake_bare_call)
    monkeypatch.setattr(sm, "CELLS", {"tiny": ("x = {n}\n", 1, 1)})
    monkeypatch.setattr(sm, "pyinstrument_version", lambda: "stub")
    cfg = BenchConfig(traces_dir=tmp_path, cache_dir=tmp_path, hta_python=None, quick=True)
    judged_n, info_n, default_n = 6, 2, 3
    cells, notes = sm.measure_cells(cfg, judged_n, info_n, default_n)

    judged = [sm.NONE, sm.LINE_SIGNAL, sm.UTIL_20, sm.BOTH]
    informational = [sm.NONE, sm.LINE_THREAD, sm.UTIL_10, sm.IDLE, sm.ALARM, sm.PYI_1, sm.PYI_3]
    default = [sm.NONE, sm.UTIL_20]
    profiled = [(label, stack) for label, stack in calls if stack is not None]
    # One untimed call of each variant first, and of each default-mode one in default mode.
    untimed = len(every) + len(default)
    assert profiled[:untimed] == [(v, True) for v in every] + [(v, False) for v in default]
    timed = profiled[untimed:]
    assert len(timed) == 4 * judged_n + 7 * info_n + 2 * default_n
    for label in every:
        expected = (judged_n if label in judged else 0) + (info_n if label in informational else 0)
        assert timed.count((label, True)) == expected, label
        assert timed.count((label, False)) == (default_n if label in default else 0), label
    # The informational and default-mode rounds come between judged ones, not after them.
    last_judged = len(timed) - 1 - timed[::-1].index((sm.BOTH, True))
    assert timed.index((sm.IDLE, True)) < last_judged
    assert timed.index((sm.UTIL_20, False)) < last_judged
    assert len(timed) - 1 - timed[::-1].index((sm.UTIL_20, False)) > timed.index((sm.BOTH, True))
    c = cells["tiny"]
    blocks = c["blocks"]
    assert list(blocks) == [sm.JUDGED_BLOCK, sm.INFO_BLOCK, sm.DEFAULT_BLOCK]
    assert blocks[sm.JUDGED_BLOCK]["rounds"] == judged_n
    assert blocks[sm.INFO_BLOCK]["rounds"] == info_n
    assert blocks[sm.DEFAULT_BLOCK]["rounds"] == default_n
    assert [blocks[b]["stack"] for b in blocks] == [True, True, False]
    assert list(blocks[sm.JUDGED_BLOCK]["inner"]) == judged
    assert list(blocks[sm.INFO_BLOCK]["inner"]) == informational
    assert list(blocks[sm.DEFAULT_BLOCK]["inner"]) == default
    for block, labels, n in (
        (sm.JUDGED_BLOCK, judged, judged_n),
        (sm.INFO_BLOCK, informational, info_n),
        (sm.DEFAULT_BLOCK, default, default_n),
    ):
        for key in ("inner", "outer", "pyfunc", "off_cpu"):
            assert {len(blocks[block][key][v]) for v in labels} == {n}, (block, key)
    assert set(blocks[sm.DEFAULT_BLOCK]["inner"][sm.UTIL_20]) == {100_500}
    assert set(blocks[sm.JUDGED_BLOCK]["inner"][sm.UTIL_20]) == {101_000}
    # The bare runs: the informational block's rounds, after one untimed call of each.
    bare = [v for v in sm.BARE if v in every]
    assert {len(c["bare"][v]) for v in bare} == {info_n}
    assert sum(1 for _, stack in calls if stack is None) == len(bare) * (1 + info_n)
    assert c["bare_rounds"] == info_n
    # Notes count each variant's timed calls in its own block (default mode's apart).
    assert any(f"tiny, {sm.LINE_SIGNAL} ({judged_n} of {judged_n} calls" in n for n in notes)
    assert any(f"tiny, {sm.IDLE} ({info_n} of {info_n} calls" in n for n in notes)
    assert any(f"tiny, {sm.UTIL_20} ({judged_n} of {judged_n} calls" in n for n in notes)
    assert any(
        f"tiny (default mode), {sm.UTIL_20} ({default_n} of {default_n} calls" in n for n in notes
    )

    section = sm._section(cfg, cells, notes, None, "machine")
    text = section.markdown
    assert "| noise floor | rounds |" in text
    assert f"in {judged_n} rounds, the *informational* block" in text
    assert (
        f"in {info_n} rounds, and the *default mode* block ({sm.NONE}; {sm.UTIL_20}, "
        "each call with `stack=False`" in text
    )
    assert f"in {default_n} rounds, the informational and default-mode rounds" in text
    assert "the stricter test" in text and "of the order of its 1% goal" in text
    rows = [line for line in text.splitlines() if line.startswith("| tiny (n=1) |")]
    assert len(rows) == len(judged) + len(informational) + len(default)
    for label in every:
        mine = [r for r in rows if r.startswith(f"| tiny (n=1) | {label} |")]
        want = [
            f"| {n} ({block}) |"
            for block, labels, n in (
                (sm.JUDGED_BLOCK, judged, judged_n),
                (sm.INFO_BLOCK, informational, info_n),
                (sm.DEFAULT_BLOCK, default, default_n),
            )
            if label in labels
        ]
        assert [r[r.rindex("| ", 0, -2) :] for r in mine] == want, label
    util_default = [r for r in rows if r.endswith(f"| {default_n} (default mode) |")][1]
    assert util_default.startswith(f"| tiny (n=1) | {sm.UTIL_20} | 0.1 ms | +0.5% |")
    targets = {t.name: t for t in section.targets}
    line = targets[f"{sm.LINE_SIGNAL}: added to the profiled run (worst cell)"]
    assert line.goal == "under 3%" and line.measured.startswith("+2.0% (tiny)")
    # The utilisation sampler's goal: judged on the default-mode block...
    util_name = (
        "utilisation sampler (20 ms, the default): added to the profiled run "
        "(worst cell) — default mode, no --stack"
    )
    off_name = (
        "utilisation sampler (20 ms, the default): cell thread kept off the CPU, "
        "added to the profiled run (worst cell) — default mode, no --stack"
    )
    util, off = targets[util_name], targets[off_name]
    assert util.goal == off.goal == "under 1%"
    assert util.measured.startswith("+0.5% (tiny)") and off.measured.startswith("+0.3% (tiny)")
    # ...its judged-block rows (with --stack) informational.
    stack_util = targets[
        "utilisation sampler (20 ms) with --stack (judged block): added to "
        "the profiled run (worst cell)"
    ]
    stack_off = targets[
        "utilisation sampler (20 ms) with --stack (judged block): cell thread "
        "kept off the CPU, added to the profiled run (worst cell)"
    ]
    assert stack_util.measured.startswith("+1.0% (tiny)")
    assert stack_off.measured.startswith("+0.0% (tiny)")
    assert stack_util.goal == stack_off.goal == "informational (no goal set)"
    assert targets[
        "both samplers as the magic makes them (--stack): added to the profiled run (worst cell)"
    ].measured.startswith("+3.0%")
    assert targets[
        "line sampler on top of the utilisation sampler (what --stack adds in the "
        "magic, worst cell)"
    ].measured.startswith("+2.0%")
    assert targets[f"{sm.PYI_1}: added to the profiled run (worst cell)"].measured.startswith(
        "+5.0%"
    )
    assert all(t.met is None for t in section.targets if "hotspots" not in t.name)
    # In a full run the default-mode block's +0.5% meets the goal the judged block's +1.0%
    # would have missed; the --stack rows stay unjudged.
    full = {
        t.name: t
        for t in sm._section(
            BenchConfig(traces_dir=tmp_path, cache_dir=tmp_path, hta_python=None, quick=False),
            cells,
            notes,
            None,
            "machine",
        ).targets
    }
    assert full[util_name].met is True and full[off_name].met is True
    assert full[stack_util.name].met is None and full[stack_off.name].met is None

    # Without the default-mode block, its targets say so and are not judged.
    calls.clear()
    cells, notes = sm.measure_cells(cfg, judged_n, info_n, 0)
    assert list(cells["tiny"]["blocks"]) == [sm.JUDGED_BLOCK, sm.INFO_BLOCK]
    assert all(stack for _, stack in calls if stack is not None)
    section = sm._section(cfg, cells, notes, None, "machine")
    assert (
        "block (none and utilisation sampler (20 ms) with `stack=False`" in section.markdown
        and "was not measured here" in section.markdown
    )
    targets = {t.name: t for t in section.targets}
    for name in (util_name, off_name):
        assert targets[name].measured == "not measured" and targets[name].met is None
    assert targets[stack_util.name].measured.startswith("+1.0% (tiny)")


def test_fit_benchmark_repeats_a_real_step_and_runs_quick() -> None:
    from benchmarks.config import BenchConfig
    from benchmarks.fit_prediction import FIT, repeated, run
    from gpuprof_nb.analysis.fit import fit_batch_size
    from gpuprof_nb.io.snapshot import load_snapshot

    main, other = load_snapshot(FIT / "tiny_b8.pickle"), load_snapshot(FIT / "tiny_b4.pickle")
    big_main, big_other = repeated(main, 5_000), repeated(other, 5_000)
    copies = -(-5_000 // main.n_events)
    assert big_main.n_events == copies * main.n_events
    assert big_main.step.allocations == copies * main.step.allocations
    assert len(big_main.step.calls) == copies * len(main.step.calls)
    # Each repeat is the same step on its own addresses: the fit is as exact as on one.
    fit = fit_batch_size(big_main, 8, big_other, 4)
    assert fit.matched_share == 1.0
    one = fit_batch_size(main, 8, other, 4)
    assert fit.predict(32).peak_bytes >= one.predict(32).peak_bytes
    cfg = BenchConfig(traces_dir=Path("."), cache_dir=Path("."), hta_python=None, quick=True)
    section = run(cfg)
    assert section.title.startswith("12. Will it fit")
    assert "prediction in all (fit + predict)" in section.markdown
    assert section.targets[0].met is None  # quick inputs judge nothing
