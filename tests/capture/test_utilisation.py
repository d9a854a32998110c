"""UtilisationSampler, live: the real OS counters while this process burns CPU and then
sleeps (no fakes of psutil or /proc). Thresholds are CPU-time shares, kept loose for a noisy
2-core CI box."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from gpuprof_nb.capture import utilisation as capture
from gpuprof_nb.capture.utilisation import THREAD_NAME, UtilisationSampler
from gpuprof_nb.io.utilisation import utilisation_of
from gpuprof_nb.model.utilisation import Utilisation


def _us(ns: int) -> float:
    return ns / 1e3


def _model(sampler: UtilisationSampler) -> Utilisation:
    u = utilisation_of({"gpuprof_nb": {"utilisation": sampler.record(_us)}})
    assert u is not None
    return u


def _spin(seconds: float) -> None:
    """Burn CPU in this thread for `seconds` of wall time (no other thread)."""
    end = time.perf_counter_ns() + int(seconds * 1e9)
    x = 0
    while time.perf_counter_ns() < end:
        x += 1


def _no_sampler_thread() -> bool:
    return not any(t.name == THREAD_NAME for t in threading.enumerate())


@pytest.fixture(scope="module")
def busy_then_idle() -> tuple[Utilisation, tuple[int, int, int], float]:
    """~300 ms of a busy loop, then 300 ms asleep, with the sampler running; and the cores
    this process's own CPU clock says the loop got (under 1 when the box is overloaded)."""
    with UtilisationSampler() as sampler:
        t0, p0 = time.perf_counter_ns(), time.process_time_ns()
        _spin(0.3)
        t1, p1 = time.perf_counter_ns(), time.process_time_ns()
        time.sleep(0.3)
        t2 = time.perf_counter_ns()
    return _model(sampler), (t0, t1, t2), (p1 - p0) / (t1 - t0)


def test_process_series_is_high_while_busy_and_low_while_asleep(busy_then_idle) -> None:
    u, (t0, t1, t2), got_cores = busy_then_idle
    busy = u.mean_over("process", _us(t0), _us(t1))
    idle = u.mean_over("process", _us(t1), _us(t2))
    assert busy is not None and idle is not None
    # The intervals straddling t0 and t1 blur the edges a little.
    assert busy == pytest.approx(got_cores, abs=0.15)
    if got_cores > 0.6:  # the OS gave the loop most of a core (not an overloaded box)
        assert busy > 0.5, busy
    assert busy > 0.2, busy
    assert idle < 0.3, idle
    assert u.series_named("process").unit == "cores"  # type: ignore[union-attr]
    assert u.series_named("process").label == "this process"  # type: ignore[union-attr]


def test_cores_are_recorded_and_the_busy_stretch_shows_on_them(busy_then_idle) -> None:
    u, (t0, t1, _), got_cores = busy_then_idle
    cores = u.cpu_cores()
    assert cores, u.notes
    assert u.source in ("proc", "psutil")
    assert [c.name for c in cores] == [f"cpu{i}" for i in range(len(cores))]
    assert all(c.unit == "%" and all(0.0 <= v <= 100.0 for v in c.values) for c in cores)
    # The loop kept a core busy (or shared it on an overloaded box): the cores together were
    # at least about as busy as this process.
    total = sum(u.mean_over(c.name, _us(t0), _us(t1)) or 0.0 for c in cores)
    assert total > min(50.0, 70.0 * got_cores), total


def test_rate_is_at_most_a_few_hundred_samples_per_second(busy_then_idle) -> None:
    u, (t0, _, t2), _ = busy_then_idle
    per_s = len(u.ts_us) / ((t2 - t0) / 1e9)
    assert 2 <= len(u.ts_us)
    assert per_s <= 400
    assert u.period_ms >= capture.MIN_PERIOD_S * 1e3
    assert list(u.ts_us) == sorted(u.ts_us)
    # The first time is the end of the first interval, after the start.
    assert _us(t0) - 50_000 < u.ts_us[0] and u.ts_us[-1] >= _us(t2) - 1e3


def test_period_is_clamped_to_a_few_hundred_samples_per_second() -> None:
    sampler = UtilisationSampler(period_s=1e-6)
    with sampler:
        time.sleep(0.1)
    u = _model(sampler)
    assert u.period_ms >= 2.5
    assert len(u.ts_us) <= 0.1 * 400 + 2


def test_a_cell_shorter_than_the_period_still_gives_an_interval() -> None:
    sampler = UtilisationSampler(period_s=0.05)
    with sampler:
        _spin(0.001)
    u = _model(sampler)
    assert len(u.ts_us) >= 1
    assert all(len(s.values) == len(u.ts_us) for s in u.series)


def test_the_cells_exception_propagates_and_the_thread_is_joined() -> None:
    class CellError(Exception):
        pass

    error = CellError("from the cell")
    sampler = UtilisationSampler()
    with pytest.raises(CellError) as caught:
        with sampler:
            assert not _no_sampler_thread()
            _spin(0.02)
            raise error
    assert caught.value is error
    assert _no_sampler_thread()
    assert len(_model(sampler).ts_us) >= 1


def test_stop_is_idempotent_and_record_is_stable() -> None:
    sampler = UtilisationSampler()
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    first = sampler.record(_us)
    sampler.stop()
    sampler.stop()
    assert sampler.record(_us) == first
    assert _no_sampler_thread()


def test_stop_before_start_does_nothing_and_record_says_so() -> None:
    sampler = UtilisationSampler()
    sampler.stop()
    artifact = sampler.record(_us)
    assert artifact["ts_us"] == [] and artifact["series"] == {}
    assert any("not started" in n for n in artifact["notes"])


def test_a_sampler_runs_once() -> None:
    sampler = UtilisationSampler()
    with sampler:
        pass
    with pytest.raises(RuntimeError, match="make a new one"):
        sampler.start()


def test_bad_period_is_refused() -> None:
    with pytest.raises(ValueError, match="period_s"):
        UtilisationSampler(period_s=0)


def test_psutil_source_when_proc_stat_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psutil")
    monkeypatch.setattr(capture, "_proc_stat_cores", lambda: None)
    with UtilisationSampler() as sampler:
        _spin(0.1)
    u = _model(sampler)
    assert u.source == "psutil"
    assert u.cpu_cores()


def test_without_nvml_the_gpu_is_left_out_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now fails
    with UtilisationSampler(cuda=True) as sampler:
        time.sleep(0.02)
    artifact = sampler.record(_us)
    assert capture.NVML_MISSING in artifact["notes"]
    assert not any(name.startswith("gpu") for name in artifact["series"])
    assert "nvml" not in artifact["source"]


def test_samples_past_the_limit_are_halved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture, "MAX_SAMPLES", 4)
    sampler = UtilisationSampler(period_s=0.0025)
    with sampler:
        t0, p0 = time.perf_counter_ns(), time.process_time_ns()
        # Long enough for 4 samples even where the spinning thread keeps the sampler waiting
        # for the GIL (about 40 samples/s on a busy 2-core box).
        _spin(0.3)
        t1, p1 = time.perf_counter_ns(), time.process_time_ns()
    u = _model(sampler)
    assert 2 <= len(u.ts_us) <= 5
    assert u.period_ms > 2.5
    assert any("every other sample dropped" in n for n in u.notes)
    # The merged intervals still add up: the process's mean is what its CPU clock says.
    mean = u.mean_over("process", _us(t0), _us(t1))
    assert mean == pytest.approx((p1 - p0) / (t1 - t0), abs=0.2)


class FakeNVML(types.ModuleType):
    """pynvml's API as the sampler calls it, for machines without a GPU: power is not
    supported, and the SM clock fails after `clock_calls` reads."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, clock_calls: int = 10**9) -> None:
        super().__init__("pynvml")
        self.clock_calls = clock_calls
        self.shut_down = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"Fake <GPU>"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=70, memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(used=2**30, total=2**34)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        self.clock_calls -= 1
        if self.clock_calls < 0:
            raise self.NVMLError("GPU is lost")
        return 1410


def test_nvml_series_and_unsupported_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML's calls through a stand-in (no GPU here); the live test below uses the real one.
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with UtilisationSampler(cuda=True, device_index=1, period_s=0.005) as sampler:
        time.sleep(0.05)
    artifact = sampler.record(_us)
    assert fake.shut_down
    assert artifact["source"].endswith("+nvml")
    series = artifact["series"]
    n = len(artifact["ts_us"])
    assert series["gpu_util"] == {
        "unit": "%",
        "label": "GPU 1 (Fake <GPU>) kernel running, % of time",
        "values": [70.0] * n,
    }
    assert series["gpu_mem_util"]["values"] == [30.0] * n
    assert series["gpu_mem_used"]["unit"] == "bytes"
    assert series["gpu_mem_used"]["values"] == [float(2**30)] * n
    assert series["gpu_sm_clock"]["values"] == [1410.0] * n
    assert "gpu_power" not in series
    assert any("power not recorded: NVML says Not Supported" in note for note in artifact["notes"])
    assert utilisation_of({"gpuprof_nb": {"utilisation": artifact}}) is not None


def test_a_counter_that_fails_mid_run_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(clock_calls=3))
    with UtilisationSampler(cuda=True, period_s=0.005) as sampler:
        time.sleep(0.05)
    artifact = sampler.record(_us)
    assert "gpu_sm_clock" not in artifact["series"]
    assert "gpu_util" in artifact["series"]
    assert any("SM clock stopped: NVML says GPU is lost" in n for n in artifact["notes"])


@pytest.mark.gpu
def test_nvml_series_while_matmuls_run() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py")
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    # NVML index = CUDA index unless CUDA_VISIBLE_DEVICES reorders them.
    with UtilisationSampler(cuda=True, device_index=torch.cuda.current_device()) as sampler:
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:
            for _ in range(8):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    u = _model(sampler)
    assert "nvml" in u.source, u.notes
    summary = u.summary()
    assert summary["gpu_util_mean"] > 50, summary
    assert summary["gpu_mem_used_max"] > 0
    assert summary["gpu_power_max"] > 0


def test_a_short_last_interval_never_shows_more_cores_than_the_machine() -> None:
    """stop() ends an interval as short as the cell's tail; there the two clocks' reads (not
    one instant) could put several cores' worth of CPU time (a 2-core VM showed 3.13 cores).
    It is merged into the interval before it, and no value passes the machine's cores."""
    sampler = UtilisationSampler(period_s=0.02)
    with sampler:
        time.sleep(0.07)
    stamps, process = sampler._stamps, sampler._process_ns
    assert len(stamps) >= 3
    # What stop() can leave: a last interval of 50 us holding 300 us of CPU time.
    stamps[-1] = stamps[-2] + 50_000
    process[-1] = process[-2] + 300_000
    entry = sampler.record(_us)
    u = _model(sampler)
    most = entry["cores"]
    assert most == (len(u.cpu_cores()) or capture.machine_cores())
    values = u.series_named("process").values
    assert max(values) <= most
    assert len(u.ts_us) == len(stamps) - 2  # the short interval merged into the one before
    assert u.ts_us[-1] == pytest.approx(_us(stamps[-1]))


def test_a_recorded_value_above_the_machine_reads_as_the_most_it_can_be() -> None:
    """Traces saved before the sampler clamped its last interval load with the value capped
    at the cores the per-core series show (the model refuses a series above them)."""
    entry = {
        "source": "proc",
        "period_ms": 20.0,
        "ts_us": [20_000.0, 40_000.0, 40_050.0],
        "series": {
            "cpu0": {"unit": "%", "label": "CPU 0", "values": [50.0, 60.0, 100.4]},
            "cpu1": {"unit": "%", "label": "CPU 1", "values": [10.0, 20.0, 30.0]},
            "process": {"unit": "cores", "label": "this process", "values": [0.6, 0.8, 3.13]},
        },
        "notes": [],
    }
    u = utilisation_of({"gpuprof_nb": {"utilisation": entry}})
    assert u is not None
    assert u.series_named("process").values == (0.6, 0.8, 2.0)
    assert max(u.series_named("cpu0").values) == 100.0
    with pytest.raises(ValueError, match="above 2 cores"):
        Utilisation(
            "x",
            20.0,
            (1.0,),
            (
                u.series_named("cpu0"),
                u.series_named("cpu1"),
                type(u.series[0])("process", "cores", "p", (3.0,)),
            ),
            cores=2,
        )
