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
    assert c.per == "run" and c.step_median_us == (1500.0, 1000.0)
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
    assert c.step_median_us[0] == pytest.approx(step_b, rel=0.01)
    assert c.step_median_us[1] == pytest.approx(step_a, rel=0.01)
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
