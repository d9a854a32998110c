"""Summary / Top ops / Kernels sections and the ProfileReport bundle: escaping, the same
numbers in HTML and text, hand-computed values, section order, include/exclude, save."""

from __future__ import annotations

import gzip
import html as html_lib
import re
from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import kernel_table, top_ops
from gpuprof_nb.analysis.report import analyze, count_steps_per_run
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.model.trace import Kernel, Op, RuntimeCall, Trace
from gpuprof_nb.render.profile import (
    guarded_section,
    kernels_section,
    ops_section,
    summary_section,
)
from gpuprof_nb.render.sections import Section
from gpuprof_nb.results.report import ProfileReport

GEMM = "void gemm_kernel<float, 128, (cutlass::Arch)80>(Params<float>)"
LONG_OP = "myext::" + "very_long_operator_name_" * 8 + "end"


def hand_trace() -> Trace:
    """Two ops on one thread, each launching one kernel; a memcpy of 1 MB in 100 us on
    another stream; kernels overlap across streams. Window 0..40 us."""
    ops = (
        Op("aten::mm", "op", 0.0, 20.0, 1, 1, external_id=1, input_dims=((4, 4), (4, 4)), index=0),
        Op(LONG_OP, "op", 22.0, 10.0, 1, 1, external_id=2, index=1),
    )
    runtime = (
        RuntimeCall("cudaLaunchKernel", 1.0, 2.0, 1, 1, correlation=11, index=2),
        RuntimeCall("cudaLaunchKernel", 23.0, 2.0, 1, 1, correlation=12, index=3),
    )
    kernels = (
        Kernel(GEMM, "kernel", 0.0, 10.0, 0, 7, correlation=11, index=4),
        Kernel("memcpy HtoD", "memcpy", 5.0, 10.0, 0, 8, bytes=1_000_000, index=5),
        Kernel(GEMM, "kernel", 24.0, 6.0, 0, 7, correlation=12, index=6),
    )
    return Trace(
        source="<hand>",
        ops=ops,
        kernels=kernels,
        runtime=runtime,
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 40.0),
    )


def cells(html: str) -> list[str]:
    """Return the unescaped text of every <td> in the HTML."""
    return [html_lib.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", html, re.S)]


def assert_html_numbers_in_text(section: Section) -> None:
    found = cells(section.html)
    assert found, "no table cells in the HTML"
    for cell in found:
        for number in re.findall(r"\d[\d,.]*", cell):
            assert number in section.text, f"{number!r} (from {cell!r}) not in the text"


def test_kernel_names_are_escaped_everywhere() -> None:
    trace = hand_trace()
    section = kernels_section(kernel_table(trace))
    assert "gemm_kernel&lt;float, 128, (cutlass::Arch)80&gt;" in section.html
    assert "<float" not in section.html
    assert GEMM in section.text
    whole = analyze(trace)._repr_mimebundle_()["text/html"]
    assert "<float" not in whole and "gemm_kernel&lt;float" in whole


def test_kernels_section_numbers_by_hand() -> None:
    section = kernels_section(kernel_table(hand_trace()))
    text = section.text
    gemm_line = next(line for line in text.splitlines() if line.startswith("void gemm"))
    # 2 calls, 16 us in all, mean 8 us, max 10 us, stream 7, 16 of 26 us of device time.
    assert re.search(r"kernel\s+2\s+16 us\s+8 us\s+10 us\s+7\s+61.5%", gemm_line), gemm_line
    copy_line = next(line for line in text.splitlines() if line.startswith("memcpy HtoD"))
    # 1,000,000 bytes in 10 us = 1e11 B/s = 100 GB/s; 10 of 26 us.
    assert re.search(
        r"memcpy\s+1\s+10 us\s+10 us\s+10 us\s+8\s+38.5%\s+977 KiB\s+100 GB/s", copy_line
    ), copy_line
    assert_html_numbers_in_text(section)


def test_ops_section_names_in_full_and_device_columns() -> None:
    section = ops_section(top_ops(hand_trace()))
    assert LONG_OP in section.text
    assert html_lib.escape(LONG_OP) in section.html
    assert 'class="name"' in section.html  # wrapped, not truncated
    mm_line = next(line for line in section.text.splitlines() if line.startswith("aten::mm"))
    # aten::mm: 1 call, 20 us CPU, its kernel 10 us = 10/16 of device time attributed to ops.
    assert re.search(r"aten::mm\s+1\s+20 us\s+20 us\s+10 us\s+10 us\s+62.5%", mm_line), mm_line
    assert "[[4, 4], [4, 4]]" in mm_line
    assert_html_numbers_in_text(section)


def test_ops_section_without_device_time_drops_device_columns() -> None:
    trace = hand_trace()
    cpu_only = Trace(
        source="<cpu>",
        ops=trace.ops,
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 40.0),
    )
    section = ops_section(top_ops(cpu_only))
    assert "self device" not in section.text and "self device" not in section.html
    assert "sorted by self_cpu_us" in section.text


def test_summary_numbers_by_hand() -> None:
    timing = TimingStats(
        wall_us=(10_000.0, 12_000.0, 16_000.0), warmup_wall_us=(50_000.0,), steps_per_run=4
    )
    report = analyze(hand_trace(), timing=timing, notes=("CPU mode: a note",))
    section = summary_section(report)
    text = section.text
    assert re.search(r"median per run\s+12 ms", text)
    # numpy-style quartiles of (10, 12, 16): 11 and 14 -> IQR 3 ms.
    assert re.search(r"IQR per run\s+3 ms", text)
    assert re.search(r"min / max per run\s+10 ms / 16 ms", text)
    assert re.search(r"median per step\s+3 ms", text)
    assert re.search(r"IQR per step\s+750 us", text)  # 3 ms / 4 steps
    # Kernels cover [0, 15] and [24, 30]: 21 us busy. The window is the recorded work, the
    # first op's start to the last op's end (0..32 us; the trace's 40 us includes idle tail).
    assert re.search(r"profiled window\s+32 us", text)
    assert re.search(r"GPU busy\s+65.6% \(21 us of the window\)", text)
    assert "noisy runs: the slowest took 1.6x the fastest" in text
    assert "CPU mode: a note" in text and "CPU mode: a note" in section.html
    assert_html_numbers_in_text(section)


def test_summary_with_cuda_event_times() -> None:
    timing = TimingStats(
        wall_us=(1_000.0, 1_300.0, 1_100.0, 1_200.0),
        device_us=(900.0, 1_000.0, 950.0, 980.0),
        device_name="NVIDIA H100",
    )
    text = summary_section(analyze(hand_trace(), timing=timing)).text
    assert re.search(r"device\s+NVIDIA H100", text)
    assert re.search(r"runs\s+4 timed \(CUDA events\)", text)
    # Statistics over the device times: median of (900, 950, 980, 1000) = 965 us.
    assert re.search(r"median per run\s+965 us", text)
    # Wall median of (1000, 1100, 1200, 1300) = 1150 us.
    assert re.search(r"median wall per run\s+1.15 ms", text)


def test_real_gpu_trace_every_html_number_is_in_the_text(data_dir: Path) -> None:
    path = data_dir / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    report = analyze(load_trace(path), top=10)
    for build in (
        summary_section,
        lambda r: ops_section(r.ops),
        lambda r: kernels_section(r.kernels),
    ):
        assert_html_numbers_in_text(build(report))


def test_sections_in_order_and_include_exclude() -> None:
    report = analyze(hand_trace(), timing=TimingStats(wall_us=(1.0, 2.0)))
    text = report._repr_mimebundle_()["text/plain"]
    titles = re.findall(r"^-- (.+) --$", text, re.M)
    assert titles == ["Diagnosis", "Summary", "Top ops", "Kernels", "Timeline", "Roofline"]
    assert report.text() == text
    # A trace whose analyses all failed shows the Summary alone, through text()'s short way.
    bare = ProfileReport(timing=report.timing, trace=report.trace, summary=report.summary)
    assert bare.text() == bare._repr_mimebundle_()["text/plain"]
    assert re.findall(r"^-- (.+) --$", bare.text(), re.M) == ["Summary"]
    assert set(report._repr_mimebundle_(include={"text/plain"})) == {"text/plain"}
    assert "text/html" not in report._repr_mimebundle_(exclude={"text/html"})
    assert "ProfileReport" in repr(report) and "<hand>" not in repr(report)


def test_timing_only_report_shows_the_summary_alone() -> None:
    report = ProfileReport(timing=TimingStats(wall_us=(5.0, 7.0)), trace=None)
    text = report._repr_mimebundle_()["text/plain"]
    assert report.text() == text  # what --timing-only prints
    assert re.findall(r"^-- (.+) --$", text, re.M) == ["Summary"]
    assert re.search(r"median per run\s+6 us", text)
    with pytest.raises(GpuprofError, match="no trace"):
        report.save("x.json")


def test_label_value_sections_are_the_generic_tables_without_a_header() -> None:
    """The Summary is built in one pass (it is rendered on every --timing-only cell); it
    must read exactly as the generic text and HTML tables would show the same rows."""
    import random

    from gpuprof_nb.render.html import html_table, note
    from gpuprof_nb.render.profile import _pairs_section
    from gpuprof_nb.render.text import text_table

    rng = random.Random(7)

    def word() -> str:
        return "".join(rng.choice("ab <>&\"' x") for _ in range(rng.randint(0, 12)))

    for _ in range(500):
        pairs = [(word(), word()) for _ in range(rng.randint(0, 6))]
        notes = [word() for _ in range(rng.randint(0, 3))]
        rows = text_table(("", ""), pairs).split("\n", 2)[-1] if pairs else ""
        text = "\n".join(([rows] if rows else []) + [f"note: {n}" for n in notes])
        table = html_table(("", ""), pairs) if pairs else ""
        html = re.sub(r"<thead>.*?</thead>", "", table) + "".join(note(f"note: {n}") for n in notes)
        section = _pairs_section("Summary", pairs, notes)
        assert (section.text, section.html) == (text, html), (pairs, notes)


def test_a_failing_section_says_so_and_the_rest_renders() -> None:
    def broken() -> Section:
        raise RuntimeError("bad <thing>")

    section = guarded_section("Roofline", broken)
    assert "RuntimeError: bad <thing>" in section.text
    assert "bad &lt;thing&gt;" in section.html


def test_offline_save_copies_the_source_and_round_trips(data_dir: Path, tmp_path: Path) -> None:
    path = data_dir / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
    trace = load_trace(path)
    report = analyze(trace)
    plain = report.save(tmp_path / "copy.json")
    assert plain.read_bytes() == gzip.decompress(path.read_bytes())
    zipped = report.save(tmp_path / "copy.json.gz")
    again = load_trace(zipped)
    assert len(again.kernels) == len(trace.kernels) and len(again.ops) == len(trace.ops)
    with pytest.raises(GpuprofError, match="not a file"):
        analyze(hand_trace()).save(tmp_path / "nope.json")


def test_steps_per_run_counts_every_optimizer_step() -> None:
    base = hand_trace()
    ann = tuple(
        Op("Optimizer.step#SGD.step", "annotation", 5.0 + 10 * i, 2.0, 1, 1, index=10 + i)
        for i in range(3)
    )
    trace = Trace(
        source="<s>",
        ops=base.ops + ann,
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 40.0),
    )
    assert count_steps_per_run(trace) == 3
    assert count_steps_per_run(base) is None


def test_a_failing_analysis_costs_its_tab_not_the_report(monkeypatch) -> None:
    import gpuprof_nb.analysis.report as report_mod

    def broken(trace, device=None):
        raise ArithmeticError("no roofs today")

    monkeypatch.setattr(report_mod, "compute_roofline", broken)
    report = analyze(hand_trace())
    assert report.roofline is None
    assert any(
        "roofline could not be computed: ArithmeticError: no roofs today" in n for n in report.notes
    )
    text = report._repr_mimebundle_()["text/plain"]
    assert re.findall(r"^-- (.+) --$", text, re.M) == [
        "Diagnosis",
        "Summary",
        "Top ops",
        "Kernels",
        "Timeline",
    ]
