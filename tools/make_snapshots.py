"""Build small CUDA memory snapshots in the exact format torch.cuda.memory._dump_snapshot
writes, for tests on machines without a GPU.

A tiny simulated caching allocator emits the history entries (segment_alloc, alloc,
free_requested, free_completed, segment_free, oom) and, at the end, the segments with their
blocks as the allocator would report them at dump time. It also keeps the ground truth a
snapshot cannot hold by itself (the true live bytes after every entry, including memory
allocated before recording) and writes it to expected.json, so tests compare the analysis
with the simulation rather than with numbers typed in by hand.

Run: .venv/bin/python tools/make_snapshots.py [OUT_DIR]   (default tests/data/snapshots)
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

MIB = 2**20
KIB = 2**10

USER = "/home/user/train.py"
LINEAR = "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py"
ADAM = "/opt/conda/lib/python3.11/site-packages/torch/optim/adam.py"


def frames(
    user_line: int, user_fn: str, *, torch_file: str | None = LINEAR, cpp: bool = False
) -> list[dict[str, Any]]:
    """A stack innermost first: optional C++ frames, a torch frame, then the user's
    line and the module body, as `stacks='all'` / `'python'` record them."""
    out: list[dict[str, Any]] = []
    if cpp:
        out += [
            {
                "filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
                "line": 1150,
                "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            },
            {"filename": "??", "line": 0, "name": "at::native::empty_cuda"},
        ]
    if torch_file:
        out.append({"filename": torch_file, "line": 125, "name": "forward"})
    out.append({"filename": USER, "line": user_line, "name": user_fn})
    out.append({"filename": USER, "line": 90, "name": "<module>"})
    return out


class Allocator:
    """Bump-pointer segments; freed ranges become inactive blocks at dump time."""

    def __init__(self, device: int = 0, *, with_time: bool = True, cpp: bool = False) -> None:
        self.device = device
        self.with_time = with_time
        self.cpp = cpp
        self.entries: list[dict[str, Any]] = []
        self.t_us = 1_700_000_000_000_000 + device * 1000
        self.next_seg = 0x7F0000000000 + device * 0x10000000000
        self.segments: dict[int, dict[str, Any]] = {}  # address -> {total, bump, stream}
        self.live: dict[int, tuple[int, list[dict[str, Any]], bool]] = {}  # addr -> size..
        self.live_bytes = 0
        self.truth: list[int] = []  # live bytes after each entry (incl. pre-recording)
        self.recording = True

    def _emit(
        self, action: str, addr: int | None, size: int, fr: list[dict[str, Any]], **extra: Any
    ) -> None:
        self.t_us += 137
        if not self.recording:
            return
        e: dict[str, Any] = {"action": action, "size": size, "stream": 0, "frames": fr}
        if addr is not None:
            e["addr"] = addr
        if self.with_time:
            e["time_us"] = self.t_us
        e.update(extra)
        self.entries.append(e)
        self.truth.append(self.live_bytes)

    def segment(self, total: int) -> int:
        addr = self.next_seg
        self.next_seg += max(total, 2 * MIB) * 2
        self.segments[addr] = {"total": total, "bump": addr}
        self._emit("segment_alloc", addr, total, frames(12, "build", cpp=self.cpp))
        return addr

    def alloc(self, seg: int, size: int, fr: list[dict[str, Any]], at: int | None = None) -> int:
        s = self.segments[seg]
        if at is None:
            at = s["bump"]
            s["bump"] += size
        assert s["bump"] <= seg + s["total"], "segment overflow in the simulation"
        self.live[at] = (size, fr, False)
        self.live_bytes += size
        self._emit("alloc", at, size, fr)
        return at

    def free(self, addr: int, *, complete: bool = True) -> None:
        size, fr, _ = self.live[addr]
        self._emit("free_requested", addr, size, fr)
        if complete:
            self.complete(addr)
        else:
            self.live[addr] = (size, fr, True)

    def complete(self, addr: int) -> None:
        size, fr, _ = self.live.pop(addr)
        self.live_bytes -= size
        self._emit("free_completed", addr, size, fr)

    def free_segment(self, seg: int) -> None:
        s = self.segments.pop(seg)
        assert not any(seg <= a < seg + s["total"] for a in self.live), "segment in use"
        self._emit("segment_free", seg, s["total"], frames(40, "cleanup", cpp=self.cpp))

    def oom(self, size: int, device_free: int, fr: list[dict[str, Any]]) -> None:
        self._emit("oom", None, size, fr, device_free=device_free)

    def dump_segments(self) -> list[dict[str, Any]]:
        out = []
        for seg, s in sorted(self.segments.items()):
            blocks: list[dict[str, Any]] = []
            cursor = seg
            for addr in sorted(a for a in self.live if seg <= a < seg + s["total"]):
                size, fr, pending = self.live[addr]
                if addr > cursor:
                    blocks.append(
                        {
                            "address": cursor,
                            "size": addr - cursor,
                            "requested_size": 0,
                            "state": "inactive",
                            "frames": [],
                        }
                    )
                blocks.append(
                    {
                        "address": addr,
                        "size": size,
                        "requested_size": size - 3,
                        "state": "active_pending_free" if pending else "active_allocated",
                        "frames": fr,
                    }
                )
                cursor = addr + size
            if cursor < seg + s["total"]:
                blocks.append(
                    {
                        "address": cursor,
                        "size": seg + s["total"] - cursor,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    }
                )
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            active = sum(b["size"] for b in blocks if b["state"] != "inactive")
            out.append(
                {
                    "device": self.device,
                    "address": seg,
                    "total_size": s["total"],
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": sum(b["requested_size"] for b in blocks),
                    "stream": 0,
                    "segment_type": "large" if s["total"] > MIB else "small",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "blocks": blocks,
                }
            )
        return out


SETTINGS = {
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "max_split_size": -1,
    "garbage_collection_threshold": 0.0,
    "expandable_segments": False,
    "pinned_num_register_threads": 1,
}


def training_steps(a: Allocator, steps: int = 3, leak: bool = False) -> list[int]:
    """Parameters before recording, then forward/backward/optimizer steps. With `leak`,
    each step keeps its loss (and a chunk of activations) alive. Returns the entry index
    where each step starts."""
    seg = a.segment(20 * MIB)
    a.recording = False
    a.alloc(seg, 4 * MIB, frames(20, "__init__", torch_file=None))
    a.alloc(seg, 2 * MIB, frames(21, "__init__", torch_file=None))
    a.recording = True
    act_seg = a.segment(40 * MIB)
    leak_seg = a.segment(16 * MIB) if leak else act_seg
    starts = []
    opt_state: list[int] = []
    for _ in range(steps):
        starts.append(len(a.entries))
        # Everything in the activation segment is freed by the end of a step, so each
        # step reuses the same addresses, as the caching allocator does.
        a.segments[act_seg]["bump"] = act_seg
        x = a.alloc(act_seg, 1 * MIB, frames(30, "load_batch", torch_file=None))
        h = a.alloc(act_seg, 8 * MIB, frames(31, "forward"))
        o = a.alloc(act_seg, 4 * MIB, frames(32, "forward"))
        loss = a.alloc(leak_seg, 512, frames(33, "loss_fn", torch_file=None))
        g = a.alloc(act_seg, 6 * MIB, frames(34, "backward", torch_file=None))
        if not opt_state:
            opt_seg = a.segment(12 * MIB)
            opt_state = [
                a.alloc(opt_seg, 4 * MIB, frames(40, "step", torch_file=ADAM)),
                a.alloc(opt_seg, 4 * MIB, frames(40, "step", torch_file=ADAM)),
            ]
        a.free(g)
        a.free(o)
        a.free(h, complete=False)  # another stream still uses it for a moment
        a.complete(h)
        a.free(x)
        if leak:
            # The kept loss pins a slice of the graph: 3 MiB per step stay alive.
            a.alloc(leak_seg, 3 * MIB - 512, frames(36, "train_loop", torch_file=None))
        else:
            a.free(loss)
    return starts


def build(out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    expected: dict[str, Any] = {}

    def write(name: str, data: dict[str, Any], truth: dict[str, Any]) -> None:
        with open(out_dir / name, "wb") as f:
            pickle.dump(data, f, protocol=4)
        expected[name] = truth

    # 1. A training loop with time_us, C++ frames, a pending free, parameters allocated
    # before recording.
    a = Allocator(cpp=True)
    starts = training_steps(a, steps=3)
    # A block freed by the program but still awaited by another stream at dump time.
    side = a.segment(2 * MIB)
    a.free(a.alloc(side, 1 * MIB, frames(80, "prefetch", torch_file=None)), complete=False)
    write(
        "train_time.pickle",
        {
            "segments": a.dump_segments(),
            "device_traces": [a.entries],
            "allocator_settings": SETTINGS,
            "external_annotations": [],
        },
        {
            "true_peak_bytes": max(a.truth),
            "live_end_bytes": a.live_bytes,
            "step_starts": starts,
            "n_events": len(a.entries),
            "has_time": True,
        },
    )

    # 2. The same without time_us (snapshots from before the field existed).
    a = Allocator(with_time=False)
    starts = training_steps(a, steps=3)
    write(
        "train_no_time.pickle",
        {"segments": a.dump_segments(), "device_traces": [a.entries]},
        {
            "true_peak_bytes": max(a.truth),
            "live_end_bytes": a.live_bytes,
            "step_starts": starts,
            "n_events": len(a.entries),
            "has_time": False,
        },
    )

    # 3. Truncated history: a ring buffer kept only the last entries, so frees arrive
    # for allocations the history no longer holds.
    a = Allocator()
    training_steps(a, steps=4)
    keep = 23
    dropped = len(a.entries) - keep
    write(
        "truncated.pickle",
        {"segments": a.dump_segments(), "device_traces": [a.entries[dropped:]]},
        {
            "true_peak_bytes": max(a.truth[dropped:]),
            "live_end_bytes": a.live_bytes,
            "n_events": keep,
            "dropped": dropped,
            "has_time": True,
        },
    )

    # 4. A leak across steps: each step leaves 3 MiB behind.
    a = Allocator()
    starts = training_steps(a, steps=4, leak=True)
    write(
        "leak_steps.pickle",
        {
            "segments": a.dump_segments(),
            "device_traces": [a.entries],
            "gpuprof_nb": {"source": "cuda", "step_starts": [starts], "notes": []},
        },
        {
            "true_peak_bytes": max(a.truth),
            "live_end_bytes": a.live_bytes,
            "step_starts": starts,
            "leak_bytes_per_step": 3 * MIB,
            "has_time": True,
        },
    )

    # 5. Two devices; device 1 has the longer history.
    a0, a1 = Allocator(0), Allocator(1)
    training_steps(a0, steps=1)
    training_steps(a1, steps=2)
    write(
        "two_devices.pickle",
        {
            "segments": a0.dump_segments() + a1.dump_segments(),
            "device_traces": [a0.entries, a1.entries],
        },
        {
            "true_peak_bytes_by_device": [max(a0.truth), max(a1.truth)],
            "n_events_by_device": [len(a0.entries), len(a1.entries)],
        },
    )

    # 6. Segments only: recorded with enabled='state', so no history.
    a = Allocator()
    training_steps(a, steps=2)
    segs = a.dump_segments()
    write(
        "segments_only.pickle",
        {"segments": segs, "device_traces": [[]]},
        {"live_end_bytes": a.live_bytes, "reserved_bytes": sum(s["total_size"] for s in segs)},
    )

    # 7. OOM: one request larger than what the device has left.
    a = Allocator()
    seg = a.segment(64 * MIB)
    for i in range(6):
        a.alloc(seg, 10 * MIB, frames(50 + i, "build_cache"))
    need = 256 * MIB
    a.oom(need, device_free=100 * MIB, fr=frames(60, "giant", torch_file=None))
    write(
        "oom.pickle",
        {"segments": a.dump_segments(), "device_traces": [a.entries]},
        {
            "true_peak_bytes": max(a.truth),
            "requested_bytes": need,
            "device_free_bytes": 100 * MIB,
            "reserved_bytes": 64 * MIB,
            "live_end_bytes": a.live_bytes,
        },
    )

    # 8. Fragmentation: small keepers interleaved with freed pieces; no large piece left.
    a = Allocator()
    seg = a.segment(32 * MIB)
    blocks = [a.alloc(seg, 1 * MIB, frames(70, "tokenize")) for _ in range(32)]
    for i, b in enumerate(blocks):
        if i % 2 == 0:
            a.free(b)
    a.oom(4 * MIB, device_free=0, fr=frames(72, "pad_batch", torch_file=None))
    segs = a.dump_segments()
    write(
        "fragmented.pickle",
        {"segments": segs, "device_traces": [a.entries]},
        {
            "true_peak_bytes": max(a.truth),
            "free_in_segments_bytes": 16 * MIB,
            "largest_free_block_bytes": 1 * MIB,
            "n_free_blocks": 16,
            "reserved_bytes": 32 * MIB,
        },
    )

    # 9. The block layout of PyTorch 2.0: frames and requested size in 'history'.
    a = Allocator(with_time=False)
    training_steps(a, steps=1)
    legacy = a.dump_segments()
    for s in legacy:
        for b in s["blocks"]:
            fr = b.pop("frames")
            req = b.pop("requested_size")
            del b["address"]
            if b["state"] != "inactive":
                b["history"] = [{"addr": 0, "real_size": req, "frames": fr}]
    write(
        "legacy_history.pickle",
        {"segments": legacy, "device_traces": [a.entries]},
        {"true_peak_bytes": max(a.truth), "live_end_bytes": a.live_bytes},
    )

    with open(out_dir / "expected.json", "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    return expected


if __name__ == "__main__":
    target = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else (Path(__file__).resolve().parent.parent / "tests" / "data" / "snapshots")
    )
    done = build(target)
    print(f"wrote {len(done)} snapshots to {target}")
