"""Record what every report shows, text and HTML, on every real trace and snapshot, into
tests/data/golden/reports.golden.xz; tests/test_golden_reports.py checks that the package
still renders exactly that, and shows a line diff where it does not.

What is recorded, per input: the ProfileReport (`gpuprof_nb.analyze(load_trace(path))`) or
MemoryReport (`gpuprof_nb.analyze_memory(load_snapshot(path))`) bundle, and the bundles of
the results it holds (ops, kernels, timeline, roofline, diagnosis), each as its full text
and its HTML in a form a diff can show (`readable_html`: one tag per line; the report's
shared <style> and each base64 data URI as a SHA-256, since the style is code and each image
is drawn from the inline SVG beside it). xz keeps the file small: the parts repeat the
report's sections. Inputs: the traces in ../shared/traces (when present) and in tests/data,
the snapshots in tests/data/snapshots.

Record again (and review the diff) only when a change of output is intended:

    KINETO_LOG_LEVEL=6 .venv/bin/python tools/record_golden.py
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "traces"
DATA = REPO / "tests" / "data"
OUT = DATA / "golden" / "reports.golden.xz"  # not *.json.xz: tests glob *.json* as traces
# Not traces: loader error cases.
NOT_TRACES = ("memory_timeline.raw.gz",)


def inputs() -> Iterator[tuple[str, str, Path]]:
    """(key, kind, path) for every input: kind is "trace" or "snapshot"."""
    for root, prefix in ((SHARED, "shared"), (DATA, "data")):
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            name = path.name
            if path.is_dir() or name in NOT_TRACES or "golden" in path.parts:
                continue
            key = f"{prefix}:{path.relative_to(root).as_posix()}"
            if name.endswith((".json", ".json.gz")) and name != "expected.json":
                yield key, "trace", path
            elif name.endswith(".pickle") and prefix == "data":
                yield key, "snapshot", path


_STYLE = re.compile(r"<style>(.*?)</style>", re.S)
_DATA_URI = re.compile(r"(data:[\w/+.-]+;base64,)([A-Za-z0-9+/=]+)")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def readable_html(html: str) -> str:
    """Return the HTML one tag per line, each <style> body and each base64 data URI
    replaced by its SHA-256: what a line diff can show."""
    html = _STYLE.sub(lambda m: f"<style>/* sha256 {_sha(m.group(1))} */</style>", html)
    html = _DATA_URI.sub(lambda m: f"{m.group(1)}sha256:{_sha(m.group(2))}", html)
    return html.replace("><", ">\n<")


def _entry(bundle: dict[str, Any]) -> dict[str, str]:
    return {"text": bundle["text/plain"], "html": readable_html(bundle["text/html"])}


def render_all(kind: str, path: Path) -> dict[str, dict[str, str]]:
    """Return {part: {text, html}} for one input."""
    # The public road, as users take it (gpuprof_nb.analyze and friends: session/analyze.py).
    from gpuprof_nb import analyze, analyze_memory, load_snapshot, load_trace

    if kind == "snapshot":
        report: Any = analyze_memory(load_snapshot(path))
        return {"report": _entry(report._repr_mimebundle_())}
    report = analyze(load_trace(path))
    parts = {"report": _entry(report._repr_mimebundle_())}
    for name in ("ops", "kernels", "timeline", "roofline", "diagnosis"):
        value = getattr(report, name)
        if value is not None:
            parts[name] = _entry(value._repr_mimebundle_())
    return parts


def record() -> dict[str, dict[str, dict[str, str]]]:
    return {key: render_all(kind, path) for key, kind, path in inputs()}


def main() -> int:
    golden = record()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(golden, sort_keys=True, indent=0).encode("utf-8")
    OUT.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    print(f"{OUT.relative_to(REPO)}: {len(golden)} inputs, {OUT.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
