"""Real `%%gpuprofile --stack` runs on the CPU: in each cell one line is planted to hold the
time (a Python loop, a sleep between ops as an `.item()`-like wait, a per-sample loop), and it
must come out as the top line, named with its cell and line number, in the Hotspots, the
Timeline and the findings. The samples must sit on the trace's clock: the sleep's time is
idle time between ops."""

from __future__ import annotations

import os
import sys
import threading
from html import escape as html_escape

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from gpuprof_nb.analysis.report import analyze  # noqa: E402
from gpuprof_nb.io.trace import load_trace  # noqa: E402
from gpuprof_nb.render.profile import profile_sections  # noqa: E402
from gpuprof_nb.render.timeline import timeline_section  # noqa: E402

OPTIONS = "-o r --quiet --stack --warmup 0 --repeat 1 --number 1"

# One intra-op thread: the planted line must stand out, and no OpenMP worker may spin through
# a sleep (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")
IDLE_KINDS = ("python_overhead", "host_sync", "dataloader", "launch_overhead")


def profile(ip, number: int, cell: str, options: str = OPTIONS):
    ip.execution_count = number
    ip.run_cell("import time, torch")
    ip.execution_count = number
    ip.run_cell_magic("gpuprofile", options, cell)
    return ip.user_ns["r"]


def check_top_line(r, label: str, text: str) -> None:
    h = r.hotspots
    assert h is not None and h.granularity == "line" and h.samples > 0, r.notes
    top = h.lines[0]
    assert top.label.startswith(label), [(x.label, x.host_us) for x in h.lines[:5]]
    assert top.text == text
    assert top.share > 0.5, [(x.label, x.share) for x in h.lines[:5]]
    # It holds the most idle time too, and the findings about idle time name it.
    (first, share), *_ = h.top_idle_lines()
    assert first is top and share > 0.3
    titles = [f.title for f in r.diagnosis.considered if f.kind in IDLE_KINDS]
    assert any(f"`{top.label}` (`{text}`): " in t for t in titles), titles
    assert "Hotspots" in [s.title for s in profile_sections(r)]
    assert top.label in r.text()
    html = r._repr_mimebundle_()["text/html"]
    assert "gp-frame" in html and html_escape(top.label) in html


def test_python_loop_is_the_top_line(ipython_shell) -> None:
    r = profile(
        ipython_shell,
        61,
        "x = torch.randn(64, 64)\nfor i in range(3):\n"
        "    y = x @ x\n    acc = 0\n    while acc < 300_000: acc += 1\n"
        "    z = y.relu()\n",
    )
    check_top_line(r, "In [61], line 5", "while acc < 300_000: acc += 1")


def test_sleep_between_ops_is_the_top_line(ipython_shell) -> None:
    r = profile(
        ipython_shell,
        62,
        "x = torch.randn(64, 64)\nfor i in range(4):\n"
        "    y = x @ x\n    time.sleep(0.03)\n    z = y.sum()\n",
    )
    check_top_line(r, "In [62], line 4", "time.sleep(0.03)")
    top = r.hotspots.lines[0]
    # On the trace's clock, the sleeping line's time falls in the gaps between ops: if the
    # samples were shifted, much of it would land on ops instead.
    assert top.host_us > 4 * 30_000 * 0.9
    assert top.idle_us > 0.9 * top.host_us
    title = r.diagnosis.finding("python_overhead").title
    assert "`In [62], line 4` (`time.sleep(0.03)`): " in title
    assert "of the time between ops" in title
    # The Timeline names it too.
    section = timeline_section(r.timeline, r.trace, r.hotspots)
    assert "`In [62], line 4` (`time.sleep(0.03)`)" in section.text
    assert "In [62], line 4" in section.html


def test_per_sample_loop_is_the_top_line(ipython_shell) -> None:
    r = profile(
        ipython_shell,
        63,
        "batch = torch.randn(3000, 16)\nw = torch.randn(16, 16)\n"
        "outs = [torch.relu(row @ w).sum() for row in batch]\n"
        "total = torch.stack(outs).sum()\n",
    )
    # The comprehension's own frame is part of its line.
    check_top_line(r, "In [63], line 3", "outs = [torch.relu(row @ w).sum() for row in batch]")
    assert r.hotspots.lines[0].label == "In [63], line 3"


def test_saved_trace_keeps_the_lines(ipython_shell, tmp_path) -> None:
    r = profile(
        ipython_shell,
        64,
        "x = torch.randn(32, 32)\nfor i in range(3):\n    y = x @ x\n    time.sleep(0.01)\n",
    )
    assert not any(op.name == "gpuprof_nb::clock" for op in r.trace.ops)
    lo, hi = r.trace.bounds_us
    samples = r.trace.samples
    assert samples is not None and lo - 1000 <= samples.ts_us[0] <= samples.ts_us[-1] <= hi + 1000
    again = analyze(load_trace(r.save(tmp_path / "t.json.gz")))
    assert again.hotspots == r.hotspots
    assert again.utilisation == r.utilisation and again.utilisation is not None


def test_without_stack_the_findings_say_how_to_get_lines(ipython_shell) -> None:
    r = profile(
        ipython_shell,
        65,
        "x = torch.randn(64, 64)\nfor i in range(3):\n    y = x @ x\n    time.sleep(0.01)\n",
        options="-o r --quiet --warmup 0 --repeat 1 --number 1",
    )
    assert r.hotspots is None and r.trace.samples is None
    assert "--stack" in r.diagnosis.finding("python_overhead").fix
    assert "Hotspots" not in [s.title for s in profile_sections(r)]
    assert "--stack" in timeline_section(r.timeline, r.trace, None).text


def test_a_raising_cell_leaves_no_sampler_behind(ipython_shell) -> None:
    switch = sys.getswitchinterval()
    ipython_shell.execution_count = 66
    result = ipython_shell.run_cell(
        "%%gpuprofile --stack --warmup 0 --repeat 1 --number 1\n"
        "import time\ntime.sleep(0.005)\nraise KeyError('planted')\n"
    )
    assert isinstance(result.error_in_exec, KeyError)
    assert result.error_in_exec.args == ("planted",)
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("gpuprof_nb")], names
    assert sys.getswitchinterval() == switch


# The planted cells (issue 32): a per-sample loop whose work is one line below the
# `for`, and a sleep inside `for _ in range(3):`. The line sampler named the `for` line (its
# signals are handled at the loop's backward jump) or, for a cell this short, no line at
# all; exact line events name the work line every time.
PER_SAMPLE = (
    "xs = torch.randn(1500, 64)\nout = []\nfor row in xs:\n"
    "    out.append(float(row.sum()) * 2.0 + sum(range(300)))\n"
)
SLEEP_IN_LOOP = (
    "x = torch.randn(64, 64)\ny = x.sum()\nfor _ in range(3):\n    time.sleep(0.02)\n"
    "    y = y + x.sum()\n"
)


def shares_in_range(h) -> None:
    for line in h.lines:
        assert 0.0 <= line.share <= 1.0 and 0.0 <= line.idle_share <= 1.0, line
    assert 0.0 <= h.idle_charged_us <= h.idle_us + 1e-6


@pytest.mark.parametrize("attempt", range(3))
def test_per_sample_loop_names_the_work_line_every_time(ipython_shell, attempt) -> None:
    r = profile(ipython_shell, 70 + attempt, PER_SAMPLE)
    check_top_line(
        r, f"In [{70 + attempt}], line 4", "out.append(float(row.sum()) * 2.0 + sum(range(300)))"
    )
    assert r.hotspots.lines[0].label == f"In [{70 + attempt}], line 4"
    assert "exact line events" in r.hotspots.source
    shares_in_range(r.hotspots)


def test_the_window_is_the_cells_not_the_profilers_start_up(ipython_shell) -> None:
    """With --stack the trace holds the Python calls of every thread from the profiler's
    start (IPython's history thread spans it all). The Timeline's window is the cell's code
    and its ops: the profiler's start-up is no Python of the user's, and the Python time
    between ops is held by the cell's lines."""
    from gpuprof_nb.analysis.timeline import cell_span

    r = profile(ipython_shell, 74, PER_SAMPLE)
    span = cell_span(r.trace)
    assert span is not None
    ops = [o for o in r.trace.ops if o.kind == "op"]
    lo = min(span[0], min(o.start_us for o in ops))
    hi = max(span[1], max(o.end_us for o in ops))
    python = [o for o in r.trace.ops if o.kind == "python"]
    # What the test is about: Python calls well outside the cell.
    assert min(o.start_us for o in python) < lo - 100, (lo, min(o.start_us for o in python))
    tl = r.timeline
    assert lo - 1 <= tl.start_us and tl.end_us <= hi + 1, (tl.start_us - lo, hi - tl.end_us)
    # The Python gaps between ops lie in the cell: its lines hold nearly all of them, but
    # for the time the cell's thread waited for a core (other processes ran: no line's).
    host_gaps = sum(g.end_us - g.start_us for g in tl.gaps if g.cause == "host")
    held = sum(line.idle_by_cause_us.get("host", 0.0) for line in r.hotspots.lines)
    lost = sum(r.trace.samples.lost_us)
    assert held + lost >= 0.8 * host_gaps, (held, lost, host_gaps)


@pytest.mark.parametrize("attempt", range(3))
def test_sleep_in_a_short_loop_names_the_sleep_every_time(ipython_shell, attempt) -> None:
    r = profile(ipython_shell, 80 + attempt, SLEEP_IN_LOOP)
    check_top_line(r, f"In [{80 + attempt}], line 4", "time.sleep(0.02)")
    top = r.hotspots.lines[0]
    assert top.host_us > 3 * 20_000 * 0.95 and top.idle_us > 0.9 * top.host_us
    shares_in_range(r.hotspots)


def test_a_cell_driven_from_a_script_gets_its_lines(tmp_path) -> None:
    """A .py file that runs the cells through IPython's run_cell: the cell's lines, not
    `check_lines.py (line unknown) <module>` (the script is user code above the cell)."""
    import subprocess

    script = tmp_path / "check_lines.py"
    script.write_text(
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'gpuprof_nb')\n"
        "ip.run_cell('import time, torch\\ntorch.set_num_threads(1)')\n"
        f"for cell in ({PER_SAMPLE!r}, {SLEEP_IN_LOOP!r}):\n"
        "    for _ in range(2):\n"
        "        res = ip.run_cell('%%gpuprofile --stack -o r --quiet\\n' + cell)\n"
        "        assert res.success, res.error_in_exec\n"
        "        h = ip.user_ns['r'].hotspots\n"
        "        top = h.lines[0]\n"
        "        print(h.granularity, '|', top.label, '|', top.text, '|',\n"
        "              all(0 <= x.share <= 1 and 0 <= x.idle_share <= 1 for x in h.lines))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split(" | ") for line in out.stdout.splitlines() if " | " in line]
    assert len(rows) == 4, out.stdout
    for granularity, label, text, in_range in rows[:2]:
        assert (granularity, in_range) == ("line", "True")
        assert label.endswith(", line 4") and label.startswith("In [")
        assert text == "out.append(float(row.sum()) * 2.0 + sum(range(300)))"
    for granularity, label, text, in_range in rows[2:]:
        assert (granularity, label.split(", ")[-1], text, in_range) == (
            "line",
            "line 4",
            "time.sleep(0.02)",
            "True",
        )
