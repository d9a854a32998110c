"""Planted bottlenecks: small cells that run on CPU under torch.profiler, each built to have
one known problem, must get that problem as their first finding."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

from gpuprof_nb.analysis.diagnose import diagnose  # noqa: E402
from gpuprof_nb.io.trace import load_trace  # noqa: E402


def record(cell, tmp_path, *, memory=False):
    """Run the cell under torch.profiler (record_shapes on), export, and load it back."""
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=memory
    ) as prof:
        cell()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return load_trace(path)


def slow_dataset_cell():
    class SlowDataset(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            time.sleep(0.01)  # a heavy per-sample transform
            return torch.randn(64)

    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=2, num_workers=0)
    w = torch.randn(64, 64)
    for x in loader:
        (x @ w).relu().sum()


def tiny_ops_cell():
    x = torch.ones(8)
    for _ in range(1500):
        x = x * 1.0001 + 0.0001


def big_matmul_cell():
    a, b = torch.randn(768, 768), torch.randn(768, 768)
    for _ in range(6):
        a @ b


def elementwise_chain_cell():
    x = torch.randn(2_000_000)
    for _ in range(12):
        x = torch.sin(x) * 1.5 + 0.1


def dtype_roundtrip_cell():
    x = torch.randn(1_000_000)
    for _ in range(12):
        x = x.to(torch.float64).to(torch.float32)


def python_loop_cell():
    t = torch.ones(4)
    acc = 0
    for _ in range(40):
        for j in range(3000):
            acc += j * j % 7
        t = t + 1


# A notebook cell's variables live on in the user namespace after the cell: the planted
# leak keeps its tensors in a module-level dict for the same reason (cleared by the test).
NAMESPACE: dict = {}


def graph_kept_alive_cell():
    w = torch.randn(256, 256, requires_grad=True)
    NAMESPACE["kept"] = kept = []
    total = 0
    for _ in range(12):
        x = torch.randn(256, 256)
        loss = (x @ w).relu().sum()
        total = total + loss  # keeps every step's graph alive
        kept.append(x @ w)
    NAMESPACE["total"] = total


CASES = [
    ("dataloader", slow_dataset_cell, False),
    ("launch_overhead", tiny_ops_cell, False),
    ("memory_bound", elementwise_chain_cell, False),
    ("dtype_cast", dtype_roundtrip_cell, False),
    ("python_overhead", python_loop_cell, False),
    ("memory_growth", graph_kept_alive_cell, True),
]


# The planted cells recorded once by tools/record_planted.py (real torch.profiler traces):
# which finding comes first depends on how fast the machine ran the cell (a thread paused
# between two tiny ops turns a dispatch gap into a Python gap), so the unit tests judge fixed
# recordings. benchmarks/first_finding.py measures the live ranking on a loaded machine.
RECORDED = Path(__file__).resolve().parents[1] / "data" / "planted_cpu"


@pytest.mark.parametrize("kind", [c[0] for c in CASES])
def test_planted_bottleneck_is_the_first_finding(kind):
    d = diagnose(load_trace(RECORDED / f"{kind}.json.gz"))
    assert d.findings, d.verdict
    assert d.findings[0].kind == kind, [(f.kind, round(f.share, 3)) for f in d.findings]
    assert d.findings[0].severity in ("high", "medium")
    assert kind in d.verdict


def test_large_matmuls_are_compute_bound_and_healthy():
    d = diagnose(load_trace(RECORDED / "compute_bound.json.gz"))
    assert d.findings[0].kind == "compute_bound"
    assert d.findings[0].severity == "info"
    problems = [f for f in d.findings if f.severity in ("high", "medium")]
    assert problems == [], [(f.kind, f.share) for f in problems]
    assert "healthy" in d.verdict.lower()


def test_the_recordings_are_what_the_planted_cells_record_now(tmp_path):
    """Every planted cell recorded live on this torch holds what its fixture holds (the
    same ops, by name and count): the fixtures are not stale."""
    for kind, cell, memory in CASES:
        try:
            live = record(cell, tmp_path, memory=memory)
        finally:
            NAMESPACE.clear()
        fixed = load_trace(RECORDED / f"{kind}.json.gz")
        names = {o.name for o in fixed.ops if o.kind == "op"}
        for name in ("aten::mul", "aten::add", "aten::sin", "aten::to", "aten::mm"):
            if name in names:
                count = sum(1 for o in fixed.ops if o.name == name)
                assert sum(1 for o in live.ops if o.name == name) == count, (kind, name)


# Live recordings: what does not depend on the machine's speed.


def test_dataloader_evidence_matches_the_annotations(tmp_path):
    trace = record(slow_dataset_cell, tmp_path)
    f = diagnose(trace).finding("dataloader")
    nexts = [o for o in trace.ops if "DataLoader" in o.name and "__next__" in o.name]
    # 8 samples in batches of 2 -> 4 batches, plus the call that raises StopIteration.
    assert f.evidence["dataloader_calls_count"] == len(nexts) == 5
    assert f.evidence["dataloader_time_us"] == pytest.approx(sum(o.dur_us for o in nexts))
    # Four batches of two 10 ms sleeps each: at least 80 ms in the loader.
    assert f.evidence["dataloader_time_us"] >= 80_000


def test_dtype_cast_counts_every_conversion(tmp_path):
    trace = record(dtype_roundtrip_cell, tmp_path)
    f = diagnose(trace).finding("dtype_cast")
    assert f.evidence["casts_per_step"] == 24  # 12 round-trips, two casts each, no steps


def test_tiny_ops_are_counted_per_cell(tmp_path):
    trace = record(tiny_ops_cell, tmp_path)
    f = diagnose(trace).finding("launch_overhead")
    # 1500 iterations of a mul and an add, plus the ones() that starts the cell: the calls
    # Python made; the title quotes every op, as the Summary counts them.
    assert f.evidence["top_level_ops_per_step"] == 1 + 2 * 1500
    from gpuprof_nb.analysis.ops import summarize_trace

    assert f.evidence["ops_per_step"] == summarize_trace(trace).op_count > 1 + 2 * 1500


def test_kept_graphs_grow_memory_every_step(tmp_path):
    try:
        trace = record(graph_kept_alive_cell, tmp_path, memory=True)
    finally:
        NAMESPACE.clear()
    f = diagnose(trace).finding("memory_growth")
    assert f.share > 0 and f.evidence["rising_steps_fraction"] >= 0.6
    # Each step keeps x @ w (256x256 fp32) alive in the list, and more through `total`.
    assert f.evidence["growth_total_bytes"] >= 11 * 256 * 256 * 4
