"""The utilisation sampler beside a real `%%gpuprofile` run on the CPU: what it read agrees
with the trace (the process is busy while ops run back to back and idle in the trace's long
gap, a sleep), it lands on the trace's clock, and the Timeline draws and prints it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from gpuprof_nb.render.timeline import timeline_section  # noqa: E402

CELL = (
    "x = torch.randn(160, 160)\nend = time.perf_counter() + 0.3\n"
    "while time.perf_counter() < end: y = x @ x\ntime.sleep(0.3)\nz = x.sum()\n"
)

# One intra-op thread: the planted line must stand out, and no OpenMP worker may spin through
# a sleep (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_utilisation_agrees_with_the_trace(ipython_shell) -> None:
    ip = ipython_shell
    ip.run_cell("import time, torch")
    ip.run_cell_magic("gpuprofile", "-o r --quiet --warmup 0 --repeat 1 --number 1", CELL)
    r = ip.user_ns["r"]
    u = r.utilisation
    assert u is not None and u.ts_us
    assert len(u.cpu_cores()) == os.cpu_count()
    # The trace's longest gap is the sleep; before it, ops ran back to back.
    sleep = max(r.timeline.gaps, key=lambda g: g.dur_us)
    assert sleep.dur_us > 250_000
    lo, hi = r.trace.bounds_us
    assert lo - 20_000 <= u.ts_us[0] and u.ts_us[-1] <= hi + 20_000
    busy_lo, busy_hi = sleep.start_us - 250_000, sleep.start_us - 20_000
    ops_busy = r.timeline.breakdown.busy_us / r.timeline.window_us
    assert ops_busy > 0.3
    in_ops = u.mean_over("process", busy_lo, busy_hi)
    asleep = u.mean_over("process", sleep.start_us + 30_000, sleep.end_us - 20_000)
    assert in_ops is not None and asleep is not None
    # CPU time of this process: a loaded machine gives the busy stretch less than a core
    # (about 0.5 with two other busy processes on 2 cores), the sleep close to none.
    assert asleep < 0.2, (in_ops, asleep)
    assert in_ops > max(0.25, 5 * asleep), (in_ops, asleep)
    # The Timeline draws the strip and prints its numbers.
    section = timeline_section(r.timeline, r.trace, r.hotspots)
    assert "gp-util" in section.html
    assert "this process" in section.text and "CPU cores" in section.text
