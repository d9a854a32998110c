"""Both magics run cells through capture/cell.py: one restore rule (grad mode and autocast
put back as found, whether the cell returned or raised, the cell's exception unchanged) and
the same code a plain cell would run (IPython's AST transformers applied). One test for both."""

from __future__ import annotations

import ast
import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.utils.capture import capture_output  # noqa: E402

# Each magic with options that keep it quick and quiet; gpuprofile also once in blocks of
# back-to-back runs (the cell compiled inside a loop).
MAGICS = [
    ("gpuprofile", "--quiet --warmup 0 --repeat 1 --number 1"),
    ("gpuprofile", "--quiet --timing-only --warmup 1 --repeat 2 --number 3"),
    ("memsnap", "--quiet"),
    ("memsnap", "--quiet --repeat 2"),
]
IDS = ["gpuprofile", "gpuprofile-blocks", "memsnap", "memsnap-repeat"]


@pytest.fixture
def ip(ipython_shell):
    shell = ipython_shell
    shell.run_cell("import torch")
    yield shell
    # Whatever a failing test left behind must not leak into the next one.
    torch.set_grad_enabled(True)
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_dtype("cpu", torch.bfloat16)


def modes() -> tuple[object, ...]:
    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
    )


RAISING_CELL = """\
ctx = torch.autocast("cpu", dtype=torch.float16)
ctx.__enter__()
torch.set_grad_enabled(False)
x = torch.ones(4) * 2
raise ValueError("boom from the cell")
"""

CHANGING_CELL = """\
torch.set_autocast_enabled("cpu", True)
torch.set_autocast_dtype("cpu", torch.float16)
torch.set_grad_enabled(False)
seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
"""


@pytest.mark.parametrize(("magic", "line"), MAGICS, ids=IDS)
def test_a_cell_that_raises_inside_autocast_leaves_no_mode_behind(ip, magic, line) -> None:
    before = modes()
    assert before == (True, False, torch.bfloat16)
    with capture_output(), pytest.raises(ValueError, match="^boom from the cell$") as info:
        ip.run_cell_magic(magic, line, RAISING_CELL)
    assert type(info.value) is ValueError  # the user's exception, not a wrapper
    assert modes() == before


@pytest.mark.parametrize(("magic", "line"), MAGICS, ids=IDS)
def test_every_run_starts_from_the_modes_found_and_they_are_put_back(ip, magic, line) -> None:
    ip.user_ns["seen"] = seen = []
    before = modes()
    with capture_output():
        ip.run_cell_magic(magic, line, CHANGING_CELL)
    assert modes() == before
    # Every run found grad on and autocast off, though the run before had changed both.
    assert seen and all(s == (False, True) for s in seen)
    plain = ip.run_cell(CHANGING_CELL)  # without a magic the change stays: that is the cell
    assert plain.success and modes() == (False, True, torch.float16)


class OneBecomesTwo(ast.NodeTransformer):
    """An AST transformer of the kind IPython extensions register (e.g. to rewrite
    literals): every constant 1 becomes 2."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if node.value == 1 and type(node.value) is int:
            return ast.copy_location(ast.Constant(2), node)
        return node


@pytest.fixture
def one_becomes_two(ip):
    transformer = OneBecomesTwo()
    ip.ast_transformers.append(transformer)
    yield
    if transformer in ip.ast_transformers:
        ip.ast_transformers.remove(transformer)


@pytest.mark.parametrize(("magic", "line"), MAGICS, ids=IDS)
def test_the_cell_runs_the_code_a_plain_cell_would(ip, one_becomes_two, magic, line) -> None:
    cell = "z = 1\nzs.append(z)\n"
    ip.user_ns["zs"] = []
    assert ip.run_cell(cell).success
    plain = ip.user_ns["z"]
    assert plain == 2  # IPython itself applies the transformer
    ip.user_ns["zs"] = zs = []
    with capture_output():
        ip.run_cell_magic(magic, line, cell)
    assert ip.user_ns["z"] == plain
    assert zs and set(zs) == {plain}


def test_a_transformer_added_later_is_applied_to_a_cached_cell(ip) -> None:
    # The compiled-cell cache keys on the transformers in place: adding one recompiles.
    cell = "w = 1\nw = w + 0\n"
    line = "--quiet --timing-only --warmup 0 --repeat 1 --number 1"
    ip.run_cell_magic("gpuprofile", line, cell)
    assert ip.user_ns["w"] == 1
    transformer = OneBecomesTwo()
    ip.ast_transformers.append(transformer)
    try:
        ip.run_cell_magic("gpuprofile", line, cell)
        assert ip.user_ns["w"] == 2
    finally:
        ip.ast_transformers.remove(transformer)
    ip.run_cell_magic("gpuprofile", line, cell)
    assert ip.user_ns["w"] == 1
