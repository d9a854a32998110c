"""%%memsnap in-process (IPython.testing.globalipapp) on CPU cells: options and errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from gpuprof_nb.analysis.report import analyze_memory  # noqa: E402
from gpuprof_nb.capture import device as capture_device  # noqa: E402
from gpuprof_nb.capture.profiler import profiler_running  # noqa: E402
from gpuprof_nb.io.snapshot import load_snapshot  # noqa: E402

LEAK_CELL = """\
runs += 1
x = torch.randn(64, 32)
loss = (x @ W).relu().sum()
losses.append(loss)
"""


@pytest.fixture(scope="module")
def ip(ipython_shell):
    shell = ipython_shell
    shell.run_cell("import torch\nW = torch.randn(32, 48, requires_grad=True)")
    return shell


def fresh(ip) -> None:
    ip.user_ns["runs"] = 0
    ip.user_ns["losses"] = []


@pytest.mark.usefixtures("cpu_path")
def test_repeat_o_quiet_and_leak(ip) -> None:
    fresh(ip)
    with capture_output() as out:
        result = ip.run_cell_magic("memsnap", "--repeat 3 -o mem --quiet", LEAK_CELL)
    assert result is None and out.stdout == "" and not out.outputs
    assert ip.user_ns["runs"] == 3 and len(ip.user_ns["losses"]) == 3
    mem = ip.user_ns["mem"]
    # Independent: x (64x32 fp32) and the relu output (64x48 fp32) stay with each kept
    # loss (4 bytes).
    per_step = 64 * 32 * 4 + 64 * 48 * 4 + 4
    assert mem.leaks.growth_bytes_per_step == pytest.approx(per_step)
    assert any(f.kind == "memory_growth" for f in mem.findings)
    assert mem.snapshot.source == "cpu-profiler"
    assert mem.peak_bytes == mem.timeline.peak_bytes > 0
    assert not profiler_running()


@pytest.mark.usefixtures("cpu_path")
def test_display_shows_cpu_note(ip) -> None:
    fresh(ip)
    with capture_output() as out:
        ip.run_cell_magic("memsnap", "", LEAK_CELL)
    assert len(out.outputs) == 1
    data = out.outputs[0].data
    assert "CPU fallback" in data["text/plain"] and "text/html" in data


@pytest.mark.usefixtures("cpu_path")
def test_save_writes_a_loadable_snapshot(ip, tmp_path: Path) -> None:
    fresh(ip)
    path = tmp_path / "snap.pickle"
    with capture_output() as out:
        ip.run_cell_magic("memsnap", f"--save {path} -o mem --quiet", LEAK_CELL)
    assert out.stdout == ""  # --quiet silences the CPU save note too
    loaded = load_snapshot(path)
    mem = ip.user_ns["mem"]
    assert loaded.source == "cpu-profiler"
    assert loaded.trace(0).n_events == mem.snapshot.trace(0).n_events
    assert mem.save(tmp_path / "again.pickle").exists()
    with capture_output() as out:
        ip.run_cell_magic("memsnap", f"--save {tmp_path / 'b.pickle'} --quiet -o m2", "y = 1")
    fresh(ip)
    with capture_output() as out:
        ip.run_cell_magic("memsnap", f"--save {tmp_path / 'c.pickle'}", LEAK_CELL)
    assert "CPU fallback snapshot" in out.stdout


@pytest.mark.usefixtures("cpu_path")
def test_window_in_ms(ip) -> None:
    fresh(ip)
    ip.run_cell_magic("memsnap", "--repeat 2 -o full --quiet", LEAK_CELL)
    full = ip.user_ns["full"].timeline
    # The window's meaning, checked on this run's own snapshot (another run's clock differs).
    cut = float(full.x[len(full.x) // 2])
    windowed = analyze_memory(ip.user_ns["full"].snapshot, window=(cut, None)).timeline
    assert windowed.time_unit == "ms" and windowed.window == (cut, None)
    assert (windowed.x >= cut).all() and windowed.n_events < full.n_events
    # The magic passes --window through (a cut at 0 ms keeps every entry of a new run).
    fresh(ip)
    ip.run_cell_magic("memsnap", "--repeat 2 -o part --quiet --window 0:", LEAK_CELL)
    part = ip.user_ns["part"].timeline
    assert part.time_unit == "ms" and part.window == (0.0, None)


def test_user_exception_propagates_unchanged(ip) -> None:
    ip.user_ns["boom"] = KeyError("mine")
    with pytest.raises(KeyError) as info:
        ip.run_cell_magic("memsnap", "--quiet", "t = torch.ones(8)\nraise boom")
    assert info.value is ip.user_ns["boom"]
    assert not profiler_running()
    assert torch.is_grad_enabled()


def test_grad_mode_restored(ip) -> None:
    ip.run_cell_magic("memsnap", "--quiet", "torch.set_grad_enabled(False)\nz = torch.ones(4)")
    assert torch.is_grad_enabled()


def test_syntax_error_before_running(ip) -> None:
    ip.user_ns["ran"] = False
    with pytest.raises(SyntaxError):
        ip.run_cell_magic("memsnap", "--quiet", "ran = True\ndef (:")
    assert ip.user_ns["ran"] is False


@pytest.mark.parametrize(
    "line, match",
    [
        ("--repeat 0", "at least 1"),
        ("--max-entries 0", "at least 1"),
        ("--stacks cpp", "invalid choice"),
        ("--window 5", "START:END"),
        ("--window 9:3", "before START"),
        ("-o 1bad", "needs a variable name"),
        ("-o None", "keyword"),
        ("-o lambda", "keyword"),
        ("--repeat 100000000000000000000000000000", "at most"),
        ("--max-entries 1000000000000", "at most"),
        ("--bogus", "unrecognized"),
    ],
)
def test_argument_errors(ip, line: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        ip.run_cell_magic("memsnap", line, "x = 1")


def test_empty_cell(ip) -> None:
    with pytest.raises(UsageError, match="empty"):
        ip.run_cell_magic("memsnap", "", "  \n")


def test_help_lists_options(ip) -> None:
    doc = ip.find_cell_magic("memsnap").__doc__
    for opt in ("--max-entries", "--stacks", "--save", "--repeat", "--window", "-o", "--quiet"):
        assert opt in doc


def test_oom_report_shown_then_error_reraised(ip, monkeypatch, data_dir) -> None:
    """With the CUDA history calls faked (no GPU here), an OOM in the cell is reported from
    the snapshot taken at it, stored with -o, and then raised unchanged."""
    import pickle

    with open(data_dir / "snapshots" / "oom.pickle", "rb") as f:
        snapshot = pickle.load(f)
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capture_device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(
        torch.cuda.memory,
        "_record_memory_history",
        lambda enabled="all", **k: calls.append(enabled),
    )
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")
    ip.user_ns["oom_error"] = err
    with capture_output() as out, pytest.raises(torch.cuda.OutOfMemoryError) as info:
        ip.run_cell_magic("memsnap", "-o rep", "raise oom_error")
    assert info.value is err
    assert calls[-1] is None
    assert len(out.outputs) == 1
    text = out.outputs[0].data["text/plain"]
    assert "Out of memory" in text and "Tried to allocate 256.00 MiB" in text
    rep = ip.user_ns["rep"]
    assert rep.findings[0].kind == "oom"
    assert rep.findings[0].evidence["requested_bytes"] == 256 * 2**20


def test_oom_still_propagates_when_save_fails(ip, monkeypatch, data_dir, tmp_path) -> None:
    """A --save that cannot be written must not replace the user's OOM error."""
    import pickle

    with open(data_dir / "snapshots" / "oom.pickle", "rb") as f:
        snapshot = pickle.load(f)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capture_device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    ip.user_ns["oom_error"] = err
    unwritable = tmp_path / "no" / "such" / "dir" / "snap.pickle"
    with capture_output(), pytest.raises(torch.cuda.OutOfMemoryError) as info:
        ip.run_cell_magic("memsnap", f"--quiet --save {unwritable}", "raise oom_error")
    assert info.value is err


def test_users_own_history_left_running_and_noted(ip, monkeypatch, data_dir, tmp_path) -> None:
    """A memory history the user started before the cell is neither restarted nor stopped
    by %%memsnap (CUDA faked), and the report's notes say so; --save writes the cell's
    entries."""
    import pickle
    import time

    with open(data_dir / "snapshots" / "oom.pickle", "rb") as f:
        old = pickle.load(f)["device_traces"][0][:2]
    history = [{**e, "time_us": time.time_ns() // 1000 - 60_000_000} for e in old]
    calls: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capture_device, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: True, raising=False)
    import gpuprof_nb.capture.memory as cm

    def marker(device: int) -> tuple[object, int]:  # its alloc marks where the cell began
        history.append(
            {
                "action": "alloc",
                "addr": 0xABC00,
                "size": 512,
                "stream": 0,
                "frames": [],
                "time_us": time.time_ns() // 1000,
            }
        )
        return object(), 0xABC00

    monkeypatch.setattr(cm, "_history_marker", marker)
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append((a, k))
    )
    monkeypatch.setattr(
        torch.cuda.memory, "_snapshot", lambda: {"segments": [], "device_traces": [history]}
    )
    ip.user_ns["history"] = history
    cell = (
        "history.append({'action': 'alloc', 'addr': 4096, 'size': 5 << 20, 'stream': 0,"
        " 'frames': [], 'time_us': __import__('time').time_ns() // 1000})"
    )
    path = tmp_path / "cell.pickle"
    with capture_output() as out:
        ip.run_cell_magic("memsnap", f"-o rep --save {path}", cell)
    assert calls == []  # the user's recording: not restarted, not switched off
    rep = ip.user_ns["rep"]
    assert any("already being recorded" in n for n in rep.snapshot.notes)
    assert "left it running" in out.outputs[0].data["text/plain"]
    saved = load_snapshot(path)
    assert saved.trace(0).size.tolist() == [5 << 20]


@pytest.mark.gpu
def test_saved_repeat_snapshot_keeps_its_runs(ip, tmp_path) -> None:
    """A --repeat CUDA snapshot saved with --save reads back with its runs: offline, the
    leak across runs is found as it was live (the run boundaries go with the pickle)."""
    path = tmp_path / "leak.pickle"
    ip.user_ns["kept_on_gpu"] = []
    ip.run_cell_magic(
        "memsnap",
        f"--repeat 3 -o m --quiet --save {path}",
        "kept_on_gpu.append(torch.ones(2**20, device='cuda'))",
    )
    live = ip.user_ns["m"]
    offline = analyze_memory(load_snapshot(path))
    ip.user_ns["kept_on_gpu"] = []
    assert len(live.leaks.step_end_bytes) == 3
    assert offline.leaks.step_end_bytes == live.leaks.step_end_bytes
    assert offline.leaks.growth_bytes_per_step == live.leaks.growth_bytes_per_step == 4 * 2**20
    assert [f.kind for f in offline.findings] == [f.kind for f in live.findings]


def test_a_cuda_capture_saved_keeps_its_run_starts(ip, tmp_path) -> None:
    """The CPU side of the GPU test above: a CUDA-source capture with run starts, through
    the session's own report and save steps, reads back with the same starts and leak."""
    import pickle

    from gpuprof_nb.capture.memory import MemoryCapture
    from gpuprof_nb.session.memsnap import run_of_capture, save_run

    data = Path(__file__).parents[1] / "data" / "snapshots" / "leak_steps.pickle"
    with open(data, "rb") as f:
        raw = pickle.load(f)
    starts = (3, 20, 34, 48)  # the fixture's runs (tests/data/snapshots/expected.json)
    raw.get("gpuprof_nb", {}).pop("step_starts", None)  # only the capture says them
    capture = MemoryCapture(snapshot=raw, device=0, source="cuda", step_starts=starts)
    run = run_of_capture(capture)
    live = run.report
    path = tmp_path / "saved.pickle"
    save_run(run, str(path))
    offline = analyze_memory(load_snapshot(path))
    assert load_snapshot(path).step_starts[0] == starts
    assert offline.leaks.step_end_bytes == live.leaks.step_end_bytes
    assert len(live.leaks.step_end_bytes) == 4
