"""Loading memory snapshots: every documented layout, the restricted unpickler, errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.errors import SnapshotFormatError
from gpuprof_nb.io.snapshot import (
    load_snapshot,
    save_snapshot,
    snapshot_from_dict,
    snapshot_to_dict,
)
from gpuprof_nb.model.memory import ACTIONS, MemorySnapshot


@pytest.fixture(scope="module")
def snaps(data_dir: Path) -> Path:
    return data_dir / "snapshots"


@pytest.fixture(scope="module")
def expected(snaps: Path) -> dict:
    return json.loads((snaps / "expected.json").read_text())


def raw(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)  # our own fixtures: plain data


@pytest.mark.parametrize(
    "name",
    [
        "train_time.pickle",
        "train_no_time.pickle",
        "truncated.pickle",
        "leak_steps.pickle",
        "two_devices.pickle",
        "segments_only.pickle",
        "oom.pickle",
        "fragmented.pickle",
        "legacy_history.pickle",
    ],
)
def test_columns_match_the_raw_entries(snaps: Path, name: str) -> None:
    data = raw(snaps / name)
    snap = load_snapshot(snaps / name)
    assert isinstance(snap, MemorySnapshot)
    assert len(snap.segments) == len(data["segments"])
    for device, entries in enumerate(data["device_traces"]):
        t = snap.trace(device)
        assert t is not None and t.n_events == len(entries)
        assert [ACTIONS[a] for a in t.action] == [e["action"] for e in entries]
        assert t.size.tolist() == [e["size"] for e in entries]
        assert t.addr.tolist() == [e.get("addr", 0) for e in entries]
        has_time = any("time_us" in e for e in entries)
        assert t.has_time == has_time
        if has_time:
            assert t.time_us.tolist() == [float(e["time_us"]) for e in entries]
        for i, e in enumerate(entries):
            stack = snap.stacks[t.stack[i]] if t.stack[i] >= 0 else ()
            assert [
                (snap.frames[j].file, snap.frames[j].line, snap.frames[j].function) for j in stack
            ] == [(f["filename"], f["line"], f["name"]) for f in e["frames"]]
    for seg, rseg in zip(snap.segments, data["segments"], strict=True):
        assert seg.total_size == rseg["total_size"]
        assert [b.size for b in seg.blocks] == [b["size"] for b in rseg["blocks"]]
        assert [b.state for b in seg.blocks] == [b["state"] for b in rseg["blocks"]]


def test_frames_are_interned(snaps: Path) -> None:
    data = raw(snaps / "train_time.pickle")
    snap = load_snapshot(snaps / "train_time.pickle")
    distinct = {
        tuple((f["filename"], f["line"], f["name"]) for f in e["frames"])
        for e in data["device_traces"][0]
    }
    distinct |= {
        tuple((f["filename"], f["line"], f["name"]) for f in b["frames"])
        for s in data["segments"]
        for b in s["blocks"]
        if b["frames"]
    }
    assert len(snap.stacks) == len(distinct)
    assert len(snap.frames) == len({f for s in distinct for f in s})


def test_oom_entry_keeps_device_free(snaps: Path, expected: dict) -> None:
    snap = load_snapshot(snaps / "oom.pickle")
    t = snap.trace(0)
    oom = int(np.flatnonzero(t.action == ACTIONS.index("oom"))[0])
    assert t.size[oom] == expected["oom.pickle"]["requested_bytes"]
    assert t.device_free[oom] == expected["oom.pickle"]["device_free_bytes"]
    assert (t.device_free[t.action != ACTIONS.index("oom")] == -1).all()


def test_legacy_history_blocks(snaps: Path) -> None:
    data = raw(snaps / "legacy_history.pickle")
    snap = load_snapshot(snaps / "legacy_history.pickle")
    for seg, rseg in zip(snap.segments, data["segments"], strict=True):
        # Without block addresses the blocks tile the segment in order.
        assert seg.blocks[0].address == rseg["address"]
        for b, rb in zip(seg.blocks, rseg["blocks"], strict=True):
            if "history" in rb:
                assert b.requested_size == rb["history"][0]["real_size"]
                assert b.stack >= 0
        assert sum(b.size for b in seg.blocks) == rseg["total_size"]


def test_segments_only_and_two_devices(snaps: Path) -> None:
    only = load_snapshot(snaps / "segments_only.pickle")
    assert only.n_events == 0 and only.devices == (0,)
    two = load_snapshot(snaps / "two_devices.pickle")
    assert two.devices == (0, 1)
    assert {s.device for s in two.segments} == {0, 1}


def test_allocator_settings_kept(snaps: Path) -> None:
    snap = load_snapshot(snaps / "train_time.pickle")
    assert snap.allocator_settings["expandable_segments"] is False


def test_bytes_gzip_and_dict_inputs(snaps: Path, tmp_path: Path) -> None:
    blob = (snaps / "train_time.pickle").read_bytes()
    gz = tmp_path / "s.pickle.gz"
    gz.write_bytes(gzip.compress(blob))
    for source in (blob, gzip.compress(blob), gz, str(gz), raw(snaps / "train_time.pickle")):
        snap = load_snapshot(source)
        assert snap.trace(0).n_events == len(raw(snaps / "train_time.pickle")["device_traces"][0])


def test_round_trip_through_dict_and_file(snaps: Path, tmp_path: Path) -> None:
    snap = load_snapshot(snaps / "leak_steps.pickle")
    again = snapshot_from_dict(snapshot_to_dict(snap))
    out = save_snapshot(snap, tmp_path / "x.pickle")
    from_file = load_snapshot(out)
    for other in (again, from_file):
        a, b = snap.trace(0), other.trace(0)
        for col in ("action", "addr", "size", "stream", "time_us", "device_free"):
            assert np.array_equal(getattr(a, col), getattr(b, col))
        assert other.step_starts == snap.step_starts
        assert [s.total_size for s in other.segments] == [s.total_size for s in snap.segments]


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # what an attacker's pickle would contain
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_refused_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"segments": [], "device_traces": [[_Evil(marker)]]})
    path = tmp_path / "evil.pickle"
    path.write_bytes(payload)
    for source in (payload, path):
        with pytest.raises(SnapshotFormatError, match="refused, never executed") as info:
            load_snapshot(source)
        assert "system" in str(info.value)
    assert not marker.exists()


def test_any_class_is_refused(tmp_path: Path) -> None:
    payload = pickle.dumps({"segments": [], "device_traces": [], "when": np.int64(3)})
    with pytest.raises(SnapshotFormatError, match="numpy"):
        load_snapshot(payload)


@pytest.mark.parametrize(
    "data, match",
    [
        ([1, 2], "top level is a list"),
        ({"foo": 1}, "neither 'segments' nor 'device_traces'"),
        ({"segments": [3]}, r"segments\[0\] is a int"),
        ({"segments": [{"address": "x", "blocks": []}]}, "'address' is 'x'"),
        (
            {"device_traces": [[{"action": "alloc", "addr": 1, "size": "big"}]]},
            r"device_traces\[0\]\[0\]: 'size' is 'big'",
        ),
        ({"device_traces": [["alloc"]]}, r"device_traces\[0\]\[0\] is a str"),
        ({"device_traces": [[{"action": "alloc", "frames": "f.py"}]]}, "'frames' is a str"),
        ({"device_traces": [[{"action": "alloc", "frames": [3]}]]}, "a frame is a int"),
    ],
)
def test_malformed_dicts_raise_format_error(data: object, match: str) -> None:
    with pytest.raises(SnapshotFormatError, match=match):
        snapshot_from_dict(data)


def test_truncated_and_missing_files(snaps: Path, tmp_path: Path) -> None:
    blob = (snaps / "train_time.pickle").read_bytes()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(SnapshotFormatError, match="truncated"):
        load_snapshot(cut)
    with pytest.raises(SnapshotFormatError, match="cannot open"):
        load_snapshot(tmp_path / "nope.pickle")


def test_unknown_actions_are_kept_as_other() -> None:
    snap = snapshot_from_dict(
        {
            "device_traces": [
                [
                    {"action": "alloc", "addr": 16, "size": 8},
                    {"action": "user_defined", "addr": 0, "size": 0},
                ]
            ]
        }
    )
    assert [ACTIONS[a] for a in snap.trace(0).action] == ["alloc", "other"]


@pytest.mark.parametrize(
    "name",
    [
        "train_time.pickle",
        "legacy_history.pickle",
        "oom.pickle",
        "segments_only.pickle",
        "two_devices.pickle",
    ],
)
def test_saved_snapshot_opens_in_torch_memory_viz(snaps: Path, tmp_path: Path, name: str) -> None:
    """What --save / .save() writes must open in PyTorch's own memory_viz tools."""
    mv = pytest.importorskip("torch.cuda._memory_viz")
    out = save_snapshot(load_snapshot(snaps / name), tmp_path / name)
    with open(out, "rb") as f:
        data = pickle.load(f)
    assert mv.segsum(data).startswith("Summary of segments")
    assert "<script" in mv.trace_plot(data)
    text = mv.trace(data)
    allocs = sum(1 for t in data["device_traces"] for e in t if e["action"] == "alloc")
    assert text.count(" = ") >= allocs


def test_damaged_snapshots_raise_only_format_errors(snaps: Path) -> None:
    """Random damage to fields (wrong types, huge numbers, missing lists) either loads and
    analyses, or raises SnapshotFormatError: never KeyError/TypeError/OverflowError."""
    import copy
    import random

    from gpuprof_nb.analysis.memory import analyze_snapshot

    base = raw(snaps / "train_time.pickle")
    values = [None, "x", -5, 3.5, [], {}, [1], {"a": 1}, True, 2**70, float("nan")]
    rng = random.Random(7)
    loaded = 0
    for _ in range(300):
        d = copy.deepcopy(base)
        if rng.random() < 0.15:
            d[rng.choice(["segments", "device_traces", "allocator_settings"])] = rng.choice(values)
        else:
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.5:
                    e = rng.choice(d["device_traces"][0])
                    e[
                        rng.choice(["action", "addr", "size", "frames", "time_us", "device_free"])
                    ] = rng.choice(values)
                else:
                    seg = rng.choice(d["segments"])
                    blocks = seg.get("blocks")
                    usable = isinstance(blocks, list) and blocks and isinstance(blocks[0], dict)
                    target = rng.choice(blocks) if usable and rng.random() < 0.6 else seg
                    target[
                        rng.choice(
                            ["size", "address", "state", "frames", "total_size", "blocks", "device"]
                        )
                    ] = rng.choice(values)
        try:
            analyze_snapshot(snapshot_from_dict(d))
            loaded += 1
        except SnapshotFormatError:
            pass
    assert 0 < loaded < 300


def test_fixtures_match_their_generator(snaps: Path, tmp_path: Path) -> None:
    """tests/data/snapshots is exactly what tools/make_snapshots.py writes (so expected.json
    is the simulator's truth for these very files)."""
    import importlib.util

    script = Path(__file__).parents[2] / "tools" / "make_snapshots.py"
    spec = importlib.util.spec_from_file_location("make_snapshots", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path)
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in snaps.iterdir())
    for name in made:
        assert (tmp_path / name).read_bytes() == (snaps / name).read_bytes(), name


def test_damaged_gzip_and_odd_notes_are_format_errors(tmp_path) -> None:
    import gzip as _gzip
    import pickle as _pickle

    from gpuprof_nb.errors import SnapshotFormatError as _SFE
    from gpuprof_nb.io.snapshot import load_snapshot as _load

    good = _gzip.compress(_pickle.dumps({"segments": [], "device_traces": []}))
    for damaged in (good[:12], good[:10] + b"\xff" * 20 + good[30:]):
        with pytest.raises(_SFE):
            _load(damaged)
        path = tmp_path / "damaged.pickle.gz"
        path.write_bytes(damaged)
        with pytest.raises(_SFE):
            _load(path)
    odd = {"segments": [], "device_traces": [], "gpuprof_nb": {"notes": 5}}
    assert _load(odd).notes == ()


# ---------------------------------------------------------------------------------------
# Pickles that expand through memo references


def _entry(addr: int) -> dict:
    return {"action": "alloc", "addr": addr, "size": 512, "stream": 0, "frames": []}


def test_memo_bomb_of_entries_refused_naming_file_and_counts(tmp_path: Path) -> None:
    # One list of 1000 references to one entry, referenced 1000 times as devices:
    # 10^6 entries from a few KB, since pickle writes each repeat as a memo reference.
    shared = [_entry(16)] * 1000
    payload = pickle.dumps({"segments": [], "device_traces": [shared] * 1000}, protocol=4)
    assert len(payload) < 10_000
    path = tmp_path / "bomb.pickle"
    path.write_bytes(payload)
    with pytest.raises(SnapshotFormatError) as info:
        load_snapshot(path)
    msg = str(info.value)
    assert str(path) in msg and "1,000,000 history entries" in msg
    assert f"{len(payload):,} bytes" in msg and "_dump_snapshot" in msg
    with pytest.raises(SnapshotFormatError, match="snapshot bytes: .*repeats the same lists"):
        load_snapshot(payload)


def test_memo_bomb_of_blocks_and_step_marks_refused(tmp_path: Path) -> None:
    block = {"address": 0, "size": 512, "state": "inactive", "frames": []}
    segment = {"device": 0, "address": 0, "total_size": 512, "blocks": [block] * 1000}
    with pytest.raises(SnapshotFormatError, match=r"1,000,000 blocks"):
        load_snapshot(pickle.dumps({"segments": [segment] * 1000, "device_traces": []}))
    marks = [0] * 1000
    bomb = {"segments": [], "device_traces": [], "gpuprof_nb": {"step_starts": [marks] * 1000}}
    with pytest.raises(SnapshotFormatError, match=r"1,000,000 step marks"):
        load_snapshot(pickle.dumps(bomb))
    # Empty containers cost objects too: a million segments or devices from one memo entry.
    empty = {"device": 0, "address": 0, "total_size": 0, "blocks": []}
    with pytest.raises(SnapshotFormatError, match=r"1,000,000 segments"):
        load_snapshot(pickle.dumps({"segments": [empty] * 10**6, "device_traces": []}))
    with pytest.raises(SnapshotFormatError, match=r"1,000,000 device traces"):
        load_snapshot(pickle.dumps({"segments": [], "device_traces": [[]] * 10**6}))


def test_limit_counts_the_unzipped_pickle_not_the_file(tmp_path: Path) -> None:
    # 150,000 distinct entries with equal bytes: gzip shrinks them to a few KB, far below
    # 8 bytes an entry, but the pickle itself is large enough to hold them honestly.
    n = 150_000
    payload = pickle.dumps(
        {"segments": [], "device_traces": [[_entry(16) for _ in range(n)]]}, protocol=4
    )
    packed = gzip.compress(payload)
    assert n > 100_000 + len(packed) // 8 and n < 100_000 + len(payload) // 8
    path = tmp_path / "many.pickle.gz"
    path.write_bytes(packed)
    for source in (path, packed):
        assert load_snapshot(source).trace(0).n_events == n


def test_real_snapshots_are_far_inside_the_limit(snaps: Path) -> None:
    from gpuprof_nb.io.snapshot import MIN_BYTES_PER_ITEM

    # Independent count with plain pickle: every fixture spends many times the minimum
    # bytes on each entry and block, so the limit has a wide margin.
    for path in sorted(snaps.glob("*.pickle")):
        data = raw(path)
        items = sum(len(t) for t in data.get("device_traces", [])) + sum(
            len(s["blocks"]) + 1 for s in data.get("segments", [])
        )
        assert path.stat().st_size / items > 5 * MIN_BYTES_PER_ITEM, path.name


def test_dicts_passed_in_are_not_limited() -> None:
    # A dict already in memory (what %%memsnap hands over from torch) is the caller's own.
    shared = [_entry(16)] * 1000
    snap = snapshot_from_dict({"segments": [], "device_traces": [shared] * 150})
    assert sum(t.n_events for t in snap.traces) == 150_000


def test_one_long_frame_list_named_by_many_entries_is_keyed_once(tmp_path: Path) -> None:
    from gpuprof_nb.io.snapshot import _StackTable

    class CountingList(list):
        iterations = 0

        def __iter__(self):
            CountingList.iterations += 1
            return super().__iter__()

    frames = CountingList({"filename": "f.py", "line": i, "name": f"fn{i}"} for i in range(40))
    table = _StackTable("x")
    assert {table.stack_of(frames) for _ in range(1000)} == {0}
    assert CountingList.iterations <= 2  # identities once, contents once; not per entry
    # End to end: 3000 entries sharing one 20,000-frame stack load as one interned stack.
    deep = [{"filename": "f.py", "line": i, "name": "fn"} for i in range(20_000)]
    entries = [dict(_entry(16 * i), frames=deep) for i in range(3000)]
    snap = load_snapshot(pickle.dumps({"segments": [], "device_traces": [entries]}))
    assert len(snap.stacks) == 1 and len(snap.stacks[0]) == 20_000
    assert set(snap.trace(0).stack.tolist()) == {0}
    assert [snap.frames[i].line for i in snap.stacks[0][:3]] == [0, 1, 2]


def test_repeated_notes_are_shown_once() -> None:
    note = "x" * 1000
    snap = load_snapshot(
        pickle.dumps(
            {"segments": [], "device_traces": [], "gpuprof_nb": {"notes": [note] * 5000 + ["y"]}}
        )
    )
    assert snap.notes == (note, "y")
