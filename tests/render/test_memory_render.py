"""The memory report's rendering: tabs in order, same digits in text and HTML, escaping,
the plot."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict
from gpuprof_nb.memory_report import analyze_memory
from gpuprof_nb.render.memory import memory_sections, plot_memory_timeline
from gpuprof_nb.render.units import fmt_bytes, fmt_pct

MIB = 2**20


@pytest.fixture(scope="module")
def leak_report(data_dir: Path):
    return analyze_memory(load_snapshot(data_dir / "snapshots" / "leak_steps.pickle"))


def test_sections_in_tab_order(leak_report) -> None:
    titles = [s.title for s in memory_sections(leak_report, with_plot=False)]
    assert titles == ["Findings", "Timeline", "At peak", "Leaks", "Segments"]


def test_numbers_agree_between_text_and_html(leak_report, data_dir: Path) -> None:
    bundle = leak_report._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    with open(data_dir / "snapshots" / "leak_steps.pickle", "rb") as f:
        data = pickle.load(f)
    # Independent: the segments' totals straight from the raw dict.
    reserved = sum(s["total_size"] for s in data["segments"])
    free = sum(b["size"] for s in data["segments"] for b in s["blocks"]
               if b["state"] == "inactive")
    shown = [fmt_bytes(reserved), fmt_bytes(free), fmt_bytes(leak_report.peak_bytes),
             fmt_bytes(3 * MIB)]
    shown += [fmt_pct(s.share) for s in leak_report.at_peak.sites]
    for value in shown:
        assert value in text, value
        assert value in html, value
    # Every table cell with a unit in the HTML also appears in the text.
    cells = set(re.findall(r'<td class="num">([^<]*)</td>', html))
    assert cells
    for cell in cells:
        assert cell in text, cell


def test_html_escapes_frame_names() -> None:
    frames = [{"filename": "<ipython-input-3-abc>", "line": 2, "name": "<module>"}]
    snap = snapshot_from_dict({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 2048, "frames": frames, "time_us": 10},
        {"action": "alloc", "addr": 8192, "size": 512, "frames": frames, "time_us": 20},
    ]]})
    html = analyze_memory(snap)._repr_mimebundle_()["text/html"]
    assert "&lt;ipython-input-3-abc&gt;:2 &lt;module&gt;" in html
    assert "<ipython-input" not in html and "<module>" not in html


def test_include_exclude(leak_report) -> None:
    only_text = leak_report._repr_mimebundle_(include=["text/plain"])
    assert set(only_text) == {"text/plain"}
    no_html = leak_report._repr_mimebundle_(exclude=["text/html"])
    assert "text/html" not in no_html and "text/plain" in no_html


def test_timeline_has_embedded_png(leak_report) -> None:
    html = leak_report._repr_mimebundle_()["text/html"]
    assert "data:image/png;base64," in html
    assert "<script" not in html and "http" not in html


def test_plot_returns_figure_and_uses_given_axes(leak_report) -> None:
    from matplotlib.figure import Figure

    fig = plot_memory_timeline(leak_report.timeline)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    labels = ax.get_legend_handles_labels()[1]
    assert "train.py:36 train_loop" in labels and "reserved" in labels
    other = Figure()
    ax2 = other.add_subplot(1, 1, 1)
    assert plot_memory_timeline(leak_report.timeline, ax=ax2) is other


def test_segments_only_plot(data_dir: Path) -> None:
    report = analyze_memory(load_snapshot(data_dir / "snapshots" / "segments_only.pickle"))
    fig = plot_memory_timeline(report.timeline)
    assert fig.axes[0].get_xlabel() == "history entry"
    assert "No history recorded" in report._repr_mimebundle_()["text/plain"]


def test_memory_modules_import_without_torch_ipython_ipywidgets() -> None:
    """io.snapshot, memory_report and render.memory stay importable with torch, IPython
    and ipywidgets blocked, and pull in no matplotlib until a plot is drawn."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    modules = ["gpuprof_nb.model.memory", "gpuprof_nb.io.snapshot",
               "gpuprof_nb.analysis.memory", "gpuprof_nb.memory_report",
               "gpuprof_nb.render.memory"]
    script = "\n".join([
        "import sys, importlib",
        "for name in ('torch', 'IPython', 'ipywidgets'):",
        "    sys.modules[name] = None",
        f"for name in {modules!r}:",
        "    importlib.import_module(name)",
        "assert 'matplotlib' not in sys.modules",
        "import gpuprof_nb",
        "r = gpuprof_nb.analyze_memory(gpuprof_nb.load_snapshot(sys.argv[1]))",
        "b = r._repr_mimebundle_()",
        "assert 'text/plain' in b and 'text/html' in b",
        "print('ok')",
    ])
    snap = root / "tests" / "data" / "snapshots" / "oom.pickle"
    result = subprocess.run([sys.executable, "-c", script, str(snap)], cwd=root,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
