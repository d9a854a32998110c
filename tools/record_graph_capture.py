"""Record, on a CUDA machine, the real traces issue 38's offline parts need and no shared
trace holds:

    OUT/graph_capture.json.gz  torch.profiler over the capture of a CUDA graph (a 3-layer
                               MLP's forward): the captured ops and their launch calls,
                               between cudaStreamBeginCapture and cudaStreamEndCapture
    OUT/graph_replay.json.gz   torch.profiler over 5 replays of that graph: cudaGraphLaunch
                               calls and the kernels they ran, which no op owns
    OUT/direct_launch.json.gz  a Triton kernel launched directly (no torch op around its
                               launch), profiled with with_stack=True: its device time
                               must show under its launch call and this file's line
    OUT/summary.json           what each shows when gpuprof_nb reads it

then `tests/io/test_graph_capture.py` and `tests/analysis/test_launchers.py` check them once
they are copied into tests/data/gpu/ (with a line each in tests/data/gpu/README.md).

Without CUDA it records nothing, says so, and exits 0 (a rehearsal of the script's own code
paths up to the device).

Run: KINETO_LOG_LEVEL=6 python tools/record_graph_capture.py OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _profile():  # noqa: ANN202 - torch's type
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)


def record_graph(out: Path) -> dict:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.GELU()
    ).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    # Warm-up on a side stream, as torch.cuda.graph's documentation asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with _profile() as prof, torch.no_grad(), torch.cuda.graph(graph):
        model(static_in)
    prof.export_chrome_trace(str(out / "graph_capture.json"))
    torch.cuda.synchronize()
    with _profile() as prof:
        for _ in range(5):
            static_in.copy_(torch.randn(64, 512, device="cuda"))
            graph.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(out / "graph_replay.json"))
    return {"replays": 5}


def record_direct_launch(out: Path) -> dict:
    import torch

    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        return {"skipped": f"no triton: {exc}"}

    @triton.jit
    def add_one(x_ptr, n, block: tl.constexpr):  # noqa: ANN001, ANN202
        offsets = tl.program_id(0) * block + tl.arange(0, block)
        mask = offsets < n
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)

    x = torch.zeros(1 << 20, device="cuda")
    add_one[(x.numel() // 1024,)](x, x.numel(), block=1024)  # compile outside the profile
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as p:
        for _ in range(10):
            add_one[(x.numel() // 1024,)](x, x.numel(), block=1024)  # the direct launch
        torch.cuda.synchronize()
    p.export_chrome_trace(str(out / "direct_launch.json"))
    return {"launches": 10}


def _gzip(path: Path) -> Path:
    import gzip
    import shutil

    target = path.with_suffix(".json.gz")
    with open(path, "rb") as src, gzip.open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return target


def summarize(out: Path) -> dict:
    """What gpuprof_nb reads from the recordings (the checks the tests will make)."""
    from gpuprof_nb.analysis.ops import top_ops
    from gpuprof_nb.io.trace import load_trace

    summary: dict = {}
    capture, replay = out / "graph_capture.json.gz", out / "graph_replay.json.gz"
    if capture.exists() and replay.exists():
        bare = top_ops(load_trace(replay))
        merged_trace = load_trace(replay, capture=capture)
        merged = top_ops(merged_trace)
        summary["graph"] = {
            "unattributed_before_us": bare.unattributed_device_us,
            "unattributed_after_us": merged.unattributed_device_us,
            "rows_after": [(r.name, r.calls, r.self_device_us) for r in merged.rows[:8]],
            "warnings": list(merged_trace.load_warnings),
        }
    direct = out / "direct_launch.json.gz"
    if direct.exists():
        table = top_ops(load_trace(direct))
        summary["direct_launch"] = [
            (r.name, r.line, r.kernels, r.device_us) for r in table.launchers
        ]
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("record_graph_capture: no CUDA device here: nothing recorded (a rehearsal)")
        (out / "summary.json").write_text(json.dumps({"cuda": False}, indent=1))
        return 0
    result: dict = {"cuda": True, "device": torch.cuda.get_device_name(0)}
    for name, step in (("graph", record_graph), ("direct_launch", record_direct_launch)):
        try:
            result[name] = step(out)
        except Exception as exc:  # noqa: BLE001 - recorded; the other step still runs
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    for raw in out.glob("*.json"):
        if raw.name != "summary.json":
            _gzip(raw)
    result["summary"] = summarize(out)
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
