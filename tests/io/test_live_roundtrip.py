"""A live CPU torch.profiler run, exported with export_chrome_trace and read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof_nb.analysis.ops import top_ops
from gpuprof_nb.io.trace import load_trace

torch = pytest.importorskip("torch")

MATMULS = 12


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(MATMULS):
            c = a @ b
            c = c.relu()
    path = tmp_path_factory.mktemp("live") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path, prof


def test_matmul_loop_round_trip(profiled: tuple[Path, object]) -> None:
    path, prof = profiled
    trace = load_trace(path)
    assert not trace.kernels
    table = top_ops(trace)
    assert table.sort_key == "self_cpu_us"  # no device activity on CPU
    assert table.rows[0].name == "aten::mm"
    mm = table.rows[0]
    assert mm.calls == MATMULS
    assert mm.input_shapes[0] == "[[256, 256], [256, 256]]"
    # torch's own aggregation of the same run, a different code path.
    averages = {e.key: e for e in prof.key_averages()}  # type: ignore[attr-defined]
    assert mm.calls == averages["aten::mm"].count
    assert mm.self_cpu_us == pytest.approx(
        averages["aten::mm"].self_cpu_time_total, rel=0.02, abs=2.0
    )
    assert mm.total_cpu_us == pytest.approx(averages["aten::mm"].cpu_time_total, rel=0.02, abs=2.0)


def test_gzip_export_round_trip(profiled: tuple[Path, object], tmp_path: Path) -> None:
    import gzip

    path, _ = profiled
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert load_trace(gz).ops == load_trace(path).ops
