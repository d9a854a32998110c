"""The `hostile` fixture: run cases through the harness (harness.py) and judge them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Case, judge, run_cases


@pytest.fixture
def hostile(tmp_path: Path) -> Any:
    """run_cases and judge together: `hostile(cases, prelude=...)` returns the rows."""

    def run(cases: list[Case], **kwargs: Any) -> dict[str, dict[str, Any]]:
        names = [c.name for c in cases]
        assert len(names) == len(set(names)), "case names must be unique"
        rows = run_cases(cases, tmp_path, **kwargs)
        judge(cases, rows)
        return rows

    return run
