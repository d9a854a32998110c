"""What several tabs and rules need is derived once per trace (analysis/derived.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.analysis import derived, timeline
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace"])
def test_a_report_derives_shared_work_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name)
    trace = load_trace(path)
    built: list[derived.TraceIndex] = []
    tops: list[derived.TraceIndex] = []
    real_columns, real_top = derived.OpColumns, timeline._top_level_positions

    def columns(ix):  # type: ignore[no-untyped-def]
        built.append(ix)
        return real_columns(ix)

    def top(ix, within=None):  # type: ignore[no-untyped-def]
        tops.append(ix)
        return real_top(ix, within)

    monkeypatch.setattr(derived, "OpColumns", columns)
    monkeypatch.setattr(timeline, "_top_level_positions", top)
    report = analyze(trace)
    report._repr_mimebundle_()
    # One index for the whole report: the columns are built once, however many tabs and
    # rules read them, and the whole-trace top-level ops found once (the drawn step's lanes
    # look among its own ops, on the same index).
    assert [ix.trace is trace for ix in built] == [True]
    assert len({id(ix) for ix in tops}) == 1 and tops[0] is built[0]
    assert sum(1 for _ in tops) <= 2
    # The trace is left as it was read: nothing is stored on it.
    assert not hasattr(trace, "derived")
    assert trace == load_trace(path)


def test_an_index_is_shared_only_when_passed() -> None:
    """Analyses given the same index share its columns; a Trace alone gets its own."""
    trace = load_trace(DATA / "cpu_only_trace" / next(iter(_names("cpu_only_trace"))))
    ix = derived.TraceIndex(trace)
    assert derived.index_of(ix) is ix
    assert derived.op_columns(ix) is derived.op_columns(ix)
    other = derived.index_of(trace)
    assert other is not ix and other.trace is trace
    assert derived.op_columns(other) is not derived.op_columns(ix)
    assert ix.peek("roofline_anchors") is None


def _names(name: str) -> list[str]:
    return [p.name for p in sorted((DATA / name).iterdir()) if ".json" in p.name]


def test_ids_beyond_int64_still_match_and_none_stays_apart() -> None:
    """Ids are matched as int64 arrays: one too large for it (a damaged trace) must still
    match itself wherever it appears, and the smallest int64 must not read as 'no id'."""
    huge, low = 2**70 + 3, -(2**63)
    arr, present = derived.ids([5, None, huge, low])
    assert present.tolist() == [True, False, True, True]
    again, _ = derived.ids([huge, low, 5])
    assert again.tolist() == [arr[2], arr[3], arr[0]]
    keys = np.sort(arr[present])
    assert derived.lookup(keys, np.arange(len(keys)), again).tolist() == [
        int(np.searchsorted(keys, v)) for v in again.tolist()
    ]


@pytest.mark.parametrize(
    "values",
    [
        [1, 2, 3],
        [1, None, 3],
        [None],
        [],
        [2**70 + 3, 1, None],
        [-(2**63), 1],
        [1, 2**63],
        [-(2**63), None],
        [7, 8, None, 2**64],
    ],
    ids=str,
)
def test_ids_read_in_one_pass_are_those_of_the_list(values: list[int | None]) -> None:
    """ids_of's one pass over the items falls back to the list's handling of a missing
    id, one outside int64 and the smallest int64."""
    from types import SimpleNamespace

    want, want_present = derived.ids(values)
    got, present = derived.ids_of([SimpleNamespace(correlation=v) for v in values], "correlation")
    assert got.tolist() == want.tolist() and present.tolist() == want_present.tolist()


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace"])
def test_top_level_ops_within_a_span_are_those_of_the_span_alone(name: str) -> None:
    """The Timeline tab draws a span's top-level ops from the shared columns: they must be
    the top-level ops of a trace holding only the ops that overlap the span."""
    import bisect
    import dataclasses
    import random

    trace = load_trace(next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name))
    a0, a1 = trace.bounds_us
    rng = random.Random(3)
    spans = [(a0, a1)] + [
        tuple(sorted((rng.uniform(a0, a1), rng.uniform(a0, a1)))) for _ in range(20)
    ]
    for lo, hi in spans:
        before = trace.ops[: bisect.bisect_left(trace.ops, hi, key=lambda o: o.start_us)]
        alone = dataclasses.replace(trace, ops=tuple(o for o in before if o.end_us > lo))
        assert timeline.top_level_ops_within(trace, lo, hi) == timeline.top_level_ops(alone)


def test_kernel_columns_and_device_kernels_match_the_kernels() -> None:
    """Kinds, devices and spans as columns are the kernels' own; a device's kernels are the
    ones with its index, in order (the whole tuple when every kernel ran there)."""
    from gpuprof_nb.model.trace import Kernel, Trace

    kinds = ("kernel", "memcpy", "memset")
    kernels = tuple(
        Kernel(f"k{i}", kinds[i % 3], float(i), 0.5 + i, device=(i * 7) % 3, stream=7, index=i)
        for i in range(20)
    )

    def trace(ks: tuple[Kernel, ...]) -> Trace:
        return Trace(
            source="t",
            ops=(),
            kernels=ks,
            runtime=(),
            syncs=(),
            memory=(),
            steps=(),
            devices=(),
            distributed=None,
            bounds_us=(0.0, 40.0),
        )

    t = trace(kernels)
    kc = derived.kernel_columns(derived.TraceIndex(t))
    assert [derived.KERNEL_KINDS[c] for c in kc.kind.tolist()] == [k.kind for k in kernels]
    assert kc.is_kernel.tolist() == [k.kind == "kernel" for k in kernels]
    assert kc.device.tolist() == [k.device for k in kernels]
    assert kc.end.tolist() == [k.end_us for k in kernels]
    for device in (0, 1, 2, 5):
        assert timeline.device_kernels(t, device) == tuple(k for k in kernels if k.device == device)
    one = trace(tuple(k for k in kernels if k.device == 1))
    assert timeline.device_kernels(one, 1) is one.kernels


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace", "h100_bert_small"])
def test_top_level_spans_are_the_merged_spans_of_the_top_level_ops(name: str) -> None:
    """top_level_spans (read from the op columns) is merge_intervals of the top-level ops'
    own (start_us, end_us), float for float."""
    from gpuprof_nb.analysis.intervals import merge_intervals

    path = next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name)
    trace = load_trace(path)
    starts, ends = timeline.top_level_spans(trace)
    tops = timeline.top_level_ops(trace)
    assert tops
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == merge_intervals(
        [(o.start_us, o.end_us) for o in tops]
    )


def test_distinct_median_and_percentile_are_numpys() -> None:
    rng = np.random.default_rng(38)
    for trial in range(3000):
        n = int(rng.integers(1, 40))
        values = [
            rng.random(n) * 1000,
            rng.integers(0, 5, n).astype(float),
            np.round(rng.exponential(50, n), 3),
            rng.integers(-3, 7, n),
        ][trial % 4]
        if trial % 8 == 1:
            values = values.copy()
            values[rng.random(n) < 0.2] = np.nan
        unique = derived.distinct(values)
        assert unique.dtype == np.unique(values).dtype
        np.testing.assert_array_equal(unique, np.unique(values))
        np.testing.assert_array_equal(derived.median(values), float(np.median(values)))
        for q in (0, 5, 50, 95, 100):
            np.testing.assert_array_equal(
                derived.percentile(values, q), float(np.percentile(values, q))
            )


def test_a_report_does_not_import_numpy_ma() -> None:
    """np.unique, np.median and np.percentile import numpy.ma on their first call (6 ms of a
    report's analysis in a fresh process): the report's analyses use derived's own."""
    import subprocess
    import sys

    paths = [str(p) for p in sorted((DATA / "a100_nccl").iterdir()) if ".json" in p.name]
    code = (
        "import sys\n"
        "from gpuprof_nb.io.trace import load_trace\n"
        "from gpuprof_nb.analysis.report import analyze\n"
        "import gpuprof_nb.render.display\n"
        f"for p in {paths!r}:\n"
        "    analyze(load_trace(p))._repr_mimebundle_()\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace", "h100_bert_small"])
def test_thread_codes_index_each_ops_and_calls_own_ids(name: str) -> None:
    """The op columns hold the torch ops at their positions. Each op's and runtime call's
    thread code picks its own (pid, tid) from the distinct pairs, listed in order of first
    appearance; thread keys are those pairs as text."""
    path = next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name)
    ix = derived.TraceIndex(load_trace(path))
    cols = derived.op_columns(ix)
    # The columns' ops are the trace's torch ops, in order, each at its position.
    assert list(cols.ops) == [o for o in ix.trace.ops if o.kind == "op"]
    assert [ix.trace.ops[p] for p in cols.positions.tolist()] == list(cols.ops)
    pairs = [(o.pid, o.tid) for o in cols.ops]
    assert list(cols.raw_threads) == list(dict.fromkeys(pairs))
    assert [cols.raw_threads[c] for c in cols.raw_thread.tolist()] == pairs
    assert [cols.thread_keys[c] for c in cols.thread.tolist()] == [
        (str(p), str(t)) for p, t in pairs
    ]
    codes, runtime_pairs = derived.runtime_threads(ix)
    calls = [(r.pid, r.tid) for r in ix.trace.runtime]
    assert list(runtime_pairs) == list(dict.fromkeys(calls))
    assert [runtime_pairs[c] for c in codes.tolist()] == calls


@pytest.mark.parametrize("name", ["a100_nccl", "cpu_only_trace", "h100_bert_small"])
def test_other_op_columns_are_the_ops_that_are_not_torch_ops(name: str) -> None:
    """Annotations and Python events as columns: each one's position, span and kind."""
    path = next(p for p in sorted((DATA / name).iterdir()) if ".json" in p.name)
    ix = derived.TraceIndex(load_trace(path))
    other = derived.other_op_columns(ix)
    every = ix.trace.ops
    want = [i for i, o in enumerate(every) if o.kind != "op"]
    assert other.positions.tolist() == want
    assert list(other.ops) == [every[i] for i in want]
    assert other.start.tolist() == [every[i].start_us for i in want]
    assert other.end.tolist() == [every[i].end_us for i in want]
    assert other.is_python.tolist() == [every[i].kind == "python" for i in want]
    assert other.is_annotation.tolist() == [every[i].kind == "annotation" for i in want]
