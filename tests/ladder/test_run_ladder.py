"""The whole ladder on a tiny MLP on CPU: every rung runs or says why not, the numbers agree
with independent computations, the loss matches a hand-written training loop."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpuprof_nb.ladder import RUNG_NAMES, LoaderSettings, load, run_ladder
from gpuprof_nb.ladder.verdicts import STATUSES
from gpuprof_nb.render.ladder import fmt_samples

STEPS, WARMUP, BATCH = 5, 1, 16


@pytest.fixture(scope="module")
def report(tiny):
    # Module-scoped fixtures run before the autouse one-thread fixture: set it here too.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_ladder(
            tiny.model_fn,
            tiny.dataset,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=STEPS,
            warmup=WARMUP,
            batch_size=BATCH,
            target_effective_batch=2 * BATCH,
            loader_settings=[LoaderSettings(0), LoaderSettings(1, False, True, 2)],
            batch_sizes=[8, 32],
            device="cpu",
            progress=False,
            label="unit",
        )
    finally:
        torch.set_num_threads(before)


def test_every_rung_runs_or_says_why(report):
    names = [r.name for r in report.rungs]
    for name in RUNG_NAMES:
        assert names.count(name) == 1, name
    for rung in report.rungs:
        assert rung.status in STATUSES
        if rung.status in ("skipped", "failed", "kept", "dropped", "no clear change", "flagged"):
            assert rung.reason, rung.name
        if rung.status in (
            "baseline",
            "kept",
            "dropped",
            "no clear change",
            "flagged",
            "reference",
        ):
            assert len(rung.step_times_us) == STEPS
            assert rung.peak_memory_bytes is not None and rung.peak_memory_bytes >= 0
    assert report.rung("fp32").status == "baseline"
    # CPU: compile skipped by default with the measured reason, CUDA graphs not applicable.
    assert report.rung("compile").status == "skipped"
    assert (
        "gcc" in report.rung("compile").reason and "compile=True" in report.rung("compile").reason
    )
    assert report.rung("reduce_overhead").status == "skipped"
    assert "GPU only" in report.rung("reduce_overhead").reason


def test_samples_per_s_from_step_times(report):
    for rung in report.rungs:
        if not rung.step_times_us:
            continue
        median_s = float(np.median(np.array(rung.step_times_us))) / 1e6
        assert rung.samples_per_s == pytest.approx(rung.samples_per_step / median_s)
        q1, q3 = np.percentile(np.array(rung.step_times_us), [25, 75])
        assert rung.step_iqr_us == pytest.approx(q3 - q1)


def test_accumulation_reaches_the_effective_batch(report):
    rung = report.rung("grad_accum")
    assert rung.status in ("kept", "dropped", "flagged")
    assert rung.samples_per_step == 2 * BATCH
    assert "effective batch 32" in rung.reason


def test_dataloader_sweep_reports_every_setting(report):
    rung = report.rung("dataloader")
    assert [t.name for t in rung.trials] == [
        "num_workers=0",
        "num_workers=1, persistent_workers, prefetch_factor=2",
    ]
    best = max(rung.trials, key=lambda t: t.samples_per_s or 0.0)
    assert rung.samples_per_s == pytest.approx(best.samples_per_s)


def _hand_loop_loss(tiny, steps: int, batch: int, seed: int = 0) -> float:
    """The fp32 baseline written out by hand: same seed, same data order, then the eval loss
    on the first batch."""
    torch.manual_seed(seed)
    model = tiny.model_fn()
    opt = tiny.optimizer_fn(model.parameters())
    loader = DataLoader(tiny.dataset, batch_size=batch, shuffle=False, drop_last=True)
    batches = iter(loader)
    first = None
    for _ in range(steps):
        x, y = next(batches)
        first = first or (x, y)
        loss = tiny.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        return float(tiny.loss_fn(model(first[0]), first[1]))


def test_baseline_loss_matches_a_hand_written_loop(report, tiny):
    expected = _hand_loop_loss(tiny, STEPS + WARMUP, BATCH)
    assert report.baseline.final_loss == pytest.approx(expected, rel=1e-6)


def test_loss_parity_is_recorded(report):
    base = report.baseline.final_loss
    for rung in report.rungs:
        if rung.final_loss is None:
            continue
        assert rung.loss_drift == pytest.approx(abs(rung.final_loss - base) / abs(base))
        if rung.status == "kept":
            assert rung.loss_drift <= report.loss_tolerance
    # Same config, same seed, same data: the fused optimizer must track fp32 closely.
    fused = report.rung("fused_adamw")
    if fused.final_loss is not None:
        assert fused.loss_drift < 1e-3


def test_combined_numbers(report):
    final = report.final
    assert report.speedup == pytest.approx(final.samples_per_s / report.baseline.samples_per_s)
    assert final.status in ("kept", "baseline")
    if final.status == "kept":
        assert final.name in report.recommendation


def test_three_run_reading_uses_the_measured_rungs(report):
    three = report.three_run
    assert three.fp32_samples_per_s == pytest.approx(report.rung("fp32").samples_per_s)
    bf16 = report.rung("bf16")
    if bf16.samples_per_s:
        assert three.precision_gain == pytest.approx(
            bf16.samples_per_s / report.rung("fp32").samples_per_s - 1
        )
    assert three.compile_samples_per_s is None


def test_batch_sweep_points(report):
    sweep = report.batch_sweep
    assert [p.batch_size for p in sweep.points] == [8, 32]
    for p in sweep.points:
        assert p.status == "ok"
        assert p.samples_per_s == pytest.approx(
            p.batch_size / (statistics.median(p.step_times_us) / 1e6)
        )


def test_modes_are_reset_after_the_ladder(report):
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled()


def test_save_load_round_trip(report, tmp_path):
    path = report.save(tmp_path / "ladder.json")
    again = load(path)
    assert again == report
    assert again.speedup == pytest.approx(report.speedup)
    comparison = report.compare(again)
    for row in comparison.rows:
        if row.this_samples_per_s:
            assert row.speed_ratio == pytest.approx(1.0)
            # The same step times on both sides: the verdict compare() gives is no change.
            assert row.verdict is not None and row.verdict.kind == "no clear change"


def test_bundle_shows_the_same_numbers_in_text_and_html(report):
    bundle = report._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    for rung in report.rungs:
        if rung.samples_per_s:
            shown = fmt_samples(rung.samples_per_s)
            assert shown in text and shown in html
    # The rung chart and the batch sweep, drawn as SVG (no matplotlib in the report).
    assert html.count('<details class="gp-plot"') == 2 and "data:image/png" not in html
    assert "Three-run reading" in text and "Batch sweep" in text
    only_text = report._repr_mimebundle_(include=["text/plain"])
    assert set(only_text) == {"text/plain"}


def test_dataloader_input_gives_the_batch_size(tiny):
    loader = DataLoader(tiny.dataset, batch_size=8, shuffle=True)
    report = run_ladder(
        tiny.model_fn,
        loader,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=1,
        rungs=["fp32"],
        progress=False,
    )
    assert report.batch_size == 8
    assert report.baseline.samples_per_step == 8
    assert [r.status for r in report.rungs[1:]] == ["skipped"] * (len(RUNG_NAMES) - 1)


def test_text_progress(tiny, capsys):
    run_ladder(
        tiny.model_fn,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=0,
        batch_size=8,
        rungs=["fp32", "fused_adamw"],
        progress=True,
    )
    out = capsys.readouterr().out
    assert "[1/2] fp32: baseline" in out and "fused_adamw" in out
    run_ladder(
        tiny.model_fn,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=0,
        batch_size=8,
        rungs=["fp32"],
        progress=False,
    )
    assert capsys.readouterr().out == ""


def test_grad_accumulation_is_not_measured_on_top_of_cuda_graphs() -> None:
    """On an H100 the grad_accum rung on top of a kept reduce-overhead rung failed: CUDA
    graphs overwrite the gradients one micro-batch leaves for the next. The rung says why
    it is not measured there instead; elsewhere it runs."""
    from gpuprof_nb.ladder.measure import RungConfig, accumulation_blocked

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    graphs = RungConfig(compile_mode="reduce-overhead")
    assert "CUDA graphs" in (accumulation_blocked(graphs, cuda) or "")
    assert accumulation_blocked(graphs, cpu) is None  # no CUDA graphs on CPU
    assert accumulation_blocked(RungConfig(compile_mode="default"), cuda) is None
    assert accumulation_blocked(RungConfig(), cuda) is None


def test_a_blocked_accumulation_rung_is_skipped_with_its_reason(tiny, monkeypatch) -> None:
    """The climb asks accumulation_blocked about the kept configuration and records the
    reason (forced here: CUDA graphs exist only on a GPU)."""
    import gpuprof_nb.ladder.rungs as rungs

    seen = []

    def blocked(config, device):
        seen.append((config.compile_mode, device.type))
        return "planted reason"

    monkeypatch.setattr(rungs, "accumulation_blocked", blocked)
    report = run_ladder(
        tiny.model_fn,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=1,
        batch_size=8,
        target_effective_batch=16,
        rungs=["fp32", "grad_accum"],
        device="cpu",
        progress=False,
    )
    rung = report.rung("grad_accum")
    assert (rung.status, rung.reason) == ("skipped", "planted reason")
    assert seen == [(None, "cpu")]
