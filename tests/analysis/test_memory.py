"""Memory analysis against independent computations: the simulator's ground truth
(tests/data/snapshots/expected.json, written by tools/make_snapshots.py) and a plain-Python
replay of the raw snapshot dict written here from the format's rules."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.analysis.memory import (
    BEFORE_LABEL,
    analyze_snapshot,
    memory_timeline,
    parse_window,
    segment_summary,
    user_frame,
)
from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict
from gpuprof_nb.model.frames import Frame

MIB = 2**20


@pytest.fixture(scope="module")
def snaps(data_dir: Path) -> Path:
    return data_dir / "snapshots"


@pytest.fixture(scope="module")
def expected(snaps: Path) -> dict:
    return json.loads((snaps / "expected.json").read_text())


def raw(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def plain_replay(data: dict, device: int) -> list[int]:
    """Live bytes after each entry, by the rules: alloc opens, only free_completed closes;
    a free_completed with no open alloc at its address freed a block live since before
    recording; blocks active at dump time and not opened in the history were live all along."""
    entries = data["device_traces"][device]
    open_blocks: dict[int, int] = {}
    unmatched_after: list[int] = []
    deltas = []
    for e in entries:
        if e["action"] == "alloc":
            if e["addr"] in open_blocks:
                deltas.append(e["size"] - open_blocks.pop(e["addr"]))
            else:
                deltas.append(e["size"])
            open_blocks[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            if e["addr"] in open_blocks:
                deltas.append(-open_blocks.pop(e["addr"]))
            else:
                deltas.append(-e["size"])
                unmatched_after.append(e["size"])
        else:
            deltas.append(0)
    before = 0
    for s in data["segments"]:
        if s.get("device", 0) != device:
            continue
        addr = s["address"]
        for b in s["blocks"]:
            addr = b.get("address", addr)  # old layouts: blocks tile the segment in order
            if b["state"] != "inactive" and addr not in open_blocks:
                before += b["size"]
            addr += b["size"]
    live = before + sum(unmatched_after)
    out = []
    for d in deltas:
        live += d
        out.append(live)
    return out


ALL = [
    "train_time.pickle",
    "train_no_time.pickle",
    "truncated.pickle",
    "leak_steps.pickle",
    "oom.pickle",
    "fragmented.pickle",
    "legacy_history.pickle",
]


@pytest.mark.parametrize("name", ALL)
def test_peak_equals_independent_replay_and_truth(snaps: Path, expected: dict, name: str) -> None:
    data = raw(snaps / name)
    tl = memory_timeline(load_snapshot(snaps / name))
    curve = plain_replay(data, 0)
    assert tl.active_bytes.tolist() == curve
    assert tl.peak_bytes == max(curve) == expected[name]["true_peak_bytes"]
    assert tl.peak_index == curve.index(max(curve))
    if "live_end_bytes" in expected[name]:
        assert tl.end_bytes == expected[name]["live_end_bytes"]


def test_two_devices_default_to_longest_history(snaps: Path, expected: dict) -> None:
    snap = load_snapshot(snaps / "two_devices.pickle")
    truth = expected["two_devices.pickle"]
    busiest = int(np.argmax(truth["n_events_by_device"]))
    assert analyze_snapshot(snap).device == busiest
    data = raw(snaps / "two_devices.pickle")
    for device in (0, 1):
        tl = memory_timeline(snap, device=device)
        assert tl.n_events == truth["n_events_by_device"][device]
        assert tl.peak_bytes == truth["true_peak_bytes_by_device"][device]
        assert tl.active_bytes.tolist() == plain_replay(data, device)


def test_only_free_completed_closes_an_allocation() -> None:
    snap = snapshot_from_dict(
        {
            "segments": [],
            "device_traces": [
                [
                    {"action": "alloc", "addr": 4096, "size": 1000},
                    {"action": "free_requested", "addr": 4096, "size": 1000},
                    {"action": "alloc", "addr": 8192, "size": 500},
                    {"action": "free_completed", "addr": 4096, "size": 1000},
                    {"action": "free_completed", "addr": 8192, "size": 500},
                ]
            ],
        }
    )
    tl = memory_timeline(snap)
    assert tl.active_bytes.tolist() == [1000, 1000, 1500, 500, 0]
    assert tl.peak_bytes == 1500 and tl.peak_index == 2
    assert tl.time_unit == "event"


def test_frees_without_alloc_do_not_break_the_timeline(snaps: Path, expected: dict) -> None:
    name = "truncated.pickle"
    data = raw(snaps / name)
    opened: set[int] = set()
    orphan = []
    for e in data["device_traces"][0]:
        if e["action"] == "alloc":
            opened.add(e["addr"])
        elif e["action"] == "free_completed":
            if e["addr"] in opened:
                opened.discard(e["addr"])
            else:
                orphan.append(e)
    assert orphan, "the fixture must free blocks whose alloc was dropped"
    result = analyze_snapshot(load_snapshot(snaps / name))
    tl = result.timeline
    assert (tl.active_bytes >= 0).all()
    assert tl.end_bytes == expected[name]["live_end_bytes"]
    assert tl.peak_bytes == expected[name]["true_peak_bytes"]
    assert any("allocated before recording" in n for n in tl.notes)


def test_reused_address_without_free_is_closed_at_reuse() -> None:
    snap = snapshot_from_dict(
        {
            "device_traces": [
                [
                    {"action": "alloc", "addr": 64, "size": 100},
                    {"action": "alloc", "addr": 64, "size": 300},
                ]
            ]
        }
    )
    result = analyze_snapshot(snap)
    assert result.timeline.active_bytes.tolist() == [100, 300]
    assert any("reused without a recorded free_completed" in n for n in result.timeline.notes)


def test_at_peak_adds_up_and_names_user_sites(snaps: Path) -> None:
    data = raw(snaps / "train_time.pickle")
    result = analyze_snapshot(load_snapshot(snaps / "train_time.pickle"))
    peak = result.at_peak
    assert sum(s.bytes for s in peak.sites) == peak.peak_bytes
    assert sum(s.share for s in peak.sites) == pytest.approx(1.0)
    # Independent: the live set at the peak index, by a plain walk over the raw entries.
    live: dict[int, tuple[int, str]] = {}
    for e in data["device_traces"][0][: result.timeline.peak_index + 1]:
        user = next(f for f in e["frames"] if f["filename"].endswith("train.py"))
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], f"train.py:{user['line']} {user['name']}")
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    by_site: dict[str, int] = {}
    for size, label in live.values():
        by_site[label] = by_site.get(label, 0) + size
    got = {s.site.label: s.bytes for s in peak.sites}
    for label, size in by_site.items():
        assert got[label] == size
    # Parameters allocated before recording keep their own allocation site.
    assert got["train.py:20 __init__"] == 4 * MIB
    assert BEFORE_LABEL not in got
    # Torch frames (linear.py) and C++ frames are skipped to find the user's line.
    assert "train.py:31 forward" in got


def test_timeline_stack_sums_to_active(snaps: Path) -> None:
    tl = analyze_snapshot(load_snapshot(snaps / "leak_steps.pickle")).timeline
    idx = np.searchsorted(tl.x, tl.sample_x[:-1])
    assert tl.site_bytes[:, :-1].sum(axis=0).tolist() == tl.active_bytes[idx].tolist()
    # The last level holds until end_x, after the last entry: it has a width.
    assert tl.sample_x[-1] == tl.end_x > tl.x[-1]
    assert tl.site_bytes[:, -1].tolist() == tl.site_bytes[:, -2].tolist()
    assert tl.peak_x in tl.sample_x.tolist()
    assert tl.site_labels[-1] == BEFORE_LABEL
    assert (tl.site_bytes >= 0).all()


def test_time_axis_in_ms_or_events(snaps: Path) -> None:
    data = raw(snaps / "train_time.pickle")
    times = [e["time_us"] for e in data["device_traces"][0]]
    tl = memory_timeline(load_snapshot(snaps / "train_time.pickle"))
    assert tl.time_unit == "ms"
    assert tl.x.tolist() == pytest.approx([(t - times[0]) / 1000 for t in times])
    tl2 = memory_timeline(load_snapshot(snaps / "train_no_time.pickle"))
    assert tl2.time_unit == "event" and tl2.x.tolist() == list(range(tl2.n_events))


def test_window_restricts_and_keeps_state(snaps: Path) -> None:
    snap = load_snapshot(snaps / "train_no_time.pickle")
    data = raw(snaps / "train_no_time.pickle")
    curve = plain_replay(data, 0)
    tl = memory_timeline(snap, window=(10, 25))
    assert tl.first_index == 10 and tl.n_events == 16
    assert tl.active_bytes.tolist() == curve[10:26]
    assert tl.peak_bytes == max(curve[10:26])
    assert tl.start_bytes == curve[9]
    with pytest.raises(ValueError):
        parse_window("5")
    assert parse_window(":30") == (None, 30.0)
    with pytest.raises(ValueError, match="before START"):
        parse_window("9:3")


def test_leak_across_steps(snaps: Path, expected: dict) -> None:
    truth = expected["leak_steps.pickle"]
    result = analyze_snapshot(load_snapshot(snaps / "leak_steps.pickle"))
    leaks = result.leaks
    curve = plain_replay(raw(snaps / "leak_steps.pickle"), 0)
    starts = truth["step_starts"]
    ends = [s - 1 for s in starts[1:]] + [len(curve) - 1]
    assert list(leaks.step_end_bytes) == [curve[i] for i in ends]
    assert leaks.growth_bytes_per_step == pytest.approx(truth["leak_bytes_per_step"])
    assert leaks.growing_sites[0].site.label == "train.py:36 train_loop"
    assert leaks.growing_sites[0].bytes == pytest.approx(truth["leak_bytes_per_step"] - 512)
    growth = [f for f in result.findings if f.kind == "memory_growth"]
    assert growth and growth[0].severity == "high"
    assert growth[0].evidence["growth_per_step_bytes"] == pytest.approx(3 * MIB)
    # Without steps there is no growth figure, only what was left allocated.
    plain = analyze_snapshot(load_snapshot(snaps / "leak_steps.pickle"), step_starts=())
    assert plain.leaks.growth_bytes_per_step is None
    assert plain.leaks.left_bytes == leaks.left_bytes


def test_left_allocated_by_site(snaps: Path) -> None:
    data = raw(snaps / "train_time.pickle")
    opened: dict[int, int] = {}
    for e in data["device_traces"][0]:
        if e["action"] == "alloc":
            opened[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            opened.pop(e["addr"], None)
    leaks = analyze_snapshot(load_snapshot(snaps / "train_time.pickle")).leaks
    assert leaks.left_bytes == sum(opened.values())
    assert sum(s.bytes for s in leaks.left_sites) == leaks.left_bytes


def test_segments_and_fragmentation(snaps: Path, expected: dict) -> None:
    truth = expected["fragmented.pickle"]
    result = analyze_snapshot(load_snapshot(snaps / "fragmented.pickle"))
    seg = result.segments
    assert seg.reserved_bytes == truth["reserved_bytes"]
    assert seg.free_bytes == truth["free_in_segments_bytes"]
    assert seg.largest_free_block_bytes == truth["largest_free_block_bytes"]
    assert seg.n_free_blocks == truth["n_free_blocks"]
    assert seg.fragmentation_ratio == pytest.approx(
        1 - truth["largest_free_block_bytes"] / truth["free_in_segments_bytes"]
    )
    kinds = [f.kind for f in result.findings]
    assert "fragmentation" in kinds and "oom" in kinds
    oom = next(f for f in result.findings if f.kind == "oom")
    assert "fragmentation" in oom.title
    assert "expandable_segments:True" in oom.fix


def test_oom_finding_evidence(snaps: Path, expected: dict) -> None:
    truth = expected["oom.pickle"]
    result = analyze_snapshot(load_snapshot(snaps / "oom.pickle"))
    assert result.findings[0].kind == "oom"
    ev = result.findings[0].evidence
    assert ev["requested_bytes"] == truth["requested_bytes"]
    assert ev["device_free_bytes"] == truth["device_free_bytes"]
    assert ev["reserved_bytes"] == truth["reserved_bytes"]
    assert ev["active_bytes"] == truth["live_end_bytes"]
    assert result.ooms[0].site.label == "train.py:60 giant"
    assert "fragmentation" not in result.findings[0].title


def test_segments_only_uses_state_at_dump(snaps: Path, expected: dict) -> None:
    truth = expected["segments_only.pickle"]
    result = analyze_snapshot(load_snapshot(snaps / "segments_only.pickle"))
    assert result.timeline.peak_bytes == truth["live_end_bytes"]
    assert sum(s.bytes for s in result.at_peak.sites) == truth["live_end_bytes"]
    assert result.segments.reserved_bytes == truth["reserved_bytes"]
    assert segment_summary(load_snapshot(snaps / "segments_only.pickle"), 0).n_segments == 3


def test_peak_advice_present(snaps: Path) -> None:
    result = analyze_snapshot(load_snapshot(snaps / "train_time.pickle"))
    advice = [f for f in result.findings if f.kind == "peak_memory"]
    assert advice and "checkpoint" in advice[0].fix and "bfloat16" in advice[0].fix
    assert advice[0].evidence["peak_bytes"] == result.timeline.peak_bytes
    order = {"high": 0, "medium": 1, "low": 2, "info": 3}
    ranks = [order[f.severity] for f in result.findings]
    assert ranks == sorted(ranks)


def test_user_frame_skips_torch_and_cpp() -> None:
    frames = [
        Frame("??", 0, "malloc"),
        Frame("/x/site-packages/torch/nn/functional.py", 9, "f"),
        Frame("/home/u/model.py", 12, "forward"),
        Frame("/home/u/run.py", 3, "main"),
    ]
    assert user_frame(frames) == frames[2]
    assert user_frame(frames[:2]) == frames[1]
    assert user_frame([]) is None


def test_analyze_memory_inputs_and_errors(snaps: Path) -> None:
    from gpuprof_nb.errors import GpuprofError
    from gpuprof_nb.session.analyze import analyze_memory

    data = raw(snaps / "oom.pickle")
    report = analyze_memory(data)  # a raw dict works like a loaded snapshot
    assert report.peak_bytes == max(plain_replay(data, 0))
    for kwargs, match in [
        ({"device": 5}, "no device 5"),
        ({"window": "a:b"}, "numbers"),
        ({"window": "7"}, "START:END"),
    ]:
        with pytest.raises(GpuprofError, match=match):
            analyze_memory(data, **kwargs)
    with pytest.raises(GpuprofError, match="expects a MemorySnapshot"):
        analyze_memory(3)  # type: ignore[arg-type]
    empty = analyze_memory(data, window="1e9:")
    assert empty.timeline.n_events == 1
    assert any("no history entries" in n for n in empty.timeline.notes)
