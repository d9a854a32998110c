"""%%memsnap --fit / --budget / --apply in-process on CPU training cells: the two runs, what
the report then holds, the prediction against a later measurement, the plan applied, the
variable put back, and the mistakes the magic refuses before anything runs."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpu_path")

SETUP = """\
import torch
torch.manual_seed(0)

class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = torch.nn.Linear(d, 4 * d)
        self.b = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(x)))

model = torch.nn.Sequential(*[Block(64) for _ in range(4)], torch.nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters())
batch_size = 128
"""

STEP = """\
x = torch.randn(batch_size, 64)
y = torch.randint(0, 10, (batch_size,))
opt.zero_grad(set_to_none=True)
torch.nn.functional.cross_entropy(model(x), y).backward()
opt.step()
"""


@pytest.fixture(scope="module")
def ip(ipython_shell):
    ipython_shell.run_cell(SETUP)
    return ipython_shell


def test_fit_budget_apply_and_a_later_measurement(ip) -> None:
    ip.user_ns["batch_size"] = 128
    with capture_output() as out:
        ip.run_cell_magic("memsnap", "--fit batch_size --budget 1MiB --apply -o mem", STEP)
    assert ip.user_ns["batch_size"] == 128  # put back
    mem = ip.user_ns["mem"]
    fit = mem.fit
    assert (fit.method, fit.batch_size, fit.other_batch_size) == ("two runs", 128, 64)
    assert fit.variable == "batch_size" and fit.matched_share > 0.95
    assert mem.snapshot.step.batch_size == 128
    cats = mem.memory_by_category
    assert cats.total_bytes == mem.peak_bytes
    params = sum(p.numel() * 4 for p in ip.user_ns["model"].parameters())
    assert cats.bytes_of("parameters") == params
    text = out.outputs[0].data["text/plain"]
    html = out.outputs[0].data["text/html"]
    assert "-- By category --" in text and "-- Will it fit --" in text
    assert 'data-category="activations"' in html
    # 1 MiB is under the parameters and optimizer state alone: nothing fits, and the plan
    # says checkpointing cannot get there.
    assert mem.largest_batch() is None and "not even batch size 1 fits" in text
    assert mem.plan is not None and not mem.plan.fits
    # The plan was applied for one more run and measured; its prediction held.
    assert mem.plan.measured_peak_bytes == pytest.approx(mem.plan.predicted_peak_bytes, rel=0.05)
    assert all("forward" not in m.__dict__ for m in ip.user_ns["model"].modules())

    # A later run at twice the batch, measured: the prediction is within 5%.
    ip.user_ns["batch_size"] = 256
    with capture_output():
        ip.run_cell_magic("memsnap", "-o at256 --quiet", STEP)
    measured = ip.user_ns["at256"].peak_bytes
    assert mem.predict(256).peak_bytes == pytest.approx(measured, rel=0.05)
    ip.user_ns["batch_size"] = 128


def test_a_budget_that_fits_with_a_plan(ip) -> None:
    ip.user_ns["batch_size"] = 1024
    with capture_output():
        ip.run_cell_magic("memsnap", "--fit batch_size -o probe --quiet", STEP)
    probe = ip.user_ns["probe"]
    budget = int(probe.peak_bytes * 0.85)
    with capture_output():
        ip.run_cell_magic(
            "memsnap", f"--fit batch_size --budget {budget} --apply -o mem --quiet", STEP
        )
    plan = ip.user_ns["mem"].plan
    assert plan.fits and plan.modules and plan.predicted_peak_bytes <= budget
    assert plan.measured_peak_bytes <= budget
    assert "checkpointed(model.get_submodule(name))" in plan.code
    assert (
        ip.user_ns["mem"].largest_batch(budget)
        < 1024
        <= ip.user_ns["mem"].largest_batch(2 * probe.peak_bytes)
    )
    ip.user_ns["batch_size"] = 128


def test_default_budget_on_the_cpu_is_the_available_ram_said_plainly(ip) -> None:
    ip.user_ns["batch_size"] = 32
    with capture_output():
        ip.run_cell_magic("memsnap", "--fit batch_size -o mem --quiet", STEP)
    mem = ip.user_ns["mem"]
    assert "no fixed capacity" in mem.budget_source and "available RAM" in mem.budget_source
    assert mem.budget_bytes > mem.peak_bytes
    assert mem.largest_batch() > 32
    ip.user_ns["batch_size"] = 128


def test_budget_without_fit_predicts_from_categories(ip) -> None:
    with capture_output() as out:
        ip.run_cell_magic("memsnap", "--budget 64MiB -o mem", STEP)
    mem = ip.user_ns["mem"]
    assert mem.fit.method == "categories" and mem.budget_bytes == 64 * 2**20
    assert "assumed to grow in proportion" in out.outputs[0].data["text/plain"]
    # The report does not know its batch size: it says so, and takes one.
    with pytest.raises(Exception, match="recorded_batch_size"):
        mem.predict(256)
    assert mem.predict(256, recorded_batch_size=128).peak_bytes > mem.peak_bytes


def test_variable_put_back_when_the_cell_raises(ip) -> None:
    ip.user_ns["batch_size"] = 128
    cell = "if batch_size != 128:\n    raise ValueError('only 128')\n" + STEP
    with capture_output(), pytest.raises(ValueError, match="only 128"):
        ip.run_cell_magic("memsnap", "--fit batch_size --quiet", cell)
    assert ip.user_ns["batch_size"] == 128


@pytest.mark.parametrize(
    "line,cell,message",
    [
        ("--fit nope", STEP, "'nope' is not defined"),
        ("--fit batch_size", "batch_size = 64\n" + STEP, "assigns batch_size"),
        ("--fit batch_size", "x = torch.randn(8, 64)", "does not read batch_size"),
        ("--fit opt", "opt.zero_grad()", "must be a whole number"),
        ("--fit batch_size --repeat 2", STEP, "drop --repeat"),
        ("--apply", STEP, "--budget"),
        ("--budget lots", STEP, "not a size"),
        ("--budget 0", STEP, "more than 0"),
    ],
)
def test_mistakes_refused_before_anything_runs(ip, line, cell, message) -> None:
    ip.user_ns["batch_size"] = 128
    ip.user_ns["ran"] = 0
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("memsnap", line, "ran += 1\n" + cell)
    assert ip.user_ns["ran"] == 0 and ip.user_ns["batch_size"] == 128


def test_two_plain_recordings_from_two_cells_fit_offline(ip) -> None:
    """Two %%memsnap runs of the step in two cells (their lines differ) still match, and
    gpuprof_nb.analyze_batches predicts a third."""
    import gpuprof_nb

    for size, name, head in ((64, "small", ""), (128, "big", "# another cell\n\n")):
        ip.user_ns["batch_size"] = size
        with capture_output():
            ip.run_cell(STEP)  # a step at this size first, as a training loop would run
            ip.run_cell_magic("memsnap", f"-o {name} --quiet", head + STEP)
    report = gpuprof_nb.analyze_batches(
        ip.user_ns["big"].snapshot, 128, ip.user_ns["small"].snapshot, 64
    )
    assert report.fit.matched_share > 0.95
    ip.user_ns["batch_size"] = 512
    with capture_output():
        ip.run_cell(STEP)
        ip.run_cell_magic("memsnap", "-o at512 --quiet", STEP)
    measured = ip.user_ns["at512"].peak_bytes
    assert report.predict(512).peak_bytes == pytest.approx(measured, rel=0.05)
    ip.user_ns["batch_size"] = 128
