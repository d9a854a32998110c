"""compare(before, after): the noise-aware verdict, the changes matched across renames, and
a real before/after pair recorded here (a DataLoader setting changed), checked against
plain-JSON computations."""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path

import pytest

from gpuprof_nb.analysis.compare import kernel_family, timing_verdict
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session.analyze import analyze, compare

DATA = Path(__file__).parents[1] / "data"
V100 = DATA / "kineto2021_v100" / "gpu_metrics_input.json"
A100 = DATA / "a100_alexnet_sync" / "benchmark_result_2869224_1695835535_trace.json.gz"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"


# ---------------------------------------------------------------------------------------
# The verdict


def test_a_change_inside_the_noise_is_no_clear_change() -> None:
    before = (1000.0, 1010.0, 990.0)
    for after in (before, (1020.0, 1030.0, 1025.0), (980.0, 975.0, 985.0)):
        v = timing_verdict(before, after)
        assert v is not None and v.kind == "no clear change", (after, v)
    # Every sample 15% apart, yet under the noise floor between two runs: not called either,
    # unless a quiet machine allows a lower floor.
    shifted = (1150.0, 1155.0, 1160.0)
    assert timing_verdict(before, shifted).kind == "no clear change"
    assert timing_verdict(before, shifted, noise_floor=0.05).kind == "slower"
    # Overlapping samples: even a 6% median change is not called.
    v = timing_verdict((1000.0, 1200.0, 900.0), (1060.0, 1100.0, 1000.0))
    assert v.kind == "no clear change"


def test_a_planted_change_beyond_the_noise_is_called() -> None:
    before = (1000.0, 1012.0, 994.0)
    slower = timing_verdict(before, tuple(1.5 * t for t in before))
    assert slower.kind == "slower" and slower.ratio == pytest.approx(1.5)
    assert slower.ci_low > 1.2 and slower.speedup == pytest.approx(1 / 1.5)
    faster = timing_verdict(before, tuple(t / 1.5 for t in before))
    assert faster.kind == "faster" and faster.ci_high < 1 / 1.2
    # The interval brackets the ratio of medians, and the answer is the same every time.
    assert slower.ci_low <= slower.ratio <= slower.ci_high
    assert timing_verdict(before, tuple(1.5 * t for t in before)) == slower


def test_no_verdict_without_two_samples_a_side() -> None:
    assert timing_verdict((1000.0,), (1500.0, 1490.0)) is None
    assert timing_verdict((1000.0, 0.0), (1500.0, 1490.0)) is None


# ---------------------------------------------------------------------------------------
# Changes


def test_a_trace_compared_with_itself_shows_no_changes() -> None:
    c = compare(BERT, BERT)
    assert c.changes == ()
    assert c.verdict is None and "no verdict" in c.verdict_note
    assert c.speedup == pytest.approx(1.0)
    assert all(d.delta_us == 0 for d in c.idle)
    assert c.findings_new == () and c.findings_resolved == ()
    assert "No changes" in c.text()


def test_kernel_families_ignore_tiles_templates_and_instance_numbers() -> None:
    a = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma"
    b = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage4_warpsize2x2x1_ffma"
    assert kernel_family(a) == kernel_family(b)
    assert kernel_family(
        "void at::native::vectorized_elementwise_kernel<4, Add<float>>(int)"
    ) == kernel_family("void at::native::vectorized_elementwise_kernel<2, Add<c10::Half>>(i)")
    assert kernel_family("triton_poi_fused_add_0") == kernel_family("triton_poi_fused_add_12")
    # The precision in a name is not a tile: fp32 and bf16 GEMMs stay apart.
    assert kernel_family("ampere_sgemm_128x64_nn") != kernel_family("ampere_bf16_s16816gemm_nn")


def test_v100_against_a100_training_traces_compare_and_say_the_hardware_differs() -> None:
    c = compare(V100, A100)
    assert c.changes and c.verdict is None
    assert any("Tesla V100" in n and "A100" in n for n in c.notes)
    bundle = c._repr_mimebundle_()
    for section in ("Verdict", "Changes", "Idle breakdown", "Findings"):
        assert f"-- {section} --" in bundle["text/plain"]
        assert f'data-section="{section}"' in bundle["text/html"]
    assert "<svg" in bundle["text/html"]


def test_bad_sides_are_library_errors() -> None:
    with pytest.raises(GpuprofError, match="before is a int"):
        compare(3, BERT)  # type: ignore[arg-type]
    with pytest.raises(GpuprofError):
        compare(BERT, DATA / "no_such_trace.json")


def test_reports_with_timings_get_a_verdict_on_their_samples() -> None:
    trace = load_trace(DATA / "mi210_gpu_only" / "gpu_only_trace.json.gz")  # no steps
    slow = TimingStats(wall_us=(1500.0, 1510.0, 1495.0))
    fast = TimingStats(wall_us=(1000.0, 1005.0, 998.0))
    before = analyze(trace, timing=slow)
    after = analyze(trace, timing=fast)
    c = compare(before, after, before_label="v1", after_label="v2")
    assert c.per == "run" and c.median_step_us == (1500.0, 1000.0)
    assert c.verdict.kind == "faster" and c.speedup == pytest.approx(1.5)
    assert "Faster" in c.text() and "v1" in c.text()
    # Timing only (no trace): still a verdict, and no changes to list.
    bare = compare(ProfileReport(timing=slow, trace=None), ProfileReport(timing=slow, trace=None))
    assert bare.verdict.kind == "no clear change" and bare.changes == ()


# ---------------------------------------------------------------------------------------
# A real before/after pair: the same training loop, the DataLoader's num_workers changed.


def _record_loader_run(tmp_path: Path, workers: int) -> Path:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    class SlowDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int):
            time.sleep(0.004)  # a heavy per-sample transform
            return torch.randn(32), torch.randn(4)

    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=4, num_workers=workers)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(8):
            # Each step marked as the profiler's own schedule marks it.
            with record_function(f"ProfilerStep#{i}"):
                x, y = next(batches)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    path = tmp_path / f"workers{workers}.json"
    prof.export_chrome_trace(str(path))
    return path


def _plain(path: Path) -> tuple[float, float]:
    """(median ProfilerStep duration, DataLoader __next__ time per step) from the JSON."""
    raw = path.read_bytes()
    events = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]
    steps = [e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    nexts = [
        e
        for e in events
        if e.get("ph") == "X" and "DataLoader" in e["name"] and "__next__" in e["name"]
    ]
    return statistics.median(e["dur"] for e in steps), sum(e["dur"] for e in nexts) / len(steps)


@pytest.mark.slow
def test_a_dataloader_change_comes_first_with_its_true_size(tmp_path: Path) -> None:
    before, after = _record_loader_run(tmp_path, 0), _record_loader_run(tmp_path, 2)
    c = compare(before, after)
    (step_b, loader_b), (step_a, loader_a) = _plain(before), _plain(after)
    assert c.per == "step"
    assert c.median_step_us[0] == pytest.approx(step_b, rel=0.01)
    assert c.median_step_us[1] == pytest.approx(step_a, rel=0.01)
    first = c.changes[0]
    assert first.category == "DataLoader", [(r.name, r.delta_us) for r in c.changes[:5]]
    assert first.delta_us == pytest.approx(loader_a - loader_b, rel=0.02, abs=50)
    # The iterator's class changed (single-process -> multi-process): still one row.
    assert sum(1 for r in c.changes if r.category == "DataLoader") == 1
    assert not any("DataLoaderIter" in r.name for r in c.changes)


def test_a_cpu_trace_against_a_gpu_trace_compares_and_says_what_cannot_be() -> None:
    cpu = DATA / "cpu_only_trace" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    c = compare(cpu, BERT)
    assert c.changes and c.idle_of == "mixed"
    assert any("before ran on cpu, after on NVIDIA H100" in n for n in c.notes)
    assert any("idle breakdown is of the device on one side" in n for n in c.notes)
    assert "Note:" in c.text()


# --- noise reaches the verdict (issue 32) ---------------------------------------------------

# The case: both sides flagged noisy (1.77x and 1.96x), a 2.5x ratio of medians whose
# whole bootstrap interval lies beyond the floor; the real effect was 5-10%.
NOISY_BEFORE = [10.0, 12.0, 17.7]
NOISY_AFTER = [4.0, 4.8, 7.84]


def test_noise_that_covers_the_difference_gets_no_call() -> None:
    from gpuprof_nb.results.compare import Verdict

    plain = Verdict.from_samples(NOISY_BEFORE, NOISY_AFTER)
    assert plain is not None and plain.kind == "faster"  # what compare used to say
    v = timing_verdict(NOISY_BEFORE, NOISY_AFTER)
    assert v is not None and v.kind == "no clear change"
    assert v.spread_before == pytest.approx(1.77) and v.spread_after == pytest.approx(1.96)
    assert "before's samples spread 1.77x" in v.why and "after's samples spread 1.96x" in v.why
    assert v.runs_to_settle is not None and v.runs_to_settle >= 3
    # The same medians measured steadily are called.
    steady = timing_verdict([11.9, 12.0, 12.1], [4.75, 4.8, 4.85])
    assert steady is not None and steady.kind == "faster" and steady.why == ""


def test_other_work_on_one_side_covers_the_difference() -> None:
    before, after = [12.0, 12.1, 11.9, 12.05], [7.0, 7.1, 6.95, 7.05]
    v = timing_verdict(before, after)
    assert v is not None and v.kind == "faster"
    busy = timing_verdict(before, after, other_work=(0.9, 0.1))
    assert busy is not None and busy.kind == "no clear change"
    assert "other work held 80% more of the cores during before" in busy.why
    # The same load on both sides slows both alike: the call stands.
    alike = timing_verdict(before, after, other_work=(0.9, 0.85))
    assert alike is not None and alike.kind == "faster"
    # Where the wait for a core was measured, it decides: here the same on both sides.
    measured = timing_verdict(before, after, other_work=(0.9, 0.1), waited=(0.02, 0.03))
    assert measured is not None and measured.kind == "faster"
    waited = timing_verdict(before, after, waited=(0.45, 0.0))
    assert waited is not None and waited.kind == "no clear change"
    assert "waited for a core 45% of the time more during before" in waited.why


def test_how_many_runs_would_settle_it_is_said() -> None:
    trace = load_trace(DATA / "planted_cpu" / "compute_bound.json.gz")
    before = analyze(trace, timing=TimingStats(wall_us=tuple(NOISY_BEFORE)))
    after = analyze(trace, timing=TimingStats(wall_us=tuple(NOISY_AFTER)))
    c = compare(before, after)
    assert c.verdict is not None and c.verdict.kind == "no clear change"
    assert f"--repeat {c.verdict.runs_to_settle}" in c.verdict_note
    assert "noise covers the difference" in c.verdict_note
    assert "--repeat" in c.text()
    within = compare(before, analyze(trace, timing=TimingStats(wall_us=(10.5, 12.5, 17.0))))
    assert within.verdict.kind == "no clear change"
    assert "no number of runs" in within.verdict_note


def test_a_difference_in_ops_both_sides_ran_alike_looks_like_noise() -> None:
    """The same trace with every op and kernel 30% longer (the machine slowed down, the
    user changed nothing): the comparison says the difference looks like noise."""
    import dataclasses

    trace = load_trace(DATA / "planted_cpu" / "compute_bound.json.gz")
    lo = trace.bounds_us[0]

    def slow(x: float) -> float:
        return lo + (x - lo) * 1.3

    slower = dataclasses.replace(
        trace,
        ops=tuple(
            dataclasses.replace(o, start_us=slow(o.start_us), dur_us=o.dur_us * 1.3)
            for o in trace.ops
        ),
        bounds_us=(lo, slow(trace.bounds_us[1])),
    )
    c = compare(analyze(trace), analyze(slower))
    assert c.changes and all(r.calls_before == r.calls_after for r in c.changes)
    assert any("looks like noise" in n for n in c.notes), c.notes
    assert "looks like noise" in c.text()


def test_one_or_two_outliers_do_not_make_a_tight_change_noise() -> None:
    # Measured: a 41 us step timed in ten blocks, two of them slow (219 us), against the
    # planted 13x slowdown; the interval of the medians is tight.
    before = [41.6, 41.6, 41.7, 41.7, 41.8, 41.8, 41.9, 42.8, 218.8, 219.2]
    after = [542.2, 542.9, 544.1, 544.6, 545.3, 545.6, 552.0, 559.7, 573.1, 602.0]
    v = timing_verdict(before, after)
    assert v is not None and v.kind == "slower", v.why
    assert v.spread_before == pytest.approx(219.2 / 41.6)  # the full spread is still shown
    # Ten samples spread wide throughout stay noise for a change they cover.
    wide = [10.0 * 3.0 ** (i / 9) for i in range(10)]
    v = timing_verdict(wide, [w * 2.5 for w in wide[::-1]])
    assert v is not None and v.kind == "no clear change", v
    assert "middle half" in v.why
