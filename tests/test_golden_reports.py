"""Every report renders exactly what tests/data/golden/reports.golden.gz recorded (full text,
HTML by SHA-256) on every real trace and snapshot: refactors of the result and display
layers must not change a byte users see. Record again with tools/record_golden.py only when a
change of output is intended, and review the text diff."""

from __future__ import annotations

import difflib
import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden" / "reports.golden.gz"


def _tool():
    spec = importlib.util.spec_from_file_location(
        "record_golden", ROOT / "tools" / "record_golden.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
RECORDED = json.loads(gzip.decompress(GOLDEN.read_bytes()))
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
        if now[part]["text"] != then[part]["text"]:
            diff = "\n".join(
                difflib.unified_diff(
                    then[part]["text"].splitlines(),
                    now[part]["text"].splitlines(),
                    "recorded",
                    "now",
                    lineterm="",
                    n=1,
                )
            )
            pytest.fail(f"{key} {part}: text changed\n{diff[:4000]}")
        assert now[part]["html_sha256"] == then[part]["html_sha256"], f"{key} {part}: HTML"


def test_every_input_here_was_recorded() -> None:
    missing = sorted(set(INPUTS) - set(RECORDED))
    assert not missing, f"not in the golden file (run tools/record_golden.py): {missing}"
