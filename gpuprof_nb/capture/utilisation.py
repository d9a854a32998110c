"""How busy the machine was while a cell ran: a daemon thread samples, every `period_s`, the
busy share of each CPU core (from the OS), the CPU time of this process and, with
cuda=True, the GPU's NVML counters. `record()` returns the samples as the JSON-able artifact
kept in the trace under {"gpuprof_nb": {"utilisation": ...}} (io/utilisation.py reads it).

What the numbers can and cannot say:
- Per-core busy time comes from the kernel's tick counters (/proc/stat on Linux, psutil
  elsewhere), counted in ticks of usually 10 ms: at 100 samples/s each interval sees 0, 1 or 2
  ticks, so a single value is coarse; means over several intervals are right.
- This process's CPU time comes from time.process_time_ns() (the OS's per-process CPU clock,
  nanosecond resolution, every platform), so it is exact per interval and needs no psutil;
  it includes the sampler's own few microseconds per sample, not child processes
  (DataLoader workers).
- NVML's "utilisation" is the share of the driver's sample period (1/6 s to 1 s) in which a
  kernel was running, and it is refreshed at that pace: see render/utilisation.NVML_NOTE.

The sampler never raises into the user's cell: whatever fails (psutil or NVML missing, a
counter the GPU does not support, a read error) leaves that series out and says why in the
artifact's "notes".
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable
from types import TracebackType
from typing import Any

# The shortest period: a few hundred samples per second at most.
MIN_PERIOD_S = 0.0025
# The default: 50 samples a second. Every 10 ms cost a GIL-bound cell more than the 1% goal
# on the benchmark machine (each sample takes the GIL); every 20 ms stayed within it
# (benchmarks/RESULTS.md, section 11: the 10 ms rows and the default-mode block).
PERIOD_S = 0.02
# Most samples kept: past it every other sample is dropped and the period doubles (the CPU
# counters are cumulative, so dropping a sample merges two intervals exactly), so an hour-long
# cell keeps about as many samples as a two-minute one.
MAX_SAMPLES = 10_000
# Per-core readings are kept raw and parsed this many at a time: parsing one right after the
# thread wakes costs several times what it costs in a batch, all of it holding the GIL.
FLUSH_EVERY = 128
# The most of one core the sampling thread may use: on a machine where one sample costs more
# (hundreds of cores to read), the period grows until it fits. On a 2-core VM a sample costs
# little enough that 100 samples/s fit (benchmarks/RESULTS.md, "Measurements behind design
# choices", M18).
MAX_CPU_SHARE = 0.01
THREAD_NAME = "gpuprof_nb-utilisation"
# A last interval (ended by stop()) shorter than this share of a period is merged into the
# one before it.
SHORTEST_LAST = 0.5
NVML_MISSING = "NVML not available: pip install nvidia-ml-py"

# The NVML series: (names, what each is called); read by one call each (_nvml_readers).
_GPU_LABELS = {
    "gpu_util": ("%", "kernel running, % of time"),
    "gpu_mem_util": ("%", "memory controller busy, % of time"),
    "gpu_mem_used": ("bytes", "memory used"),
    "gpu_power": ("W", "power"),
    "gpu_sm_clock": ("MHz", "SM clock"),
}

# A source of per-core counters: read() returns what it read (cheap, done every sample),
# parse(raw) each core's cumulative busy seconds (done in batches, off the sample's path),
# close() releases what it holds.
CoreSource = tuple[Callable[[], object], Callable[[object], list[float]], Callable[[], None]]


def _psutil_cores() -> CoreSource | None:
    """Return the per-core source through psutil, or None without psutil. Busy is
    total - idle - iowait, total leaving out guest time (already counted in user time on
    Linux), as psutil.cpu_percent counts it."""
    try:
        import psutil
    except ImportError:
        return None
    fields: tuple[str, ...] = psutil.cpu_times()._fields
    idle = tuple(i for i, f in enumerate(fields) if f in ("idle", "iowait", "guest", "guest_nice"))
    cpu_times = psutil.cpu_times

    def read() -> object:
        return [sum(t) - sum([t[i] for i in idle]) for t in cpu_times(percpu=True)]

    def parse(raw: object) -> list[float]:
        return raw  # type: ignore[return-value]  # read() returned the list itself

    return read, parse, lambda: None


def _proc_stat_cores() -> CoreSource | None:
    """Return the per-core source from /proc/stat, counted as psutil counts it; None off
    Linux. read() keeps the file open and returns the CPU lines as bytes; parse() turns them
    into numbers later, many samples at a time.

    Preferred to psutil on Linux, which reads the same file: psutil opens and parses it on
    every call, and right after a sleep that costs several times what re-reading an open
    descriptor does, and parsing alone costs several times what it does in a batch
    (benchmarks/RESULTS.md, "Measurements behind design choices", M18). Every microsecond of
    it holds the GIL the cell runs under."""
    if not sys.platform.startswith("linux") or not os.path.exists("/proc/stat"):
        return None
    hz = float(os.sysconf("SC_CLK_TCK"))
    fd = os.open("/proc/stat", os.O_RDONLY)
    size = 65536

    def read() -> object:
        nonlocal size
        # The cpu lines come first; a read that fills the buffer before the line after them
        # is repeated with a bigger one (hundreds of cores).
        data = os.pread(fd, size, 0)
        while len(data) == size and b"\nintr" not in data:
            size *= 4
            data = os.pread(fd, size, 0)
        return data[data.find(b"\n") + 1 : data.find(b"\nintr")]

    def parse(raw: object) -> list[float]:
        # Lines "cpuN user nice system idle iowait irq softirq steal guest guest_nice"
        # (ticks) after the all-CPU line, up to the first line that is not a CPU's.
        out = []
        for line in raw.split(b"\n"):  # type: ignore[attr-defined]  # bytes from read()
            if not line.startswith(b"cpu"):
                break
            t = [int(x) for x in line.split()[1:9]]
            out.append((sum(t) - t[3] - t[4]) / hz)
        return out

    return read, parse, functools.partial(os.close, fd)


def machine_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS says, else all)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


class UtilisationSampler:
    """Sample CPU (and with cuda=True, GPU) utilisation in a daemon thread while a cell runs.

    `device_index` is the GPU's NVML index, which is not always the CUDA device index: NVML
    ignores CUDA_VISIBLE_DEVICES, so with CUDA_VISIBLE_DEVICES=2 CUDA's device 0 is NVML's 2
    (the caller maps it, e.g. from the device's PCI bus id). `period_s` is the time between
    samples, at least MIN_PERIOD_S.

    Use it as a context manager, or call start() and stop(); then record(). One sample is
    taken at start() and one at stop(), so even a cell shorter than the period gives one
    interval. stop() is idempotent and never raises; __exit__ never swallows the cell's
    exception.
    """

    def __init__(
        self, *, cuda: bool = False, device_index: int = 0, period_s: float = PERIOD_S
    ) -> None:
        if not (isinstance(period_s, (int, float)) and math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"period_s must be a positive number of seconds, got {period_s!r}")
        self.cuda = cuda
        self.device_index = device_index
        self._period_s = max(float(period_s), MIN_PERIOD_S)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = self._stopped = False
        self._notes: list[str] = []
        # Samples, one entry each: the perf_counter_ns stamp, this process's CPU time (ns),
        # each core's cumulative busy seconds, each NVML reading.
        self._stamps = array("q")
        self._process_ns = array("q")
        self._cores: list[array[float]] | None = None
        self._cores_source = ""
        self._read_cores: Callable[[], object] | None = None
        self._parse_cores: Callable[[object], list[float]] | None = None
        self._close_cores: Callable[[], None] | None = None
        # What read_cores returned for the latest samples, parsed in batches (_flush_cores).
        self._pending: list[object] = []
        self._gpu: dict[str, array[float]] = {}
        self._gpu_labels: dict[str, str] = {}
        self._nvml: Any = None
        self._nvml_readers: list[tuple[tuple[str, ...], Callable[[], tuple[float, ...]]]] = []
        # Thread CPU time spent sampling, and the samples it took (to keep under MAX_CPU_SHARE).
        self._cost_ns = 0
        self._cost_samples = 0
        self._wait_now_s = 0.0
        self._halvings = 0

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Take the baseline sample and start the sampling thread. Never raises for a
        failure to sample (it becomes a note); a sampler runs once."""
        if self._started:
            raise RuntimeError("this UtilisationSampler was already started; make a new one")
        self._started = True
        try:
            self._open_cores()
            if self.cuda:
                self._open_nvml()
            self._sample()
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()
        except Exception as exc:  # the cell must run whatever happens here
            self._note(f"utilisation sampling failed to start: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop the thread (waiting for it at most a second or so), take the last sample and
        release NVML. Idempotent; never raises."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        try:
            self._stopping.set()
            thread = self._thread
            if thread is not None:
                thread.join(timeout=max(1.0, 4 * self._period_s))
                if thread.is_alive():
                    self._note(
                        "the sampling thread did not stop within a second; its last "
                        "samples may be missing"
                    )
            if self._stamps:
                self._sample()
            if thread is None or not thread.is_alive():
                self._close_cores_quietly()
            if self._nvml is not None and (thread is None or not thread.is_alive()):
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:
                    self._note(f"NVML shutdown failed: {exc}")
                self._nvml = None
        except Exception as exc:
            self._note(f"stopping the utilisation sampler failed: {type(exc).__name__}: {exc}")

    def __enter__(self) -> UtilisationSampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        """The thread: sample every period until stopped; any error ends sampling with a
        note, never a traceback in the cell's output."""
        try:
            clock = time.thread_time_ns
            while not self._stopping.wait(self._wait_s()):
                t0 = clock()
                self._sample()
                self._cost_ns += clock() - t0
                self._cost_samples += 1
        except BaseException as exc:  # noqa: B036  # a thread's error would print in the cell
            self._note(f"utilisation sampling stopped early: {type(exc).__name__}: {exc}")

    def _wait_s(self) -> float:
        """Return the time to the next sample: the period, or longer where one sample costs
        so much CPU that the period would spend more than MAX_CPU_SHARE of a core."""
        wait = self._period_s
        if self._cost_samples:
            wait = max(wait, self._cost_ns / self._cost_samples / 1e9 / MAX_CPU_SHARE)
        self._wait_now_s = wait
        return wait

    # -- sources ---------------------------------------------------------------------------

    def _note(self, text: str) -> None:
        with self._lock:
            if text not in self._notes:
                self._notes.append(text)

    def _open_cores(self) -> None:
        for source, make in (("proc", _proc_stat_cores), ("psutil", _psutil_cores)):
            try:
                made = make()
                if made is None:
                    continue
                read, parse, self._close_cores = made
                first = parse(read())
            except Exception as exc:
                self._close_cores_quietly()
                self._note(f"per-core CPU utilisation from {source} failed: {exc}")
                continue
            if first:
                self._read_cores, self._parse_cores = read, parse
                self._cores_source = source
                self._cores = [array("d") for _ in first]
                return
            self._close_cores_quietly()
        self._note(
            "per-core CPU utilisation not recorded: psutil is not installed "
            "(pip install psutil) and there is no /proc/stat"
        )

    def _close_cores_quietly(self) -> None:
        close, self._close_cores = self._close_cores, None
        if close is not None:
            try:
                close()
            except OSError:
                pass

    def _open_nvml(self) -> None:
        """Initialise NVML and keep a reader for each counter this GPU answers."""
        try:
            import pynvml
        except ImportError:
            self._note(NVML_MISSING)
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError (no driver, no permission) or OSError
            self._note(f"NVML not available ({exc}): no GPU utilisation recorded")
            return
        self._nvml = pynvml
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:
            self._note(f"NVML has no GPU {self.device_index} ({exc}): no GPU utilisation recorded")
            return
        try:
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            name = ""
        gpu = f"GPU {self.device_index}" + (f" ({name})" if name else "")

        def rates() -> tuple[float, ...]:
            r = pynvml.nvmlDeviceGetUtilizationRates(handle)
            return float(r.gpu), float(r.memory)

        def used() -> tuple[float, ...]:
            return (float(pynvml.nvmlDeviceGetMemoryInfo(handle).used),)

        def power() -> tuple[float, ...]:
            return (pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,)  # mW

        def clock() -> tuple[float, ...]:
            return (float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),)

        for names, read in (
            (("gpu_util", "gpu_mem_util"), rates),
            (("gpu_mem_used",), used),
            (("gpu_power",), power),
            (("gpu_sm_clock",), clock),
        ):
            try:
                read()
            except Exception as exc:  # NVMLError_NotSupported and kin
                self._note(
                    f"{gpu} {', '.join(_GPU_LABELS[n][1] for n in names)} not "
                    f"recorded: NVML says {exc}"
                )
                continue
            self._nvml_readers.append((names, read))
            for n in names:
                self._gpu[n] = array("d")
                self._gpu_labels[n] = f"{gpu} {_GPU_LABELS[n][1]}"

    # -- sampling --------------------------------------------------------------------------

    def _sample(self) -> None:
        """Take one sample of every source; a source that fails is dropped with a note."""
        raw: object = None
        if self._read_cores is not None:
            try:
                raw = self._read_cores()
            except Exception as exc:
                self._drop_cores(f"per-core CPU utilisation stopped: {exc}")
        # The stamp and the process's CPU clock are read together (neither lets go of the
        # GIL), so the process series is exact per interval.
        stamp = time.perf_counter_ns()
        process_ns = time.process_time_ns()
        gpu: list[tuple[tuple[str, ...], tuple[float, ...] | None]] = []
        for names, read in self._nvml_readers:
            try:
                gpu.append((names, read()))
            except Exception as exc:
                gpu.append((names, None))
                self._note(
                    f"GPU {', '.join(_GPU_LABELS[n][1] for n in names)} stopped: NVML says {exc}"
                )
        with self._lock:
            if self._cores is not None:
                self._pending.append(raw)
                if len(self._pending) >= FLUSH_EVERY:
                    self._flush_cores()
            for names, values in gpu:
                if values is None:
                    for n in names:
                        self._gpu.pop(n, None)
                    continue
                for n, v in zip(names, values, strict=True):
                    if n in self._gpu:
                        self._gpu[n].append(v)
            self._nvml_readers = [r for r in self._nvml_readers if r[0][0] in self._gpu]
            self._stamps.append(stamp)
            self._process_ns.append(process_ns)
            if len(self._stamps) >= MAX_SAMPLES and not self._stopping.is_set():
                self._decimate()

    def _flush_cores(self) -> None:
        """Parse the pending per-core readings onto the series. Called with the lock held."""
        pending, self._pending = self._pending, []
        parse = self._parse_cores
        if self._cores is None or parse is None:
            return
        try:
            parsed = [parse(raw) for raw in pending]
        except Exception as exc:
            self._cores = None
            self._read_cores = None
            self._notes.append(f"per-core CPU utilisation left out: {exc}")
            return
        if any(len(values) != len(self._cores) for values in parsed):
            self._cores = None
            self._read_cores = None
            self._notes.append(
                "per-core CPU utilisation left out: the number of CPUs changed during the cell"
            )
            return
        for k, series in enumerate(self._cores):
            series.extend([values[k] for values in parsed])

    def _drop_cores(self, why: str) -> None:
        with self._lock:
            self._cores = None
            self._read_cores = None
            self._pending = []
            self._notes.append(why)

    def _decimate(self) -> None:
        """Keep every other sample (the first among them) and double the period. Called with
        the lock held."""
        self._flush_cores()
        for arr in (self._stamps, self._process_ns, *(self._cores or ()), *self._gpu.values()):
            del arr[1::2]
        self._period_s *= 2
        self._halvings += 1

    # -- the artifact ----------------------------------------------------------------------

    def record(self, to_trace_us: Callable[[int], float]) -> dict[str, Any]:
        """Return the samples as the JSON-able utilisation artifact, times converted from
        perf_counter_ns to trace-clock microseconds with `to_trace_us`:
        {"source", "period_ms", "ts_us" (end of each interval), "series" ({name: {"unit",
        "label", "values"}}), "notes"}. Per-core values are % of the interval busy, "process"
        is CPU seconds per second (cores), NVML readings are the values read at each time."""
        stamps, process, cores, gpu, notes = self._samples()
        n = len(stamps)
        # No share of a core above the cores this process may run on.
        most = float(len(cores) if cores else machine_cores())
        series = _interval_series(stamps, process, cores, most)
        for name, values in gpu.items():
            unit = _GPU_LABELS[name][0]
            series[name] = {
                "unit": unit,
                "label": self._gpu_labels[name],
                "values": [round(v, 2) for v in values[1:]],
            }
        if n < 2:
            notes.append(
                "no utilisation interval recorded: the sampler was not started and stopped"
            )
        period_s = max(self._wait_now_s, self._period_s)
        notes += self._period_notes(period_s)
        parts = [
            p for p in (self._cores_source if cores is not None else "", "nvml" if gpu else "") if p
        ]
        return {
            "source": "+".join(parts) or "process_time",
            "cores": int(most),
            "period_ms": round(period_s * 1e3, 6),
            "ts_us": [float(to_trace_us(s)) for s in stamps[1:]],
            "series": series,
            "notes": notes,
        }

    def _samples(
        self,
    ) -> tuple[list[int], list[int], list[list[float]] | None, dict[str, list[float]], list[str]]:
        """Return copies of (stamps, process CPU ns, per-core series or None, NVML series,
        notes), every series one value per sample, the short last interval merged."""
        with self._lock:
            self._flush_cores()
            stamps = list(self._stamps)
            process = list(self._process_ns)
            cores = [list(c) for c in self._cores] if self._cores is not None else None
            gpu = {n: list(v) for n, v in self._gpu.items()}
            notes = list(self._notes)
        n = len(stamps)
        # Every series has one value per sample; one that fell behind was dropped mid-run.
        gpu = {k: v for k, v in gpu.items() if len(v) == n}
        if cores is not None and any(len(c) != n for c in cores):
            cores = None
        # The interval stop() ends is as short as the cell's tail: microseconds, in which
        # the two clocks' reads (not taken at one instant) can put several cores' worth of
        # CPU time; it is merged into the one before (the counters are cumulative, so the
        # merge is exact) unless it is at least SHORTEST_LAST of a period.
        if n >= 3 and stamps[-1] - stamps[-2] < SHORTEST_LAST * self._period_s * 1e9:
            keep = [i for i in range(n) if i != n - 2]
            stamps = [stamps[i] for i in keep]
            process = [process[i] for i in keep]
            cores = [[c[i] for i in keep] for c in cores] if cores is not None else None
            gpu = {k: [v[i] for i in keep] for k, v in gpu.items()}
        return stamps, process, cores, gpu, notes

    def _period_notes(self, period_s: float) -> list[str]:
        """Return the notes on the period: samples dropped to keep MAX_SAMPLES, or a period
        stretched (to `period_s`) to keep under MAX_CPU_SHARE."""
        notes = []
        if self._halvings:
            notes.append(
                f"every other sample dropped {self._halvings} time(s) to keep at most "
                f"{MAX_SAMPLES:,} samples: the period is now "
                f"{self._period_s * 1e3:.3g} ms"
            )
        if period_s > 1.5 * self._period_s:
            notes.append(
                f"sampled every {period_s * 1e3:.3g} ms, not every "
                f"{self._period_s * 1e3:.3g} ms: one sample takes "
                f"{self._cost_ns / max(self._cost_samples, 1) / 1e3:.3g} us of CPU "
                f"here, and sampling keeps under {MAX_CPU_SHARE:.0%} of a core"
            )
        return notes


def _interval_series(
    stamps: list[int], process: list[int], cores: list[list[float]] | None, most: float
) -> dict[str, dict[str, Any]]:
    """Return the per-interval series: each core's % busy and this process's CPU cores in
    use (at most `most`), from the cumulative counters read at `stamps` (ns)."""
    n = len(stamps)
    walls = [max(stamps[i] - stamps[i - 1], 1) for i in range(1, n)]
    series: dict[str, dict[str, Any]] = {}
    for k, busy in enumerate(cores or ()):
        series[f"cpu{k}"] = {
            "unit": "%",
            "label": f"CPU {k}",
            "values": [
                round(min(max((busy[i] - busy[i - 1]) * 1e11 / walls[i - 1], 0.0), 100.0), 2)
                for i in range(1, n)
            ],
        }
    if n:
        series["process"] = {
            "unit": "cores",
            "label": "this process",
            "values": [
                round(min(max((process[i] - process[i - 1]) / walls[i - 1], 0.0), most), 4)
                for i in range(1, n)
            ],
        }
    return series
