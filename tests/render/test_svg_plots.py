"""The report's SVG plots, read back as XML: every dot, ridge and bar sits where its numbers,
recomputed here from the hand-made trace, say it should; names with < > & and quotes come
back intact; the drawing stays small however many kernels a step has."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
from plotcheck import embedded_plots

from gpuprof_nb.analysis.lanes import timeline_lanes
from gpuprof_nb.analysis.roofline import compute_roofline
from gpuprof_nb.analysis.timeline import device_timeline
from gpuprof_nb.model.device import DeviceSpec
from gpuprof_nb.model.trace import Kernel, Op, Trace
from gpuprof_nb.render import svg
from gpuprof_nb.render.html import STYLE
from gpuprof_nb.render.roofline import ABOVE_ROOF_COLOUR, roofline_section, roofline_svg
from gpuprof_nb.render.sections import Section
from gpuprof_nb.render.timeline import (
    MAX_TIMELINE_BYTES,
    MAX_TIMELINE_MARKS,
    timeline_section,
    timeline_svg,
)

NS = "{http://www.w3.org/2000/svg}"
F32, BF16 = "float", "c10::BFloat16"
ODD = "Syn <GPU> & \"x\" 'y'"
SPEC = DeviceSpec(
    name=ODD,
    kind="cuda",
    fp32_flops_per_s=1e12,
    bandwidth_bytes_per_s=1e11,
    bf16_flops_per_s=1e13,
    fp16_flops_per_s=1e13,
    source="test",
)


def _parse(svg_text: str) -> ET.Element:
    assert svg_text.startswith("<svg ") and svg_text.endswith("</svg>")
    return ET.fromstring(svg_text)


def _floats(attr: str | None) -> list[float]:
    assert attr is not None
    return [float(v) for v in attr.split()]


def _title(el: ET.Element) -> str:
    t = el.find(f"{NS}title")
    assert t is not None and t.text is not None
    return t.text


class LogMap:
    """The log-axis mapping written out from the SVG's own limits and plot box."""

    def __init__(self, root: ET.Element) -> None:
        self.x_lo, self.x_hi = _floats(root.get("data-x-log"))
        self.y_lo, self.y_hi = _floats(root.get("data-y-log"))
        self.left, self.top, self.right, self.bottom = _floats(root.get("data-plot-box"))

    def x(self, v: float) -> float:
        f = (math.log10(v) - math.log10(self.x_lo)) / (
            math.log10(self.x_hi) - math.log10(self.x_lo)
        )
        return self.left + f * (self.right - self.left)

    def y(self, v: float) -> float:
        f = (math.log10(v) - math.log10(self.y_lo)) / (
            math.log10(self.y_hi) - math.log10(self.y_lo)
        )
        return self.bottom - f * (self.bottom - self.top)

    def x_inv(self, px: float) -> float:
        f = (px - self.left) / (self.right - self.left)
        return 10 ** (math.log10(self.x_lo) + f * (math.log10(self.x_hi) - math.log10(self.x_lo)))

    def y_inv(self, px: float) -> float:
        f = (self.bottom - px) / (self.bottom - self.top)
        return 10 ** (math.log10(self.y_lo) + f * (math.log10(self.y_hi) - math.log10(self.y_lo)))


# -- roofline ------------------------------------------------------------------------------------

# (op, input dims, dtypes, kernel, kernel us, FLOPs, bytes) with FLOPs and bytes by hand:
# mm: 2*M*N*K; bytes = A + B + C elements times the element size (2 for bf16, 4 for float).
HAND = [
    (
        "aten::mm",
        [[1024, 1024], [1024, 1024]],
        [BF16, BF16],
        "gemm<bf16>",
        500.0,
        2 * 1024**3,
        3 * 1024 * 1024 * 2,
    ),
    (
        "aten::add",
        [[1000], [1000], []],
        [F32, F32, "Scalar"],
        "add<float>",
        0.06,
        1000,
        3 * 1000 * 4,
    ),
    ("aten::relu", [[4096]], [F32], "relu<float>", 2.0, 4096, 2 * 4096 * 4),
    (
        "aten::bmm",
        [[4, 64, 64], [4, 64, 64]],
        ["c10::Half"] * 2,
        "gemm<half>",
        3.0,
        2 * 4 * 64**3,
        3 * 4 * 64 * 64 * 2,
    ),
]


def _trace(entries):
    ops, kernels = [], []
    for i, (name, dims, types, kname, dur, *_rest) in enumerate(entries):
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


@pytest.fixture(scope="module")
def roof_svg():
    roofline = compute_roofline(_trace(HAND), SPEC)
    # The analysis agrees with the hand counts (else the positions below test nothing).
    by_name = {p.name: p for p in roofline.points}
    for name, *_, flops, nbytes in HAND:
        assert (by_name[name].flops, by_name[name].bytes_moved) == (flops, nbytes), name
    return _parse(roofline_svg(roofline))


def test_each_dot_sits_at_its_intensity_and_achieved_rate(roof_svg):
    m = LogMap(roof_svg)
    dots = {
        _title(c).split(" [")[0]: c
        for c in roof_svg.iter(f"{NS}circle")
        if c.get("class") == "gp-point"
    }
    assert set(dots) == {h[0] for h in HAND}
    for name, _, _, _, us, flops, nbytes in HAND:
        c = dots[name]
        assert float(c.get("cx")) == pytest.approx(m.x(flops / nbytes), abs=0.01), name
        assert float(c.get("cy")) == pytest.approx(m.y(flops / (us * 1e-6)), abs=0.01), name
    # Area grows with time: the 500 us matmul is the biggest dot.
    assert max(dots.values(), key=lambda c: float(c.get("r"))) is dots["aten::mm"]
    # 12 kB in 0.06 us is 200 GB/s, over the 100 GB/s roof: ringed in red, labelled.
    assert dots["aten::add"].get("stroke") == ABOVE_ROOF_COLOUR
    assert "above roof!" in _title(dots["aten::add"])
    assert any("(above roof!)" in (t.text or "") for t in roof_svg.iter(f"{NS}text"))


def test_ridges_sit_at_peak_over_bandwidth_and_the_slope_is_the_bandwidth(roof_svg):
    m = LogMap(roof_svg)
    ridges = [c for c in roof_svg.iter(f"{NS}circle") if c.get("class") == "gp-ridge"]
    # fp32 1 TFLOP/s and bf16/fp16 10 TFLOP/s over 100 GB/s: knees at 10 and 100 FLOP/byte.
    got = sorted((float(c.get("cx")), float(c.get("cy"))) for c in ridges)
    want = sorted((m.x(peak / 1e11), m.y(peak)) for peak in (1e12, 1e13))
    assert got == [pytest.approx(w, abs=0.01) for w in want]
    slope = next(
        p
        for p in roof_svg.iter(f"{NS}path")
        if "bandwidth roof" in (p.findtext(f"{NS}title") or "")
    )
    nums = [float(v) for v in re.findall(r"-?[\d.]+", slope.get("d"))]
    for px, py in (nums[0:2], nums[2:4]):
        # Each end of the drawn slope is a point where FLOP/s = intensity x bandwidth.
        assert m.y_inv(py) == pytest.approx(m.x_inv(px) * 1e11, rel=1e-3)
    # It ends at the highest knee.
    assert (nums[2], nums[3]) == pytest.approx((m.x(100.0), m.y(1e13)), abs=0.01)


def test_decade_ticks_are_labelled_where_the_mapping_puts_them(roof_svg):
    m = LogMap(roof_svg)
    checked = 0
    for t in roof_svg.iter(f"{NS}text"):
        y = float(t.get("y"))
        if (
            abs(y - (m.bottom + 14)) < 0.01
            and t.text
            and t.text.replace(",", "").replace(".", "").isdigit()
        ):
            assert float(t.get("x")) == pytest.approx(m.x(float(t.text.replace(",", ""))), abs=0.01)
            checked += 1
    assert checked >= 2


def test_roofline_svg_escapes_names_and_has_titles(roof_svg):
    texts = [t.text for t in roof_svg.iter(f"{NS}text")]
    assert f"Roofline: {ODD} (datasheet)" in texts
    assert ODD in roof_svg.get("aria-label")
    marks = [
        e
        for e in roof_svg.iter()
        if e.tag in (f"{NS}circle", f"{NS}path")
        and (e.get("class") in ("gp-point", "gp-ridge") or e.find(f"{NS}title") is not None)
    ]
    assert all(e.find(f"{NS}title") is not None for e in marks)
    # In the section's HTML, the SVG is the only drawing and it is wrapped for CSS to show.
    roofline = compute_roofline(_trace(HAND), SPEC)
    html = roofline_section(roofline).html
    assert len(embedded_plots(html)) == 1
    assert "Syn &lt;GPU&gt; &amp; &quot;x&quot; &#x27;y&#x27;" in html
    assert ODD not in html


def test_no_svg_without_plottable_points():
    assert roofline_svg(compute_roofline(_trace([]), SPEC)) == ""
    assert "<svg" not in roofline_section(compute_roofline(_trace([]), SPEC)).html


# -- timeline ------------------------------------------------------------------------------------

KNAME = "void k<float, \"q\"> & 'r'"


def _kernel_trace(spans, stream=7):
    kernels = tuple(
        Kernel(
            name=f"{KNAME} #{i}",
            kind="kernel",
            start_us=s,
            dur_us=d,
            device=0,
            stream=stream,
            index=i,
        )
        for i, (s, d) in enumerate(spans)
    )
    ends = [s + d for s, d in spans]
    return Trace(
        source="hand",
        ops=(),
        kernels=kernels,
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, max(ends)),
    )


def _svg(trace: Trace) -> str:
    """The drawing of a trace's whole window, with its lanes."""
    tl = device_timeline(trace)
    return timeline_svg(tl, timeline_lanes(trace, tl))


def _section(trace: Trace) -> Section:
    """The Timeline section of a trace, its representative step drawn with its lanes."""
    tl = device_timeline(trace)
    return timeline_section(tl, trace, lanes=timeline_lanes(trace, tl, tl.representative_step))


def _lane_rects(root: ET.Element, lane: str) -> list[ET.Element]:
    (group,) = [g for g in root.iter(f"{NS}g") if g.get("data-lane") == lane]
    return list(group.iter(f"{NS}rect"))


def test_bars_sit_at_kernel_start_and_duration():
    spans = [(100.0, 50.0), (300.0, 120.0), (700.0, 10.0), (900.0, 100.0)]
    trace = _kernel_trace(spans)
    root = _parse(_svg(trace))
    left, _, right, _ = _floats(root.get("data-plot-box"))
    # Independent: the drawing spans the kernels' first start to last end.
    lo, hi = min(s for s, _ in spans), max(s + d for s, d in spans)
    assert _floats(root.get("data-x-us")) == [lo, hi]
    rects = _lane_rects(root, "GPU 0 stream 7")
    assert len(rects) == len(spans)
    px_per_us = (right - left) / (hi - lo)
    for rect, (s, d), i in zip(rects, spans, range(len(spans)), strict=True):
        assert float(rect.get("x")) == pytest.approx(left + (s - lo) * px_per_us, abs=0.006)
        assert float(rect.get("width")) == pytest.approx(d * px_per_us, abs=0.006)
        # The hover title names the kernel (escaped in the markup, intact once parsed).
        assert _title(rect).startswith(f"{KNAME} #{i}\n")
    # Idle gaps between the kernels are shaded where they are.
    gaps = [
        r
        for g in root.iter(f"{NS}g")
        if g.get("fill-opacity") == "0.28"
        for r in g.iter(f"{NS}rect")
    ]
    starts = sorted(float(r.get("x")) for r in gaps)
    want = sorted(left + (s + d - lo) * px_per_us for s, d in spans[:-1])
    assert starts == [pytest.approx(w, abs=0.006) for w in want]


def test_names_with_markup_are_escaped_in_the_section():
    trace = _kernel_trace([(0.0, 10.0), (50.0, 10.0)])
    html = _section(trace).html
    assert "void k&lt;float, &quot;q&quot;&gt; &amp; &#x27;r&#x27;" in html
    assert KNAME not in html and "<float" not in html


def test_many_kernels_merge_into_a_bounded_drawing():
    # 20,000 kernels of 1 us, 1 us apart: far more than pixels.
    spans = [(2.0 * i, 1.0) for i in range(20_000)]
    trace = _kernel_trace(spans)
    text = _svg(trace)
    root = _parse(text)
    rects = [r for r in root.iter(f"{NS}rect") if r.find(f"{NS}title") is not None]
    assert len(rects) <= MAX_TIMELINE_MARKS
    assert len(text) < 150_000
    # Every kernel is in exactly one bar: the titles' counts add up.
    bars = _lane_rects(root, "GPU 0 stream 7")
    counted = 0
    for r in bars:
        first = _title(r).split("\n")[0]
        m = re.match(r"([\d,]+) kernels, ", first)
        counted += int(m.group(1).replace(",", "")) if m else 1
    assert counted == len(spans)
    # The bars still cover the whole span, left to right.
    left, _, right, _ = _floats(root.get("data-plot-box"))
    assert float(bars[0].get("x")) == pytest.approx(left, abs=0.01)
    last = bars[-1]
    assert float(last.get("x")) + float(last.get("width")) == pytest.approx(right, abs=0.01)


def test_cpu_lanes_come_from_top_level_ops():
    ops = (
        Op("aten::linear", "op", 0.0, 100.0, 1, 5, index=0),
        Op("aten::addmm", "op", 10.0, 80.0, 1, 5, index=1),  # nested: not its own bar
        Op("aten::relu <x>", "op", 200.0, 50.0, 1, 5, index=2),
    )
    trace = Trace("hand", ops, (), (), (), (), (), (), None, (0.0, 250.0))
    root = _parse(_svg(trace))
    rects = _lane_rects(root, "CPU thread 5")
    assert [_title(r).split("\n")[0] for r in rects] == ["aten::linear", "aten::relu <x>"]


# -- primitives ----------------------------------------------------------------------------------


def test_scales_ticks_and_clipping():
    s = svg.LogScale(0.1, 1000.0, 0.0, 400.0)
    assert [s(v) for v in (0.1, 1, 10, 100, 1000)] == pytest.approx([0, 100, 200, 300, 400])
    assert svg.log_ticks(0.1, 1000.0) == pytest.approx([0.1, 1, 10, 100, 1000])
    assert svg.log_ticks(20.0, 300.0) == pytest.approx([20, 50, 100, 200])
    assert [svg.log_label(v) for v in (0.01, 1, 1000, 1e-5, 2e6)] == [
        "0.01",
        "1",
        "1,000",
        "10\u207b\u2075",
        "2\u00d710\u2076",
    ]
    assert svg.nice_ticks(0.0, 4.37, target=10) == pytest.approx(
        [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]
    )
    assert svg.nice_ticks(0.0, 4.37) == pytest.approx([0, 1, 2, 3, 4])
    assert [svg.tick_label(v) for v in (0.3, 3.0, 1200.0)] == ["0.3", "3", "1,200"]
    # A segment through a 10x10 box: only the inside part is kept.
    assert svg.clip_segment(-5, 5, 15, 5, (0, 0, 10, 10)) == pytest.approx((0, 5, 10, 5))
    assert svg.clip_segment(-5, -5, -1, -1, (0, 0, 10, 10)) is None


def test_plot_is_inline_svg_for_the_styled_view_and_an_image_elsewhere():
    drawing = (
        svg.svg_open(120, 40, "tiny <plot>")
        + f'<rect width="5" height="5" style="stroke:{svg.BACKGROUND}">'
        + svg.title("a & b")
        + "</rect>"
        + svg.text(2, 20, "label")
        + "</svg>"
    )
    html = svg.plot_html(drawing)
    (inline,) = embedded_plots(html)
    assert inline == drawing
    # Hidden three ways until the report's style shows it (sanitizers keep one or more).
    assert html.startswith('<details class="gp-plot" hidden="hidden" style="display:none">')
    assert ".gpuprof .gp-plot { display: block !important;" in STYLE
    assert ".gpuprof img.gp-plot-img { display: none; }" in STYLE
    assert 'alt="tiny &lt;plot&gt;" width="120" height="40"' in html
    # The image stands alone: no theme variables, no currentColor, no hover titles, a font
    # named and a white card under the drawing.
    image = svg.image_svg(drawing)
    root = ET.fromstring(image)
    assert "var(" not in image and "currentColor" not in image and "<title>" not in image
    assert root.get("font-family") == svg.IMAGE_FONT and root.get("fill") == svg.IMAGE_INK
    assert root[0].tag == f"{NS}rect" and root[0].get("fill") == "#ffffff"
    assert [t.text for t in root.iter(f"{NS}text")] == ["label"]
    assert svg.plot_html("") == ""


def test_lanes_of_a_step_match_the_whole_trace_computation(data_dir):
    """The drawing looks for top-level ops among the ops near the step only; per step of a
    real trace, its lanes hold exactly the ops and kernels found from the whole trace."""
    from gpuprof_nb.analysis.timeline import top_level_ops
    from gpuprof_nb.io.trace import load_trace

    trace = load_trace(data_dir / "ddp_nccl_sampled" / "sampled_rank-0.json.gz")
    tl = device_timeline(trace)
    assert len(tl.steps) >= 2
    for step in tl.steps:
        lo, hi = step.start_us, step.end_us
        lanes = {
            lane.label: sorted((s, e, n) for s, e, _, n in lane.bars)
            for lane in timeline_lanes(trace, tl, step).lanes
        }
        cpu = {}
        for o in top_level_ops(trace):
            if o.end_us > lo and o.start_us < hi:
                cpu.setdefault(f"CPU thread {o.tid}", []).append((o.start_us, o.end_us, o.name))
        gpu = {}
        for k in trace.kernels:
            if k.device == tl.device and k.end_us > lo and k.start_us < hi:
                gpu.setdefault(f"GPU {tl.device} stream {k.stream}", []).append(
                    (k.start_us, k.end_us, k.name)
                )
        want = {**cpu, **gpu}
        assert lanes and all(sorted(want[name]) == items for name, items in lanes.items())
        assert {n for n in want if n.startswith("GPU")} == {n for n in lanes if n.startswith("GPU")}


def test_long_kernel_names_keep_the_drawing_small():
    # 340 kernels 2.2 px apart with 270-character names: few enough rectangles, too many
    # bytes, so names in titles are cut and merging goes on until the bytes fit.
    long_name = "void cutlass::Kernel<" + "x" * 250 + ">"
    kernels = tuple(
        Kernel(
            name=f"{long_name}{i}",
            kind="kernel",
            start_us=100.0 * i,
            dur_us=1.0,
            device=0,
            stream=7,
            index=i,
        )
        for i in range(340)
    )
    trace = Trace(
        source="hand",
        ops=(),
        kernels=kernels,
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 34_000.0),
    )
    text = _svg(trace)
    assert len(text.encode()) < MAX_TIMELINE_BYTES + 10_000
    bars = _lane_rects(_parse(text), "GPU 0 stream 7")
    assert all(len(_title(b).split("\n")[-1]) < 200 for b in bars)


# -- the strip of every step ---------------------------------------------------------------------


def test_every_step_is_in_the_strip_where_it_ran_with_its_numbers(data_dir):
    """Each profiled step is one hover rectangle spanning its start to its end; its tip's
    numbers (duration and shares, as the per-step table writes them) are in the section's
    text; the representative (median) step is outlined."""
    from gpuprof_nb.io.trace import load_trace
    from gpuprof_nb.render.timeline import steps_chart
    from gpuprof_nb.render.units import fmt_pct, fmt_us

    trace = load_trace(data_dir / "ddp_nccl_sampled" / "sampled_rank-0.json.gz")
    tl = device_timeline(trace)
    assert len(tl.steps) >= 2
    section = timeline_section(tl, trace, lanes=timeline_lanes(trace, tl, tl.representative_step))
    strip_svg = embedded_plots(section.html)[0]
    assert strip_svg == plot_module().chart_svg(steps_chart(tl, _left(strip_svg)))
    root = _parse(strip_svg)
    left, _, right, _ = _floats(root.get("data-plot-box"))
    lo, hi = _floats(root.get("data-x-us"))
    # Independent: the strip spans the first step's start to the last step's end.
    assert (lo, hi) == (tl.steps[0].start_us, max(s.end_us for s in tl.steps))
    px = (right - left) / (hi - lo)
    (group,) = [g for g in root.iter(f"{NS}g") if g.get("class") == "gp-steps"]
    rects = list(group.iter(f"{NS}rect"))
    assert len(rects) == len(tl.steps)
    for rect, step in zip(rects, tl.steps, strict=True):
        assert float(rect.get("x")) == pytest.approx(left + (step.start_us - lo) * px, abs=0.01)
        assert float(rect.get("width")) == pytest.approx(max(step.dur_us * px, 0.6), abs=0.01)
        tip = _title(rect)
        assert tip.startswith(f"step {step.number}: {fmt_us(step.dur_us)}")
        for c in step.breakdown.us_by_category():
            share = fmt_pct(step.breakdown.fraction(c))
            assert share in tip and share in section.text
        assert fmt_us(step.dur_us) in section.text
    rep = tl.representative_step
    (outline,) = [g for g in root.iter(f"{NS}g") if g.get("class") == "gp-median-step"]
    (box,) = list(outline.iter(f"{NS}rect"))
    assert float(box.get("x")) == pytest.approx(left + (rep.start_us - lo) * px, abs=0.01)
    assert f"step {rep.number}, the median" in strip_svg


def plot_module():
    from gpuprof_nb.render import plot

    return plot


def _left(svg_text: str) -> int:
    return int(float(_parse(svg_text).get("data-plot-box").split()[0]))
