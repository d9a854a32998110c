"""nn.Module ranges recorded live on CPU (real torch.profiler runs): paths as the model names
them, forward and backward charged to the module that ran them (checked against a
brute-force walk of the raw events), nothing recorded when no module runs, no hook left."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpuprof_nb.analysis.modules import module_breakdown  # noqa: E402
from gpuprof_nb.analysis.timeline import device_timeline  # noqa: E402
from gpuprof_nb.capture.modules import MODULE_PREFIX, ModuleRecorder  # noqa: E402
from gpuprof_nb.capture.profiler import profile_cell  # noqa: E402
from gpuprof_nb.io.trace import trace_from_dict  # noqa: E402

BACKWARD = "autograd::engine::evaluate_function: "


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 300, d: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def record(step, namespace: dict) -> tuple[dict, object]:
    recorder = ModuleRecorder(namespace)
    artifact = profile_cell(step, cuda=False, samplers=[("modules", recorder)])
    trace = trace_from_dict(artifact, "test")
    return artifact, trace


def transformer_step() -> tuple[dict, object]:
    torch.manual_seed(0)
    model = TinyTransformer()
    loss_fn = nn.CrossEntropyLoss()
    ids = torch.randint(0, 300, (4, 16))

    def step() -> None:
        loss = loss_fn(model(ids).view(-1, 300), ids.view(-1))
        loss.backward()

    step()  # warm-up
    return record(step, {"model": model, "loss_fn": loss_fn})


def cnn_step() -> tuple[dict, object]:
    torch.manual_seed(0)
    net = SmallCNN()
    images = torch.randn(4, 3, 16, 16)

    def step() -> None:
        net(images).sum().backward()

    step()
    return record(step, {"net": net})


def brute_force(artifact: dict) -> tuple[dict[str, float], dict[str, float], float]:
    """Per module path: forward self host time is not needed here; returns (backward host
    time per path, forward op count per path, backward time tied to no module), walking
    the raw events one by one: each top-level backward op's sequence number, the forward op
    with that number started last before it, the innermost module range around that op."""
    spans = [e for e in artifact["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    modules = [e for e in spans if str(e.get("name", "")).startswith(MODULE_PREFIX)]
    ops = [e for e in spans if e.get("cat") == "cpu_op"]
    backward = sorted((e for e in ops if e["name"].startswith(BACKWARD)), key=lambda e: e["ts"])
    top = []
    for b in backward:
        if not any(o is not b and o["ts"] <= b["ts"] < o["ts"] + o["dur"] for o in top):
            top.append(b)

    def inside_backward(e: dict) -> bool:
        return any(b["ts"] <= e["ts"] < b["ts"] + b["dur"] for b in top)

    def module_of(e: dict) -> str | None:
        around = [m for m in modules if m["ts"] <= e["ts"] < m["ts"] + m["dur"]]
        if not around:
            return None
        return min(around, key=lambda m: m["dur"])["name"][len(MODULE_PREFIX) :]

    per_path: dict[str, float] = defaultdict(float)
    forward_ops: dict[str, float] = defaultdict(float)
    outside = 0.0
    for b in top:
        seq = b["args"].get("Sequence number")
        fwd = [
            o
            for o in ops
            if o["args"].get("Sequence number") == seq
            and not o["name"].startswith(BACKWARD)
            and o["ts"] < b["ts"]
            and not inside_backward(o)
        ]
        owner = module_of(max(fwd, key=lambda o: o["ts"])) if fwd and seq is not None else None
        if owner is None:
            outside += b["dur"]
        else:
            per_path[owner] += b["dur"]
    for o in ops:
        if not inside_backward(o) and not o["name"].startswith(BACKWARD):
            owner = module_of(o)
            if owner is not None:
                forward_ops[owner] += 1
    return dict(per_path), dict(forward_ops), outside


@pytest.fixture(scope="module")
def transformer() -> tuple[dict, object]:
    return transformer_step()


@pytest.fixture(scope="module")
def cnn() -> tuple[dict, object]:
    return cnn_step()


def test_paths_are_the_attribute_paths_of_the_model(transformer, cnn) -> None:
    _, trace = transformer
    mb = module_breakdown(trace)
    assert mb.source == "hooks"
    expected = {"model", "model.emb", "model.head", "loss_fn"}
    for i in range(3):
        expected |= {f"model.layers.{i}"}
        expected |= {f"model.layers.{i}.{n}" for n in ("norm1", "attn", "norm2", "mlp")}
        expected |= {f"model.layers.{i}.mlp.{k}" for k in range(3)}
    assert {r.path for r in mb.rows} == expected
    assert all(r.calls == 1 for r in mb.rows)
    assert mb.row("model.layers.2.mlp.0").module_type == "Linear"  # type: ignore[union-attr]
    assert mb.row("model.layers.1").parent == "model"  # type: ignore[union-attr]
    [layers] = [g for g in mb.groups if g.pattern == "model.layers.{0..2}"]
    assert layers.members == ("model.layers.0", "model.layers.1", "model.layers.2")
    _, trace = cnn
    paths = {r.path for r in module_breakdown(trace).rows}
    assert paths == {"net", "net.features", "net.classifier"} | {
        f"net.features.{k}" for k in range(8)
    }
    root = trace.modules.roots[0]
    assert (root.path, root.module_type, root.input_shape) == ("net", "SmallCNN", (4, 3, 16, 16))


@pytest.mark.parametrize("which", ["transformer", "cnn"])
def test_backward_is_charged_to_the_module_whose_forward_made_it(which, request) -> None:
    artifact, trace = request.getfixturevalue(which)
    mb = module_breakdown(trace, device_timeline(trace))
    per_path, forward_ops, outside = brute_force(artifact)
    got = {}
    for r in mb.rows:
        kids = [c for c in mb.rows if c.parent == r.path]
        own = r.backward_host_us - sum(c.backward_host_us for c in kids)
        if own > 0:
            got[r.path] = own
    assert got.keys() == per_path.keys()
    for path, us in per_path.items():
        assert got[path] == pytest.approx(us, rel=1e-6, abs=0.01), path  # ns rounding
    assert mb.backward_outside_us == pytest.approx(outside, rel=1e-6, abs=1e-3)
    # Every module that ran forward on tensors needing grad has a backward of its own or
    # in its children (the CNN's pooling and ReLUs included).
    for r in mb.rows:
        if r.path in forward_ops and r.module_type not in ("Dropout",):
            assert r.backward_host_us > 0, r.path


@pytest.mark.parametrize("which", ["transformer", "cnn"])
def test_module_times_add_up_to_the_step(which, request) -> None:
    artifact, trace = request.getfixturevalue(which)
    tl = device_timeline(trace)
    mb = module_breakdown(trace, tl)
    assert not mb.on_device
    # The whole: the window of recorded work.
    assert mb.total_us == pytest.approx(tl.window_us)
    roots = sum(r.host_us for r in mb.roots)
    assert roots + mb.outside_us == pytest.approx(mb.total_us, rel=1e-9)
    # What is outside every module is independently: the backward ops tied to no module
    # (AccumulateGrad), plus the host time outside every range: within 2% of the step.
    spans = [e for e in artifact["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    module_spans = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"].startswith(MODULE_PREFIX)
    )
    _, _, untied = brute_force(artifact)
    covered = 0.0
    end = float("-inf")
    for a, b in module_spans:
        if b > end:
            covered += b - max(a, end)
            end = b
    backward_tied = sum(r.backward_host_us for r in mb.roots)
    forward_union = covered
    independent_outside = tl.window_us - forward_union - backward_tied
    assert mb.outside_us == pytest.approx(independent_outside, abs=0.02 * tl.window_us)
    assert untied <= mb.outside_us + 1e-6
    # Self times add up too: every moment inside a module belongs to exactly one.
    assert sum(r.self_host_us for r in mb.rows) == pytest.approx(roots, rel=1e-9)


def test_no_module_records_nothing_and_says_so() -> None:
    a = torch.randn(32, 32)
    artifact, trace = record(lambda: a @ a, {})
    assert not [e for e in artifact["traceEvents"] if e.get("name", "").startswith(MODULE_PREFIX)]
    assert trace.modules is not None and trace.modules.recorded and trace.modules.calls == 0
    mb = module_breakdown(trace)
    assert mb.rows == () and "no nn.Module ran" in mb.notes[0]


def test_hooks_are_removed_even_when_the_cell_raises() -> None:
    from torch.nn.modules import module as m

    before = (len(m._global_forward_pre_hooks), len(m._global_forward_hooks))
    lin = nn.Linear(4, 4)

    def boom() -> None:
        lin(torch.randn(2, 4))
        raise ValueError("cell error")

    with pytest.raises(ValueError, match="cell error"):
        record(boom, {"lin": lin})
    assert (len(m._global_forward_pre_hooks), len(m._global_forward_hooks)) == before


def test_a_module_that_raises_inside_a_caught_error_keeps_the_ranges_nested() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("inner")

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bad = Bad()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                self.bad(x)
            except RuntimeError:
                pass
            return self.fc(x)

    outer = Outer()
    _, trace = record(lambda: outer(torch.randn(2, 4)), {"outer": outer})
    mb = module_breakdown(trace)
    assert {r.path for r in mb.rows} == {"outer", "outer.bad", "outer.fc"}
    assert mb.row("outer.fc").parent == "outer"  # type: ignore[union-attr]
    fc = mb.row("outer.fc")
    assert fc is not None and fc.host_us > 0


def test_memory_allocated_inside_a_module_is_charged_to_it() -> None:
    class Alloc(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            big = torch.ones(1000, 1000)  # 4,000,000 bytes, inside this module
            return x + big.sum()

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.alloc = Alloc()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.alloc(x))

    outer = Outer()
    x = torch.randn(2, 4)
    recorder = ModuleRecorder({"outer": outer})
    artifact = profile_cell(lambda: outer(x), cuda=False, memory=True, samplers=[("m", recorder)])
    mb = module_breakdown(trace_from_dict(artifact))
    alloc, fc, root = mb.row("outer.alloc"), mb.row("outer.fc"), mb.row("outer")
    assert alloc is not None and fc is not None and root is not None
    assert alloc.bytes_allocated is not None and alloc.bytes_allocated >= 4_000_000
    assert fc.bytes_allocated is not None and fc.bytes_allocated < 4_000_000
    assert root.bytes_allocated >= alloc.bytes_allocated + fc.bytes_allocated  # type: ignore[operator]
    # Without --memory there is nothing to say: None, not 0.
    _, plain = record(lambda: outer(x), {"outer": outer})
    assert all(r.bytes_allocated is None for r in module_breakdown(plain).rows)
