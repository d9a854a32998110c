"""The Roofline section and plot: same digits in text and HTML, escaping, roofs and ridge
points labelled, dots above the roof flagged (the SVG drawing's geometry is checked in
test_svg_plots.py)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from plotcheck import embedded_plots

from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.trace import Kernel, Op, Trace
from gpuprof_nb.render.roofline import drawn_roofs, plot_roofline, roofline_section
from gpuprof_nb.render.units import fmt_pct, fmt_rate, fmt_us

F32, BF16 = "float", "c10::BFloat16"
SPEC = DeviceSpec(
    name="Synthetic <GPU>",
    kind="cuda",
    fp32_flops_per_s=1e12,
    bandwidth_bytes_per_s=1e11,
    bf16_flops_per_s=1e13,
    fp16_flops_per_s=1e13,
    source="test",
)


def _trace(entries):
    ops, kernels = [], []
    for i, (name, dims, types, kname, dur) in enumerate(entries):
        ops.append(
            Op(
                name=name,
                kind="op",
                start_us=10.0 * i,
                dur_us=5.0,
                pid=1,
                tid=1,
                external_id=i + 1,
                input_dims=tuple(dims),
                input_types=tuple(types),
                index=i,
            )
        )
        kernels.append(
            Kernel(
                name=kname,
                kind="kernel",
                start_us=100.0 + 100 * i,
                dur_us=dur,
                device=0,
                stream=7,
                external_id=i + 1,
                index=i,
            )
        )
    return Trace(
        source="t",
        ops=tuple(ops),
        kernels=tuple(kernels),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 1000.0),
    )


@pytest.fixture
def roofline():
    return compute_roofline(
        _trace(
            [
                ("aten::mm", [[1024, 1024], [1024, 1024]], [BF16, BF16], "gemm<bf16>", 500.0),
                # 12 kB in 0.06 us: 200 GB/s, above the 100 GB/s roof
                ("aten::add", [[1000], [1000], []], [F32, F32, "Scalar"], "add<float>", 0.06),
                ("aten::relu", [[4096]], [F32], "relu<float>", 2.0),
                ("aten::bmm", [[4, 64, 64], [4, 64, 64]], ["c10::Half"] * 2, "gemm<half>", 3.0),
            ]
        ),
        SPEC,
    )


def test_section_text_and_html_show_the_same_numbers(roofline):
    sec = roofline_section(roofline)
    assert sec.title == "Roofline"
    mm = next(p for p in roofline.points if p.name == "aten::mm")
    for shown in (
        fmt_us(mm.time_us),
        fmt_rate(mm.achieved_flops_per_s, "FLOP/s"),
        fmt_pct(mm.fraction_of_roof),
        fmt_rate(mm.flops, "FLOP"),
    ):
        assert shown in sec.text
        assert shown in sec.html
    # independent: 2*1024^3 FLOPs in 500 us = 4.29 TFLOP/s, 42.9% of the 10 TFLOP/s roof
    assert "4.29 TFLOP/s" in sec.text and "42.9%" in sec.text
    assert "above roof!" in sec.text and "above roof!" in sec.html
    assert len(embedded_plots(sec.html)) == 1 and "<svg" not in sec.text
    # per-kernel table: kernel names (with < >) escaped in HTML, verbatim in text
    assert "gemm<bf16>" in sec.text and "gemm&lt;bf16&gt;" in sec.html
    assert "gemm<bf16>" not in sec.html


def test_html_is_escaped_and_embeds_an_svg(roofline):
    sec = roofline_section(roofline)
    assert "Synthetic &lt;GPU&gt;" in sec.html
    assert "Synthetic <GPU>" not in sec.html
    m = re.search(r"<svg .*?</svg>", sec.html, re.S)
    assert m is not None
    root = ET.fromstring(m.group(0))  # well-formed XML, so every name is escaped
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text for t in root.iter(f"{ns}text")]
    assert "Roofline: Synthetic <GPU> (datasheet)" in titles
    assert len([c for c in root.iter(f"{ns}circle") if c.get("class") == "gp-point"]) == 4


def test_plot_draws_roofs_ridges_and_flags_above_roof(roofline):
    from matplotlib.figure import Figure

    fig = plot_roofline(roofline)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    texts = [t.get_text() for t in ax.texts]
    # bf16 and fp16 share a peak: one line, one label; plus the fp32 vector roof.
    assert any(t.startswith("bf16/fp16 tensor 10 TFLOP/s") for t in texts)
    assert any(t.startswith("fp32 vector 1 TFLOP/s") for t in texts)
    assert "ridge 100" in texts and "ridge 10" in texts
    assert any("memory 100 GB/s" in t for t in texts)
    assert any("above roof!" in t for t in texts)
    assert drawn_roofs(roofline) == [("fp32 vector", 1e12), ("bf16/fp16 tensor", 1e13)]
    # one dot per op group, one per ridge (the same description as the SVG)
    sizes = sorted(len(c.get_offsets()) for c in ax.collections)
    assert sizes == [2, len(roofline.points)] and len(roofline.points) == 4


def test_plot_into_given_axes_and_without_device():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    r = compute_roofline(_trace([("aten::relu", [[4096]], [F32], "relu", 2.0)]))
    assert r.device is None
    assert plot_roofline(r, ax=ax) is fig
    assert "no device ceilings" in ax.get_title()
    sec = roofline_section(r)
    assert "n/a" in sec.text  # no roof, bound or % of roof without ceilings
    assert r.note in sec.text


def test_empty_roofline_renders_and_mimebundle(roofline):
    r = compute_roofline(_trace([]))
    sec = roofline_section(r)
    assert "no op with a FLOP formula" in sec.text
    bundle = roofline._repr_mimebundle_()
    assert {"text/plain", "text/html"} <= set(bundle)
    assert "aten::mm" in bundle["text/plain"]
    assert set(roofline._repr_mimebundle_(include=["text/plain"])) == {"text/plain"}
