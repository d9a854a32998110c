"""Where the tests find their inputs, relative to this checkout (never an absolute path).

`SHARED_TRACES` is ../shared/traces beside the repository root: real traces too large or too
many to copy into tests/data. It is absent in CI and on most machines; tests that read it
skip when `SHARED_TRACES.is_dir()` is false. Imported as `from _paths import ...` (pytest
puts tests/ on sys.path for tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED_TRACES = REPO.parent / "shared" / "traces"
