"""gpuprof_nb's module and torch.compile records kept with a trace: read back into model
objects, and a malformed record costs only itself (a load warning naming the field)."""

from __future__ import annotations

import copy

import pytest

from gpuprof_nb.errors import TraceFormatError
from gpuprof_nb.io.modules import compile_log_of, module_capture_of
from gpuprof_nb.io.trace import trace_from_dict

ENTRY = {
    "gpuprof_nb": {
        "modules": {
            "recorded": True,
            "prefix": "nn.Module: ",
            "calls": 3,
            "roots": [
                {
                    "path": "model",
                    "class": "Tiny",
                    "calls": 1,
                    "input_shape": [8, 32],
                    "input_dtype": "int64",
                }
            ],
            "types": {"model": "Tiny", "model.fc": "Linear"},
        },
        "compile": {
            "logged": True,
            "events": [
                {
                    "kind": "graph_break",
                    "compile_id": "0/0",
                    "source": "n = y.item()",
                    "function": "f",
                    "text": "Graph break in user code at a.py:3\n",
                },
                {"kind": "recompile", "compile_id": "0/1", "text": "\"0/0: tensor 'x' size\""},
            ],
            "frames": [
                {
                    "compile_id": "0/0",
                    "co_name": "f",
                    "co_filename": "a.py",
                    "co_firstlineno": 1,
                    "entire_frame_compile_time_s": 0.5,
                    "graph_op_count": 3,
                    "restart_reasons": ["r"],
                }
            ],
            "earlier": [{"compile_id": "7/0", "co_name": "g", "co_filename": "b.py"}],
        },
    }
}
EVENTS = [
    {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 1,
        "ts": 0,
        "dur": 5,
        "args": {},
    }
]


def test_records_read_into_model_objects() -> None:
    mods = module_capture_of(ENTRY)
    assert mods is not None and mods.recorded and mods.calls == 3
    [root] = mods.roots
    assert (root.path, root.module_type, root.input_shape, root.input_dtype) == (
        "model",
        "Tiny",
        (8, 32),
        "int64",
    )
    assert mods.types["model.fc"] == "Linear"
    log = compile_log_of(ENTRY)
    assert log is not None and log.logged
    assert [e.kind for e in log.events] == ["graph_break", "recompile"]
    assert log.events[0].function == "f" and log.events[0].source == "n = y.item()"
    assert [(f.compile_id, f.earlier) for f in log.frames] == [("0/0", False), ("7/0", True)]
    assert log.frames[0].compile_time_s == 0.5 and log.frames[0].graph_ops == 3


def test_absent_records_are_none() -> None:
    assert module_capture_of({}) is None and compile_log_of({"gpuprof_nb": {}}) is None


@pytest.mark.parametrize(
    "where, value, message",
    [
        (("modules", "calls"), -1, "gpuprof_nb.modules.calls must be a count"),
        (("modules", "roots"), {"a": 1}, "gpuprof_nb.modules.roots must be a list"),
        (("compile", "events"), [{"kind": "boom"}], "gpuprof_nb.compile.events[0].kind"),
        (
            ("compile", "frames"),
            [{"entire_frame_compile_time_s": -2}],
            "frames[0].entire_frame_compile_time_s must be seconds >= 0",
        ),
    ],
)
def test_a_malformed_record_is_named_and_costs_only_itself(where, value, message) -> None:
    bad = copy.deepcopy(ENTRY)
    bad["gpuprof_nb"][where[0]][where[1]] = value
    reader = module_capture_of if where[0] == "modules" else compile_log_of
    with pytest.raises(TraceFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        reader(bad, "t.json")
    trace = trace_from_dict({"traceEvents": EVENTS, **bad}, "t.json")
    assert len(trace.ops) == 1
    assert any(message.split(" must")[0] in w for w in trace.load_warnings)
