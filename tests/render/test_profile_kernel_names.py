"""Long C++ kernel names in the HTML tables (Kernels tab, Roofline per-kernel table): a short
form in the cell, the full name in the cell's title and under a <details>, everything escaped,
the table still a table; text/plain keeps the full names."""

from __future__ import annotations

import gzip
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import kernel_table
from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.render.html import SHORT_NAME_WIDTH, html_table, short_kernel_name
from gpuprof_nb.render.profile import kernels_section, profile_sections

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = [
    "h100_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    "h100_vit_inference/Falconsai_nsfw_image_detection__1016002.json.gz",
    "mi300_bert_small/gaunernst_bert-small-uncased__1016001.json.gz",
    "a100_alexnet_sync/benchmark_result_2869224_1695835535_trace.json.gz",
    "kineto2021_v100/gpu_metrics_input.json",
]
BERT = DATA / REAL[0]


def _kernel_names(path: Path) -> set[str]:
    """Kernel names read straight from the JSON (not through the loader)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    return {
        e["name"]
        for e in events
        if isinstance(e, dict) and str(e.get("cat", "")).lower() == "kernel"
    }


def _base_name(name: str) -> str:
    """The function's own name: before its first '<' or '(', after its last '::'."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    head = re.split(r"[<(]", name, maxsplit=1)[0]
    return head.rsplit("::", 1)[-1]


@pytest.mark.parametrize("rel", REAL, ids=lambda r: r.split("/")[0])
def test_short_form_of_real_kernel_names(rel: str) -> None:
    names = _kernel_names(DATA / rel)
    assert names
    longs = 0
    for name in names:
        short = short_kernel_name(name)
        bare = name.removeprefix("void ")
        assert len(short) <= SHORT_NAME_WIDTH, short
        assert not short.startswith("void ")
        if len(bare) <= SHORT_NAME_WIDTH:
            assert short == bare
            continue
        longs += 1
        base = _base_name(name)
        if len(base) < SHORT_NAME_WIDTH - 8:
            # The function's own name survives whole, right at the start or after its
            # namespace, and the parameter list is folded.
            assert re.match(rf"(\w+::)*{re.escape(base)}\b", short), (short, base)
            if name.rstrip().endswith(")"):
                assert short.endswith(("(...)", "…")), short
        else:
            assert short.endswith("…") and base.startswith(short[:-1]), short
    if rel.startswith(("h100", "mi300", "a100")):
        assert longs, "expected C++ template names longer than the cell in this trace"


def test_short_form_by_hand() -> None:
    gelu = next(n for n in _kernel_names(BERT) if "GeluCUDAKernelImpl" in n)
    # 'void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(
    # ...)::{lambda()#2}::operator()() const::{lambda()#4}::...' : namespaces dropped, the
    # lambda chain folded, the parameter list folded.
    assert short_kernel_name(gelu).startswith(
        "vectorized_elementwise_kernel<4, GeluCUDAKernelImpl(...)::{lambda}, "
    )
    assert short_kernel_name(gelu).endswith(">(...)")
    wmma = (
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_"
        "tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::"
        "Params)"
    )
    # 'cutlass::Kernel2<' (17) + 68 + '>(...)' (6) = 91 > 80; without 'cutlass::' 82 > 80:
    # the template argument is cut to 80 - len('Kernel2<>(...)') - 1 = 65 characters + '…'.
    assert short_kernel_name(wmma) == (
        "Kernel2<"
        + "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8"[:65]
        + "…>(...)"
    )
    add = (
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
        "at::native::CUDAFunctor_add<c10::BFloat16> >(at::TensorIteratorBase&, "
        "at::native::CUDAFunctor_add<c10::BFloat16> const&)::{lambda(int)#1}>(int, "
        "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<c10::BFloat16> >("
        "at::TensorIteratorBase&, at::native::CUDAFunctor_add<c10::BFloat16> const&)::"
        "{lambda(int)#1})"
    )
    # Template arguments three levels deep do not fit (96 characters without namespaces),
    # nor two (91); one level does: 'elementwise_kernel<' (19) + 50 + '>(...)' (6) = 75, but
    # with 'at::native::' 87.
    assert short_kernel_name(add) == (
        "elementwise_kernel<128, 4, gpu_kernel_impl_nocast<...>(...)::{lambda}>(...)"
    )
    assert short_kernel_name("void foo(int)") == "foo(int)"
    assert short_kernel_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
    # Unbalanced brackets (a cut name) and names with no brackets are only cut.
    broken = "void k<" + "x" * 200
    assert short_kernel_name(broken) == ("k<" + "x" * 200)[:79] + "…"
    assert short_kernel_name("Cijk_" + "A" * 300) == ("Cijk_" + "A" * 300)[:79] + "…"
    # 'operator()' and 'operator<' are names, not brackets.
    op = "void k<F::operator()(float) const, G::operator<>(" + "int, " * 30 + "int)"
    assert short_kernel_name(op) == "k<operator()(...) const, operator<>(...)"
    # ...but only as a whole word: 'my_operator<T>' is a template.
    named = "void my_operator<" + "T<long long int>, " * 5 + "U>(int)"
    assert short_kernel_name(named) == "my_operator<" + "T<...>, " * 5 + "U>(...)"


def _cells(table_html: str) -> tuple[list[str], list[list[ET.Element]]]:
    box = ET.fromstring(table_html)  # well-formed XML: every tag closed, all escaped
    # Tables scroll inside the output where they are wider than it (style kept inline).
    assert box.tag == "div" and box.get("style") == "overflow-x:auto"
    (root,) = box
    assert root.tag == "table"
    headers = [th.text or "" for th in root.find("thead").find("tr")]
    rows = [list(tr) for tr in root.find("tbody")]
    for tr in rows:
        assert [td.tag for td in tr] == ["td"] * len(headers)
    return headers, rows


def test_cell_has_short_form_title_and_details_and_escapes() -> None:
    nasty = (
        "void ns::kern<\"q\" & 'a', "
        + ", ".join(f"T<{i}>" for i in range(30))
        + ">(int <x>, float&)"
    )
    short = short_kernel_name(nasty)
    assert short != nasty.removeprefix("void ") and len(short) <= SHORT_NAME_WIDTH
    plain = "void foo(int&)"
    html = html_table(
        ("kernel", "calls"),
        [(nasty, "1"), (plain, "2"), ("ampere<x>", "3")],
        numeric=(False, True),
        name_cols=(0,),
        short_cols=(0,),
    )
    assert '<"q"' not in html and "& '" not in html and "<x>" not in html
    headers, rows = _cells(html)
    assert headers == ["kernel", "calls"] and len(rows) == 3
    long_cell, plain_cell, short_cell = (r[0] for r in rows)
    assert long_cell.get("title") == nasty
    details = long_cell.find("details")
    assert details.get("class") == "gp-name"
    assert details.find("summary").text == short
    assert details.find("div").text == nasty
    # 'void ' alone dropped: no <details>, the full name still on hover.
    assert plain_cell.text == "foo(int&)" and plain_cell.get("title") == plain
    assert plain_cell.find("details") is None
    assert short_cell.text == "ampere<x>" and short_cell.get("title") is None
    assert [r[1].text for r in rows] == ["1", "2", "3"]


def _tables(html: str) -> list[str]:
    return re.findall(r'<div class="gp-scroll"[^>]*><table>.*?</table></div>', html, flags=re.S)


def test_real_report_tables_show_short_names_and_text_keeps_full_ones() -> None:
    names = _kernel_names(BERT)
    report = analyze(load_trace(BERT), top=10)
    sections = {s.title: s for s in profile_sections(report)}
    kernels = sections["Kernels"]
    (table,) = _tables(kernels.html)
    headers, rows = _cells(table)
    assert len(rows) == len(report.kernels.rows)
    shown = 0
    for tr in rows:
        cell = tr[0]
        full = cell.get("title") or cell.text
        assert full in names or full.startswith(("Memcpy", "Memset"))
        summary = cell.find("details/summary")
        label = summary.text if summary is not None else cell.text
        assert label == short_kernel_name(full) and len(label) <= SHORT_NAME_WIDTH
        shown += summary is not None
        # text/plain: the full name, uncut.
        assert full in kernels.text
    assert shown >= 5, "the BERT trace has many long template names"

    roof = sections["Roofline"]
    kernel_table_html = next(t for t in _tables(roof.html) if re.search(r"<th[^>]*>kernel</th>", t))
    headers, rows = _cells(kernel_table_html)
    assert len(rows) == min(10, len(report.roofline.kernel_points))
    for tr, k in zip(rows, report.roofline.kernel_points, strict=False):
        assert (tr[0].get("title") or tr[0].text) == k.name
        assert tr[1].text == k.op_name
    # Compared with every name written out in full, the page is much shorter.
    full_chars = sum(len(k.name) for k in report.roofline.kernel_points[:10])
    summaries = re.findall(r"<summary>(.*?)</summary>", kernel_table_html)
    assert summaries and sum(map(len, summaries)) < full_chars / 2


def test_kernels_section_html_rows_match_table_rows() -> None:
    table = kernel_table(load_trace(BERT))
    section = kernels_section(table)
    (html,) = _tables(section.html)
    _, rows = _cells(html)
    assert [tr[2].text for tr in rows] == [f"{r.calls:,}" for r in table.rows]
