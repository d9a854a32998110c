"""Will it fit, offline and without torch: memory by category, batch-size fits and the
checkpointing plan on the CPU snapshots in tests/data/fit (a small transformer language
model recorded at batch 4, 8 and 16 by tools/make_fit_snapshots.py), and the arithmetic
of predictions, budgets and the plan's knapsack on hand-made inputs."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from gpuprof_nb.analysis.fit import categories_and_fit, fit_batch_size, memory_by_category
from gpuprof_nb.analysis.plan import _Candidate, _knapsack, plan_checkpointing, plan_code
from gpuprof_nb.analysis.report import analyze_batches, analyze_memory
from gpuprof_nb.errors import GpuprofError, SnapshotFormatError
from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict, snapshot_to_dict
from gpuprof_nb.results.fit import CATEGORIES, BatchFit, parse_bytes

FIT = Path(__file__).parents[1] / "data" / "fit"
VOCAB, D, LAYERS, SEQ = 256, 32, 2, 16


def load(b: int):
    return load_snapshot(FIT / f"tiny_b{b}.pickle")


def param_count() -> tuple[int, int]:
    """(parameters, parameter tensors) of tools/make_fit_snapshots.py's model, by hand."""
    layer = [
        3 * D * D,  # in_proj_weight
        3 * D,  # in_proj_bias
        D * D,  # out_proj.weight
        D,  # out_proj.bias
        4 * D * D,  # linear1.weight
        4 * D,  # linear1.bias
        4 * D * D,  # linear2.weight
        D,  # linear2.bias
        D,  # norm1.weight
        D,  # norm1.bias
        D,  # norm2.weight
        D,  # norm2.bias
    ]
    sizes = [VOCAB * D] + layer * LAYERS + [D * VOCAB, VOCAB]
    return sum(sizes), len(sizes)


def test_categories_exact_where_the_arithmetic_is_known() -> None:
    snap = load(8)
    report = analyze_memory(snap)
    cats = report.memory_by_category
    assert cats is not None and cats.method == "step record"
    assert [c.category for c in cats.categories] == list(CATEGORIES)
    assert cats.total_bytes == report.peak_bytes
    n, tensors = param_count()
    assert cats.bytes_of("parameters") == 4 * n
    # Adam: two fp32 moments per parameter and a 4-byte step count per parameter tensor.
    assert cats.bytes_of("optimizer state") == 8 * n + 4 * tensors
    # The batch: token ids and targets, int64.
    assert cats.bytes_of("inputs") == 2 * 8 * SEQ * 8
    # The logits (batch x seq x vocab fp32) are what backward needs first.
    logits = 8 * SEQ * VOCAB * 4
    assert cats.bytes_of("activations") >= logits
    paths = {m.path for m in cats.activations_by_module}
    assert {"layers.0", "layers.1", "head"} <= paths
    with pytest.raises(GpuprofError, match="no memory category"):
        cats.bytes_of("weights")
    assert cats.as_dict()["parameters"] == 4 * n


def test_step_record_survives_a_save_and_a_load(tmp_path: Path) -> None:
    snap = load(8)
    again = snapshot_from_dict(snapshot_to_dict(snap))
    assert again.step == snap.step
    assert memory_by_category(again) == memory_by_category(snap)


def test_malformed_step_records_are_refused_naming_the_field() -> None:
    raw = snapshot_to_dict(load(4))
    raw["gpuprof_nb"]["step"]["tags"][0][2] = "weights"
    with pytest.raises(SnapshotFormatError, match=r"gpuprof_nb.step.tags\[0\]"):
        snapshot_from_dict(raw, where="x.pickle")
    raw = snapshot_to_dict(load(4))
    raw["gpuprof_nb"]["step"]["calls"][0][0] = 7
    with pytest.raises(SnapshotFormatError, match=r"calls\[0\]: root 7"):
        snapshot_from_dict(raw, where="x.pickle")
    raw["gpuprof_nb"]["step"] = "yes"
    with pytest.raises(SnapshotFormatError, match="expected a dict"):
        snapshot_from_dict(raw, where="x.pickle")


def test_two_run_fit_reproduces_both_runs_and_predicts_2x() -> None:
    main, other, at16 = load(8), load(4), load(16)
    fit = fit_batch_size(main, 8, other, 4, variable="batch_size")
    assert fit.method == "two runs" and fit.matched_share == 1.0
    assert fit.predict(8).peak_bytes == analyze_memory(main).peak_bytes
    assert fit.predict(4).peak_bytes == analyze_memory(other).peak_bytes
    assert fit.relative_error == 0.0
    measured = analyze_memory(at16).peak_bytes
    p = fit.predict(16)
    assert p.peak_bytes == pytest.approx(measured, rel=0.05)
    assert p.low_bytes <= measured <= p.high_bytes
    report = analyze_batches(main, 8, other, 4, variable="batch_size", budget_bytes=2**30)
    assert report.fit.batch_size == 8 and report.plan is not None and report.plan.fits
    assert report.predict(16) == p
    with pytest.raises(GpuprofError, match="same batch size"):
        fit_batch_size(main, 8, other, 8)
    with pytest.raises(GpuprofError, match="whole number"):
        fit_batch_size(main, 0, other, 4)


def test_category_fit_without_a_batch_size_asks_for_one() -> None:
    snap = load(8)
    assert snap.step.batch_size == 8  # %%memsnap --fit stamps it
    _, known = categories_and_fit(snap)
    assert known.batch_size == 8 and known.method == "categories"
    unknown = dataclasses.replace(snap, step=dataclasses.replace(snap.step, batch_size=None))
    cats, fit = categories_and_fit(unknown)
    assert fit is not None and fit.batch_size is None
    with pytest.raises(GpuprofError, match="recorded_batch_size"):
        fit.predict(16)
    p = fit.predict(16, recorded_batch_size=8)
    measured = analyze_memory(load(16)).peak_bytes
    assert p.peak_bytes == pytest.approx(measured, rel=0.05)
    assert p.low_bytes <= p.peak_bytes <= p.high_bytes
    assert cats.total_bytes == analyze_memory(load(8)).peak_bytes


def lines(fixed, scaling, uncertain=None, **kw) -> BatchFit:
    f = np.asarray(fixed, dtype=float)
    return BatchFit(
        method=kw.pop("method", "two runs"),
        batch_size=kw.pop("batch_size", 10),
        other_batch_size=kw.pop("other_batch_size", 5),
        variable="b",
        fixed_bytes=f,
        scaling_bytes=np.asarray(scaling, dtype=float),
        uncertain_bytes=np.asarray(uncertain if uncertain is not None else [0] * len(f), float),
        measured_peak_bytes=0,
        other_measured_peak_bytes=0,
        relative_error=kw.pop("relative_error", 0.0),
        overhead_bytes=kw.pop("overhead_bytes", 0),
        rounding_bytes=0,
        matched_share=1.0,
    )


def test_prediction_is_the_highest_line_and_its_interval() -> None:
    fit = lines([1000, 200], [0, 1000])  # recorded at 10: levels 1000 and 1200
    assert fit.predict(10).peak_bytes == 1200
    assert fit.predict(5).peak_bytes == 1000  # the fixed line wins at small batches
    p = fit.predict(40)  # 200 + 1000 * 4
    assert p.peak_bytes == 4200
    # The curve allowance: 1% of the peak once B is twice the recorded size or more.
    assert (p.low_bytes, p.high_bytes) == (4158, 4242)
    noisy = lines([0], [1000], uncertain=[100], relative_error=0.02)
    q = noisy.predict(20)  # x = 2; other run at 0.5: distance |2-1| / |0.5-1| = 2
    half = 0.02 * 2 * 2000 + 100 * 1 + 0.01 * 2000
    assert (q.low_bytes, q.high_bytes) == (2000 - half, 2000 + half)
    assert q.relative_uncertainty == pytest.approx(half / 2000)
    with pytest.raises(GpuprofError, match="at least 1"):
        fit.predict(0)
    with pytest.raises(GpuprofError, match="whole number"):
        fit.predict(2.5)


def test_largest_batch_under_a_budget() -> None:
    fit = lines([1000, 200], [0, 1000])  # 200 + 100 per sample
    assert fit.largest_batch(10_000) == 98
    assert fit.largest_batch(999) is None  # the fixed 1000 never fits
    assert fit.largest_batch(10_000, conservative=True) < 98
    flat = lines([500], [0])
    assert flat.largest_batch(600) == 2**31
    with_overhead = lines([0], [1000], overhead_bytes=500)
    assert with_overhead.largest_batch(10_500) == 100


def test_parse_bytes() -> None:
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("1.5k") == 1500
    assert parse_bytes(4096) == 4096
    for bad in ("lots", "8 GiBs", "-1", "0", True):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def _candidate(path: str, us: float) -> _Candidate:
    return _Candidate(path, "M", (0,), (0,), (0,), (), (), (), us)


def _antichain(paths: list[str]) -> bool:
    return not any(a != b and a.startswith(b + ".") for a in paths for b in paths)


def test_knapsack_is_exact_against_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(40):
        paths = ["a", "a.x", "a.y", "a.y.z", "b", "b.x", "c", "d"]
        cands = [_candidate(p, rng.uniform(1, 100)) for p in paths]
        # Gains on a whole-number grid of the need, so flooring to 1/256 loses nothing.
        need = 256.0
        gains = [float(rng.randint(0, 160)) for _ in paths]
        for i, p in enumerate(paths):  # a parent frees at least what its children do
            kids = [gains[j] for j, q in enumerate(paths) if q.startswith(p + ".")]
            gains[i] = max(gains[i], sum(kids))
        best = math.inf
        for r in range(len(paths) + 1):
            for combo in itertools.combinations(range(len(paths)), r):
                if not _antichain([paths[i] for i in combo]):
                    continue
                if sum(gains[i] for i in combo) >= need:
                    best = min(best, sum(cands[i].recompute_us for i in combo))
        got = _knapsack(cands, gains, need)
        if math.isinf(best):
            assert got is None
        else:
            assert got is not None and _antichain([paths[i] for i in got])
            assert sum(gains[i] for i in got) >= need
            assert sum(cands[i].recompute_us for i in got) == pytest.approx(best)


def test_plan_on_the_recorded_transformer() -> None:
    snap = load(8)
    peak = analyze_memory(snap).peak_bytes
    none_needed = plan_checkpointing(snap, peak + 1)
    assert none_needed.fits and not none_needed.modules and none_needed.code == ""
    plan = plan_checkpointing(snap, int(peak * 0.9))
    assert plan.fits and plan.modules
    assert plan.predicted_peak_bytes <= int(peak * 0.9) * 0.96 + 1
    assert plan.baseline_peak_bytes == peak
    assert all(p.startswith("layers.") for p in plan.paths)
    assert plan.recompute_us == pytest.approx(sum(m.recompute_us for m in plan.modules))
    hopeless = plan_checkpointing(snap, 1000)
    assert not hopeless.fits and "cannot bring this step under the budget" in hopeless.notes[-1]
    with pytest.raises(GpuprofError, match="more than 0"):
        plan_checkpointing(snap, 0)
    # At another batch size through the fit: more to free at 16 than at 8.
    fit = fit_batch_size(snap, 8, load(4), 4)
    at16 = plan_checkpointing(snap, int(peak * 0.9), fit=fit, batch_size=16)
    assert at16.batch_size == 16 and at16.baseline_peak_bytes == fit.predict(16).peak_bytes
    assert sum(m.saved_bytes for m in at16.modules) > sum(m.saved_bytes for m in plan.modules)


def test_plan_code_is_python_that_names_the_model() -> None:
    code = plan_code("net", ["layers.0", "layers.3"])
    compile(code, "<plan>", "exec")
    assert "net.get_submodule(name)" in code and "'layers.3'" in code
    assert "use_reentrant=False" in code


GPU = Path(__file__).parents[1] / "data" / "gpu"


def test_cuda_recordings_of_tools_gpu_fit_check() -> None:
    """The transformer's CUDA snapshots tools/gpu_fit_check.py saves (b/2, b and 2b; copied
    into tests/data/gpu after a GPU pass): categories add up to the peak, the allocator's
    overhead is known, and the fit from b/2 and b predicts the 2b recording within 5%."""
    sizes = sorted(int(p.stem.removeprefix("gpu_fit_b")) for p in GPU.glob("gpu_fit_b*.pickle"))
    if len(sizes) < 3:
        pytest.skip("no CUDA fit recordings in tests/data/gpu yet (tools/gpu_fit_check.py)")
    half, b, double = sizes[:3]
    snap = {n: load_snapshot(GPU / f"gpu_fit_b{n}.pickle") for n in sizes}
    assert snap[b].source == "cuda" and snap[b].step is not None
    report = analyze_memory(snap[b])
    cats = report.memory_by_category
    assert cats.total_bytes == report.peak_bytes
    assert cats.allocator_overhead_bytes is not None
    assert cats.bytes_of("parameters") > 0 and cats.bytes_of("optimizer state") > 0
    fit = fit_batch_size(snap[b], b, snap[half], half)
    measured = analyze_memory(snap[double]).peak_bytes
    assert fit.predict(double).peak_bytes == pytest.approx(measured, rel=0.05)
