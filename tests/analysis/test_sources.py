"""Source lines named as users wrote them: `In [n], line L` for notebook cells (ipykernel's
hashed files, IPython's <ipython-input-N-...>), `file.py:L function` otherwise, and "line
unknown" where a frame carries no line (never `:0`)."""

from __future__ import annotations

import pytest

from gpuprof_nb.analysis.sources import (
    cell_number,
    is_cell_file,
    profiler_frame_file,
    profiler_frame_label,
    source_label,
)

CELL = "/tmp/ipykernel_9247/117277944.py"
CELLS = {CELL: 12}


@pytest.mark.parametrize(
    ("args", "kwargs", "label"),
    [
        ((CELL, 4, "<module>", CELLS), {}, "In [12], line 4"),
        ((CELL, 3, "make", CELLS), {}, "In [12], line 3 in make"),
        ((CELL, 0, "<module>", CELLS), {}, "In [12], line unknown"),
        (
            (CELL, 0, "<module>", CELLS),
            {"first_line": True},
            "In [12], line unknown (profiler events name functions only)",
        ),
        (
            ("/home/user/train.py", 1, "<module>", CELLS),
            {"first_line": True},
            "train.py (line unknown: profiler events name functions only) <module>",
        ),
        ((CELL, 2, "make", CELLS), {"first_line": True}, "In [12], make (defined at line 2)"),
        ((CELL, 4, "<module>", {}), {}, "cell 117277944.py, line 4"),
        (("<ipython-input-7-0a1b2c3d>", 5, "<module>", {}), {}, "In [7], line 5"),
        (("/home/user/train.py", 123, "step", CELLS), {}, "train.py:123 step"),
        (("/home/user/train.py", 0, "step", CELLS), {}, "train.py (line unknown) step"),
        (("C:\\work\\train.py", 9, "step", {}), {}, "train.py:9 step"),
    ],
)
def test_labels(args, kwargs, label) -> None:
    assert source_label(*args, **kwargs) == label
    assert ":0" not in label


def test_cell_files_and_numbers() -> None:
    assert is_cell_file(CELL) and is_cell_file("<ipython-input-7-0a1b2c3d>")
    assert not is_cell_file("/home/user/ipykernel_utils.py")
    assert cell_number(CELL, CELLS) == 12 and cell_number(CELL, {}) is None
    assert cell_number("<ipython-input-7-0a1b2c3d>", {}) == 7


def test_profiler_event_names() -> None:
    name = f"{CELL}(0): <module>"
    assert profiler_frame_file(name) == CELL
    assert profiler_frame_label(name, CELLS) == (
        "In [12], line unknown (profiler events name functions only)"
    )
    assert profiler_frame_label(f"{CELL}(2): make", CELLS) == "In [12], make (defined at line 2)"
    assert (
        profiler_frame_label("torch/nn/modules/module.py(1736): _call_impl", {})
        == "module.py, _call_impl (defined at line 1736)"
    )
    # A built-in call has no file: its name stays as the profiler wrote it.
    assert profiler_frame_label("<built-in function sleep>", CELLS) == "<built-in function sleep>"
    assert profiler_frame_file("<built-in function sleep>") is None
