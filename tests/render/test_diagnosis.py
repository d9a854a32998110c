"""Diagnosis and Timeline sections: escaping, the same numbers in text and HTML, the drawing
(its geometry is checked in test_svg_plots.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from plotcheck import embedded_plots

from gpuprof_nb.analysis.diagnose import Diagnosis, Finding, diagnose
from gpuprof_nb.analysis.lanes import timeline_lanes
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.render.diagnosis import diagnosis_section
from gpuprof_nb.render.evidence import evidence_rows
from gpuprof_nb.render.timeline import plot_timeline, timeline_section
from gpuprof_nb.render.units import fmt_bytes, fmt_pct, fmt_us

DATA = Path(__file__).parent.parent / "data"
NCCL = DATA / "ddp_nccl_sampled" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def nccl():
    trace = load_trace(NCCL)
    return trace, device_timeline(trace)


def test_evidence_units_come_from_the_suffix():
    rows = dict(
        evidence_rows(
            {
                "idle_us": 1500.0,
                "idle_fraction": 0.25,
                "peak_bytes": 3 << 30,
                "calls_count": 7.0,
                "bw_bytes_per_s": 2.5e9,
                "first_over_median_ratio": 3.0,
                "ops_per_step": 12.0,
            }
        )
    )
    assert rows["idle"] == fmt_us(1500.0) == "1.5 ms"
    assert rows["idle (share)"] == fmt_pct(0.25) == "25.0%"
    assert rows["peak"] == fmt_bytes(3 << 30)
    assert rows["calls"] == "7"
    assert rows["bw"] == "2.5 GB/s"
    assert rows["first over median"] == "3x"
    assert rows["ops per step"] == "12"


def test_diagnosis_section_escapes_and_shows_every_number():
    f = Finding(
        "launch_overhead",
        "high",
        "Kernel void foo<float, 4> <script>x</script>",
        {"median_kernel_us": 4.25, "kernels_per_step": 1234.0},
        "model = torch.compile(model)  # a < b",
        0.4,
    )
    d = Diagnosis(
        findings=(f,),
        not_judged=("cold_start: no <timings>",),
        verdict="Main bottleneck: launch_overhead",
    )
    s = diagnosis_section(d)
    assert s.title == "Diagnosis"
    assert "<script>" not in s.html and "&lt;script&gt;" in s.html
    assert "no &lt;timings&gt;" in s.html
    assert "<pre>model = torch.compile(model)  # a &lt; b</pre>" in s.html
    assert 'class="sev-high"' in s.html
    for _, shown in evidence_rows(f.evidence):
        assert shown in s.text and shown in s.html
    assert "[high]" in s.text and "torch.compile(model)" in s.text


def test_empty_diagnosis_renders():
    s = diagnosis_section(Diagnosis(verdict="Nothing to judge"))
    assert "No findings." in s.text and "Nothing to judge" in s.html


def test_timeline_section_numbers_and_svg(nccl):
    trace, tl = nccl
    s = timeline_section(tl, trace, lanes=timeline_lanes(trace, tl, tl.representative_step))
    for c, us in tl.breakdown.us_by_category().items():
        assert fmt_us(us) in s.text and fmt_us(us) in s.html, c
        share = fmt_pct(tl.breakdown.fraction(c))
        assert share in s.text and share in s.html
    # The strip of every step, then the representative step, then the launch queue strip.
    strip, drawing, queue = embedded_plots(s.html)
    assert "launch queue length per stream" in queue
    assert ET.fromstring(strip).get("data-steps") == str(len(tl.steps))
    lanes = [
        g.get("data-lane") for g in ET.fromstring(drawing).iter() if g.get("class") == "gp-lane"
    ]
    streams = sorted({k.stream for k in trace.kernels})
    assert [lane for lane in lanes if lane.startswith("GPU")] == [
        f"GPU 0 stream {s}" for s in streams
    ]
    rep = tl.representative_step
    assert f"step {rep.number} (median duration)" in s.text


def test_plot_timeline_lanes_and_gaps(nccl):
    trace, tl = nccl
    fig = plot_timeline(tl, timeline_lanes(trace, tl))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    streams = sorted({k.stream for k in trace.kernels})
    assert [lab for lab in labels if lab.startswith("GPU")] == [
        f"GPU 0 stream {s}" for s in streams
    ]
    assert any(lab.startswith("CPU thread") for lab in labels)
    # One bar collection per lane, plus one shaded collection per idle cause present.
    causes = {g.cause for g in tl.gaps}
    assert len(ax.collections) == len(labels) + len(causes)
    from matplotlib.figure import Figure

    other = Figure()
    given = other.add_subplot(1, 1, 1)
    first = tl.steps[0].number
    assert plot_timeline(tl, timeline_lanes(trace, tl, first), step=first, ax=given) is other
    # Lanes of another span are refused, saying how to compute the right ones.
    with pytest.raises(GpuprofError, match="timeline_lanes"):
        plot_timeline(tl, timeline_lanes(trace, tl), step=first)


def test_plot_without_trace_or_steps():
    from gpuprof_nb.model.trace import Kernel, Trace

    k = (Kernel("k", "kernel", 0.0, 10.0, 0, 7), Kernel("k", "kernel", 50.0, 10.0, 0, 7))
    trace = Trace("hand", (), k, (), (), (), (), (), None, (0.0, 60.0))
    tl = device_timeline(trace)
    assert plot_timeline(tl, None).axes
    s = timeline_section(tl, None)
    assert "whole window" in s.text


def test_mimebundles(nccl):
    trace, tl = nccl
    d = diagnose(trace, timeline=tl)
    bundle = d._repr_mimebundle_()
    assert "text/plain" in bundle and "text/html" in bundle
    assert d.verdict in bundle["text/plain"]
    tb = tl._repr_mimebundle_()
    assert "text/plain" in tb and "<svg " in tb["text/html"]


def test_one_label_per_stretch_of_one_cause():
    from gpuprof_nb.model.trace import Op, Trace

    # A DataLoader call 0-1000 with a tiny op inside it, then 1000 us of torch ops.
    ops = (
        Op(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "annotation",
            0.0,
            1000.0,
            1,
            1,
        ),
        Op("aten::stack", "op", 500.0, 1.0, 1, 1),
        Op("aten::mm", "op", 1000.0, 1000.0, 1, 1),
    )
    trace = Trace("hand", ops, (), (), (), (), (), (), None, (0.0, 2000.0))
    tl = device_timeline(trace)
    assert [g.cause for g in tl.gaps] == ["dataloader", "dataloader"]
    ax = plot_timeline(tl, timeline_lanes(trace, tl)).axes[0]
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["dataloader"]


def test_quoted_lines_in_titles_show_as_code_and_stay_escaped():
    title = "Held by `In [3], line 2` (`if a < b: print(x)`): 40% of time between ops"
    f = Finding(kind="python_overhead", severity="high", title=title, evidence={}, fix="x")
    section = diagnosis_section(Diagnosis(findings=(f,), verdict=f"Main bottleneck: {title}"))
    assert title in section.text  # the text form keeps the backticks
    html = section.html
    assert "<code>In [3], line 2</code>" in html
    assert "<code>if a &lt; b: print(x)</code>" in html
    assert "`" not in html and "a < b" not in html
