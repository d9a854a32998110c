"""Every report on every real trace and snapshot, as an untrusted notebook in JupyterLab and as
GitHub are reported to show it (tests/render/viewers.py replays their sanitizers; the browser
test checks the real JupyterLab): the banner comes first, no text of an inline SVG leaks out,
every chart is there as an image, every section is there under its heading, the tab bar is
gone, every table scrolls inside its own box and every image keeps to the output's width
(nothing wider than the output at 948 px), and every number with a unit shown as text is also
in the report's text/plain. Reports of the other kinds (will it fit with its plan, a
comparison, a distributed run) and the parts a user displays alone (Modules, Compile,
Critical path, Annotations) too."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from viewers import (
    github_view,
    jupyterlab_view,
    leaked_svg_text,
    shown_images,
    unboxed_tables,
    unscaled_images,
)

from gpuprof_nb.render.bundle import BANNER

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _golden_tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "record_golden", ROOT / "tools" / "record_golden.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


INPUTS = [(key, kind, path) for key, kind, path in _golden_tool().inputs()]
# A number with its unit as the report formats it ("98.7 us", "42.9%", "1.2 GiB", "3.35 TB/s").
_NUMBER = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?: ?%| (?:ns|us|ms|s|B|KiB|MiB|GiB|TiB|[kMGTP]?B/s|"
    r"[kMGTP]?FLOP(?:/s)?))(?![\w/])"
)


def _report(kind: str, path: Path) -> Any:
    from gpuprof_nb import analyze, analyze_memory, load_snapshot, load_trace

    if kind == "snapshot":
        return analyze_memory(load_snapshot(path))
    return analyze(load_trace(path))


def check_report(bundle: dict[str, str]) -> None:
    """The checks every report's bundle must pass (see the module's docstring)."""
    html, text = bundle["text/html"], bundle["text/plain"]
    inline = html.count('<details class="gp-plot"')
    lab = jupyterlab_view(html)
    assert leaked_svg_text(lab) == []
    assert lab.text().startswith(BANNER)
    assert len(shown_images(lab)) == inline
    assert unboxed_tables(lab) == [], "a table that does not scroll inside the output"
    assert unscaled_images(lab) == []
    assert not lab.shown_elements("input") and not lab.shown_elements("label")
    sections = re.findall(r'<div class="gp-panel" data-section="([^"]*)">', html)
    assert sections and len(lab.shown_elements("h4")) >= len(sections)
    shown = lab.text()
    assert ".gpuprof" not in shown and "white-space:" not in shown  # no CSS as text
    missing = sorted({n for n in _NUMBER.findall(shown) if n not in text})
    assert not missing, f"numbers shown in HTML but not in text/plain: {missing[:10]}"
    gh = github_view(html)
    assert leaked_svg_text(gh) == []
    assert len(shown_images(gh)) == inline


@pytest.mark.parametrize("key,kind,path", INPUTS, ids=[k for k, _, _ in INPUTS])
def test_report_reads_in_a_sanitizing_viewer(key: str, kind: str, path: Path) -> None:
    check_report(_report(kind, path)._repr_mimebundle_())


def _other_reports() -> Any:
    """(key, result) for the report kinds no single trace or snapshot gives, and for the
    parts of a report a user may display on their own."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuprof_nb import analyze, analyze_memory, analyze_run, compare, load_snapshot, load_trace
    from gpuprof_nb.analysis.report import analyze_batches

    main, other = (load_snapshot(DATA / "fit" / f"tiny_b{b}.pickle") for b in (8, 4))
    budget = int(analyze_memory(main).peak_bytes * 0.9)
    fit = analyze_batches(main, 8, other, 4, variable="batch_size", budget_bytes=budget)
    assert fit.plan is not None  # the plan's table and code are rendered too
    yield "will it fit", fit
    planted = DATA / "planted_cpu"
    before = analyze(load_trace(planted / "dataloader.json.gz"))
    after = analyze(load_trace(planted / "launch_overhead.json.gz"))
    yield "comparison", compare(before, after)
    with ThreadPoolExecutor(2) as pool:
        ranks = sorted((DATA / "gloo_run" / "slow_rank1").glob("*.json.gz"))
        yield "run", analyze_run(ranks, executor=pool, progress=False)
    for name, trace in (
        ("transformer", DATA / "gpu" / "modules_transformer.json.gz"),
        ("compiled", DATA / "mi300_compile_triton" / "trace.json.gz"),
    ):
        report = analyze(load_trace(trace))
        for part in ("modules", "compile", "critical_path", "annotations"):
            if getattr(report, part, None) is not None:
                yield f"{name}.{part}", getattr(report, part)


def test_other_reports_read_in_a_sanitizing_viewer() -> None:
    seen = []
    for key, result in _other_reports():
        try:
            check_report(result._repr_mimebundle_())
        except AssertionError as exc:
            raise AssertionError(f"{key}: {exc}") from exc
        seen.append(key)
    for part in ("transformer.modules", "compiled.compile", "transformer.critical_path"):
        assert part in seen, seen
