"""What samples beside `%%gpuprofile`'s profiled run: the utilisation always, the Python
lines with --stack (exact line events; the sampler where another tracer holds the hook); and
which GPU NVML is asked about when CUDA_VISIBLE_DEVICES renumbers them."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from gpuprof_nb.capture.linetrace import LineTracer  # noqa: E402
from gpuprof_nb.capture.samplers import cell_samplers, line_recorder, nvml_index  # noqa: E402
from gpuprof_nb.capture.sampling import LineSampler  # noqa: E402
from gpuprof_nb.capture.utilisation import UtilisationSampler  # noqa: E402


def test_stack_adds_exact_line_events() -> None:
    code = compile("pass", "<c>", "exec")
    plain = cell_samplers(code, stack=False, modules=False, cuda=False)
    assert [(k, type(s)) for k, s in plain] == [("utilisation", UtilisationSampler)]
    stacked = cell_samplers(code, stack=True, modules=False, cuda=False)
    assert [(k, type(s)) for k, s in stacked] == [
        ("utilisation", UtilisationSampler),
        ("samples", LineTracer),
    ]
    assert stacked[1][1].cell_code is code
    assert stacked[1][1].engine == ("monitoring" if sys.version_info >= (3, 12) else "settrace")


def test_another_tracer_keeps_the_sampler() -> None:
    """A debugger or coverage holding sys.settrace is left alone: the lines are sampled."""
    code = compile("pass", "<c>", "exec")

    def other(frame, event, arg):
        return None

    before = sys.gettrace()
    sys.settrace(other)
    try:
        recorder = line_recorder(code)
    finally:
        sys.settrace(before)
    if sys.version_info >= (3, 12):
        assert isinstance(recorder, LineTracer)  # sys.monitoring has tool ids of its own
    else:
        assert isinstance(recorder, LineSampler)


def test_module_ranges_are_recorded_unless_no_modules() -> None:
    from gpuprof_nb.capture.modules import ModuleRecorder

    code = compile("pass", "<c>", "exec")
    got = cell_samplers(code, stack=False, modules=True, cuda=False)
    assert [(k, type(s)) for k, s in got] == [
        ("utilisation", UtilisationSampler),
        ("modules", ModuleRecorder),
    ]


@pytest.mark.parametrize(
    "visible, current, expected",
    [
        ("", 1, 1),
        ("3,5", 1, 5),
        ("3, 5", 0, 3),
        ("GPU-0a1b,GPU-2c3d", 1, 1),
        ("7", 0, 7),
    ],
)
def test_nvml_index_follows_cuda_visible_devices(monkeypatch, visible, current, expected) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    assert nvml_index(True) == expected
    assert nvml_index(False) == 0
