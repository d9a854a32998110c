"""One description per chart (render/plot.py), drawn as SVG and by the matplotlib adapter
(render/plot_mpl.py): both show the same ticks, marks and labels; labels keep off each other,
the dots, the legend and the lines (measured on the SVG by the layout's own text boxes, and on
the matplotlib Figure by matplotlib's own text extents); every legend entry has a swatch."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprof_nb import analyze, load_trace
from gpuprof_nb.analysis.lanes import timeline_lanes
from gpuprof_nb.render import plot
from gpuprof_nb.render.plot_mpl import chart_figure
from gpuprof_nb.render.roofline import roofline_chart
from gpuprof_nb.render.timeline import timeline_chart

NS = "{http://www.w3.org/2000/svg}"
DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = sorted(
    p
    for p in DATA.glob("*/*.json*")
    if p.name.endswith((".json", ".json.gz")) and p.parent.name not in ("snapshots", "golden")
)


@pytest.fixture(scope="module")
def reports() -> dict[str, object]:
    out = {}
    for path in TRACES:
        report = analyze(load_trace(path))
        out[f"{path.parent.name}/{path.name}"] = report
    return out


def _boxes(root: ET.Element, cls: str) -> list[tuple[str, plot.Rect]]:
    out = []
    for t in root.iter(f"{NS}text"):
        if t.get("class") != cls:
            continue
        x, y, size = float(t.get("x")), float(t.get("y")), float(t.get("font-size"))
        anchor = t.get("text-anchor") or "start"
        out.append((t.text or "", plot.text_box(x, y, t.text or "", size, anchor)))  # type: ignore[arg-type]
    return out


def _dots(root: ET.Element) -> list[plot.Rect]:
    out = []
    for c in root.iter(f"{NS}circle"):
        if c.get("class") == "gp-point":
            x, y, r = (float(c.get(k)) for k in ("cx", "cy", "r"))
            out.append((x - r, y - r, x + r, y + r))
    return out


def _overlap(a: plot.Rect, b: plot.Rect) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_roofline_labels_never_overlap_each_other_or_a_dot(reports) -> None:
    """On every real trace: no two dot labels overlap, and no label (a name or a number)
    covers a dot; names that find no free spot become numbers with a key under the plot."""
    checked = 0
    for key, report in reports.items():
        if report.roofline is None or not report.roofline.points:
            continue
        chart = roofline_chart(report.roofline)
        if not chart.labels:
            continue
        root = ET.fromstring(plot.chart_svg(chart))
        labels = _boxes(root, "gp-label")
        assert len(labels) == len(chart.labels), key
        for (ta, a), (tb, b) in itertools.combinations(labels, 2):
            assert not _overlap(a, b), (key, ta, tb)
        numbered = {t for t, _ in labels if t.isdigit()}
        keys = [t for t, _ in _boxes(root, "gp-key")]
        assert len(keys) == len(numbered), key
        dots = _dots(root)
        for text, box in labels:
            if not text.isdigit():
                assert not any(_overlap(box, d) for d in dots), (key, text)
        checked += 1
    assert checked >= 10


def test_svg_and_matplotlib_draw_the_same_description(reports) -> None:
    """The roofline Figure holds the chart's ticks, its dots at their data positions and
    every label's text (or its number), as the SVG does."""
    report = reports["h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz"]
    chart = roofline_chart(report.roofline)
    fig = chart_figure(chart)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [t.label for t in chart.x.ticks]
    assert [t.get_text() for t in ax.get_yticklabels()] == [t.label for t in chart.y.ticks]
    (points,) = [m for m in chart.marks if isinstance(m, plot.Dots) and m.cls == "gp-point"]
    offsets = max(ax.collections, key=lambda c: len(c.get_offsets())).get_offsets()
    assert [float(v) for o in offsets for v in o] == pytest.approx(
        [float(v) for xy in zip(points.x, points.y, strict=True) for v in xy]
    )
    root = ET.fromstring(plot.chart_svg(chart))
    svg_labels = sorted(t for t, _ in _boxes(root, "gp-label"))
    texts = {t.get_text() for t in ax.texts}
    assert set(svg_labels) <= texts | {t for t in svg_labels if t.isdigit()}
    # The legend: the same entries, each with a swatch.
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [e.label for e in chart.legend]


def test_matplotlib_labels_do_not_overlap_as_matplotlib_measures_them(reports) -> None:
    """matplotlib measures its own text: the placed labels and numbers of the roofline do
    not overlap each other in the Figure."""
    from matplotlib.text import Text

    checked = 0
    for key, report in list(reports.items())[::3]:
        if report.roofline is None or not report.roofline.points:
            continue
        chart = roofline_chart(report.roofline)
        if len(chart.labels) < 2:
            continue
        fig = chart_figure(chart)
        fig.canvas.draw()  # annotations find their place when drawn
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        wanted = {lb.text for lb in chart.labels}
        # The text alone (an annotation's extent includes its leader line).
        boxes = [
            Text.get_window_extent(t, renderer)
            for t in ax.texts
            if t.get_text() in wanted or t.get_text().isdigit()
        ]
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), key
        checked += 1
    assert checked >= 3


def test_every_legend_entry_has_a_swatch_and_the_timeline_names_its_bars(reports) -> None:
    """The timeline's legend names every colour its bars and shades use, each entry with a
    swatch drawn beside it: on a CPU-only trace too, where the bars are torch ops."""
    for key in (
        "planted_cpu/dataloader.json.gz",
        "h100_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    ):
        report = reports[key]
        chart = timeline_chart(
            report.timeline, report.timeline_lanes, report.timeline.representative_step
        )
        colours = set()
        for m in chart.marks:
            if isinstance(m, plot.Rects):
                colours |= {m.fill} if isinstance(m.fill, str) else set(m.fill)
        assert colours <= {e.colour for e in chart.legend}, key
        root = ET.fromstring(plot.chart_svg(chart))
        (legend,) = [g for g in root.iter(f"{NS}g") if g.get("class") == "gp-legend"]
        entries = [g for g in legend if g.tag == f"{NS}g"]
        assert len(entries) == len(chart.legend)
        for g in entries:
            assert len(list(g)) == 2 and g[1].tag == f"{NS}text", key  # swatch, then its label
    cpu = timeline_chart(reports["planted_cpu/dataloader.json.gz"].timeline, None)
    assert "inside torch ops" in {
        e.label
        for e in timeline_chart(
            reports["planted_cpu/dataloader.json.gz"].timeline,
            timeline_lanes(
                reports["planted_cpu/dataloader.json.gz"].trace,
                reports["planted_cpu/dataloader.json.gz"].timeline,
            ),
        ).legend
    }
    assert cpu.legend


@pytest.mark.parametrize(
    "deltas",
    [
        (-3980.0, 10_000.0, 0.4),  # a large change each way and a tiny one
        (-83_000.0, 3550.0, -45.0, 1.2),
        (12.0, 0.3),  # slower only
        (-2.0,),
    ],
)
def test_changes_chart_labels_every_bar_inside_the_plot(deltas) -> None:
    """Each bar, however small, carries its value, written beside it inside the plot (clear
    of the names on the left and of the frame); zero has a tick and a line."""
    from gpuprof_nb.render.compare import changes_chart
    from gpuprof_nb.results.compare import ChangeRow

    rows = [
        ChangeRow("autograd::engine::evaluate_function: AddmmBackward0 " + str(i), "op", 5000.0,
                  5000.0 + d, 1, 1)
        for i, d in enumerate(deltas)
    ]  # fmt: skip
    chart = changes_chart(rows)
    assert any(t.label == "0" and t.value == 0 for t in chart.x.ticks)
    assert any(isinstance(m, plot.Rule) and m.value == 0 for m in chart.marks)
    root = ET.fromstring(plot.chart_svg(chart))
    left, top, right, bottom = (float(v) for v in root.get("data-plot-box").split())
    # The value labels: the texts inside the plot (tick labels sit under it).
    values = [
        t for t in root.iter(f"{NS}text")
        if t.text and top < float(t.get("y")) < bottom and t.text[0] in "+-"
    ]  # fmt: skip
    assert len(values) == len(deltas)
    for t in values:
        box = plot.text_box(
            float(t.get("x")), float(t.get("y")), t.text, 10, t.get("text-anchor") or "start"
        )
        assert left < box[0] and box[2] < right, (t.text, box, left, right)
    bars = list(next(g for g in root.iter(f"{NS}g") if g.get("class") == "gp-changes"))
    assert all(float(b.get("width")) >= 2.0 for b in bars)
