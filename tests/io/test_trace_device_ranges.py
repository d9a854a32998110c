"""What the loader reads for the timeline's device-side analyses: `gpu_user_annotation`
events (Trace.gpu_annotations) and the event-wait fields of `cuda_sync` events, checked
against a plain reading of the raw JSON of real traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuprof_nb.io.trace import load_trace, trace_from_dict

DATA = Path(__file__).parents[1] / "data"
WITH_GPU_ANNOTATIONS = [
    DATA / "v100_ns_resolution/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    DATA / "a100_nccl/nccl_data.json.gz",
    DATA / "amd_mi250_toy/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    DATA / "mi300_compile_triton/trace.json.gz",
]
WITH_EVENT_WAITS = [
    DATA / "a100_multistream_sync/event_sync_trace.json.gz",
    DATA / "a100_event_sync/event_sync_trace.json.gz",
    DATA / "a100_alexnet_sync/benchmark_result_2869224_1695835535_trace.json.gz",
]


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


@pytest.mark.parametrize("path", WITH_GPU_ANNOTATIONS, ids=lambda p: p.parent.name)
def test_gpu_user_annotations_are_read_as_recorded(path: Path) -> None:
    raw = sorted(
        (e for e in _events(path) if e.get("cat") == "gpu_user_annotation"),
        key=lambda e: e["ts"],
    )
    trace = load_trace(path)
    assert len(trace.gpu_annotations) == len(raw) > 0
    for got, e in zip(trace.gpu_annotations, raw, strict=True):
        assert (got.name, got.start_us, got.dur_us) == (e["name"], e["ts"], e["dur"])
        # The device is the event's pid, the stream its tid (the kernels' lanes).
        assert (got.device, got.stream) == (int(e["pid"]), int(e["tid"]))
        assert got.external_id == e["args"]["External id"]
        assert got.end_us == pytest.approx(e["ts"] + e["dur"])
    # They are device ranges, not host ops: the op list is unchanged by them.
    assert not any(o.name == raw[0]["name"] and o.start_us == raw[0]["ts"] for o in trace.ops)


@pytest.mark.parametrize("path", WITH_EVENT_WAITS, ids=lambda p: p.parent.name)
def test_sync_events_keep_what_they_waited_on(path: Path) -> None:
    raw = sorted((e for e in _events(path) if e.get("cat") == "cuda_sync"), key=lambda e: e["ts"])
    trace = load_trace(path)
    assert len(trace.syncs) == len(raw)
    for got, e in zip(trace.syncs, raw, strict=True):
        args = e["args"]
        stream = args.get("wait_on_stream", -1)
        record = args.get("wait_on_cuda_event_record_corr_id", -1)
        assert got.wait_on_stream == (stream if stream >= 0 else None)
        assert got.wait_on_event_record == (record if record >= 0 else None)
        assert got.correlation == args["correlation"]


def test_the_dict_reader_reads_them_alike() -> None:
    # trace_from_dict takes the same road as the file reader.
    path = WITH_EVENT_WAITS[0]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    assert trace_from_dict(d).syncs == load_trace(path).syncs
    path = WITH_GPU_ANNOTATIONS[2]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        d = json.load(f)
    assert trace_from_dict(d).gpu_annotations == load_trace(path).gpu_annotations
