"""Failing rungs, NaN losses, empty data, batches that do not fit: clear messages, the
ladder goes on where it can, and nothing is left switched on."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils.data import TensorDataset

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.ladder import run_ladder, sweep_batch_sizes


def _assert_clean_state():
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled()


class NoAutocast(torch.nn.Module):
    """Works in fp32, raises under autocast (like an op without a low-precision kernel)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("this op has no bf16 kernel\nsecond line of detail")
        return self.lin(x)


def test_failed_rung_is_reported_and_the_ladder_goes_on(tiny):
    # On CPU: NoAutocast raises under CPU autocast only.
    report = run_ladder(
        NoAutocast,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=1,
        batch_size=8,
        rungs=["fp32", "bf16", "fused_adamw"],
        device="cpu",
        progress=False,
    )
    bf16 = report.rung("bf16")
    assert bf16.status == "failed"
    assert bf16.reason == "RuntimeError: this op has no bf16 kernel"
    assert report.rung("fused_adamw").status in ("kept", "dropped", "no clear change")
    assert report.rung("fused_adamw").step_times_us
    assert "Failed: bf16 (RuntimeError: this op has no bf16 kernel)" in report.recommendation
    assert report.three_run.amp_samples_per_s is None
    _assert_clean_state()


def test_compile_rung_runs_for_real_and_is_reset(tiny, monkeypatch):
    # backend="eager" exercises dynamo (tracing, guards, reset) without building C++ kernels,
    # so this stays a few seconds; inductor on this CPU costs about 40 s cold.
    import torch._dynamo

    resets = []
    real_reset = torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: (resets.append(1), real_reset()))
    report = run_ladder(
        tiny.model_fn,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=3,
        warmup=1,
        batch_size=8,
        rungs=["fp32", "compile"],
        compile=True,
        compile_backend="eager",
        progress=False,
    )
    rung = report.rung("compile")
    assert rung.status in ("kept", "dropped", "no clear change", "flagged")
    assert rung.compile_time_us is not None and rung.compile_time_us >= 0
    assert "compile(default, eager)" in rung.settings
    # Compiling did not change the numbers: same loss as the eager baseline.
    assert rung.final_loss == pytest.approx(report.baseline.final_loss, rel=1e-5)
    # bf16 was not asked for, so the three-run reading has no compile number.
    assert report.three_run.compile_samples_per_s is None
    # Exactly one compiled measurement, so exactly one reset of dynamo's caches.
    assert len(resets) == 1
    _assert_clean_state()


def test_compile_failure_is_a_failed_rung(tiny, monkeypatch):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("compiler exploded\nlong trace")

    monkeypatch.setattr(torch, "compile", broken_compile)
    report = run_ladder(
        tiny.model_fn,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=0,
        batch_size=8,
        rungs=["fp32", "compile", "fused_adamw"],
        compile=True,
        progress=False,
    )
    assert report.rung("compile").status == "failed"
    assert report.rung("compile").reason == "RuntimeError: compiler exploded"
    assert report.rung("fused_adamw").step_times_us
    _assert_clean_state()


def test_nan_baseline_loss_is_a_clear_error(tiny):
    def nan_loss(out, target):
        return tiny.loss_fn(out, target) * float("nan")

    with pytest.raises(GpuprofError, match=r"loss became nan at step 1 .*detect_anomaly"):
        run_ladder(
            tiny.model_fn,
            tiny.dataset,
            nan_loss,
            tiny.optimizer_fn,
            steps=2,
            warmup=0,
            batch_size=8,
            rungs=["fp32"],
            progress=False,
        )
    _assert_clean_state()


def test_nan_only_under_low_precision_fails_that_rung(tiny):
    def fragile_loss(out, target):
        loss = tiny.loss_fn(out, target)
        return loss * float("nan") if out.dtype == torch.bfloat16 else loss

    report = run_ladder(
        tiny.model_fn,
        tiny.dataset,
        fragile_loss,
        tiny.optimizer_fn,
        steps=2,
        warmup=0,
        batch_size=8,
        rungs=["fp32", "bf16"],
        progress=False,
    )
    assert report.rung("bf16").status == "failed"
    assert "loss became nan" in report.rung("bf16").reason
    _assert_clean_state()


def test_empty_dataset(tiny):
    empty = TensorDataset(torch.zeros(0, 16), torch.zeros(0, dtype=torch.long))
    with pytest.raises(GpuprofError, match="yielded no batches"):
        run_ladder(
            tiny.model_fn,
            empty,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=2,
            batch_size=8,
            rungs=["fp32"],
            progress=False,
        )
    # Fewer samples than one batch (the ladder drops short batches for static shapes).
    short = TensorDataset(torch.zeros(3, 16), torch.zeros(3, dtype=torch.long))
    with pytest.raises(GpuprofError, match="smaller batch_size"):
        run_ladder(
            tiny.model_fn,
            short,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=2,
            batch_size=8,
            rungs=["fp32"],
            progress=False,
        )
    _assert_clean_state()


def test_batches_must_be_pairs(tiny):
    singles = TensorDataset(torch.zeros(32, 16))
    with pytest.raises(GpuprofError, match=r"\(inputs, targets\)"):
        run_ladder(
            tiny.model_fn,
            singles,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=2,
            batch_size=8,
            rungs=["fp32"],
            progress=False,
        )


def test_argument_mistakes(tiny):
    args = (tiny.model_fn, tiny.dataset, tiny.loss_fn, tiny.optimizer_fn)
    with pytest.raises(GpuprofError, match="unknown rung"):
        run_ladder(*args, batch_size=8, rungs=["fp32", "fp8"], progress=False)
    with pytest.raises(GpuprofError, match="batch_size"):
        run_ladder(*args, rungs=["fp32"], progress=False)
    with pytest.raises(GpuprofError, match="Dataset or DataLoader"):
        run_ladder(tiny.model_fn, 42, tiny.loss_fn, tiny.optimizer_fn, batch_size=8)
    with pytest.raises(GpuprofError, match="steps"):
        run_ladder(*args, batch_size=8, steps=0)
    with pytest.raises(GpuprofError, match="compile"):
        run_ladder(*args, batch_size=8, compile="yes")


LIVE_ACTIVATIONS: list[weakref.ref] = []


class Greedy(torch.nn.Module):
    """Raises torch's own out-of-memory error for batches of 64 or more, with an activation
    alive in its frame (as a real OOM has)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, x):
        hidden = self.lin(x)
        if x.shape[0] >= 64:
            LIVE_ACTIVATIONS.append(weakref.ref(hidden))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return hidden


def test_batch_that_does_not_fit_in_the_baseline(tiny):
    LIVE_ACTIVATIONS.clear()
    with pytest.raises(
        GpuprofError, match=r"batch size 64 .*does not fit.*smaller batch_size"
    ) as caught:
        run_ladder(
            Greedy,
            tiny.dataset,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=2,
            batch_size=64,
            rungs=["fp32"],
            progress=False,
        )
    # The error is still held (as IPython holds the last one), yet the activation and the
    # model are already freed: the ladder dropped the frames that pointed at them.
    assert caught.value is not None
    assert LIVE_ACTIVATIONS and all(ref() is None for ref in LIVE_ACTIVATIONS)
    _assert_clean_state()


def test_batch_sweep_stops_at_the_first_oom(tiny):
    sweep = sweep_batch_sizes(
        Greedy,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        [8, 16, 64, 128],
        steps=2,
        warmup=0,
        progress=False,
    )
    assert [(p.batch_size, p.status) for p in sweep.points] == [(8, "ok"), (16, "ok"), (64, "oom")]
    assert sweep.oom_batch_size == 64
    assert "does not fit" in sweep.points[-1].error
    assert "64 ran out of memory" in sweep.summary()
    text = sweep._repr_mimebundle_()["text/plain"]
    assert "oom" in text
    _assert_clean_state()


def test_peak_memory_sees_a_known_allocation(tiny):
    size = 64 * 2**20

    class Hungry(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 4)

        def forward(self, x):
            # 64 MiB alive during the forward, freed before backward ends.
            scratch = torch.ones(size // 4, dtype=torch.float32)
            return self.lin(x) + scratch[:1] * 0

    # On CPU: the scratch is a CPU tensor, and the bounds are the CPU method's.
    report = run_ladder(
        Hungry,
        tiny.dataset,
        tiny.loss_fn,
        tiny.optimizer_fn,
        steps=2,
        warmup=0,
        batch_size=8,
        rungs=["fp32"],
        device="cpu",
        progress=False,
    )
    peak = report.baseline.peak_memory_bytes
    # The scratch plus the parameters and AdamW's two moments and step counters:
    # (16 * 4 + 4) floats x 3, 2 scalar steps; activations of 8 x 16 are small change.
    params = (16 * 4 + 4) * 4
    assert peak >= size + 3 * params
    assert peak <= size + 3 * params + 64 * 1024


def test_static_shapes_are_detected(tiny):
    from torch.utils.data import DataLoader

    from gpuprof_nb.ladder import RungConfig
    from gpuprof_nb.ladder.measure import Workload, measure

    calls = []

    def ragged(samples):
        # Every other batch drops a feature column: shapes change between steps.
        calls.append(1)
        x = torch.stack([s[0] for s in samples])
        y = torch.stack([s[1] for s in samples])
        return (x[:, :15] if len(calls) % 2 else x), y

    class Flexible(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 4)

        def forward(self, x):
            return self.lin(x.mean(dim=1, keepdim=True))

    def workload(collate):
        return Workload(
            model_fn=Flexible,
            dataset=tiny.dataset,
            collate_fn=collate,
            loss_fn=tiny.loss_fn,
            optimizer_fn=tiny.optimizer_fn,
            batch_size=8,
            steps=3,
            warmup=0,
            device=torch.device("cpu"),
            seed=0,
        )

    assert measure(workload(ragged), RungConfig()).static_shapes is False
    default_collate = DataLoader(tiny.dataset).collate_fn
    assert measure(workload(default_collate), RungConfig()).static_shapes is True


def test_flagged_low_precision_still_gets_its_three_run_reference(tiny):
    def louder_in_bf16(out, target):
        # Under bf16 the loss (and so every SGD update) is tripled: the trained weights, and
        # the probe loss after training, must drift from fp32.
        loss = tiny.loss_fn(out, target)
        return loss * 3 if out.dtype == torch.bfloat16 else loss

    report = run_ladder(
        tiny.model_fn,
        tiny.dataset,
        louder_in_bf16,
        lambda p: torch.optim.SGD(p, lr=0.1),
        steps=3,
        warmup=1,
        batch_size=8,
        rungs=["fp32", "bf16", "compile"],
        compile=True,
        compile_backend="eager",
        loss_tolerance=1e-3,
        progress=False,
    )
    bf16 = report.rung("bf16")
    assert bf16.status == "flagged" and "loss drifted" in bf16.reason
    assert bf16.loss_drift > 1e-3
    # The compile rung builds on fp32 (bf16 was not kept); bf16 + compile is measured for the
    # three-run reading only.
    assert "fp32" in report.rung("compile").settings
    reference = report.rung("amp+compile")
    assert reference.status == "reference"
    assert "bf16 autocast" in reference.settings and "compile(default" in reference.settings
    assert report.three_run.compile_samples_per_s == pytest.approx(reference.samples_per_s)
    assert report.three_run.compile_gain == pytest.approx(
        reference.samples_per_s / bf16.samples_per_s - 1
    )
    assert "Flagged: bf16" in report.recommendation


def test_under_an_active_profiler_cpu_memory_is_left_empty(tiny):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as outer:
        # On CPU: on CUDA the peak comes from the allocator's counters, no profiler needed.
        report = run_ladder(
            tiny.model_fn,
            tiny.dataset,
            tiny.loss_fn,
            tiny.optimizer_fn,
            steps=2,
            warmup=0,
            batch_size=8,
            rungs=["fp32"],
            device="cpu",
            progress=False,
        )
        # The caller's profiling session is still running: the ladder did not start its own.
        assert torch._C._autograd._profiler_enabled()
    assert any(e.name == "aten::addmm" for e in outer.events())
    assert report.baseline.peak_memory_bytes is None
    assert report.baseline.step_times_us
    assert "-" in report._repr_mimebundle_()["text/plain"]
