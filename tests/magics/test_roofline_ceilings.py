"""A live %%gpuprofile draws its roofline against the ceilings measure_ceilings() cached for
this machine; an offline analysis of a CPU trace never borrows this machine's ceilings."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

import gpuprof_nb  # noqa: E402
from gpuprof_nb.capture.device import measure_ceilings  # noqa: E402

CELL = "for _ in range(3):\n    C = A @ B\n"


@pytest.fixture()
def measured(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_NB_CACHE_DIR", str(tmp_path))
    return measure_ceilings("cpu", matmul_size=128, copy_bytes=2**20, repeat=2)


def test_live_capture_uses_measured_cpu_ceilings(ipython_shell, measured, tmp_path) -> None:
    ipython_shell.user_ns.update(A=torch.randn(192, 192), B=torch.randn(192, 192))
    ipython_shell.run_cell_magic(
        "gpuprofile", f"-o rr --quiet --warmup 0 --repeat 1 --trace {tmp_path}/t.json", CELL
    )
    report = ipython_shell.user_ns["rr"]
    assert report.roofline.device is not None
    assert report.roofline.device.measured
    assert report.roofline.device.fp32_flops_per_s == pytest.approx(measured.fp32_flops_per_s)
    # `A @ B` is anchored at aten::matmul (its aten::mm child owns no separate point).
    mm = [p for p in report.roofline.points if p.name in ("aten::matmul", "aten::mm")]
    assert len(mm) == 1 and mm[0].roof_flops_per_s is not None

    offline = gpuprof_nb.analyze(gpuprof_nb.load_trace(tmp_path / "t.json"))
    assert offline.roofline.device is None  # a CPU trace from elsewhere: no borrowed roofs
