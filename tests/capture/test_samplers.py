"""What samples beside `%%gpuprofile`'s profiled run: the utilisation always, the Python line
with --stack; and which GPU NVML is asked about when CUDA_VISIBLE_DEVICES renumbers them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpuprof_nb.capture.samplers import cell_samplers, nvml_index  # noqa: E402
from gpuprof_nb.capture.sampling import LineSampler  # noqa: E402
from gpuprof_nb.capture.utilisation import UtilisationSampler  # noqa: E402


def test_stack_adds_the_line_sampler() -> None:
    code = compile("pass", "<c>", "exec")
    plain = cell_samplers(code, stack=False, modules=False, cuda=False)
    assert [(k, type(s)) for k, s in plain] == [("utilisation", UtilisationSampler)]
    stacked = cell_samplers(code, stack=True, modules=False, cuda=False)
    assert [(k, type(s)) for k, s in stacked] == [
        ("utilisation", UtilisationSampler),
        ("samples", LineSampler),
    ]
    assert stacked[1][1].cell_code is code


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
