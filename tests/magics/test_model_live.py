"""`%%gpuprofile` in the model's language, real CPU runs: the Modules tab of a small
transformer and a CNN (times add up to the step, backward charged to its module), a planted
slow module named first every time, and torch.compile's graph breaks and recompiles with
their line, reason and fix."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
pytest.importorskip("torch")

MODELS = '''
import torch
from torch import nn
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)

class Tiny(nn.Module):
    def __init__(self, vocab=200, d=32, n=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, vocab)
    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)
    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(self.pool(x).flatten(1))

class Slow(nn.Module):
    """Planted: the same width as its siblings, but it runs its matmul 200 times."""
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) / d ** 0.5)
    def forward(self, x):
        for _ in range(200):
            x = torch.tanh(x @ self.w)
        return x

class Planted(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d), Slow(d), nn.Linear(d, d)])
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

tiny = Tiny(); ids = torch.randint(0, 200, (4, 16))
opt = torch.optim.SGD(tiny.parameters(), lr=0.01)
net = Net(); images = torch.randn(4, 3, 16, 16)
planted = Planted(); xp = torch.randn(128, 128)
'''


@pytest.fixture(scope="module")
def ip(ipython_shell):
    ipython_shell.run_cell(MODELS)
    return ipython_shell


def profile(ip, cell: str, line: str = "-o r --quiet --warmup 1 --repeat 1 --number 1"):
    ip.run_cell_magic("gpuprofile", line, cell)
    return ip.user_ns["r"]


@pytest.mark.parametrize(
    "cell, root",
    [
        (
            "loss = nn.functional.cross_entropy(tiny(ids).view(-1, 200), ids.view(-1))\n"
            "loss.backward(); opt.step(); opt.zero_grad()",
            "tiny",
        ),
        ("net(images).sum().backward()", "net"),
    ],
    ids=["transformer", "cnn"],
)
def test_module_times_add_up_to_the_step_and_backward_lands_in_its_module(ip, cell, root) -> None:
    r = profile(ip, cell)
    mb = r.modules
    assert mb is not None and mb.source == "hooks" and mb.rows
    # The roots plus the time in no module make the whole profiled window (within 2%,
    # measured against the window the timeline computes on its own).
    roots = sum(x.host_us for x in mb.roots)
    assert roots + mb.outside_us == pytest.approx(r.timeline.window_us, rel=0.02)
    assert {x.path for x in mb.roots} == {root}
    # Every module with weights had a backward of its own, charged to it.
    weighted = [x for x in mb.rows if x.module_type in ("Linear", "Conv2d", "Embedding")]
    assert weighted and all(x.backward_host_us > 0 for x in weighted)
    # The tab shows the module tree, every row's numbers in the text.
    text = r.text()
    assert "-- Modules --" in text
    for x in mb.rows:
        assert x.path in text
    html = r._repr_mimebundle_()["text/html"]
    assert "<details>" in html or not mb.groups
    assert "icicle chart" in html


def test_repeated_blocks_fold_with_their_count(ip) -> None:
    r = profile(ip, "tiny(ids).sum().backward()")
    [g] = [g for g in r.modules.groups if g.pattern == "tiny.blocks.{0..3}"]
    assert g.count == 4 and g.members[0] == "tiny.blocks.0"
    assert "tiny.blocks.{0..3} x4" in r.text()


@pytest.mark.parametrize("attempt", range(3))
def test_a_planted_slow_module_is_named_first_every_time(ip, attempt) -> None:
    r = profile(ip, "planted(xp).sum().backward()")
    assert r.modules.rows[0].path == "planted.blocks.2"
    hottest = r.text().split("Most time of their own:")[1].strip().splitlines()[0]
    assert "planted.blocks.2" in hottest


GRAPH_BREAK = """
def step(x):
    y = torch.sin(x) * 2
    n = y.sum().item()
    return torch.relu(y.cos() + n)

cstep = torch.compile(step, backend="eager")
xc = torch.randn(32, 32)
"""


def test_a_planted_item_is_a_graph_break_naming_its_line_reason_and_fix(ip) -> None:
    import torch

    torch._dynamo.reset()
    ip.run_cell(GRAPH_BREAK)
    r = profile(ip, "cstep(xc)")
    comp = r.compile
    assert comp is not None and comp.logged and comp.graphs == 2
    [b] = comp.breaks
    assert b.source == "n = y.sum().item()"
    assert re.fullmatch(r"In \[\d+\], line 3 in step", b.where)
    assert "item()" in b.reason
    assert "capture_scalar_outputs" in b.fix and ".item()" in b.fix
    f = r.diagnosis.finding("graph_break")
    assert f is not None and f in r.diagnosis.findings
    assert "n = y.sum().item()" in f.title and "capture_scalar_outputs = True" in f.fix
    assert f.evidence["graph_breaks_count"] == 1
    assert "-- Compile --" in r.text()


def test_a_print_breaks_the_graph_too(ip) -> None:
    import torch

    torch._dynamo.reset()
    ip.run_cell(
        "def noisy(x):\n    y = x * 2\n    print('step')\n    return y + 1\n"
        "cnoisy = torch.compile(noisy, backend='eager')"
    )
    r = profile(ip, "cnoisy(xc)", "-o r --quiet --once")
    [b] = r.compile.breaks
    assert b.source == "print('step')" and "print" in b.reason
    assert "reorderable_logging_functions" in b.fix


def test_a_shape_change_gives_the_recompile_reason(ip) -> None:
    import torch

    torch._dynamo.reset()
    ip.run_cell(
        "def scale(x):\n    return (x.sin() * 2).sum()\n"
        "cscale = torch.compile(scale, backend='eager', dynamic=False)\n"
        "cscale(torch.randn(8, 4))"
    )
    r = profile(ip, "cscale(torch.randn(12, 4))", "-o r --quiet --once")
    [rec] = r.compile.recompiles
    assert rec.function == "scale"
    assert (
        "size mismatch at index 0" in rec.reasons[0] and "expected 8, actual 12" in rec.reasons[0]
    )
    assert "mark_dynamic" in rec.fix
    f = r.diagnosis.finding("recompilation")
    assert f is not None and "size mismatch" in f.title and "mark_dynamic" in f.fix


def test_no_modules_records_no_module_ranges(ip) -> None:
    r = profile(ip, "net(images).sum().backward()", "-o r --quiet --once --no-modules")
    assert r.trace.modules is None
    assert r.modules is not None and r.modules.rows == ()
    assert "-- Modules --" not in r.text()
    from torch.nn.modules import module as m

    assert not m._global_forward_pre_hooks and not m._global_forward_hooks


@pytest.mark.slow
def test_inductor_graph_break_is_explained_too(ip) -> None:
    """The default backend (Inductor builds C++ kernels with gcc on CPU: slow to compile)."""
    import torch

    torch._dynamo.reset()
    ip.run_cell(
        "def tail(x):\n    y = (x * 3).relu()\n    k = int(y.max().item())\n    return y + k\n"
        "ctail = torch.compile(tail)\nxt = torch.randn(16, 16)"
    )
    r = profile(ip, "ctail(xt)", "-o r --quiet --once")
    [b] = r.compile.breaks
    assert b.source == "k = int(y.max().item())" and "item()" in b.reason
    assert r.compile.graphs == 2 and r.compile.compile_time_s > 0
    assert r.diagnosis.finding("graph_break") is not None
