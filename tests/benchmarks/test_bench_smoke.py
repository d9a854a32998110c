"""Smoke tests for benchmarks/: the scripts run on tiny inputs and their generators write
what they claim. No timing asserts (benchmarks are not tests)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
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


def _doc(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _events(path: Path) -> list[dict]:
    return _doc(path)["traceEvents"]


def test_replicated_trace_shifts_time_and_ids(tmp_path: Path) -> None:
    source = _small_traces(1)[0]
    original = _events(source)
    timed = [e for e in original if e.get("ph") != "M"]
    # The target is the whole file: the header and metadata once, then 3 copies at least.
    out = replicate_trace(source, tmp_path / "big.json",
                          len(json.dumps(_doc(source))) + 3 * len(json.dumps(timed)))
    events = _events(out)
    copies = [e for e in events if e.get("ph") != "M"]
    assert len(copies) >= 3 * len(timed)
    # The copy k of event i is event i shifted by k spans, with ids offset by k id-steps.
    first, second = copies[: len(timed)], copies[len(timed): 2 * len(timed)]
    assert [e["name"] for e in first] == [e["name"] for e in second]
    shifts = {b["ts"] - a["ts"] for a, b in zip(first, second, strict=True) if "ts" in a}
    assert len(shifts) == 1 and shifts.pop() > 0
    corr = [e["args"]["correlation"] for e in copies
            if e.get("cat") == "kernel" and "correlation" in e.get("args", {})]
    assert len(corr) == len(set(corr)), "correlation ids must stay unique across copies"
    # Independent count: kernels in the source times the full copies written.
    full = len(copies) // len(timed)
    kernels_src = sum(1 for e in timed if e.get("cat") == "kernel")
    kernels_out = sum(1 for e in copies[: full * len(timed)] if e.get("cat") == "kernel")
    assert kernels_out == full * kernels_src


def test_replicated_trace_loads_with_gpuprof(tmp_path: Path) -> None:
    from gpuprof_nb.io.trace import load_trace

    source = _small_traces(1)[0]
    events = _events(source)
    timed = [e for e in events if e.get("ph") != "M"]
    out = replicate_trace(source, tmp_path / "big.json",
                          len(json.dumps(_doc(source))) + 2 * len(json.dumps(timed)))
    expected = sum(1 for e in _events(out) if e.get("ph") == "X" and e.get("cat") == "kernel")
    assert len(load_trace(out).kernels) == expected


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
        set(e) == {"action", "addr", "size", "stream", "time_us", "frames"} for e in entries)
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
            b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")


def test_synthetic_snapshot_peak_matches_gpuprof(tmp_path: Path) -> None:
    from gpuprof_nb.analysis.memory import analyze_snapshot
    from gpuprof_nb.io.snapshot import load_snapshot

    path = write_synthetic_snapshot(tmp_path / "s.pickle", 200_000)
    with open(path, "rb") as fh:
        snap = pickle.load(fh)
    peak, _, live_addrs = _replay(snap["device_traces"][0])
    params = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated" and b["address"] not in live_addrs)
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
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick",
         "--only", "overhead,accuracy,traces,json,snapshots",
         "--traces-dir", str(traces), "--hta-python", str(tmp_path / "no-hta"),
         "--big-trace-mb", "1", "--big-snapshot-mb", "1", "--out", str(out),
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    for title in ("1. Overhead", "2. Timing accuracy", "3. Trace analysis",
                  "JSON library choice", "4. Snapshot analysis"):
        assert f"## {title}" in text
    assert "This comparison failed" not in text
    assert "HTA venv not available" in text
    for p in traces.iterdir():
        assert f"`{p.name}`" in text


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
    made = [Section("1. A", "body | with a pipe\n\n| t | x |\n|---|---|",
                    (Target("speed", "2.0x", ">= 1x", True), Target("mem", "1 MB", "< 2", None))),
            Section("B", "no targets here"),
            Section("2. C", "text", (Target("x", "3", "5", False),))]
    text = render_results(cfg, made, "cmd", 1.0)
    again = sections_in_results(text)
    assert list(again) == ["1. A", "B", "2. C"]
    assert [again[s.title] for s in made] == made


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
