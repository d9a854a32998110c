"""The Modules, Compile and MFU parts of a report: every number the HTML shows is in the
text too, repeated blocks fold in a <details> element, the icicle's hover titles carry the
numbers, and an empty breakdown says why."""

from __future__ import annotations

import html as html_lib
import re
from pathlib import Path

from gpuprof_nb import load_trace
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.render.compile import compile_section
from gpuprof_nb.render.modules import modules_section
from gpuprof_nb.render.profile import summary_section
from gpuprof_nb.results.modules import ModuleBreakdown

DATA = Path(__file__).parent.parent / "data"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
NUMBER = re.compile(r"\d[\d,.]*")


def visible_numbers(html: str) -> list[str]:
    """Numbers in table cells and in SVG hover titles (what a reader sees or hovers)."""
    found = re.findall(r"<td[^>]*>(.*?)</td>", html, re.S)
    found += re.findall(r"<title>(.*?)</title>", html, re.S)
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", c)) for c in found)
    return NUMBER.findall(text)


def test_modules_section_numbers_are_all_in_the_text() -> None:
    report = analyze(load_trace(BERT))
    section = modules_section(report.modules)  # type: ignore[arg-type]
    numbers = visible_numbers(section.html)
    assert numbers
    for n in numbers:
        assert n in section.text, n
    # Every hover title is a line of the text, word for word.
    for title in re.findall(r"<title>(.*?)</title>", section.html, re.S):
        words = html_lib.unescape(title)
        if not words.startswith("in no module"):
            assert words in section.text, words


def test_repeated_blocks_fold_in_details_and_unfold_in_text() -> None:
    report = analyze(load_trace(BERT))
    mb = report.modules
    section = modules_section(mb)  # type: ignore[arg-type]
    layers = next(g for g in mb.groups if g.pattern.endswith("BertLayer_{0..3}"))  # type: ignore[union-attr]
    assert section.html.count("<details>") == len(
        [g for g in mb.groups if g.pattern in section.text]  # type: ignore[union-attr]
    )
    summary = re.search(r"<summary>(.*?)</summary>", section.html, re.S)
    assert summary is not None
    assert f"{layers.pattern} x4" in section.text
    for member in layers.members:
        assert member in section.text  # unfolded in the text
    # The icicle counts its blocks, and there is one per module wide enough to see.
    blocks = int(re.search(r'data-blocks="(\d+)"', section.html).group(1))  # type: ignore[union-attr]
    assert 1 <= blocks <= len(mb.rows) + 1  # type: ignore[union-attr]


def test_an_empty_breakdown_says_why() -> None:
    mb = ModuleBreakdown(
        rows=(),
        groups=(),
        source="none",
        on_device=False,
        total_us=1.0,
        outside_us=1.0,
        notes=("the trace has no nn.Module ranges; profile it with %%gpuprofile",),
    )
    section = modules_section(mb)
    assert "no nn.Module ranges" in section.text and "no nn.Module ranges" in section.html


def test_mfu_rows_lead_the_gpu_summary_in_text_and_html() -> None:
    report = analyze(load_trace(DATA / "gpu" / "compute_bound.json.gz"))
    section = summary_section(report)
    rows = re.findall(r"<tr><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td></tr>", section.html)
    assert [html_lib.unescape(label) for label, _ in rows[:2]] == ["device", "MFU"]
    for _, value in rows:
        for n in NUMBER.findall(html_lib.unescape(value)):
            assert n in section.text, n


def test_compile_section_of_a_trace_recorded_elsewhere() -> None:
    report = analyze(load_trace(DATA / "a100_triton" / "triton_example.json.gz"))
    assert report.compile is not None and not report.compile.logged
    section = compile_section(report.compile, report.graph_replays)
    assert "call(s) of 1 compiled graph(s)" in section.text
    assert "recorded without gpuprof_nb" in section.text
