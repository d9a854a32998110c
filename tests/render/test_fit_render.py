"""Will it fit, rendered: where its tabs go, the stacked bar's geometry against the bytes,
every number of the HTML in the text too, and nothing new on reports that cannot tell
tensors apart."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprof_nb.analysis.report import analyze_batches, analyze_memory
from gpuprof_nb.io.snapshot import load_snapshot
from gpuprof_nb.render.fit import category_svg
from gpuprof_nb.render.memory import memory_sections
from gpuprof_nb.render.units import fmt_bytes

FIT = Path(__file__).parents[1] / "data" / "fit"


@pytest.fixture(scope="module")
def report():
    main = load_snapshot(FIT / "tiny_b8.pickle")
    other = load_snapshot(FIT / "tiny_b4.pickle")
    peak = analyze_memory(main).peak_bytes
    return analyze_batches(
        main,
        8,
        other,
        4,
        variable="batch_size",
        budget_bytes=int(peak * 0.9),
        budget_source="--budget",
    )


def test_tabs_follow_the_timeline(report, data_dir: Path) -> None:
    titles = [s.title for s in memory_sections(report, with_plot=False)]
    assert titles == [
        "Findings",
        "Timeline",
        "By category",
        "Will it fit",
        "At peak",
        "Leaks",
        "Segments",
    ]
    plain = analyze_memory(load_snapshot(data_dir / "snapshots" / "leak_steps.pickle"))
    assert plain.memory_by_category is None and plain.fit is None
    assert [s.title for s in memory_sections(plain, with_plot=False)] == [
        "Findings",
        "Timeline",
        "At peak",
        "Leaks",
        "Segments",
    ]


def test_bar_heights_are_the_bytes(report) -> None:
    cats = report.memory_by_category
    root = ET.fromstring(category_svg(cats))
    rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("data-category")]
    shown = {c.category: c.bytes for c in cats.categories if c.bytes}
    assert [r.get("data-category") for r in rects] == list(shown)
    heights = {r.get("data-category"): float(r.get("height")) for r in rects}
    per_byte = sum(heights.values()) / sum(shown.values())
    for name, value in shown.items():
        assert heights[name] == pytest.approx(value * per_byte, abs=0.02)
    # Stacked: each part starts where the one below it ends.
    ys = [(float(r.get("y")), float(r.get("height"))) for r in rects]
    for (y_lo, _), (y_up, h_up) in zip(ys, ys[1:], strict=False):
        assert y_up + h_up == pytest.approx(y_lo, abs=0.02)


def test_numbers_agree_between_text_and_html(report) -> None:
    bundle = report._repr_mimebundle_()
    text, html = bundle["text/plain"], bundle["text/html"]
    cells = set(re.findall(r'<td class="num"[^>]*>([^<]*)</td>', html))
    assert cells
    for cell in cells:
        assert cell.replace("&#x27;", "'") in text, cell
    # The bar's labels (beside the timeline and in its own tab) are in the text too.
    for label in re.findall(r"<text[^>]*>([a-z ]+ [\d.]+ [KMG]?i?B)<title>", html):
        assert label in text, label
    cats = report.memory_by_category
    for c in cats.categories:
        assert fmt_bytes(c.bytes) in text
    assert report.plan is not None and report.plan.fits
    assert "checkpointed(model.get_submodule(name))" in text
    assert "checkpointed(model.get_submodule(name))" in html
    for m in report.plan.modules:
        assert m.path in text
    assert f"predicted peak {fmt_bytes(report.plan.predicted_peak_bytes)}" in text
