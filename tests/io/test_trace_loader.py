"""load_trace / trace_from_dict on real traces, checked against a plain-json recomputation."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from _paths import SHARED_TRACES as SHARED

from gpuprof_nb.analysis.intervals import device_busy_us
from gpuprof_nb.analysis.ops import kernel_table
from gpuprof_nb.io.trace import decode as trace_decode
from gpuprof_nb.io.trace import load_trace, trace_from_dict
from gpuprof_nb.model.trace import DistributedInfo, Step

DATA = Path(__file__).parents[1] / "data"
NOT_TRACES = {"memory_timeline.raw.gz"}

DEVICE_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
# What the loader reads as host events (ops, annotations, runtime calls, syncs), a stream in
# their args or not.
HOST_CATS = {
    "cpu_op",
    "Operator",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "Runtime",
    "cuda_sync",
    "Trace",
}
KIND_OF_CAT = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}


def _looks_like_trace(path: Path) -> bool:
    """Other layers keep non-trace JSON in tests/data too: peek for the event keys."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        head = f.read(1 << 16)
    return b'"traceEvents"' in head or b'"ph"' in head


def _trace_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name not in NOT_TRACES
        and p.name.endswith((".json", ".json.gz"))
        and _looks_like_trace(p)
    )


LOCAL = _trace_files(DATA)
SHARED_FILES = _trace_files(SHARED)


def _plain_json(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _reference(d: dict) -> dict:
    """Independent numbers: a straight pass over the event dicts, its own interval sweep."""
    spans = []
    per_name: Counter[tuple[str, str]] = Counter()
    kernels = 0
    for e in d["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args")
        # MTIA's device events, and a device event of any other category with a stream
        # (annotations on a device's timeline excepted): device activity too.
        other = (
            cat not in DEVICE_CATS
            and cat not in HOST_CATS
            and isinstance(args, dict)
            and "stream" in args
            and "annotation" not in str(cat)
        )
        if cat not in DEVICE_CATS and cat != "mtia_ccp_events" and not other:
            continue
        start, dur = float(e["ts"]), max(float(e["dur"]), 0.0)
        spans.append((start, start + dur))
        if cat in KIND_OF_CAT:
            kind = KIND_OF_CAT[cat]
        else:
            kind = (
                "memcpy" if cat == "mtia_ccp_events" and e["name"].startswith("dma") else "kernel"
            )
        per_name[(e["name"], kind)] += dur
        kernels += kind == "kernel"
    # Sweep over sorted start/end points (a different algorithm from merge_intervals).
    points = sorted(
        [(s, 1) for s, _ in spans] + [(t, -1) for _, t in spans], key=lambda p: (p[0], -p[1])
    )
    busy, depth, opened = 0.0, 0, 0.0
    for t, delta in points:
        if depth == 0 and delta == 1:
            opened = t
        depth += delta
        if depth == 0 and delta == -1:
            busy += t - opened
    top_us = max(per_name.values(), default=0.0)
    tops = {key for key, us in per_name.items() if us >= top_us * (1 - 1e-12)}
    return {
        "kernels": kernels,
        "device_events": len(spans),
        "busy": busy,
        "tops": tops,
        "top_us": top_us,
    }


def _check_against_reference(path: Path) -> None:
    trace = load_trace(path)
    ref = _reference(_plain_json(path))
    assert sum(1 for k in trace.kernels if k.kind == "kernel") == ref["kernels"]
    assert len(trace.kernels) == ref["device_events"]
    assert device_busy_us(trace) == pytest.approx(ref["busy"], rel=0.005, abs=1e-6)
    if ref["tops"]:
        row = kernel_table(trace).rows[0]
        assert row.total_us == pytest.approx(ref["top_us"], rel=1e-9)
        assert (row.name, row.kind) in ref["tops"]


@pytest.mark.parametrize("path", LOCAL, ids=lambda p: str(p.relative_to(DATA)))
def test_copied_traces_match_plain_json(path: Path) -> None:
    _check_against_reference(path)


@pytest.mark.skipif(not SHARED_FILES, reason="../shared/traces is not on this machine")
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: str(p.relative_to(SHARED)))
def test_every_shared_trace_matches_plain_json(path: Path) -> None:
    _check_against_reference(path)


def test_local_copies_exist() -> None:
    # The copies above must keep running in CI, where ../shared/traces is absent.
    assert len(LOCAL) >= 12


# --------------------------------------------------------------------------------------------
# the streaming reader and the dict path agree, whatever the chunk size


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_stream_reader_equals_dict_path_at_any_chunk_size(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = DATA / "a100_event_sync" / "event_sync_trace.json.gz"
    from_dict = trace_from_dict(_plain_json(path), source=str(path))
    monkeypatch.setattr(trace_decode, "CHUNK_CHARS", chunk)
    streamed = load_trace(path)
    assert streamed == from_dict


def test_stream_reader_equals_dict_path_on_a_bigger_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    path = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    monkeypatch.setattr(trace_decode, "CHUNK_CHARS", 1000)
    assert load_trace(path) == trace_from_dict(_plain_json(path), source=str(path))


def test_bare_event_array_is_accepted(tmp_path: Path) -> None:
    d = _plain_json(DATA / "a100_triton" / "triton_example.json.gz")
    p = tmp_path / "array.json"
    p.write_text(json.dumps(d["traceEvents"]))
    t = load_trace(p)
    assert len(t.kernels) == _reference(d)["device_events"]
    assert t.devices == ()


# --------------------------------------------------------------------------------------------
# gzip detection by content


def test_gzip_detected_by_magic_not_name(tmp_path: Path) -> None:
    src = DATA / "a100_triton" / "triton_example.json.gz"
    plain = gzip.decompress(src.read_bytes())
    misnamed_gz = tmp_path / "really_gzip.json"
    misnamed_gz.write_bytes(src.read_bytes())
    misnamed_plain = tmp_path / "really_plain.json.gz"
    misnamed_plain.write_bytes(plain)
    a, b = load_trace(misnamed_gz), load_trace(misnamed_plain)
    assert a.kernels == b.kernels and a.ops == b.ops
    assert len(a.kernels) == _reference(json.loads(plain))["device_events"]


def test_accepts_pathlike_and_utf8_bom(tmp_path: Path) -> None:
    plain = gzip.decompress((DATA / "a100_triton" / "triton_example.json.gz").read_bytes())
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf" + plain)
    original = str(DATA / "a100_triton" / "triton_example.json.gz")
    assert load_trace(p).kernels == load_trace(original).kernels


# --------------------------------------------------------------------------------------------
# format quirks, each checked against the raw events


def test_2021_kineto_format() -> None:
    path = DATA / "kineto2021_v100" / "gpu_metrics_input.json"
    d = _plain_json(path)
    t = load_trace(path)
    raw_kernels = [e for e in d["traceEvents"] if e.get("cat") == "Kernel"]
    # "stream 7" thread ids: the stream number comes through as an int.
    assert {k.stream for k in t.kernels if k.kind == "kernel"} == {
        int(e["tid"].split()[1]) for e in raw_kernels
    }
    # lowercase 'external id' on device events.
    assert [k.external_id for k in t.kernels if k.kind == "kernel"] == [
        e["args"]["external id"] for e in sorted(raw_kernels, key=lambda e: e["ts"])
    ]
    # computeProperties (old key) -> devices.
    props = d["computeProperties"]
    assert [dv.name for dv in t.devices] == [p["name"] for p in props]
    assert t.devices[0].compute_capability == (props[0]["major"], props[0]["minor"])
    assert t.devices[0].num_sms == props[0]["multiProcessorCount"]
    assert t.devices[0].total_memory_bytes == props[0]["totalGlobalMem"]
    # ProfilerStep recorded as Operator is an annotation, and gives the step.
    ps = [e for e in d["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert [s.number for s in t.steps] == [int(e["name"].split("#")[1]) for e in ps]
    assert t.steps[0].dur_us == pytest.approx(ps[0]["dur"])
    assert all(o.kind == "annotation" for o in t.ops if o.name.startswith("ProfilerStep#"))
    # Memcpy bytes.
    memcpy = [e for e in d["traceEvents"] if e.get("cat") == "Memcpy"]
    assert sum(k.bytes or 0 for k in t.kernels if k.kind == "memcpy") == sum(
        e["args"]["bytes"] for e in memcpy
    )
    # Host tids given as digit strings become ints, the same as pids.
    assert all(isinstance(o.tid, int) for o in t.ops)


def test_amd_rocm_trace() -> None:
    path = DATA / "mi300_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    d = _plain_json(path)
    t = load_trace(path)
    hip = [e for e in d["traceEvents"] if e.get("cat") == "cuda_runtime"]
    assert len(t.runtime) == len(hip)
    assert any(r.name.startswith("hip") for r in t.runtime)
    raw_devices = {e["args"]["device"] for e in d["traceEvents"] if e.get("cat") == "kernel"}
    assert {k.device for k in t.kernels} == raw_devices
    assert t.devices[0].name == d["deviceProperties"][0]["name"]
    # [memory] events with the newer fields.
    mem = [e for e in d["traceEvents"] if e.get("name") == "[memory]"]
    assert len(t.memory) == len(mem)
    assert sum(m.bytes for m in t.memory) == sum(e["args"]["Bytes"] for e in mem)
    assert max(m.total_allocated or 0 for m in t.memory) == max(
        e["args"]["Total Allocated"] for e in mem
    )


def test_shapes_and_types_become_tuples() -> None:
    path = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    d = _plain_json(path)
    t = load_trace(path)
    by_index = {o.index: o for o in t.ops}
    for i, e in enumerate(d["traceEvents"]):
        if e.get("cat") != "cpu_op" or "Input Dims" not in e["args"]:
            continue
        op = by_index[i]
        assert json.loads(json.dumps(op.input_dims)) == e["args"]["Input Dims"]
        assert isinstance(op.input_dims, tuple)
        assert all(isinstance(x, tuple) for x in op.input_dims)
        assert list(op.input_types or ()) == e["args"]["Input type"]
        if "Concrete Inputs" in e["args"]:
            assert list(op.concrete_inputs or ()) == e["args"]["Concrete Inputs"]


def test_event_mapping_on_a_synthetic_dict() -> None:
    d = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
        "traceEvents": [
            {"ph": "M", "name": "process_name", "ts": 1, "pid": 9, "tid": 0, "args": {}},
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 9,
                "tid": "5",
                "ts": 1000.5,
                "dur": 20,
                "args": {
                    "External id": 7,
                    "Input Dims": [[2, 3], [3, 4]],
                    "Call stack": "a.py(1): f;b.py(2): g",
                    "Sequence number": 11,
                },
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#4",
                "pid": 9,
                "tid": 5,
                "ts": 1000,
                "dur": 50,
            },
            {
                "ph": "X",
                "cat": "python_function",
                "name": "a.py(1): f",
                "pid": 9,
                "tid": 5,
                "ts": 999,
                "dur": 60,
            },
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": "ProfilerStep#4",
                "pid": 0,
                "tid": 7,
                "ts": 1001,
                "dur": 40,
            },
            {
                "ph": "X",
                "cat": "cuda_driver",
                "name": "cuLaunchKernel",
                "pid": 9,
                "tid": 5,
                "ts": 1002,
                "dur": 3,
                "args": {"correlation": 77},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k<1>",
                "pid": 0,
                "tid": 7,
                "ts": 1010,
                "dur": 5,
                "args": {
                    "device": 0,
                    "stream": 7,
                    "correlation": 77,
                    "grid": [1, 2, 3],
                    "block": [32, 1, 1],
                },
            },
            {
                "ph": "X",
                "cat": "gpu_memset",
                "name": "Memset (Device)",
                "pid": 0,
                "tid": 7,
                "ts": 1020,
                "dur": 2,
                "args": {"device": 0, "stream": 7, "bytes": 400},
            },
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": "Event Sync",
                "pid": 0,
                "tid": 7,
                "ts": 1030,
                "dur": 1,
                "args": {"device": 0, "stream": -1},
            },
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 9,
                "tid": 5,
                "ts": 1040,
                "s": "t",
                "args": {"Bytes": -64, "Device Id": 0, "Device Type": 1},
            },
            {"ph": "s", "cat": "ac2g", "id": 77, "pid": 9, "tid": 5, "ts": 1002, "name": "ac2g"},
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": 10,
                "dur": 99999,
            },
            {"ph": "i", "name": "Iteration Start", "pid": "Traces", "tid": "x", "ts": 5, "s": "g"},
        ],
    }
    t = trace_from_dict(d, source="synthetic")
    assert [(o.name, o.kind) for o in t.ops] == [
        ("a.py(1): f", "python"),
        ("ProfilerStep#4", "annotation"),
        ("aten::mm", "op"),
    ]
    mm = t.ops[2]
    assert mm.tid == 5 and mm.external_id == 7 and mm.sequence_number == 11
    assert mm.input_dims == ((2, 3), (3, 4))
    assert mm.stack == ("a.py(1): f", "b.py(2): g")
    assert [(k.kind, k.stream, k.correlation) for k in t.kernels] == [
        ("kernel", 7, 77),
        ("memset", 7, None),
    ]
    assert t.kernels[0].grid == (1, 2, 3) and t.kernels[1].bytes == 400
    assert t.runtime[0].name == "cuLaunchKernel" and t.runtime[0].correlation == 77
    assert t.syncs[0].stream == -1
    assert t.memory[0].bytes == -64 and t.memory[0].addr is None
    assert t.steps == (Step(4, "ProfilerStep#4", 1000.0, 1050.0),)
    # metadata ('M'), summary spans and the 'Traces' instant do not stretch the window.
    assert t.bounds_us == (999.0, 1059.0)
    assert t.distributed == DistributedInfo(rank=3, world_size=8, backend="nccl")
    assert t.schema_version == 1 and t.metadata["schemaVersion"] == 1
    assert "traceEvents" not in t.metadata


def test_steps_from_optimizer_annotations_when_no_profiler_steps() -> None:
    def ann(name: str, ts: float, dur: float) -> dict:
        return {
            "ph": "X",
            "cat": "user_annotation",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
        }

    events = [ann("Optimizer.step#SGD.step", s, 10) for s in (100, 300, 520)]
    events.append(ann("Optimizer.step#EMA.step", 305, 2))  # a second, rarer optimizer
    t = trace_from_dict({"traceEvents": events})
    ends = [110.0, 310.0, 530.0]
    assert [(s.number, s.start_us, s.end_us) for s in t.steps] == [
        (1, ends[0], ends[1]),
        (2, ends[1], ends[2]),
    ]


def test_profiler_step_is_an_annotation_whatever_its_category() -> None:
    t = trace_from_dict(
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "ProfilerStep#3",
                    "pid": 1,
                    "tid": 1,
                    "ts": 0,
                    "dur": 5,
                },
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "Optimizer.step#SGD.step",
                    "pid": 1,
                    "tid": 1,
                    "ts": 1,
                    "dur": 2,
                },
            ]
        }
    )
    assert [o.kind for o in t.ops] == ["annotation", "op"]
    assert [(s.number, s.dur_us) for s in t.steps] == [(3, 5.0)]


def test_negative_durations_are_clamped_and_reported() -> None:
    t = trace_from_dict(
        {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "pid": 0,
                    "tid": 7,
                    "ts": 10,
                    "dur": -3,
                    "args": {"stream": 7, "device": 0},
                },
                {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 5, "dur": 20},
            ]
        }
    )
    assert t.kernels[0].dur_us == 0.0
    assert t.bounds_us == (5.0, 25.0)
    assert len(t.load_warnings) == 1 and "negative" in t.load_warnings[0]


def test_distributed_and_missing_device_properties() -> None:
    t = load_trace(DATA / "a100_nccl" / "nccl_data.json.gz")
    d = _plain_json(DATA / "a100_nccl" / "nccl_data.json.gz")
    info = d["distributedInfo"]
    assert (t.distributed.rank, t.distributed.world_size, t.distributed.backend) == (
        info["rank"],
        info["world_size"],
        info["backend"],
    )
    plain = load_trace(DATA / "rank_non_gpu" / "rank_non_gpu.json.gz")
    assert plain.devices == () and plain.schema_version is None and not plain.kernels


def test_cpu_only_gpu_only_mtia_and_range_profiler_traces_load() -> None:
    cpu = load_trace(DATA / "cpu_only_trace" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert cpu.ops and not cpu.kernels and not cpu.has_device_activity
    gpu = load_trace(DATA / "mi210_gpu_only" / "gpu_only_trace.json.gz")
    assert gpu.kernels and not gpu.ops
    mtia = load_trace(DATA / "mtia_inference" / "mtia_inference_rank_0.json.gz")
    assert mtia.devices[0].name == "ARTEMIS" and mtia.devices[0].num_sms is None
    ranged = load_trace(
        DATA / "a100_cupti_range" / "benchmark_result_924719_1679055439_trace.json.gz"
    )
    assert not ranged.kernels and ranged.runtime


def test_sequences_sorted_by_start_then_file_position() -> None:
    t = load_trace(DATA / "h100_kineto_unit" / "before_fix_trace.json")
    for seq in (t.ops, t.kernels, t.runtime, t.syncs):
        keys = [(x.start_us, x.index) for x in seq]
        assert keys == sorted(keys)


def test_flow_events_skipped_undecoded_keep_positions(tmp_path: Path) -> None:
    # Flows are skipped by a pattern rather than decoded: odd strings inside them must not
    # derail the reader, and later events keep their file positions.
    events = [
        {"ph": "s", "id": 1, "name": 'a}b"{', "cat": "ac2g", "ts": 1, "pid": 1, "tid": 1},
        {"ph": "f", "id": 1, "name": "[x]", "ts": 2, "pid": 0, "tid": 7, "bp": "e"},
        {"ph": "s", "id": 2, "args": {"nested": [1, 2]}, "ts": 3, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 4, "dur": 2},
        {"ph": "f", "id": 2, "ts": 5, "pid": 0, "tid": 7},
    ]
    p = tmp_path / "flows.json"
    p.write_text(json.dumps({"traceEvents": events}, indent=1))
    t = load_trace(p)
    assert [(o.name, o.index) for o in t.ops] == [("aten::add", 3)]
    assert t == trace_from_dict({"traceEvents": events}, source=str(p))
