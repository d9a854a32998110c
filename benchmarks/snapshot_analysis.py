"""Comparison 4: memory-snapshot analysis (load + timeline + peak + at-peak) vs unpickling.

Inputs: the largest snapshot in tests/data/snapshots and a synthetic one of about
`big_snapshot_mb` MiB written by `write_synthetic_snapshot` in the format
torch.cuda.memory._dump_snapshot writes (see its docstring). Each approach runs in its own
child process (benchmarks/child.py), so peak memory is per approach.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from benchmarks.config import BenchConfig, Section, Target
from benchmarks.measure import (
    Outcome,
    fmt_s,
    hotspot_lines,
    measure,
    run_child,
    run_script,
    this_python,
)

REPO = Path(__file__).resolve().parent.parent
MIB = 2**20

# --- a streaming pickle writer (protocol 2 opcodes) ------------------------------------
# A 1 GB snapshot holds millions of history entries; building them as Python objects to
# pickle.dump them would need several GB in the generator alone. So the pickle is written
# opcode by opcode. What it decodes to is exactly what pickle.load of a real dump gives:
# dicts, lists, tuples, str, int, bool. Like a real dump, the frame dicts are shared
# between entries (torch symbolizes each distinct frame once), so they are written once
# and referenced by memo afterwards; dict keys and action names are memoized too, since
# torch builds them once (one Python str per key and per action) for the whole snapshot.
PROTO = b"\x80\x02"
EMPTY_DICT, EMPTY_LIST, MARK = b"}", b"]", b"("
SETITEMS, APPENDS, STOP = b"u", b"e", b"."
TUPLE2, NEWTRUE, NEWFALSE, NONE = b"\x86", b"\x88", b"\x89", b"N"


def _int(value: int) -> bytes:
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _str(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


class _Memo:
    """Assigns memo slots: the first use writes the value and PUTs it; later uses GET it."""

    def __init__(self) -> None:
        self.slots: dict[object, int] = {}
        self.gets: dict[object, bytes] = {}  # key -> its GET opcode, once written
        self.frames_done: dict[int, bytes] = {}  # site -> its frames list, all references

    def ref(self, key: object, encode: Callable[[], bytes]) -> bytes:
        got = self.gets.get(key)
        if got is not None:
            return got
        slot = len(self.slots)
        self.slots[key] = slot
        self.gets[key] = b"j" + struct.pack("<I", slot)
        return encode() + b"r" + struct.pack("<I", slot)

    def key(self, name: str) -> bytes:
        got = self.gets.get(name)
        return got if got is not None else self.ref(name, lambda: _str(name))


def _value(v: object, memo: _Memo) -> bytes:
    if v is None:
        return NONE
    if v is True:
        return NEWTRUE
    if v is False:
        return NEWFALSE
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, tuple) and len(v) == 2:
        return _value(v[0], memo) + _value(v[1], memo) + TUPLE2
    if isinstance(v, list):
        return EMPTY_LIST + (MARK + b"".join(_value(x, memo) for x in v) + APPENDS if v else b"")
    if isinstance(v, dict):
        return _dict(v, memo)
    raise TypeError(f"cannot write {type(v).__name__}")


def _dict(d: dict[str, object], memo: _Memo) -> bytes:
    if not d:
        return EMPTY_DICT
    body = b"".join(memo.key(k) + _value(v, memo) for k, v in d.items())
    return EMPTY_DICT + MARK + body + SETITEMS


USER = "/home/user/train.py"
TORCH_PY = (
    ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward"),
    ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750, "_call_impl"),
    (
        "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py",
        1739,
        "_wrapped_call_impl",
    ),
)
CPP = (
    (
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
        1150,
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
    ),
    (
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
        3350,
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate",
    ),
    ("??", 0, "at::native::empty_cuda"),
    ("??", 0, "at::_ops::empty_memory_format::call"),
)


def _stack(site: int) -> list[tuple[str, int, str]]:
    """A stack innermost first, as stacks='all' records it: C++ frames, torch's Python
    frames, the user's line (one of 64 sites), then the outer user frames."""
    return [
        *CPP,
        *TORCH_PY,
        (USER, 100 + site, f"layer_{site % 16}"),
        (USER, 60, "train_step"),
        (USER, 30, "main"),
        (USER, 200, "<module>"),
    ]


def _frames(site: int, memo: _Memo) -> bytes:
    """The entry's own list of the shared frame dicts (after the first use of a site,
    every frame is a memo reference, so the bytes are cached per site)."""
    done = memo.frames_done.get(site)
    if done is not None:
        return done
    refs = []
    for filename, line, name in _stack(site):
        frame = {"filename": filename, "line": line, "name": name}
        refs.append(
            memo.ref(("frame", filename, line, name), lambda frame=frame: _dict(frame, memo))
        )
    out = EMPTY_LIST + MARK + b"".join(refs) + APPENDS
    memo.frames_done[site] = (
        EMPTY_LIST
        + MARK
        + b"".join(memo.gets[("frame", f, ln, n)] for f, ln, n in _stack(site))
        + APPENDS
    )
    return out


def write_synthetic_snapshot(dest: Path, target_bytes: int) -> Path:
    """Write a snapshot pickle of about `target_bytes`: a training loop on device 0 with
    parameters allocated before recording (known only from the segments), per step
    `K` activation allocs freed in reverse (free_requested + free_completed; the same
    addresses reused each step, as the caching allocator does) and one 512-byte block
    kept per step (a slow leak). Segments at dump time agree with the history: the
    parameters and the kept blocks are active_allocated, the rest inactive.
    Reuses `dest` when it was already written for the same size."""
    stamp = dest.with_suffix(dest.suffix + ".done")
    if dest.exists() and stamp.exists() and stamp.read_text().strip() == str(target_bytes):
        return dest
    memo = _Memo()
    base = 0x7F3A00000000
    param_sizes = [4 * MIB] * 8
    act_sizes = [(i % 7 + 1) * 256 * 1024 for i in range(48)]  # 48 blocks, 256 KiB-1.75 MiB
    act_base = base + sum(param_sizes)
    seg_a_total = sum(param_sizes) + sum(act_sizes)
    leak_base = base + 2**32
    t_us = 1_700_000_000_000_000
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".tmp")
    entry_keys = ("action", "addr", "size", "stream", "time_us", "frames")

    def entry(action: str, addr: int, size: int, site: int) -> bytes:
        nonlocal t_us
        t_us += 7
        values = (
            memo.key(action),
            _int(addr),
            _int(size),
            _int(0),
            _int(t_us),
            _frames(site, memo),
        )
        return (
            EMPTY_DICT
            + MARK
            + b"".join(memo.key(k) + v for k, v in zip(entry_keys, values, strict=True))
            + SETITEMS
        )

    steps = 0
    with open(tmp, "wb") as out:
        # Top-level dict; its 'device_traces' value comes first so the history can be
        # streamed, then the segments (whose kept-block list depends on the step count).
        out.write(PROTO + EMPTY_DICT + MARK)
        out.write(memo.key("device_traces") + EMPTY_LIST + MARK + EMPTY_LIST)
        written = out.tell()
        first = True
        # Leak segment: recorded as allocated during the history (its segment_alloc).
        leak_total = 0
        while written < target_bytes:
            chunk = [MARK]
            if first:
                # Room for one kept block per step (a step writes ~20 KB of history).
                leak_total = (target_bytes // 10_000) * 512 + 2 * MIB
                chunk.append(entry("segment_alloc", leak_base, leak_total, 0))
                first = False
            offsets = []
            cursor = act_base
            for i, size in enumerate(act_sizes):
                chunk.append(entry("alloc", cursor, size, i))
                offsets.append((cursor, size, i))
                cursor += size
            if (steps + 1) * 512 <= leak_total:
                chunk.append(entry("alloc", leak_base + steps * 512, 512, 63))
            for addr, size, i in reversed(offsets):
                chunk.append(entry("free_requested", addr, size, i))
                chunk.append(entry("free_completed", addr, size, i))
            chunk.append(APPENDS)
            data = b"".join(chunk)
            out.write(data)
            written += len(data)
            steps += 1
        out.write(APPENDS)  # closes the list of device traces (one device)
        kept = min(steps, leak_total // 512)
        segments = [
            _segment(
                0,
                base,
                seg_a_total,
                [(base + i * s, s, "active_allocated", 50 + i) for i, s in enumerate(param_sizes)]
                + [(act_base, sum(act_sizes), "inactive", None)],
            ),
            _segment(
                0,
                leak_base,
                leak_total,
                [(leak_base + i * 512, 512, "active_allocated", 63) for i in range(kept)]
                + [(leak_base + kept * 512, leak_total - kept * 512, "inactive", None)],
            ),
        ]
        out.write(memo.key("segments") + EMPTY_LIST + MARK)
        for seg in segments:
            out.write(_segment_bytes(seg, memo))
        out.write(APPENDS)
        settings = {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
        }
        out.write(memo.key("allocator_settings") + _dict(settings, memo))
        out.write(SETITEMS + STOP)
    os.replace(tmp, dest)
    stamp.write_text(str(target_bytes))
    return dest


def _segment(
    device: int, address: int, total: int, blocks: list[tuple[int, int, str, int | None]]
) -> dict[str, object]:
    allocated = sum(size for _, size, state, _ in blocks if state == "active_allocated")
    return {
        "device": device,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": "large" if total > MIB else "small",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "blocks": blocks,
    }


def _segment_bytes(seg: dict[str, object], memo: _Memo) -> bytes:
    parts = [EMPTY_DICT, MARK]
    for key, value in seg.items():
        if key == "blocks":
            continue
        parts.append(memo.key(key) + _value(value, memo))
    parts.append(memo.key("blocks") + EMPTY_LIST)
    blocks = seg["blocks"]
    assert isinstance(blocks, list)
    if blocks:
        parts.append(MARK)
        for address, size, state, site in blocks:
            body = (
                memo.key("address")
                + _int(address)
                + memo.key("size")
                + _int(size)
                + memo.key("requested_size")
                + _int(size if site is not None else 0)
                + memo.key("state")
                + _str(state)
                + memo.key("frames")
                + (_frames(site, memo) if site is not None else EMPTY_LIST)
            )
            parts.append(EMPTY_DICT + MARK + body + SETITEMS)
        parts.append(APPENDS)
    parts.append(SETITEMS)
    return b"".join(parts)


def write_in_child(dest: Path, target_bytes: int) -> Path:
    """write_synthetic_snapshot in a child process (keeps this process small)."""
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "from benchmarks.snapshot_analysis import write_synthetic_snapshot;"
        "write_synthetic_snapshot(Path(sys.argv[2]), int(sys.argv[3]))"
    )
    run_script(code, str(REPO), str(dest), str(target_bytes))
    return dest


def _fmt_mb(n: float) -> str:
    return f"{n / MIB:.0f} MB" if n >= 10 * MIB else f"{n / MIB:.2f} MB"


MID_SNAPSHOT_MB = 64


def run(cfg: BenchConfig) -> Section:
    inputs: list[tuple[str, Path, int]] = []
    snap_dir = REPO / "tests" / "data" / "snapshots"
    existing = sorted(snap_dir.glob("*.pickle"), key=lambda p: p.stat().st_size)
    if existing:
        inputs.append(
            (f"largest in tests/data/snapshots: `{existing[-1].name}`", existing[-1], cfg.repeats)
        )
    if cfg.big_snapshot_mb > MID_SNAPSHOT_MB and not cfg.quick:
        # A mid-size one too: the ratio between the fixture and the 1 GB extreme.
        dest = cfg.cache_dir / f"synthetic_snapshot_{MID_SNAPSHOT_MB}mb.pickle"
        write_in_child(dest, MID_SNAPSHOT_MB * MIB)
        inputs.append((f"synthetic, {MID_SNAPSHOT_MB} MiB target", dest, cfg.repeats))
    if cfg.big_snapshot_mb > 0:
        dest = cfg.cache_dir / f"synthetic_snapshot_{cfg.big_snapshot_mb}mb.pickle"
        write_in_child(dest, cfg.big_snapshot_mb * MIB)
        inputs.append(
            (
                f"synthetic, {cfg.big_snapshot_mb} MiB target",
                dest,
                cfg.big_repeats if cfg.big_snapshot_mb >= 256 else cfg.repeats,
            )
        )
    lines = [
        "gpuprof_nb = `load_snapshot` + `analyze_snapshot` (timeline, peak, at-peak, and also "
        "leaks, segments and findings); floor = `pickle.load` of the same file. Work time "
        "only (imports excluded), median of runs; peak = the child's high-water RSS.",
        "",
        "| snapshot | pickle size | history entries | pickle.load | gpuprof_nb | ours / floor "
        "| peak floor | peak ours | stages (ours) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    targets: list[Target] = []
    measured: list[tuple[Path, Outcome, Outcome]] = []
    for label, path, repeats in inputs:
        floor = measure(
            "pickle.load",
            this_python(),
            "unpickle-floor",
            str(path),
            repeats=repeats,
            cap_bytes=cfg.cap_bytes,
        )
        ours = measure(
            "gpuprof_nb",
            this_python(),
            "gpuprof-snapshot",
            str(path),
            repeats=repeats,
            cap_bytes=cfg.cap_bytes,
        )
        ratio = (
            ours.median_seconds / floor.median_seconds
            if ours.ok and floor.ok and floor.median_seconds > 0
            else float("nan")
        )
        entries = floor.facts.get("trace_entries", "-") if floor.ok else "-"
        stages = (
            ", ".join(f"{n} {fmt_s(ours.median_stage(n))}" for n in ours.runs[0].stages)
            if ours.ok
            else "-"
        )
        lines.append(
            f"| {label} | {_fmt_mb(path.stat().st_size)} | {entries} | {_cell(floor)} "
            f"| {_cell(ours)} | {'-' if ratio != ratio else f'{ratio:.2f}x'} "
            f"| {_fmt_mb(floor.peak_rss_bytes) if floor.ok else '-'} "
            f"| {_fmt_mb(ours.peak_rss_bytes) if ours.ok else '-'} | {stages} |"
        )
        measured.append((path, floor, ours))
        judged = path.stat().st_size >= MIB  # tiny files time fixed costs, not the analysis
        targets.append(
            Target(
                f"{label}: time vs pickle.load",
                f"{ratio:.2f}x" if ratio == ratio else f"failed: {ours.error or floor.error}",
                "<= 2x",
                (ratio <= 2 if ratio == ratio else False) if judged else None,
            )
        )
    tiny = [label for (label, path, _), t in zip(inputs, targets, strict=True) if t.met is None]
    if tiny:
        lines += [
            "",
            f"Not judged: {', '.join(tiny)}, under 1 MiB. This machine has no GPU, so "
            "the largest snapshots it has are the test fixtures of a few KB; on them the "
            "ratio compares fixed per-call costs (about 1 ms: the restricted unpickler, "
            "the numpy set-up of each analysis) with an unpickle of well under 0.1 ms, "
            "not the analysis. Snapshots of 1 MiB or more are judged.",
        ]
    if any(t.met is False for t in targets):
        lines += ["", *_gap_notes(cfg, measured)]
    return Section("4. Snapshot analysis", "\n".join(lines), tuple(targets))


def _gap_notes(cfg: BenchConfig, measured: list[tuple[Path, Outcome, Outcome]]) -> list[str]:
    """Where the time goes when the target is missed: stages, then cProfile hotspots on a
    snapshot of at most 64 MiB (profiling the 1 GB one would take minutes)."""
    out = ["### Missed target: what the numbers say", ""]
    big = [(p, f, o) for p, f, o in measured if f.ok and o.ok]
    if big:
        path, floor, ours = max(big, key=lambda m: m[0].stat().st_size)
        load = ours.median_stage("load")
        extra = max(load - floor.median_seconds, 0)
        out.append(
            f"- On the {_fmt_mb(path.stat().st_size)} snapshot, load_snapshot takes "
            f"{fmt_s(load)} of gpuprof_nb's {fmt_s(ours.median_seconds)}; pickle.load alone "
            f"takes {fmt_s(floor.median_seconds)}, so {fmt_s(extra)} "
            "of loading is turning the unpickled entries into the columnar model."
        )
    size = min(64, cfg.big_snapshot_mb) if cfg.big_snapshot_mb > 0 else 0
    if size:
        path = cfg.cache_dir / f"synthetic_snapshot_{size}mb.pickle"
        write_in_child(path, size * MIB)
        try:
            prof = run_child(
                this_python(), "gpuprof-snapshot", str(path), cap_bytes=cfg.cap_bytes, profile=True
            )
        except (RuntimeError, ValueError, OSError) as exc:
            out.append(f"- (profiling failed: {exc})")
        else:
            out += [
                "",
                f"Hotspots of gpuprof_nb on the {size} MiB synthetic snapshot (cProfile, "
                "own time; inflated by the profiler):",
                "",
                *hotspot_lines(prof),
            ]
    return out


def _cell(outcome: Outcome) -> str:
    return fmt_s(outcome.median_seconds) if outcome.ok else f"failed: {outcome.error}"
