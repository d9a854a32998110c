"""The memory report's rendering: tabs in order, same digits in text and HTML, escaping,
the plot."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
from plotcheck import embedded_plots

from gpuprof_nb.analysis.report import analyze_memory
from gpuprof_nb.io.snapshot import load_snapshot, snapshot_from_dict
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
    free = sum(b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] == "inactive")
    shown = [
        fmt_bytes(reserved),
        fmt_bytes(free),
        fmt_bytes(leak_report.peak_bytes),
        fmt_bytes(3 * MIB),
    ]
    shown += [fmt_pct(s.share) for s in leak_report.at_peak.sites]
    for value in shown:
        assert value in text, value
        assert value in html, value
    # Every table cell with a unit in the HTML also appears in the text.
    cells = set(re.findall(r'<td class="num"[^>]*>([^<]*)</td>', html))
    assert cells
    for cell in cells:
        assert cell in text, cell


def test_html_escapes_frame_names() -> None:
    frames = [{"filename": "<frozen run<T>>", "line": 2, "name": "<module>"}]
    snap = snapshot_from_dict(
        {
            "segments": [],
            "device_traces": [
                [
                    {
                        "action": "alloc",
                        "addr": 4096,
                        "size": 2048,
                        "frames": frames,
                        "time_us": 10,
                    },
                    {"action": "alloc", "addr": 8192, "size": 512, "frames": frames, "time_us": 20},
                ]
            ],
        }
    )
    html = analyze_memory(snap)._repr_mimebundle_()["text/html"]
    assert "&lt;frozen run&lt;T&gt;&gt;:2 &lt;module&gt;" in html
    assert "<frozen" not in html and "<module>" not in html


def test_include_exclude(leak_report) -> None:
    only_text = leak_report._repr_mimebundle_(include=["text/plain"])
    assert set(only_text) == {"text/plain"}
    no_html = leak_report._repr_mimebundle_(exclude=["text/html"])
    assert "text/html" not in no_html and "text/plain" in no_html


def test_timeline_has_an_inline_svg(leak_report) -> None:
    html = leak_report._repr_mimebundle_()["text/html"]
    assert len(embedded_plots(html)) == 1
    assert "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


NS = "{http://www.w3.org/2000/svg}"
FA = [{"filename": "train.py", "line": 2, "name": "make_a<T>"}]
FB = [{"filename": "train.py", "line": 9, "name": "make \"b\" & 'c'"}]
# (action, address, size, frames, time us): A 2048 B, then B 1024 B, A freed, B 512 B more.
EVENTS = [
    ("alloc", 4096, 2048, FA, 10),
    ("alloc", 8192, 1024, FB, 20),
    ("free_requested", 4096, 2048, FA, 30),
    ("free_completed", 4096, 2048, FA, 30),
    ("alloc", 9216, 512, FB, 40),
]


def _steps(d: str) -> list[tuple[float, float]]:
    """Return (x, value) for each level of an M/H/V step path: the value holds from x on."""
    x = y = 0.0
    out = []
    for cmd, val in re.findall(r"([MHVZ])([^MHVZ]*)", d):
        if cmd == "M":
            x, y = (float(v) for v in val.split())
        elif cmd == "H":
            x = float(val)
        elif cmd == "V":
            y = float(val)
            out.append((x, y))
    return out


def test_memory_svg_stacks_sites_where_the_bytes_say() -> None:
    import xml.etree.ElementTree as ET

    from gpuprof_nb.render.memory import memory_svg

    snap = snapshot_from_dict(
        {
            "segments": [],
            "device_traces": [
                [
                    {"action": a, "addr": addr, "size": size, "frames": fr, "time_us": t}
                    for a, addr, size, fr, t in EVENTS
                ]
            ],
        }
    )
    report = analyze_memory(snap)
    root = ET.fromstring(memory_svg(report.timeline))
    x_lo, x_hi = (float(v) for v in root.get("data-x").split())
    y_lo, y_hi = (float(v) for v in root.get("data-y").split())
    left, top, right, bottom = (float(v) for v in root.get("data-plot-box").split())
    # Independent: per entry, each site's live bytes replayed by hand (free at completion).
    live = {"a": 0, "b": 0}
    rows = []
    for a, _, size, fr, t in EVENTS:
        site = "a" if fr is FA else "b"
        live[site] += size if a == "alloc" else -size if a == "free_completed" else 0
        rows.append(((t - 10) / 1000.0, live["a"], live["b"]))
    # The axis runs past the last entry to the timeline's end: its level has a width.
    assert x_lo == 0.0 and x_hi == report.timeline.end_x > rows[-1][0]
    assert report.peak_bytes == max(a + b for _, a, b in rows) == 3072

    def to_data(px: float, py: float) -> tuple[float, float]:
        return (
            x_lo + (px - left) / (right - left) * (x_hi - x_lo),
            y_lo + (bottom - py) / (bottom - top) * (y_hi - y_lo),
        )

    paths = {
        p.findtext(f"{NS}title").split("\n")[0]: p
        for p in root.iter(f"{NS}path")
        if p.get("class") == "gp-site"
    }
    assert set(paths) == {"train.py:2 make_a<T>", "train.py:9 make \"b\" & 'c'"}
    # Sites are stacked in the report's order: the first at the bottom.
    first, second = (lab for lab in report.timeline.site_labels if lab in paths)
    for label, height in (
        (first, lambda a, b: a if first.startswith("train.py:2") else b),
        (second, lambda a, b: a + b),
    ):
        # The levels drawn, in data units, without the last one (back down to the axis).
        levels = [to_data(px, py) for px, py in _steps(paths[label].get("d"))][:-1]

        # Path coordinates are written to 0.1 px: a level may start up to 0.05 px late.
        slack = 0.06 / (right - left) * (x_hi - x_lo)

        def drawn(t: float, levels=levels, slack=slack) -> float:
            return [v for x, v in levels if x <= t + slack][-1]

        for t in sorted({r[0] for r in rows}):
            # Entries at one instant share a pixel: the drawing shows one of their values.
            want = [height(a, b) for rt, a, b in rows if rt == t]
            assert any(drawn(t) == pytest.approx(w, abs=2e-3 * y_hi) for w in want), (
                label,
                t,
                drawn(t),
                want,
            )
    total = [to_data(px, py) for px, py in _steps(paths[second].get("d"))][:-1]
    assert max(v for _, v in total) == pytest.approx(3072, abs=2e-3 * y_hi)
    # The peak marker sits at the peak.
    peak = next(p for p in root.iter(f"{NS}path") if p.get("class") == "gp-peak")
    m = re.match(r"M([\d.]+) ([\d.]+)h10l-5 9z", peak.get("d"))
    tip = to_data(float(m.group(1)) + 5, float(m.group(2)) + 9)
    assert tip[0] == pytest.approx(0.01, abs=1e-3 * x_hi)
    assert tip[1] == pytest.approx(3072, abs=2e-3 * y_hi)


def test_plot_returns_figure_and_uses_given_axes(leak_report) -> None:
    from matplotlib.figure import Figure

    fig = plot_memory_timeline(leak_report.timeline)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
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
    """io.snapshot, analysis.memory and render.memory stay importable with torch, IPython
    and ipywidgets blocked, and pull in no matplotlib until a plot is drawn."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    modules = [
        "gpuprof_nb.model.memory",
        "gpuprof_nb.io.snapshot",
        "gpuprof_nb.analysis.memory",
        "gpuprof_nb.render.memory",
    ]
    script = "\n".join(
        [
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
            "assert 'matplotlib' not in sys.modules, 'displaying the report drew with matplotlib'",
            "print('ok')",
        ]
    )
    snap = root / "tests" / "data" / "snapshots" / "oom.pickle"
    result = subprocess.run(
        [sys.executable, "-c", script, str(snap)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
