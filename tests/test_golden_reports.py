"""Every report renders exactly what tests/data/golden/reports.golden.xz recorded (full text,
and the HTML one tag per line: tools/record_golden.readable_html) on every real trace and
snapshot: refactors of the result and display layers must not change a byte users see. A
change shows as a line diff. Record again with tools/record_golden.py only when a change of
output is intended, and review the diff."""

from __future__ import annotations

import difflib
import importlib.util
import json
import lzma
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden" / "reports.golden.xz"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "record_golden", ROOT / "tools" / "record_golden.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
RECORDED = json.loads(lzma.decompress(GOLDEN.read_bytes()))
INPUTS = {key: (kind, path) for key, kind, path in TOOL.inputs()}


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_report_renders_as_recorded(key: str) -> None:
    if key not in INPUTS:
        pytest.skip(f"{key} is not on this machine")
    kind, path = INPUTS[key]
    now = TOOL.render_all(kind, path)
    then = RECORDED[key]
    assert sorted(now) == sorted(then)
    for part in then:
        for form in ("text", "html"):
            if now[part][form] != then[part][form]:
                diff = "\n".join(
                    difflib.unified_diff(
                        then[part][form].splitlines(),
                        now[part][form].splitlines(),
                        "recorded",
                        "now",
                        lineterm="",
                        n=1,
                    )
                )
                pytest.fail(f"{key} {part}: {form} changed\n{diff[:4000]}")


def test_every_input_here_was_recorded() -> None:
    missing = sorted(set(INPUTS) - set(RECORDED))
    assert not missing, f"not in the golden file (run tools/record_golden.py): {missing}"
