"""The H100 recordings of issue 35's GPU pass (tests/data/gpu/README.md, second table),
replayed offline: module device time against the raw JSON's device events, MFU against a
hand count and the datasheet, CUDA graph replays against the raw launches and kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import gpuprof_nb

GPU = Path(__file__).parent.parent / "data" / "gpu"
DEVICE_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


def _events(name: str) -> list[dict]:
    with gzip.open(GPU / name) as fh:
        return json.load(fh)["traceEvents"]


@pytest.mark.parametrize("name", ["modules_transformer.json.gz", "modules_cnn.json.gz"])
def test_module_device_time_adds_up_to_the_device_events(name: str) -> None:
    raw = sum(e["dur"] for e in _events(name) if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)
    report = gpuprof_nb.analyze(gpuprof_nb.load_trace(GPU / name))
    mb = report.modules
    assert mb is not None and mb.on_device and mb.rows
    assert sum(r.device_us for r in mb.roots) + mb.outside_us == pytest.approx(raw, rel=1e-9)
    for r in mb.rows:
        assert 0 <= r.device_us <= raw + 1e-6
    # Backward is charged to the modules whose weights it differentiates.
    weighted = [r for r in mb.rows if r.module_type in ("Linear", "Conv2d", "Embedding")]
    assert weighted and all(r.backward_device_us > 0 for r in weighted)


def test_bf16_matmuls_mfu_is_the_hand_count_over_the_datasheet_peak() -> None:
    events = _events("mfu_bf16_matmuls.json.gz")
    mm = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    flops = sum(
        2 * e["args"]["Input Dims"][0][0] * e["args"]["Input Dims"][0][1] * 4096 for e in mm
    )
    assert len(mm) == 16 and flops == 16 * 2 * 4096**3
    m = gpuprof_nb.analyze(gpuprof_nb.load_trace(GPU / "mfu_bf16_matmuls.json.gz")).mfu
    assert m is not None and m.roof == "bf16" and not m.measured_peak  # no ceilings offline
    assert m.model_flops_per_step == flops
    assert m.peak_flops_per_s == pytest.approx(989.5e12)
    assert m.mfu == pytest.approx(flops / (m.step_us * 1e-6) / 989.5e12)
    assert 0 < m.mfu <= 1  # type: ignore[operator]


def test_cuda_graph_replays_are_charged_to_their_launches() -> None:
    events = _events("cuda_graphs.json.gz")
    launches = [
        e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"
    ]
    ids = {e["args"]["correlation"] for e in launches}
    replayed = [
        e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in ids
    ]
    g = gpuprof_nb.analyze(gpuprof_nb.load_trace(GPU / "cuda_graphs.json.gz")).graph_replays
    assert g is not None
    assert g.launches == len(launches) == 20
    assert g.kernels == len(replayed) == 320
    assert g.device_us == pytest.approx(sum(e["dur"] for e in replayed), rel=1e-9)
    assert all(r.launched_from != "(no op)" or r.module for r in g.rows)
