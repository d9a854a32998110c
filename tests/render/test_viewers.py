"""Every report on every real trace and snapshot, as an untrusted notebook in JupyterLab and as
GitHub are reported to show it (tests/render/viewers.py replays their sanitizers; the browser
test checks the real JupyterLab): the banner comes first, no text of an inline SVG leaks out,
every chart is there as an image, every section is there under its heading, the tab bar is
gone, and every number with a unit shown as text is also in the report's text/plain."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
from viewers import github_view, jupyterlab_view, leaked_svg_text, shown_images

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
