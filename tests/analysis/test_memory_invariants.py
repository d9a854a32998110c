"""The memory timeline agrees with its own snapshot, per device, on every snapshot in
tests/data and on synthetic ones written in each year's `_dump_snapshot` layout:

- the timeline ends at the active bytes the segments hold at dump time;
- the peak is at least both ends;
- every level (the start too) is the end state walked back through the history.

The synthetic snapshots come from a small caching-allocator model that rounds blocks up the
way PyTorch's does (512-byte multiples, large blocks sometimes left unsplit), so the history's
requested sizes and the segments' block sizes differ as they do in real snapshots. The walk
back is written here in plain Python from the format's rules, apart from the analysis code.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuprof_nb.analysis.memory import analyze_snapshot, memory_timeline
from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict

MIB = 2**20
DATA = Path(__file__).parents[1] / "data" / "snapshots"
ACTIVE = ("active_allocated", "active_pending_free", "active_awaiting_free")


def active_blocks(data: dict[str, Any], device: int) -> dict[int, int]:
    """Address -> size of the blocks active at dump time on `device` (old layouts without
    block addresses tile the segment in order)."""
    out: dict[int, int] = {}
    for seg in data.get("segments") or []:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            addr = b.get("address", addr)
            if b["state"] in ACTIVE:
                out[addr] = b["size"]
            addr += b["size"]
    return out


def walked_back(data: dict[str, Any], device: int) -> tuple[int, list[int]]:
    """Return (level before the first entry, level after each entry): the active bytes at
    dump time, walked back entry by entry. An alloc still live at dump counts with its
    block's size; every other alloc and free with the size its entry records."""
    traces = data.get("device_traces") or []
    entries = traces[device] if device < len(traces) else []
    live = active_blocks(data, device)
    last_at: dict[int, int] = {}
    for i, e in enumerate(entries):
        if e["action"] in ("alloc", "free_completed"):
            last_at[e["addr"]] = i
    level = sum(live.values())
    after = [0] * len(entries)
    for i in range(len(entries) - 1, -1, -1):
        after[i] = level
        e = entries[i]
        if e["action"] == "alloc":
            still_live = last_at[e["addr"]] == i and e["addr"] in live
            level -= live[e["addr"]] if still_live else e["size"]
        elif e["action"] == "free_completed":
            level += e["size"]
    return level, after


def devices_of(data: dict[str, Any]) -> list[int]:
    found = {s.get("device", 0) for s in data.get("segments") or []}
    found.update(d for d, t in enumerate(data.get("device_traces") or []) if t)
    return sorted(found)


def check_invariants(data: dict[str, Any]) -> int:
    """Assert the three invariants on every device of a raw snapshot dict; return how many
    devices were checked."""
    snap = snapshot_from_dict(data)
    checked = 0
    for device in devices_of(data):
        tl = memory_timeline(snap, device=device)
        start, after = walked_back(data, device)
        seg_active = sum(active_blocks(data, device).values())
        if data.get("segments"):
            assert tl.end_bytes == seg_active, (device, tl.end_bytes, seg_active)
            per_segment = sum(
                s.get("active_size", 0)
                for s in data["segments"]
                if s.get("device", 0) == device and "active_size" in s
            )
            if all("active_size" in s for s in data["segments"]):
                assert tl.end_bytes == per_segment
        assert tl.peak_bytes >= max(tl.start_bytes, tl.end_bytes)
        if after:
            assert tl.active_bytes.tolist() == after
            assert tl.start_bytes == start
            assert tl.peak_bytes == max(start, *after)
        checked += 1
    return checked


# ---------------------------------------------------------------------------------------
# Every snapshot in tests/data


@pytest.mark.parametrize(
    "path",
    sorted(DATA.glob("*.pickle")) + sorted((DATA.parent / "gpu").glob("*.pickle")),
    ids=lambda p: p.name,
)
def test_invariants_hold_on_every_fixture(path: Path) -> None:
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert check_invariants(data) >= 1


# ---------------------------------------------------------------------------------------
# Synthetic snapshots in each year's layout


def _frames(rng: random.Random) -> list[dict[str, Any]]:
    line = rng.randrange(10, 60)
    return [
        {
            "filename": "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py",
            "line": 125,
            "name": "forward",
        },
        {"filename": "/home/user/train.py", "line": line, "name": "step"},
    ]


def _round(size: int) -> int:
    """The caching allocator's rounding: at least 512 bytes, in multiples of 512."""
    return max(512, (size + 511) // 512 * 512)


class _Program:
    """One device's random allocation program on a bump-pointer caching allocator."""

    def __init__(self, year: int, device: int, rng: random.Random) -> None:
        self.year, self.device, self.rng = year, device, rng
        self.entries: list[dict[str, Any]] = []
        self.segs: list[dict[str, Any]] = []
        self.live: dict[int, tuple[int, int, list[dict[str, Any]]]] = {}  # addr -> block..
        self.t_us = 1_700_000_000_000_000 + device * 7

    def emit(self, action: str, addr: int, size: int, fr: list[dict[str, Any]]) -> None:
        self.t_us += self.rng.randrange(5, 200)
        e: dict[str, Any] = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "frames": fr,
        }
        if self.year >= 2024:
            e["time_us"] = self.t_us
        if self.year >= 2025:
            e["compile_context"] = "N/A"
            e["user_metadata"] = ""
        self.entries.append(e)

    def segment_for(self, block: int) -> dict[str, Any]:
        for seg in self.segs:
            if seg["bump"] + block <= seg["address"] + seg["total"]:
                return seg
        total = max(block, 20 * MIB)
        base = 0x7F0000000000 + self.device * 0x10000000000 + len(self.segs) * 0x100000000
        seg = {"address": base, "total": total, "bump": base, "blocks": []}
        self.segs.append(seg)
        self.emit("segment_alloc", base, total, _frames(self.rng))
        return seg

    def run(self) -> None:
        rng = self.rng
        for _ in range(rng.randrange(150, 400)):
            if self.live and rng.random() < 0.45:
                addr = rng.choice(sorted(self.live))
                _block_size, req, fr = self.live.pop(addr)
                self.emit("free_requested", addr, req, fr)
                self.emit("free_completed", addr, req, fr)
                continue
            req = rng.choice(
                [rng.randrange(1, 4096), rng.randrange(4096, MIB), rng.randrange(MIB, 24 * MIB)]
            )
            block = _round(req)
            if block > MIB and rng.random() < 0.4:
                # A large block whose remainder was too small to split off stays whole.
                block += rng.randrange(1, MIB // 512) * 512
            seg = self.segment_for(block)
            addr = seg["bump"]
            seg["bump"] += block
            fr = _frames(rng)
            seg["blocks"].append((addr, block))
            self.live[addr] = (block, req, fr)
            self.emit("alloc", addr, req, fr)

    def dump(self) -> list[dict[str, Any]]:
        """The segments at dump time: each tiled into its blocks in address order."""
        out = []
        for seg in self.segs:
            blocks: list[dict[str, Any]] = []
            cursor = seg["address"]
            for addr, size in sorted(seg["blocks"]):
                if addr > cursor:
                    blocks.append(_block(self.year, cursor, addr - cursor, None))
                blocks.append(_block(self.year, addr, size, self.live.get(addr)))
                cursor = addr + size
            end = seg["address"] + seg["total"]
            if cursor < end:
                blocks.append(_block(self.year, cursor, end - cursor, None))
            active = sum(b["size"] for b in blocks if b["state"] in ACTIVE)
            row: dict[str, Any] = {
                "device": self.device,
                "address": seg["address"],
                "total_size": seg["total"],
                "allocated_size": active,
                "active_size": active,
                "stream": 0,
                "segment_type": "large",
                "blocks": blocks,
            }
            if self.year >= 2024:
                row["requested_size"] = sum(
                    b.get("requested_size", 0) for b in blocks if b["state"] in ACTIVE
                )
            if self.year >= 2025:
                row["segment_pool_id"] = (0, 0)
                row["is_expandable"] = False
            out.append(row)
        return out


def synthetic_snapshot(
    year: int, seed: int, *, record_from: int = 0, keep_last: int | None = None, devices: int = 1
) -> dict[str, Any]:
    """A snapshot dict as `_dump_snapshot` wrote it in `year` (2023: PyTorch 2.0, blocks
    with `history`, no times; 2024: `frames`, `requested_size`, `time_us`; 2025: pool ids,
    expandable flags, allocator settings, annotations), from a random allocation program.
    Entries before `record_from` happen before recording starts; `keep_last` keeps only
    the newest entries, as a full ring buffer does."""
    rng = random.Random(seed)
    traces: list[list[dict[str, Any]]] = []
    segments: list[dict[str, Any]] = []
    for device in range(devices):
        program = _Program(year, device, rng)
        program.run()
        segments += program.dump()
        recorded = program.entries[record_from:]
        if keep_last is not None:
            recorded = recorded[-keep_last:]
        traces.append(recorded)
    data: dict[str, Any] = {"segments": segments, "device_traces": traces}
    if year >= 2025:
        data["allocator_settings"] = {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "roundup_power2_divisions": {},
        }
        data["external_annotations"] = []
    return data


def _block(
    year: int, addr: int, size: int, held: tuple[int, int, list[dict[str, Any]]] | None
) -> dict[str, Any]:
    state = "active_allocated" if held else "inactive"
    req = held[1] if held else 0
    frames = held[2] if held else []
    if year == 2023:
        # PyTorch 2.0: no address on blocks (they tile the segment), the allocation's size
        # and stack in the first history record.
        return {
            "size": size,
            "state": state,
            "history": [{"addr": addr, "real_size": req, "frames": frames}] if held else [],
        }
    return {"address": addr, "size": size, "requested_size": req, "state": state, "frames": frames}


YEARS = (2023, 2024, 2025)


@pytest.mark.parametrize("year", YEARS)
@pytest.mark.parametrize("seed", range(4))
def test_invariants_hold_on_synthetic_snapshots(year: int, seed: int) -> None:
    data = synthetic_snapshot(year, seed)
    assert check_invariants(data) == 1
    # The history records requested sizes, the segments rounded blocks: they really differ.
    recorded = sum(e["size"] for e in data["device_traces"][0] if e["action"] == "alloc")
    assert recorded > 0
    assert (
        any(
            b["size"] != b.get("requested_size", b["size"])
            for s in data["segments"]
            for b in s["blocks"]
            if b["state"] in ACTIVE
        )
        or year == 2023
    )


@pytest.mark.parametrize("year", YEARS)
def test_a_history_that_starts_mid_run_starts_at_the_end_walked_back(year: int) -> None:
    # Recording began after 120 entries, and the ring buffer kept only the last 200: both
    # leave memory live before the first entry that only the walk back can account for.
    for kwargs in ({"record_from": 120}, {"keep_last": 200}):
        data = synthetic_snapshot(year, 11, **kwargs)
        assert check_invariants(data) == 1
        tl = memory_timeline(snapshot_from_dict(data))
        assert tl.start_bytes > 0


def test_every_device_of_a_multi_device_snapshot() -> None:
    data = synthetic_snapshot(2025, 5, devices=3, keep_last=150)
    assert check_invariants(data) == 3


def test_the_peak_is_the_start_when_the_window_only_frees() -> None:
    # Memory allocated before recording and only freed during it: the highest level is the
    # state before the first entry, and what was live then is what the peak shows.
    data = {
        "segments": [
            {
                "device": 0,
                "address": 0,
                "total_size": 4 * MIB,
                "blocks": [
                    {"address": 0, "size": 1 * MIB, "state": "active_allocated"},
                    {"address": MIB, "size": 3 * MIB, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "free_completed", "addr": 2 * MIB, "size": 2 * MIB},
                {"action": "free_completed", "addr": 3 * MIB, "size": MIB // 2},
            ]
        ],
    }
    analysis = analyze_snapshot(snapshot_from_dict(data))
    tl = analysis.timeline
    assert tl.active_bytes.tolist() == [MIB + MIB // 2, MIB]
    assert tl.start_bytes == tl.peak_bytes == 3 * MIB + MIB // 2
    assert tl.end_bytes == MIB
    assert analysis.at_peak.peak_bytes == tl.peak_bytes
    assert sum(s.bytes for s in analysis.at_peak.sites) == tl.peak_bytes


def test_an_allocation_missing_from_the_segments_is_closed_at_the_end() -> None:
    # The history leaves 4096 open, but no active block is there at dump: its free was lost.
    data = {
        "segments": [
            {
                "device": 0,
                "address": 0,
                "total_size": 2 * MIB,
                "blocks": [
                    {"address": 0, "size": 1024, "state": "active_allocated"},
                    {"address": 1024, "size": 2 * MIB - 1024, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "alloc", "addr": 0, "size": 1000},
                {"action": "alloc", "addr": 4096, "size": 3000},
                {"action": "alloc", "addr": 8192, "size": 500},
                {"action": "free_completed", "addr": 8192, "size": 500},
            ]
        ],
    }
    snap = snapshot_from_dict(data)
    analysis = analyze_snapshot(snap)
    # The block at 0 counts with its 1024 bytes from its alloc on; 4096 leaves at the end.
    assert analysis.timeline.active_bytes.tolist() == [1024, 4024, 4524, 1024]
    assert analysis.timeline.end_bytes == 1024
    assert any("not live in the segments" in n for n in analysis.timeline.notes)
    assert any("size of their block" in n for n in analysis.timeline.notes)


def test_a_snapshot_loaded_from_a_file_keeps_the_invariants(tmp_path: Path) -> None:
    data = synthetic_snapshot(2025, 3, keep_last=180)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data))
    tl = memory_timeline(load_snapshot(path))
    start, after = walked_back(data, 0)
    assert (tl.start_bytes, tl.end_bytes) == (start, after[-1])


def test_the_area_reaches_a_peak_the_last_allocation_makes() -> None:
    """The last entry of a history makes the peak: its level must have a width, so the area
    drawn reaches the peak and the site that made it shows (the curve used to stop at the
    last entry, drawing 8.5 MiB under a "peak 17 MiB" line)."""
    from gpuprof_nb.results.invariants import impossible

    frames = [{"filename": "/home/me/train.py", "line": 7, "name": "step"}]
    entries = [
        {"action": "alloc", "addr": 0, "size": 8 * MIB, "frames": frames, "time_us": 1000},
        {"action": "alloc", "addr": 8 * MIB, "size": MIB, "frames": frames, "time_us": 2000},
        {"action": "free_completed", "addr": 8 * MIB, "size": MIB, "time_us": 2500},
        {
            "action": "alloc",
            "addr": 16 * MIB,
            "size": 9 * MIB,
            "frames": [{"filename": "/home/me/train.py", "line": 9, "name": "step"}],
            "time_us": 4000,
        },
    ]
    tl = analyze_snapshot(snapshot_from_dict({"segments": [], "device_traces": [entries]})).timeline
    assert tl.peak_bytes == 17 * MIB and tl.peak_index == 3
    assert tl.end_x > float(tl.x[-1])
    totals = tl.site_bytes.sum(axis=0)
    widths = np.diff(tl.sample_x)
    assert max(t for t, w in zip(totals[:-1], widths, strict=True) if w > 0) == 17 * MIB
    # The band of the line that made the peak has a width at the peak.
    k = tl.site_labels.index("train.py:9 step")
    assert tl.site_bytes[k, -2] == 9 * MIB and widths[-1] > 0
    assert impossible(tl) == []
