"""Sites, stacks and hotspots name notebook cells `In [n], line L`, as the user numbered
them, under ipykernel's compiler (cells run from hashed files such as
/tmp/ipykernel_<pid>/117277944.py), and keep those names when saved and loaded again."""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.utils.capture import capture_output  # noqa: E402

from gpuprof_nb.analysis.report import analyze, analyze_memory  # noqa: E402
from gpuprof_nb.io.snapshot import load_snapshot  # noqa: E402
from gpuprof_nb.io.trace import load_trace  # noqa: E402

HASHED = re.compile(r"\d{6,}\.py")


@pytest.fixture
def kernel_ip(ipython_shell, monkeypatch):
    """The shared shell with ipykernel's compiler, as in Jupyter."""
    compiler = pytest.importorskip("ipykernel.compiler")
    kc = compiler.XCachingCompiler()
    kc.flags = ipython_shell.compile.flags
    monkeypatch.setattr(ipython_shell, "compile", kc)
    saved = ipython_shell.execution_count
    yield ipython_shell
    ipython_shell.execution_count = saved


def run_as(ip, number: int, cell: str) -> None:
    ip.execution_count = number
    assert ip.run_cell(cell).success


@pytest.mark.usefixtures("cpu_path")
def test_memory_sites_name_cells_and_lines(kernel_ip, tmp_path) -> None:
    ip = kernel_ip
    run_as(ip, 41, "import torch\ndef make():\n    return torch.zeros(1000, 1000)\n")
    ip.execution_count = 42
    with capture_output():
        ip.run_cell_magic(
            "memsnap",
            "-o m --quiet --save " + str(tmp_path / "s.pickle"),
            "a = torch.randn(500, 500)\nb = make()\nc = torch.zeros_like(b)\n",
        )
    m = ip.user_ns["m"]
    labels = [s.site.label for s in m.at_peak.sites]
    # The line that allocated, inside the function an earlier cell defined too (exact line
    # events beside the profiler, whose own Python events name only where functions start).
    assert sorted(labels) == [
        "In [41], line 3 in make [aten::zeros]",
        "In [42], line 1 [aten::randn]",
        "In [42], line 3 [aten::zeros_like]",
    ]
    assert m.snapshot.exact_lines
    text = m._repr_mimebundle_()["text/plain"]
    assert not HASHED.search(text) and ".py:0" not in text
    # Saved and loaded again, the snapshot still names the cells.
    again = analyze_memory(load_snapshot(tmp_path / "s.pickle"))
    assert [s.site.label for s in again.at_peak.sites] == labels


def test_hotspots_name_the_cell_function(kernel_ip, tmp_path) -> None:
    ip = kernel_ip
    run_as(
        ip,
        51,
        "def spin(n):\n    acc = 0\n    for j in range(n):\n        acc += j * j % 7\n"
        "    return acc\n",
    )
    ip.execution_count = 52
    ip.run_cell_magic(
        "gpuprofile",
        "-o r --quiet --stack --warmup 0 --repeat 1 --number 1",
        "import torch\nt = torch.ones(4)\nfor _ in range(20):\n    spin(30000)\n    t = t + 1\n",
    )
    r = ip.user_ns["r"]
    title = r.diagnosis.finding("python_overhead").title
    # The line events name the lines inside the function the earlier cell defined. The
    # loop's head and body run once each per iteration and hold about half the time each:
    # which one leads depends on the machine's noise (a loaded one put the head at 51%).
    loop = {
        "In [51], line 3 in spin": "(`for j in range(n):`)",
        "In [51], line 4 in spin": "(`acc += j * j % 7`)",
    }
    lead = r.hotspots.lines[0].label
    assert lead in loop, lead
    assert f"Held by `{lead}` {loop[lead]}: " in title, title
    assert "`In [51], line 4 in spin` (`acc += j * j % 7`)" in title, title
    assert not HASHED.search(r.text())
    # The trace written with the report keeps the names for a later offline analysis.
    path = r.save(tmp_path / "t.json.gz")
    offline = analyze(load_trace(path))
    assert offline.diagnosis.finding("python_overhead").title == title


@pytest.mark.usefixtures("cpu_path")
def test_a_magic_cell_is_named_by_its_own_number(kernel_ip) -> None:
    """IPython 9 moves execution_count to the next number before a cell runs; the magic
    names its cell by the number the shell gave the cell, as the prompt shows it."""
    ip = kernel_ip
    # A `z` left in the shared shell by an earlier test (test_memsnap makes one) would be
    # live at the peak too, as "(allocated before recording)".
    ip.user_ns.pop("z", None)
    result = ip.run_cell("%%memsnap -o m --quiet\nz = torch.zeros(1000)\n", store_history=True)
    assert result.success
    labels = [s.site.label for s in ip.user_ns["m"].at_peak.sites]
    assert labels == [f"In [{result.execution_count}], line 1 [aten::zeros]"]
    result = ip.run_cell(
        "%%gpuprofile --quiet --timing-only --warmup 0 --repeat 1 --number 1"
        "\nraise KeyError('where')\n",
        store_history=True,
    )
    tb = result.error_in_exec.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert ip.compile.format_code_name(tb.tb_frame.f_code.co_filename) == (
        "Cell",
        f"In[{result.execution_count}]",
    )
