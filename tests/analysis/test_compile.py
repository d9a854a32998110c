# ruff: noqa: E501  (Dynamo's own messages, quoted as it writes them)
"""torch.compile explained from Dynamo's records: graph-break reasons and fixes, recompile
guards and fixes, gpuprof_nb's own hook guards left out, time between compiled regions."""

from __future__ import annotations

import json

from gpuprof_nb.analysis.compile import (
    break_fix,
    break_parts,
    compile_report,
    explain_log,
    recompile_fix,
)
from gpuprof_nb.model.compile import CompiledFrame, CompileEvent, CompileLog
from gpuprof_nb.model.trace import Op, Trace

ITEM_BREAK = """Graph break in user code at <ipython-input-3-0a1b2c>:4
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` to include these operations.
"""
PRINT_BREAK = """Graph break in user code at /src/train.py:12
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str'] (has_kwargs False)
  Hint: Avoid calling builtin `print` with argument types ['str'].
"""
OLD_STYLE = (
    "Graph break in user code at m.py:7\nGraph Break Reason: generic_jump TensorVariable()\n"
)


def test_break_parts_and_fixes_by_reason() -> None:
    file, line, reason, explanation, hints, _ = break_parts(ITEM_BREAK)
    assert (file, line) == ("<ipython-input-3-0a1b2c>", 4)
    assert reason == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert "capture_scalar_outputs = True" in break_fix(reason, explanation, hints)
    _, line, reason, explanation, hints, _ = break_parts(PRINT_BREAK)
    assert line == 12 and reason == "Failed to trace builtin operator `print`"
    assert "reorderable_logging_functions" in break_fix(reason, explanation, hints)
    _, _, reason, explanation, hints, _ = break_parts(OLD_STYLE)
    assert reason == "generic_jump TensorVariable()"
    assert "torch.where" in break_fix(reason, explanation, hints)


def test_recompile_fixes_by_guard() -> None:
    assert "mark_dynamic(x, 1)" in recompile_fix(
        ("0/0: tensor 'x' size mismatch at index 1. expected 8, actual 9",)
    )
    assert "dtype" in recompile_fix(("0/0: tensor 'x' dtype mismatch. expected Float",))
    assert "dynamic=True" in recompile_fix(("0/0: something else",))


def _log(*events: CompileEvent) -> CompileLog:
    frame = CompiledFrame("0/0", "f", "<ipython-input-3-0a1b2c>", 2, 0.25, 4)
    resume = CompiledFrame(
        "1/0", "torch_dynamo_resume_in_f_at_4", "<ipython-input-3-0a1b2c>", 4, 0.1, 2
    )
    return CompileLog(logged=True, events=events, frames=(frame, resume))


def test_breaks_count_again_on_recompiles_and_our_hook_guards_are_left_out() -> None:
    log = _log(
        CompileEvent("graph_break", "0/0", ITEM_BREAK, "n = y.sum().item()", "f"),
        CompileEvent("graph_break", "0/1", ITEM_BREAK, "n = y.sum().item()", "f"),
        CompileEvent(
            "recompile",
            "0/1",
            json.dumps("0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9"),
        ),
        CompileEvent(
            "recompile", "1/1", json.dumps(["1/0: len(G['m']._global_forward_hooks) != 1"])
        ),
    )
    breaks, recompiles = explain_log(log, {"<ipython-input-3-0a1b2c>": 3})
    [b] = breaks
    assert b.count == 2 and b.where == "In [3], line 4 in f" and b.source == "n = y.sum().item()"
    [r] = recompiles
    assert r.function == "f" and r.where == "In [3], line 2 in f" and "mark_dynamic(x, 0)" in r.fix


def _op(name: str, start: float, dur: float, index: int) -> Op:
    return Op(name, "op", start, dur, 1, 1, index=index)


def test_time_between_compiled_regions_is_what_the_break_left_uncompiled() -> None:
    # Region 0/0 runs 0..100: its graph's op 0..40, the .item() 45..50, then the resume
    # region 1/0 (nested, as the first graph's code calls it) 60..100 with its op 62..98.
    ops = (
        _op("Torch-Compiled Region: 0/0", 0.0, 100.0, 0),
        _op("aten::mm", 0.0, 40.0, 1),
        _op("aten::_local_scalar_dense", 45.0, 5.0, 2),
        _op("Torch-Compiled Region: 1/0", 60.0, 40.0, 3),
        _op("aten::cos", 62.0, 36.0, 4),
    )
    trace = Trace(
        source="<hand>",
        ops=ops,
        kernels=(),
        runtime=(),
        syncs=(),
        memory=(),
        steps=(),
        devices=(),
        distributed=None,
        bounds_us=(0.0, 100.0),
        compile_log=_log(CompileEvent("graph_break", "0/0", ITEM_BREAK, "n = y.item()", "f")),
    )
    report = compile_report(trace)
    assert report is not None
    assert report.regions == 2 and report.graphs_ran == 2 and report.graphs == 2
    # Uncovered inside 0/0: 40..45 and 50..60 = 15 us; plus the scalar read 5 us.
    assert report.between_regions_us == 20.0
    assert report.compile_time_s == 0.35
