"""The utilisation strip (SVG) and its text: well-formed, escaped, cells where the span puts
them, and every number a cell's hover text shows is in the text too."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from gpuprof_nb.model.utilisation import Utilisation, UtilisationSeries
from gpuprof_nb.render.svg import SVG_NS
from gpuprof_nb.render.utilisation import (
    MAX_CELLS,
    NVML_NOTE,
    utilisation_strip_svg,
    utilisation_text,
)

NS = {"s": SVG_NS}
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _u(
    n: int = 20,
    cores: int = 4,
    period_ms: float = 10.0,
    start_us: float = 5_000.0,
    label: str = "CPU",
    gpu: bool = True,
) -> Utilisation:
    ts = tuple(start_us + (i + 1) * period_ms * 1e3 for i in range(n))
    series = [
        UtilisationSeries(
            f"cpu{c}", "%", f"{label} {c}", tuple(float((i * 7 + c * 13) % 101) for i in range(n))
        )
        for c in range(cores)
    ]
    series.append(
        UtilisationSeries(
            "process", "cores", "this process", tuple(0.25 * (i % 5) for i in range(n))
        )
    )
    if gpu:
        series += [
            UtilisationSeries(
                "gpu_util",
                "%",
                "GPU 0 (Tesla <T4>) kernel running, % of time",
                tuple(float(min(100, i * 9)) for i in range(n)),
            ),
            UtilisationSeries(
                "gpu_mem_used",
                "bytes",
                "GPU 0 memory used",
                tuple(float(2**30 + i * 2**24) for i in range(n)),
            ),
            UtilisationSeries(
                "gpu_power", "W", "GPU 0 power", tuple(60.0 + 3.5 * i for i in range(n))
            ),
            UtilisationSeries(
                "gpu_sm_clock",
                "MHz",
                "GPU 0 SM clock",
                tuple(1590.0 if i % 2 else 1200.0 for i in range(n)),
            ),
        ]
    return Utilisation(
        "proc+nvml" if gpu else "proc",
        period_ms,
        ts,
        tuple(series),
        ("GPU 0 memory controller busy not recorded: <unsupported> & odd",),
    )


def _root(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def _titled_rects(root: ET.Element) -> list[tuple[ET.Element, str]]:
    out = []
    for g in root.iter(f"{{{SVG_NS}}}g"):
        for rect in g.findall("s:rect", NS):
            t = rect.find("s:title", NS)
            if t is not None:
                out.append((rect, t.text or ""))
    return out


def test_strip_is_well_formed_and_escaped() -> None:
    u = _u()
    svg = utilisation_strip_svg(u, u.interval_start_us(0), u.ts_us[-1], 800)
    root = _root(svg)
    assert root.get("width") == "800"
    assert "<T4>" not in svg and "&lt;T4&gt;" in svg
    texts = ["".join(t.itertext()) for t in root.iter(f"{{{SVG_NS}}}text")]
    assert any("Tesla <T4>" in t for t in texts)
    # NVML's caveat is the hover text of the GPU utilisation row's label.
    assert any(NVML_NOTE in t for t in texts)
    rows = [g.get("data-row") for g in root.iter(f"{{{SVG_NS}}}g") if g.get("data-row")]
    assert rows == [
        "cpu0",
        "cpu1",
        "cpu2",
        "cpu3",
        "process",
        "GPU util",
        "GPU mem used",
        "GPU power",
        "GPU SM clock",
    ]


def test_every_hover_number_is_in_the_text() -> None:
    u = _u(n=137)  # more intervals than cells: bins are means of several
    lo, hi = u.interval_start_us(0) + 12_345.0, u.ts_us[-1] - 20_000.0
    svg = utilisation_strip_svg(u, lo, hi, 900)
    text = "\n".join(utilisation_text(u, lo, hi))
    in_text = set(NUMBER.findall(text))
    root = _root(svg)
    tips = [t for _, t in _titled_rects(root)]
    assert tips
    for tip in tips:
        missing = [x for x in NUMBER.findall(tip) if x not in in_text]
        assert not missing, (tip, missing)
    # The labels' numbers too.
    for t in root.iter(f"{{{SVG_NS}}}text"):
        own = t.text or ""
        assert not [x for x in NUMBER.findall(own) if x not in in_text], own


def test_text_summary_lines() -> None:
    u = _u(gpu=False)
    lines = utilisation_text(u)
    assert lines[0].startswith("CPU utilisation (proc, 100 samples/s): cores mean ")
    assert "max core" in lines[0] and "this process" in lines[0] and "cores mean" in lines[0]
    assert not any(NVML_NOTE in line for line in lines)
    assert any(line.startswith("Note: GPU 0 memory controller") for line in lines)
    gpu_lines = utilisation_text(_u())
    assert any(
        line.startswith("GPU utilisation (NVML, 100 samples/s): GPU util mean ")
        for line in gpu_lines
    )
    assert NVML_NOTE in gpu_lines


def test_text_numbers_match_the_model() -> None:
    u = Utilisation(
        "proc",
        10.0,
        (10_000.0, 20_000.0),
        (
            UtilisationSeries("cpu0", "%", "CPU 0", (100.0, 0.0)),
            UtilisationSeries("cpu1", "%", "CPU 1", (50.0, 50.0)),
            UtilisationSeries("process", "cores", "this process", (1.0, 0.5)),
        ),
    )
    first = utilisation_text(u)[0]
    assert first == (
        "CPU utilisation (proc, 100 samples/s): cores mean 50.0%, max core "
        "50.0%; this process 0.75 cores mean, 1.00 max"
    )
    table = utilisation_text(u)[-2:]
    assert table[0].split() == ["0-10", "100.0%", "50.0%", "1.00"]
    assert table[1].split() == ["10-20", "0.0%", "50.0%", "0.50"]


def test_cells_sit_where_the_span_puts_them() -> None:
    u = _u(n=10, cores=1, gpu=False)
    # A span that starts inside interval 2 and ends inside interval 8.
    lo, hi = u.interval_start_us(2) + 4_000.0, u.interval_start_us(8) + 5_000.0
    width = 600
    root = _root(utilisation_strip_svg(u, lo, hi, width))
    assert root.get("data-x-us") == f"{lo!r} {hi!r}"

    def px(t: float) -> float:
        return (t - lo) / (hi - lo) * width

    cells = [(r, tip) for r, tip in _titled_rects(root) if tip.startswith("cpu0:")]
    xs = [(float(r.get("x", "nan")), float(r.get("width", "nan"))) for r, _ in cells]
    assert xs[0][0] == pytest.approx(0.0, abs=0.01)
    assert xs[-1][0] + xs[-1][1] == pytest.approx(width, abs=0.02)
    # The first whole interval starts at interval 3's start.
    assert xs[1][0] == pytest.approx(px(u.interval_start_us(3)), abs=0.01)
    for (x, w), (next_x, _) in zip(xs, xs[1:], strict=False):
        assert x + w == pytest.approx(next_x, abs=0.02)
    # The clipped first cell says so in its hover text: 0 ms to the end of interval 2.
    assert cells[0][1].endswith(f"(0-{(u.ts_us[2] - lo) / 1e3:g} ms)")


def test_many_intervals_are_binned_and_many_cores_are_averaged() -> None:
    u = _u(n=500, cores=40)
    root = _root(utilisation_strip_svg(u, u.interval_start_us(0), u.ts_us[-1], 900))
    rows = [g for g in root.iter(f"{{{SVG_NS}}}g") if g.get("data-row")]
    assert rows[0].get("data-row") == "cores mean"
    assert not any(g.get("data-row") == "cpu0" for g in rows)
    for g in rows:
        assert len(g.findall("s:rect", NS)) <= MAX_CELLS + 1  # cells and the row's outline
    text = utilisation_text(u)
    assert any(line.startswith("CPU: all 40 cores, mean % busy") for line in text)
    assert len(text) < 80


def test_span_outside_the_samples() -> None:
    u = _u(n=5)
    svg = utilisation_strip_svg(u, 1e9, 2e9, 300)
    _root(svg)
    assert "no utilisation samples in this span" in svg
    assert utilisation_text(u, 1e9, 2e9) == [
        "no utilisation samples in this span",
        "Note: GPU 0 memory controller busy not recorded: <unsupported> & odd",
    ]


def test_empty_recording() -> None:
    u = Utilisation("process_time", 10.0, (), (), ("no utilisation interval recorded",))
    _root(utilisation_strip_svg(u, 0.0, 1.0, 100))
    assert utilisation_text(u)[-1] == "Note: no utilisation interval recorded"


def test_model_helpers() -> None:
    # (The model has no test folder of its own yet; its helpers feed the strip.)
    u = Utilisation(
        "proc",
        0.01,
        (10.0, 20.0, 40.0),
        (
            UtilisationSeries("cpu1", "%", "CPU 1", (0.0, 100.0, 50.0)),
            UtilisationSeries("cpu0", "%", "CPU 0", (10.0, 10.0, 10.0)),
            UtilisationSeries("process", "cores", "this process", (1.0, 0.0, 2.0)),
        ),
    )
    assert [s.name for s in u.cpu_cores()] == ["cpu0", "cpu1"]
    assert u.series_named("gpu_util") is None
    # Intervals (0, 10], (10, 20], (20, 40]: the first is taken as one period long.
    assert u.mean_over("cpu1", 0.0, 40.0) == pytest.approx((0 + 1000 + 1000) / 40)
    assert u.mean_over("cpu1", 15.0, 25.0) == pytest.approx((5 * 100 + 5 * 50) / 10)
    assert u.mean_over("cpu1", 12.0, 12.0) == 100.0
    assert u.mean_over("cpu1", 50.0, 60.0) is None
    assert u.mean_over("cpu1", 20.0, 10.0) is None
    assert u.mean_over("nope", 0.0, 40.0) is None
    assert u.summary() == pytest.approx(
        {
            "cpu1_mean": 50.0,
            "cpu1_max": 100.0,
            "cpu0_mean": 10.0,
            "cpu0_max": 10.0,
            "process_mean": (10 + 0 + 40) / 40,
            "process_max": 2.0,
        }
    )
