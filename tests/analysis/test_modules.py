"""Time per nn.Module on real traces recorded with torch's `nn.Module:` events: every
kernel's time lands in exactly one module (or outside them all), as a brute-force walk of
the raw events finds it; traces without module events say what is missing."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from _paths import SHARED_TRACES

from gpuprof_nb import load_trace
from gpuprof_nb.analysis.modules import module_breakdown
from gpuprof_nb.analysis.timeline import device_timeline

DATA = Path(__file__).parent.parent / "data"
SHARED = SHARED_TRACES / "tracelens" / "tests" / "traces"
WITH_MODULES = [
    DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz",
    DATA / "h100_vit_inference" / "Falconsai_nsfw_image_detection__1016002.json.gz",
    DATA / "mi300_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz",
]
SHARED_WITH_MODULES = [
    SHARED / "mi300" / "ddp_resnet18_no_pool" / "train_resnet18.json.gz",
    SHARED / "mi300" / "resnet_act_checkpoint.json.gz",
]


def _available(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.exists()]


def brute_force_self_device(path: Path) -> tuple[dict[str, float], float]:
    """Per module path, the device time of the kernels launched while it was the innermost
    module on the launching thread, found from the raw JSON one kernel at a time; and the
    kernel time launched outside every module. Forward only: these traces' backward ops are
    tied to modules through sequence numbers, which this walk does not follow (so it is
    used on inference traces, and on the forward kernels of training ones)."""
    events = json.load(gzip.open(path))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    modules = [
        e
        for e in spans
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")
    ]

    # Paths by containment: a module's parent is the shortest module on its thread that
    # contains it (ties: the earlier one).
    def contains(a: dict, b: dict) -> bool:
        return (
            a is not b
            and (a["pid"], a["tid"]) == (b["pid"], b["tid"])
            and a["ts"] <= b["ts"]
            and b["ts"] + b["dur"] <= a["ts"] + a["dur"]
            and (a["dur"], -a["ts"]) > (b["dur"], -b["ts"])
        )

    paths: dict[int, str] = {}

    def path_of(m: dict) -> str:
        key = id(m)
        if key not in paths:
            outer = [a for a in modules if contains(a, m)]
            name = m["name"][len("nn.Module: ") :]
            if outer:
                parent = min(outer, key=lambda a: (a["dur"], -a["ts"]))
                paths[key] = f"{path_of(parent)}.{name}"
            else:
                paths[key] = name
        return paths[key]

    calls = {
        e["args"]["correlation"]: e
        for e in spans
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    own: dict[str, float] = defaultdict(float)
    outside = 0.0
    for k in spans:
        if k.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        call = calls.get(k["args"].get("correlation"))
        holders = (
            [
                m
                for m in modules
                if (m["pid"], m["tid"]) == (call["pid"], call["tid"])
                and m["ts"] <= call["ts"] < m["ts"] + m["dur"]
            ]
            if call is not None
            else []
        )
        if holders:
            inner = min(holders, key=lambda m: (m["dur"], -m["ts"]))
            own[path_of(inner)] += k["dur"]
        else:
            outside += k["dur"]
    return dict(own), outside


@pytest.mark.parametrize("path", _available(WITH_MODULES), ids=lambda p: p.parent.name)
def test_inference_traces_charge_every_kernel_to_the_module_a_brute_force_walk_finds(
    path: Path,
) -> None:
    trace = load_trace(path)
    mb = module_breakdown(trace, device_timeline(trace))
    assert mb.source == "python_events" and mb.on_device
    own, outside = brute_force_self_device(path)
    got = {r.path: r.self_device_us for r in mb.rows if r.self_device_us > 0}
    assert got.keys() == own.keys()
    for name, us in own.items():
        assert got[name] == pytest.approx(us, rel=1e-9, abs=1e-6), name
    kernel_us = sum(k.dur_us for k in trace.kernels)
    assert mb.total_us == pytest.approx(kernel_us)
    assert mb.outside_us == pytest.approx(outside, abs=1e-6)
    # The tree's device time matches the trace's kernels: roots plus outside.
    assert sum(r.device_us for r in mb.roots) + mb.outside_us == pytest.approx(kernel_us)
    # Inclusive = own + children, everywhere.
    for r in mb.rows:
        kids = [c for c in mb.rows if c.parent == r.path]
        assert r.device_us == pytest.approx(r.self_device_us + sum(c.device_us for c in kids))
        assert 0.0 <= r.self_share <= r.share <= 1.0
    # Hottest first.
    assert [r.self_time_us for r in mb.rows] == sorted(
        (r.self_time_us for r in mb.rows), reverse=True
    )


def test_bert_layers_fold_into_one_group_with_their_spread() -> None:
    trace = load_trace(WITH_MODULES[0])
    mb = module_breakdown(trace)
    layers = [g for g in mb.groups if g.pattern.endswith("BertLayer_{0..3}")]
    assert len(layers) == 1
    g = layers[0]
    times = [mb.row(p).time_us for p in g.members]  # type: ignore[union-attr]
    assert g.count == 4 and g.time_us == pytest.approx(sum(times))
    assert g.min_us == min(times) and g.max_us == max(times)
    assert g.spread == pytest.approx((max(times) - min(times)) / (sum(times) / 4))


@pytest.mark.parametrize("path", _available(SHARED_WITH_MODULES), ids=lambda p: p.name)
def test_training_traces_tie_backward_kernels_to_modules(path: Path) -> None:
    trace = load_trace(path)
    mb = module_breakdown(trace, device_timeline(trace))
    kernel_us = sum(k.dur_us for k in trace.kernels)
    assert sum(r.device_us for r in mb.roots) + mb.outside_us == pytest.approx(kernel_us)
    convs = [r for r in mb.rows if r.module_type == "Conv2d"]
    assert convs and all(r.backward_device_us > 0 for r in convs)
    # Backward host time charged to modules, plus what no module holds, is every top-level
    # backward op's time.
    backward = [o for o in trace.ops if o.name.startswith("autograd::engine::evaluate_function")]
    top, ends = [], {}
    for o in backward:
        key = (o.pid, o.tid)
        if o.start_us >= ends.get(key, float("-inf")):
            top.append(o)
            ends[key] = o.end_us
    # (Recompute runs inside backward ops: its time is part of theirs.)
    charged = sum(r.backward_host_us + r.recompute_host_us for r in mb.roots)
    assert charged + mb.backward_outside_us == pytest.approx(sum(o.dur_us for o in top))
    assert mb.backward_outside_us < 0.1 * charged


@pytest.mark.skipif(not SHARED_WITH_MODULES[1].exists(), reason="shared traces not here")
def test_activation_checkpointing_shows_as_recompute_of_the_forward_paths() -> None:
    mb = module_breakdown(load_trace(SHARED_WITH_MODULES[1]))
    recomputed = [r for r in mb.rows if r.recompute_calls]
    assert recomputed
    # Each recomputed module ran forward as often, under the same path: once a step (three
    # steps), twice for the ReLU each block calls twice.
    assert all(r.calls == r.recompute_calls and r.calls in (3, 6) for r in recomputed)
    assert sum(r.calls == 6 for r in recomputed) == sum(r.module_type == "ReLU" for r in recomputed)
    assert all("CheckpointWrapper" in r.path for r in recomputed)
    assert [r.path for r in mb.roots] == ["DistributedDataParallel_0"]


@pytest.mark.parametrize(
    "path",
    [
        DATA / "planted_cpu" / "compute_bound.json.gz",
        DATA / "a100_triton" / "triton_example.json.gz",
    ],
    ids=lambda p: p.parent.name,
)
def test_traces_without_module_events_say_how_to_record_them(path: Path) -> None:
    mb = module_breakdown(load_trace(path))
    assert mb.source == "none" and mb.rows == () and mb.groups == ()
    assert mb.outside_us == mb.total_us
    assert "with_modules=True" in mb.notes[0] and "%%gpuprofile" in mb.notes[0]


def test_tie_by_sequence_matches_the_loop() -> None:
    """The sort that ties backward ops to forward ops by sequence number against the loop
    it stands for (a bisection per op): numbers missing on either side, starts tied between
    a backward op and forward ops, forward nodes of -1, and forward starts out of order
    (where the loop itself answers)."""
    import numpy as np

    from gpuprof_nb.analysis.modules import _tie_by_sequence, _tie_by_sequence_loop

    rng = np.random.default_rng(0)
    for trial in range(400):
        n_fwd, n_bwd = (int(x) for x in rng.integers(0, 30, size=2))
        fwd_seq = rng.integers(0, 6, n_fwd).tolist()
        fwd_start = np.sort(rng.integers(0, 20, n_fwd).astype(float))
        if trial % 5 == 0:
            rng.shuffle(fwd_start)
        fwd_node = rng.integers(-1, 4, n_fwd)
        bwd_seq = [None if rng.random() < 0.2 else int(x) for x in rng.integers(0, 7, n_bwd)]
        bwd_start = rng.integers(0, 22, n_bwd).astype(float)
        args = (fwd_seq, fwd_start, fwd_node, bwd_seq, bwd_start)
        assert _tie_by_sequence(*args).tolist() == _tie_by_sequence_loop(*args).tolist()


@pytest.mark.parametrize("path", _available(SHARED_WITH_MODULES), ids=lambda p: p.name)
def test_backward_spans_hold_the_ops_contains_finds(path: Path) -> None:
    """_BackwardSpans.holds (one search per thread) against contains() op by op, and the
    annotations' positions against a comparison per op."""
    from gpuprof_nb.analysis.derived import TraceIndex, op_columns, op_kinds
    from gpuprof_nb.analysis.modules import _BackwardSpans, _positions, _top_backward_ops

    ix = TraceIndex(load_trace(path))
    cols = op_columns(ix)
    spans = _BackwardSpans(ix, _top_backward_ops(ix))
    expected = [spans.contains((str(o.pid), str(o.tid)), o.start_us) for o in cols.ops]
    assert spans.holds(ix).tolist() == expected and any(expected)
    kinds = op_kinds(ix)
    for kind in ("annotation", "python", "op", "none"):
        assert _positions(kinds, kind) == [i for i, k in enumerate(kinds) if k == kind]
