"""Will it fit, on real CPU training steps recorded through the CPU fallback with the step
record: the categories add up to the measured peak (and to an independent count of it),
predictions at 2x and 4x the batch land within 5% of the peak then measured, and a
checkpointing plan, applied, fits the budget it was given."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from gpuprof_nb.analysis.fit import (  # noqa: E402
    fit_batch_size,
    fit_from_categories,
    memory_by_category,
)
from gpuprof_nb.analysis.plan import plan_checkpointing  # noqa: E402
from gpuprof_nb.analysis.report import analyze_memory  # noqa: E402
from gpuprof_nb.capture.batches import checkpoint_applied  # noqa: E402
from gpuprof_nb.capture.memory import record_cpu_memory  # noqa: E402
from gpuprof_nb.capture.step import StepRecorder  # noqa: E402
from gpuprof_nb.io.snapshot import snapshot_from_dict  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_path")


class Workload:
    """A model, its optimizer, a batch maker and the step the tests record."""

    def __init__(self, model, make_batch, loss, optimizer=torch.optim.Adam) -> None:
        torch.manual_seed(0)
        self.model = model
        self.opt = optimizer(model.parameters())
        self.make_batch = make_batch
        self.loss = loss
        self.ns = {"model": self.model, "opt": self.opt}

    def step(self, b: int) -> None:
        x, y = self.make_batch(b)
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(x), y).backward()
        self.opt.step()

    def record(self, b: int):
        # The CPU fallback by name: module-scoped fixtures record before the function-scoped
        # `cpu_path` patch applies, and on a GPU machine record_memory would take CUDA's
        # history, which these CPU tensors never enter (seen on an H100).
        capture = record_cpu_memory(lambda: self.step(b), recorder=StepRecorder("cpu", self.ns))
        return snapshot_from_dict(capture.snapshot)

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def mlp(width: int = 512) -> Workload:
    model = torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 10),
    )
    return Workload(
        model,
        lambda b: (torch.randn(b, 256), torch.randint(0, 10, (b,))),
        torch.nn.functional.cross_entropy,
    )


class Tiny(torch.nn.Module):
    """A small transformer language model: embedding, encoder layers, a head."""

    def __init__(self, vocab: int = 512, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.vocab = vocab
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def transformer() -> Workload:
    model = Tiny()
    return Workload(
        model,
        lambda b: (torch.randint(0, 512, (b, 32)), torch.randint(0, 512, (b, 32))),
        lambda out, y: torch.nn.functional.cross_entropy(out.reshape(-1, 512), y.reshape(-1)),
    )


def independent_peak(work: Workload, b: int) -> int:
    """The step's peak counted another way: the bytes live before it (parameters, their
    gradients, optimizer state) plus the highest running sum of torch.profiler's memory
    events over the step (kineto's `[memory]` events, not the memory profiler's tree)."""
    from torch.profiler import ProfilerActivity, profile

    live = work.param_bytes()
    live += sum(
        p.grad.numel() * p.grad.element_size()
        for p in work.model.parameters()
        if p.grad is not None
    )
    live += sum(
        v.numel() * v.element_size()
        for state in work.opt.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work.step(b)
    events = sorted(
        (
            e
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type().name == "CPU"
        ),
        key=lambda e: e.start_ns(),
    )
    running = top = 0
    for e in events:
        running += e.nbytes()
        top = max(top, running)
    return live + top


@pytest.fixture(scope="module")
def mlp_runs():
    work = mlp()
    work.step(512)  # a first step makes the optimizer state
    half = work.record(256)
    main = work.record(512)
    return work, half, main


def test_categories_add_up_to_the_peak_and_to_an_independent_count(mlp_runs) -> None:
    work, _half, main = mlp_runs
    report = analyze_memory(main)
    cats = report.memory_by_category
    assert cats is not None and cats.method == "step record"
    assert cats.total_bytes == report.peak_bytes
    assert sum(c.share for c in cats.categories) == pytest.approx(1.0)
    assert independent_peak(work, 512) == pytest.approx(report.peak_bytes, rel=0.01)
    # Exact where the arithmetic is known: fp32 parameters; Adam keeps two moments per
    # parameter and a 4-byte step count per parameter tensor.
    params = work.param_bytes()
    assert cats.bytes_of("parameters") == params
    assert cats.bytes_of("optimizer state") == 2 * params + 4 * len(list(work.model.parameters()))
    assert cats.allocator_overhead_bytes is None  # no caching allocator on the CPU


def test_activations_by_module_are_the_saved_outputs(mlp_runs) -> None:
    _work, _half, main = mlp_runs
    cats = memory_by_category(main)
    # At batch 512 the peak is where backward begins: ReLU keeps its output, GELU its
    # input (the middle Linear's output) and the last Linear its input (GELU's output).
    by_path = {m.path: m.bytes for m in cats.activations_by_module}
    width = 512 * 512 * 4
    assert by_path["1"] == by_path["2"] == by_path["3"] == width
    assert cats.bytes_of("activations") == sum(by_path.values())
    assert cats.bytes_of("inputs") >= 512 * 256 * 4  # the batch


@pytest.mark.parametrize("build,b", [(mlp, 256), (transformer, 8)], ids=["mlp", "transformer"])
def test_predicted_peaks_at_2x_and_4x_within_5_percent(build, b) -> None:
    work = build()
    work.step(b // 2)
    half = work.record(b // 2)
    main = work.record(b)
    fit = fit_batch_size(main, b, half, b // 2)
    by_category = fit_from_categories(main, batch_size=b)
    assert fit.method == "two runs" and fit.matched_share > 0.95
    for k in (2, 4):
        measured = analyze_memory(work.record(k * b)).peak_bytes
        predicted = fit.predict(k * b)
        assert predicted.peak_bytes == pytest.approx(measured, rel=0.05)
        assert predicted.low_bytes <= predicted.peak_bytes <= predicted.high_bytes
        # The categories alone (one run) are within 5% here too, and their interval holds
        # the measurement.
        guess = by_category.predict(k * b)
        assert guess.peak_bytes == pytest.approx(measured, rel=0.05)
        assert guess.low_bytes * 0.99 <= measured <= guess.high_bytes * 1.01


def test_checkpointing_plan_applied_fits_its_budget() -> None:
    work = transformer()
    work.step(8)
    main = work.record(8)
    peak = analyze_memory(main).peak_bytes
    budget = int(peak * 0.85)
    plan = plan_checkpointing(main, budget)
    assert plan.fits and plan.modules
    assert plan.predicted_peak_bytes <= budget < plan.baseline_peak_bytes
    assert all(p.startswith("layers.") for p in plan.paths)
    assert "use_reentrant=False" in plan.code and "model.get_submodule(name)" in plan.code
    with checkpoint_applied(work.model, plan.paths):
        measured = analyze_memory(work.record(8)).peak_bytes
    assert measured <= budget
    assert measured == pytest.approx(plan.predicted_peak_bytes, rel=0.05)
    # Taken off again: the model's own forwards are back.
    assert all("forward" not in m.__dict__ for m in work.model.modules())


def cnn() -> Workload:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    return Workload(
        model,
        lambda b: (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))),
        torch.nn.functional.cross_entropy,
        torch.optim.AdamW,
    )


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(64, 5)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(16, 64)
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x):
        h = self.embed(x)
        return self.head(h + self.attn(h, h, h, need_weights=False)[0])


def lstm() -> Workload:
    return Workload(
        Recurrent(),
        lambda b: (torch.randn(b, 20, 32), torch.randint(0, 5, (b,))),
        torch.nn.functional.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
    )


def attention() -> Workload:
    return Workload(
        Attention(),
        lambda b: (torch.randn(b, 48, 16), torch.randn(b, 48, 16)),
        torch.nn.functional.mse_loss,
        torch.optim.AdamW,
    )


@pytest.mark.parametrize("build", [cnn, lstm, attention], ids=["cnn", "lstm", "attention"])
def test_other_shapes_predicted_within_5_percent_and_inside_the_interval(build) -> None:
    work = build()
    work.step(8)
    half = work.record(8)
    main = work.record(16)
    fit = fit_batch_size(main, 16, half, 8)
    measured = analyze_memory(work.record(64)).peak_bytes
    p = fit.predict(64)
    assert p.peak_bytes == pytest.approx(measured, rel=0.05)
    # The LSTM's workspace is not a line in the batch (0.4% off at 4x on this machine):
    # the interval's allowance for that holds it.
    assert p.low_bytes <= measured <= p.high_bytes


def test_transformer_categories_add_up_to_an_independent_count() -> None:
    work = transformer()
    work.step(8)
    main = work.record(8)
    report = analyze_memory(main)
    cats = report.memory_by_category
    assert cats.total_bytes == report.peak_bytes
    assert independent_peak(work, 8) == pytest.approx(report.peak_bytes, rel=0.01)
    assert cats.bytes_of("parameters") == work.param_bytes()
    # The logits (batch x 32 x vocab 512, fp32) are kept for the loss's backward.
    assert cats.bytes_of("activations") >= 8 * 32 * 512 * 4
    assert {"layers.0", "layers.1"} <= {m.path for m in cats.activations_by_module}
