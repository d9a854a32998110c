"""Recording memory around a function: the CPU profiler fallback live, CUDA where present."""

from __future__ import annotations

import time

import pytest
import torch

from gpuprof_nb.analysis.report import analyze_memory
from gpuprof_nb.capture import device as capture_device
from gpuprof_nb.capture.memory import record_cpu_memory, record_cuda_memory, record_memory
from gpuprof_nb.capture.profiler import profiler_running
from gpuprof_nb.io.snapshot import snapshot_from_dict

N, D, H = 256, 64, 128


def test_cpu_fallback_losses_kept_without_item_show_as_leak() -> None:
    w = torch.randn(D, H, requires_grad=True)
    losses: list[torch.Tensor] = []

    def step() -> None:
        x = torch.randn(N, D)
        loss = (x @ w).relu().sum()
        losses.append(loss)  # no .item(): x and the relu output stay alive with the graph

    capture = record_cpu_memory(step, repeat=3)
    assert capture.source == "cpu-profiler" and len(capture.step_starts) == 3
    report = analyze_memory(snapshot_from_dict(capture.snapshot))
    # Independent: what the graph of one kept loss holds, from shapes and dtypes.
    x_bytes = N * D * 4
    relu_bytes = N * H * 4
    loss_bytes = 4
    per_step = x_bytes + relu_bytes + loss_bytes
    leaks = report.leaks
    assert leaks.growth_bytes_per_step == pytest.approx(per_step)
    assert leaks.left_bytes == 3 * per_step
    growing = {s.site.label: s.bytes for s in leaks.growing_sites}
    # Profiler-made frames carry where a function starts: "step (defined at line L)".
    assert any(
        "step (defined at line" in k and k.endswith("[aten::randn]") and v == x_bytes
        for k, v in growing.items()
    )
    assert any(
        "step (defined at line" in k and k.endswith("[aten::relu]") and v == relu_bytes
        for k, v in growing.items()
    )
    assert all("test_memory_capture.py" in k for k in growing)
    finding = next(f for f in report.findings if f.kind == "memory_growth")
    assert finding.severity == "high" and ".item()" in finding.fix
    # The transient matmul output is live at the peak on top of what was kept.
    assert report.peak_bytes >= 2 * per_step + x_bytes + N * H * 4
    assert not profiler_running()


def test_cpu_fallback_categories_where_available() -> None:
    w = torch.nn.Parameter(torch.randn(D, H))
    opt = torch.optim.Adam([w])

    def step() -> None:
        loss = (torch.randn(N, D) @ w).relu().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    capture = record_cpu_memory(step, repeat=2)
    snap = snapshot_from_dict(capture.snapshot)
    if any("could not categorise" in n for n in capture.notes):
        pytest.skip("this torch's memory profiler could not run")
    assert {"optimizer_state", "gradient"} <= set(snap.categories)


def test_cpu_fallback_exception_propagates_and_profiler_stops() -> None:
    err = ValueError("boom")

    def bad() -> None:
        torch.ones(10)
        raise err

    with pytest.raises(ValueError) as info:
        record_memory(bad, repeat=2)
    assert info.value is err
    assert not profiler_running()
    with pytest.raises(ValueError, match="repeat"):
        record_memory(lambda: None, repeat=0)


@pytest.mark.gpu
def test_cuda_oom_is_captured_and_history_turned_off() -> None:
    free, _total = torch.cuda.mem_get_info()
    keep = torch.empty(1 << 20, device="cuda")

    def oom() -> None:
        torch.empty(free + (1 << 34), dtype=torch.uint8, device="cuda")

    capture = record_cuda_memory(oom)
    assert isinstance(capture.oom, torch.cuda.OutOfMemoryError)
    entries = capture.snapshot["device_traces"][capture.device]
    assert any(e["action"] == "oom" for e in entries)
    report = analyze_memory(snapshot_from_dict(capture.snapshot))
    assert report.findings[0].kind == "oom"
    # Recording is off: new allocations add no history.
    torch.empty(1 << 20, device="cuda")
    after = torch.cuda.memory._snapshot()["device_traces"]
    assert all(len(t) == 0 for t in after)
    del keep


@pytest.mark.gpu
def test_cuda_history_of_a_cpu_only_cell_says_why_it_is_empty() -> None:
    """On a GPU machine a cell of CPU tensors leaves the CUDA history empty; the capture
    says so (the H100 run showed only 'No history recorded (segments only)')."""
    capture = record_cuda_memory(lambda: torch.ones(1000, 1000))
    assert any("made no allocation on cuda" in n for n in capture.notes), capture.notes
    busy = record_cuda_memory(lambda: torch.ones(1000, 1000, device="cuda"))
    assert not any("made no allocation" in n for n in busy.notes)


@pytest.mark.gpu
def test_cuda_history_peak_matches_torch_counter() -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    def work() -> None:
        a = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        b = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        del a, b

    capture = record_cuda_memory(work, repeat=2)
    report = analyze_memory(snapshot_from_dict(capture.snapshot))
    # Independent: the caching allocator's own peak counter over the same window (memory
    # live before recording is in both).
    assert report.peak_bytes == torch.cuda.max_memory_allocated()
    assert len(capture.step_starts) == 2


class FakeCuda:
    """Stands in for torch.cuda's memory-history calls on a machine without CUDA: records
    every call and hands back a fixture snapshot, so the on/off discipline is testable."""

    def __init__(self, snapshot: dict, recording: bool = False) -> None:
        self.calls: list[dict] = []
        self.snapshot = snapshot
        self.recording = recording  # True: the user started a history before the cell

    def record(self, enabled="all", **kwargs) -> None:
        self.calls.append({"enabled": enabled, **kwargs})
        self.recording = enabled is not None

    def take(self) -> dict:
        assert self.recording, "snapshot taken after recording was switched off"
        return self.snapshot


@pytest.fixture
def fake_cuda(monkeypatch, data_dir):
    import pickle

    with open(data_dir / "snapshots" / "oom.pickle", "rb") as f:
        fake = FakeCuda(pickle.load(f))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capture_device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.take)
    # CPU builds of torch lack this probe; CUDA builds have it.
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: fake.recording, raising=False)
    return fake


def test_cuda_path_turns_history_off_on_success(fake_cuda) -> None:
    capture = record_memory(lambda: None, max_entries=1234, stacks="all")
    assert capture.source == "cuda" and capture.oom is None
    first, last = fake_cuda.calls[0], fake_cuda.calls[-1]
    assert first["enabled"] == "all" and first["max_entries"] == 1234
    # Stacks of allocations only: Python stacks at frees broke backward through activation
    # checkpointing on an H100 (capture/memory.py: _start_history).
    assert first["stacks"] == "all" and first["context"] == "alloc"
    assert last == {"enabled": None} and not fake_cuda.recording


def test_cuda_path_returns_oom_with_snapshot_taken_at_it(fake_cuda) -> None:
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")

    def oom() -> None:
        raise err

    capture = record_cuda_memory(oom)
    assert capture.oom is err
    assert capture.snapshot is fake_cuda.snapshot
    assert not fake_cuda.recording


def test_cuda_path_other_errors_propagate_and_history_off(fake_cuda) -> None:
    err = RuntimeError("not memory")

    def bad() -> None:
        raise err

    with pytest.raises(RuntimeError) as info:
        record_cuda_memory(bad)
    assert info.value is err
    assert fake_cuda.calls[-1] == {"enabled": None} and not fake_cuda.recording
    with pytest.raises(ValueError, match="stacks"):
        record_cuda_memory(lambda: None, stacks="cpp")


def test_cuda_repeat_starts_map_to_entry_indices() -> None:
    from gpuprof_nb.capture.memory import _indices_at

    entries = [{"action": "alloc", "time_us": t} for t in (100, 200, 300, 400)]
    snap = {"device_traces": [entries]}
    assert _indices_at(snap, 0, [50, 250, 350]) == (0, 2, 3)
    # A clock that does not match (all starts past the end) gives no steps, not wrong ones.
    assert _indices_at(snap, 0, [10**9, 10**9 + 5]) == ()
    assert _indices_at({"device_traces": [[{"action": "alloc"}]]}, 0, [1, 2]) == ()


def _now_us() -> int:
    return time.time_ns() // 1000


MARK_ADDR = 0x7F00DEAD0000


@pytest.fixture
def users_history(fake_cuda, monkeypatch):
    """The user's own history, recording since before the cell: two old entries (a minute
    ago, from the fixture's frames), one of them an alloc at the address the marker will
    get (freed before the cell); the marker's alloc; then the cell's own entries."""
    import gpuprof_nb.capture.memory as cm

    old = fake_cuda.snapshot["device_traces"][0][:2]
    history = [{**e, "time_us": _now_us() - 60_000_000} for e in old]
    history[0] = {**history[0], "action": "alloc", "addr": MARK_ADDR}
    fake_cuda.snapshot = {**fake_cuda.snapshot, "device_traces": [history]}
    fake_cuda.recording = True

    def marker(device: int) -> tuple[object, int]:
        history.append(
            {
                "action": "alloc",
                "addr": MARK_ADDR,
                "size": 512,
                "stream": 0,
                "frames": [],
                "time_us": _now_us(),
            }
        )
        return object(), MARK_ADDR

    monkeypatch.setattr(cm, "_history_marker", marker)
    return fake_cuda


def _cell_allocates(fake: FakeCuda, size: int):
    def run() -> None:
        fake.snapshot["device_traces"][0].append(
            {
                "action": "alloc",
                "addr": 0x1000,
                "size": size,
                "stream": 0,
                "frames": [],
                "time_us": _now_us(),
            }
        )
        time.sleep(0.002)  # the cell goes on a moment: the next repeat starts on a later us

    return run


def test_users_running_history_is_read_and_left_running(users_history) -> None:
    before = list(users_history.snapshot["device_traces"][0])
    capture = record_memory(_cell_allocates(users_history, 12345), max_entries=99)
    # Never restarted (that would clear the user's buffer and settings), never stopped.
    assert users_history.calls == [] and users_history.recording
    # The report sees only the cell's entries; the user's buffer itself is untouched.
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [12345]
    assert users_history.snapshot["device_traces"][0][:2] == before
    assert any("already being recorded" in n and "left it running" in n for n in capture.notes)
    assert not any("dropped the oldest" in n for n in capture.notes)


def test_users_history_survives_an_oom_and_other_errors(users_history) -> None:
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    alloc = _cell_allocates(users_history, 777)

    def oom() -> None:
        alloc()
        raise err

    capture = record_cuda_memory(oom)
    assert capture.oom is err and users_history.recording and users_history.calls == []
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [777]
    with pytest.raises(RuntimeError, match="not memory"):
        record_cuda_memory(lambda: (_ for _ in ()).throw(RuntimeError("not memory")))
    assert users_history.recording and users_history.calls == []


def test_users_history_is_cut_at_the_marker_not_by_clock(users_history) -> None:
    # Entries from before the cell stamped in the future (a clock that disagrees with ours)
    # are still left out: the cut is the marker's alloc in the allocator's own record.
    for e in users_history.snapshot["device_traces"][0]:
        e["time_us"] = _now_us() + 10**9
    capture = record_cuda_memory(_cell_allocates(users_history, 4242))
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [4242]
    assert any("before the cell are left out" in n for n in capture.notes)


def test_users_history_without_marker_falls_back_to_times(users_history, monkeypatch) -> None:
    import gpuprof_nb.capture.memory as cm

    # The buffer no longer holds the marker (wrapped, or allocs skipped): times decide.
    monkeypatch.setattr(cm, "_history_marker", lambda device: (object(), 0x1234))
    capture = record_cuda_memory(_cell_allocates(users_history, 99))
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [99]

    # Memory so full that the marker cannot be allocated: the cell still runs.
    def no_room(device: int) -> tuple[object, int]:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 512 bytes")

    monkeypatch.setattr(cm, "_history_marker", no_room)
    capture = record_cuda_memory(_cell_allocates(users_history, 98))
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [98]
    assert capture.oom is None and users_history.recording and users_history.calls == []
    # ... and with no times either, every entry is kept and the note says so.
    entries = users_history.snapshot["device_traces"][0]
    for e in entries:
        e.pop("time_us")
    capture = record_cuda_memory(lambda: None)
    assert capture.snapshot["device_traces"][0] == entries
    assert any("before the cell are included" in n for n in capture.notes)


def test_users_history_of_state_only_is_flagged(fake_cuda, monkeypatch) -> None:
    import gpuprof_nb.capture.memory as cm

    # enabled='state' keeps a one-entry buffer: the report warns that allocations are missing.
    monkeypatch.setattr(cm, "_history_marker", lambda device: (object(), 0x1234))
    fake_cuda.snapshot = {**fake_cuda.snapshot, "device_traces": [[]]}
    fake_cuda.recording = True
    capture = record_cuda_memory(lambda: None)
    assert fake_cuda.recording and fake_cuda.calls == []
    assert any("enabled='state'" in n for n in capture.notes)


def test_repeat_starts_index_the_cells_entries_only(users_history) -> None:
    capture = record_cuda_memory(_cell_allocates(users_history, 64), repeat=3)
    assert [e["size"] for e in capture.snapshot["device_traces"][0]] == [64, 64, 64]
    assert capture.step_starts == (0, 1, 2)


def test_torch_without_the_probe_counts_as_not_recording(fake_cuda, monkeypatch) -> None:
    from gpuprof_nb.capture.memory import history_recording

    monkeypatch.delattr(torch._C, "_cuda_isHistoryEnabled", raising=False)
    assert history_recording() is False
    record_cuda_memory(lambda: None)
    assert fake_cuda.calls[0]["enabled"] == "all" and fake_cuda.calls[-1] == {"enabled": None}


@pytest.mark.gpu
def test_cuda_users_history_left_running_with_its_buffer() -> None:
    mib = 1 << 20
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        before = torch.empty(3 * mib, dtype=torch.uint8, device="cuda")

        def work() -> None:
            a = torch.empty(5 * mib, dtype=torch.uint8, device="cuda")
            del a

        capture = record_cuda_memory(work)
        assert torch._C._cuda_isHistoryEnabled()
        sizes = [
            e["size"]
            for e in capture.snapshot["device_traces"][capture.device]
            if e["action"] == "alloc"
        ]
        assert 5 * mib in sizes and 3 * mib not in sizes
        assert any("left it running" in n for n in capture.notes)
        # The user's buffer still holds the allocation from before the cell and keeps
        # recording after it.
        after = torch.empty(7 * mib, dtype=torch.uint8, device="cuda")
        own = torch.cuda.memory._snapshot()["device_traces"][capture.device]
        own_sizes = [e["size"] for e in own if e["action"] == "alloc"]
        assert 3 * mib in own_sizes and 5 * mib in own_sizes and 7 * mib in own_sizes
        del before, after
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
