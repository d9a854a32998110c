"""%%gpuprofile in-process (IPython.testing.globalipapp) on CPU cells."""

from __future__ import annotations

import gzip
import json
import linecache
import os
import statistics

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from gpuprof_nb.capture.profiler import profiler_running  # noqa: E402
from gpuprof_nb.errors import GpuprofError  # noqa: E402
from gpuprof_nb.render.units import fmt_us  # noqa: E402


@pytest.fixture(scope="module")
def ip(ipython_shell):
    """The session's shared shell (conftest), with this module's variables set."""
    ipython_shell.run_cell("import torch\nA = torch.randn(128, 128)\nruns = 0")
    return ipython_shell


def magic(ip, line: str, cell: str):
    return ip.run_cell_magic("gpuprofile", line, cell)


COUNTING_CELL = "runs += 1\nB = A @ A"


@pytest.mark.usefixtures("cpu_path")
def test_default_order_warmup_timed_profiled_and_o_stores(ip) -> None:
    ip.user_ns["runs"] = 0
    assert magic(ip, "-o r --quiet --warmup 2 --repeat 4 --number 1", COUNTING_CELL) is None
    # 2 warm-up + 4 timed + 1 profiled, all in the user namespace.
    assert ip.user_ns["runs"] == 7
    r = ip.user_ns["r"]
    assert len(r.timing.warmup_wall_us) == 2
    assert len(r.timing.wall_us) == 4 and r.timing.number == 1
    assert r.timing.device_us is None  # CPU: wall clock only
    assert r.trace is not None and r.ops is not None
    assert "B" in ip.user_ns
    assert any("CPU mode" in n for n in r.notes)


@pytest.mark.usefixtures("cpu_path")
def test_timing_reports_the_planted_run_times(ip, fake_clock) -> None:
    """Accuracy against torch.utils.benchmark.Timer is measured in benchmarks/ (a timed
    assertion here would fail on a loaded machine); this checks the arithmetic exactly: the
    warm-up is kept apart, each timed run is one sample, the median is the planted one."""
    planted = [5000.0, 2000.0, 2600.0, 1800.0, 2200.0, 2400.0, 9999.0]
    ip.user_ns["planted"] = list(planted)
    magic(ip, "-o r --quiet --warmup 1 --repeat 5", "spend(planted.pop(0))")
    t = ip.user_ns["r"].timing
    assert ip.user_ns["planted"] == []  # 1 warm-up + 5 timed + 1 profiled run
    assert t.warmup_wall_us == (5000.0,)
    assert t.number == 1 and t.calibration_runs == 0
    assert t.wall_us == tuple(planted[1:6])
    assert t.median_us == statistics.median(planted[1:6]) == 2200.0
    assert t.min_us == 1800.0 and t.max_us == 2600.0
    text = ip.user_ns["r"].text()
    assert f"median per run     {fmt_us(2200.0)}" in text


def test_a_fast_cell_is_timed_in_blocks_and_reported_per_run(ip, fake_clock) -> None:
    """A 10 us cell: the automatic warm-up runs until 5 ms are spent, one untimed block
    sizes the samples at about 1 ms, and each sample's time is divided by its runs."""
    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --timing-only", "runs += 1\nspend(10)")
    t = ip.user_ns["r"].timing
    assert len(t.warmup_wall_us) == 500 and set(t.warmup_wall_us) == {10.0}
    assert t.number == 100 and t.calibration_runs == 100
    assert t.wall_us == (10.0, 10.0, 10.0)
    assert ip.user_ns["runs"] == 500 + 100 + 3 * 100 == t.cell_runs


@pytest.mark.usefixtures("cpu_path")
def test_a_cold_first_run_is_reported_apart_from_the_steady_state(ip, fake_clock) -> None:
    """The warm-up's one-off cost (42x the median here) is a Summary line and a one-off
    finding; the headline and the findings are about the runs that follow."""
    ip.user_ns["planted"] = [42_000.0, 1000.0, 1010.0, 990.0, 1000.0]
    magic(ip, "-o r --quiet --warmup 1 --repeat 3 --number 1", "spend(planted.pop(0))")
    r = ip.user_ns["r"]
    d = r.diagnosis
    assert [f.kind for f in d.one_off] == ["cold_start"]
    assert d.one_off[0].evidence["first_over_median_ratio"] == pytest.approx(42.0)
    assert all(f.kind != "cold_start" for f in d.findings)
    assert "cold_start" not in d.verdict and "first run" not in d.verdict
    text = r.text()
    assert "first warm-up run  42 ms (42x the median wall time; a one-off" in text
    assert text.index("One-off costs") > text.index(d.verdict)


def test_a_first_run_within_the_noise_is_no_cold_start(ip, fake_clock) -> None:
    # 2.5x the median, but the timed runs themselves spread over 3x: noise, not a cold start.
    ip.user_ns["planted"] = [2500.0, 1000.0, 3000.0, 900.0, 1000.0]
    magic(ip, "-o r --quiet --warmup 1 --repeat 3 --number 1", "spend(planted.pop(0))")
    d = ip.user_ns["r"].diagnosis
    assert d.one_off == () and d.finding("cold_start").share == 0.0


def test_top_op_is_the_matmul(ip) -> None:
    # 1024x1024 matmuls (~2 GFLOP each, tens of ms on a CPU): a loaded machine that stalls
    # the small relu for 12 ms (seen on a 2-core runner) cannot put it above them.
    ip.user_ns["M"] = torch.randn(1024, 1024)
    magic(ip, "-o r --quiet --repeat 1", "for _ in range(3):\n    P = M @ M\nS = P.relu()")
    r = ip.user_ns["r"]
    assert r.ops.rows[0].name in ("aten::mm", "aten::addmm")
    # Independently: the raw profiler trace holds three aten::mm events.
    mm = [
        e
        for e in r.artifact["traceEvents"]
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"
    ]
    assert len(mm) == 3
    assert r.ops.rows[0].calls == 3


def test_timing_only_has_no_trace(ip) -> None:
    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --timing-only --warmup 0 --repeat 2", COUNTING_CELL)
    r = ip.user_ns["r"]
    assert ip.user_ns["runs"] == 2
    assert r.trace is None and r.ops is None and r.artifact is None
    assert r.timing.runs == 2
    text = r._repr_mimebundle_()["text/plain"]
    assert "Summary" in text and "Top ops" not in text


@pytest.mark.usefixtures("cpu_path")
def test_timing_only_prints_its_text_like_timeit_and_displays_nothing(ip) -> None:
    """A rich display costs ipykernel two synchronous stream flushes; --timing-only prints
    the report's text instead (the stored report still renders as HTML)."""
    with capture_output() as cap:
        magic(ip, "-o r --timing-only --warmup 0 --repeat 2", COUNTING_CELL)
    r = ip.user_ns["r"]
    assert not cap.outputs
    assert cap.stdout == r.text() + "\n" == r._repr_mimebundle_()["text/plain"] + "\n"
    assert f"median per run     {fmt_us(r.timing.median_us)}" in cap.stdout
    assert "--timing-only: no profiler trace was recorded" in cap.stdout
    with capture_output() as cap:
        magic(ip, "-o r --timing-only --quiet --warmup 0 --repeat 2", COUNTING_CELL)
    assert cap.stdout == "" and not cap.outputs


def test_once_runs_the_cell_exactly_once(ip) -> None:
    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --once", COUNTING_CELL)
    r = ip.user_ns["r"]
    assert ip.user_ns["runs"] == 1
    assert r.timing.once and r.timing.runs == 1 and r.timing.profiled
    assert r.trace is not None
    assert any("cold-start" in n for n in r.notes)
    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --once --timing-only", COUNTING_CELL)
    assert ip.user_ns["runs"] == 1
    assert ip.user_ns["r"].timing.once and not ip.user_ns["r"].timing.profiled


def test_trace_option_writes_a_loadable_gzip(ip, tmp_path) -> None:
    from gpuprof_nb import load_trace

    path = tmp_path / "sub" / "t.json.gz"
    magic(ip, f"-o r --quiet --repeat 1 --trace {path}", "P = A @ A")
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(raw))["traceEvents"]
    trace = load_trace(path)
    r = ip.user_ns["r"]
    assert len(trace.ops) == len(r.trace.ops)
    assert any(str(path) in n for n in r.notes)
    # report.save to plain JSON round-trips too.
    plain = r.save(tmp_path / "t.json")
    assert len(load_trace(plain).ops) == len(r.trace.ops)


def test_a_trace_path_that_cannot_be_written_is_refused_before_the_cell_runs(ip, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    ip.user_ns["runs"] = 0
    for path, words in ((blocker / "t.json", "(?i)not a directory"), (fifo, "FIFO")):
        with pytest.raises(UsageError, match=words):
            ip.run_cell_magic("gpuprofile", f"--quiet --trace {path}", "runs += 1")
    assert ip.user_ns["runs"] == 0


def test_a_trace_that_fails_to_write_becomes_a_note_and_keeps_the_report(
    ip, tmp_path, monkeypatch
) -> None:
    import gpuprof_nb.session.profile

    def full_disk(trace: object, path: object) -> None:
        raise GpuprofError(f"cannot write the trace to {path}: No space left on device")

    monkeypatch.setattr(gpuprof_nb.session.profile, "save_trace_dict", full_disk)
    magic(ip, f"-o r --quiet --repeat 1 --trace {tmp_path / 't.json'}", "P = A @ A")
    r = ip.user_ns["r"]
    assert any(n.startswith("trace NOT written") for n in r.notes)
    assert r.trace is not None
    assert r.save(tmp_path / "later.json").is_file()


def test_quiet_displays_nothing_and_default_displays_the_report(ip) -> None:
    with capture_output() as quiet:
        magic(ip, "--quiet --repeat 1", "P = A @ A")
    assert quiet.outputs == [] and quiet.stdout == ""
    with capture_output() as shown:
        magic(ip, "--repeat 1", "P = A @ A")
    assert len(shown.outputs) == 1
    data = shown.outputs[0].data
    assert "Summary" in data["text/plain"] and "Top ops" in data["text/plain"]
    assert "text/html" in data


@pytest.mark.parametrize(
    "line",
    [
        "--bogus",
        "--repeat x",
        "--repeat 0",
        "--warmup -1",
        "--top 0",
        "-o 1abc",
        "--sort nonsense",
        "--timing-only --trace t.json",
        "--once=yes",
        "'unbalanced",
        "--number 0",
        "--number x",
        "--number 2 --once",
    ],
)
def test_bad_options_raise_usage_error_with_usage_and_run_nothing(ip, line: str) -> None:
    ip.user_ns["runs"] = 0
    with pytest.raises(UsageError) as info:
        magic(ip, line, COUNTING_CELL)
    assert "usage:" in str(info.value)
    assert ip.user_ns["runs"] == 0


def test_sort_key_orders_the_table(ip) -> None:
    magic(ip, "-o r --quiet --repeat 1 --sort calls --top 3", "P = A @ A\nQ = (A + 1) * 2")
    r = ip.user_ns["r"]
    assert r.ops.sort_key == "calls" and len(r.ops.rows) <= 3
    calls = [row.calls for row in r.ops.rows]
    assert calls == sorted(calls, reverse=True)


@pytest.mark.parametrize("cell", ["", "   \n\n  "])
def test_empty_cell_is_a_clear_usage_error(ip, cell: str) -> None:
    with pytest.raises(UsageError, match="empty"):
        magic(ip, "", cell)


def test_syntax_error_is_reported_and_nothing_runs(ip) -> None:
    ip.user_ns["runs"] = 0
    with pytest.raises(SyntaxError):
        magic(ip, "", "runs += 1\nfor for in")
    assert ip.user_ns["runs"] == 0


@pytest.mark.parametrize("exc_type", [ZeroDivisionError, KeyboardInterrupt])
@pytest.mark.parametrize("fail_on_run", [1, 3])  # 1: warm-up; 3: the profiled run
def test_raising_cell_propagates_and_leaves_no_state(ip, exc_type, fail_on_run: int) -> None:
    ip.user_ns.update(runs=0, fail_on=fail_on_run, exc_type=exc_type)
    cell = (
        "runs += 1\n"
        "assigned_before = runs\n"
        "torch.set_grad_enabled(False)\n"
        "torch.set_autocast_enabled('cpu', True)\n"
        "if runs == fail_on:\n"
        "    raise exc_type('boom at run %d' % runs)\n"
    )
    assert torch.is_grad_enabled()
    with pytest.raises(exc_type) as info:
        magic(ip, "--quiet --warmup 1 --repeat 1", cell)
    assert str(info.value) == f"boom at run {fail_on_run}"
    assert ip.user_ns["assigned_before"] == fail_on_run
    assert not profiler_running()
    assert torch.is_grad_enabled()
    assert not torch.is_autocast_enabled("cpu")
    # The traceback ends on the user's line in the cell.
    tb = info.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_lineno == 6
    assert "raise exc_type" in linecache.getline(tb.tb_frame.f_code.co_filename, 6)


def test_profiled_run_raising_still_shows_the_finished_timings(ip) -> None:
    ip.user_ns.update(runs=0, fail_on=4)
    cell = "runs += 1\nP = A @ A\nif runs == fail_on:\n    raise KeyboardInterrupt\n"
    with capture_output() as cap, pytest.raises(KeyboardInterrupt):
        magic(ip, "-o partial --warmup 1 --repeat 2 --number 1", cell)
    r = ip.user_ns["partial"]
    assert r.timing.runs == 2 and r.trace is None
    assert r.notes[0].startswith("the profiled run raised KeyboardInterrupt")
    assert len(cap.outputs) == 1 and "median per run" in cap.outputs[0].data["text/plain"]
    assert not profiler_running()


def test_raising_cell_through_run_cell_shows_the_users_error(ip) -> None:
    with capture_output() as cap:
        result = ip.run_cell("%%gpuprofile --quiet\nraise RuntimeError('from the cell')")
    assert isinstance(result.error_in_exec, RuntimeError)
    assert str(result.error_in_exec) == "from the cell"
    assert not profiler_running()
    assert "from the cell" in cap.stdout + cap.stderr


@pytest.mark.usefixtures("cpu_path")
def test_steps_from_profiler_step_annotations(ip) -> None:
    cell = (
        "for i in range(4):\n"
        "    with torch.profiler.record_function(f'ProfilerStep#{i}'):\n"
        "        P = A @ A\n"
    )
    magic(ip, "-o r --quiet --repeat 3", cell)
    r = ip.user_ns["r"]
    assert r.timing.steps_per_run == 4
    assert r.summary.step_count == 4
    assert r.timing.median_step_us == pytest.approx(statistics.median(r.timing.wall_us) / 4)


def test_steps_from_optimizer_annotations_count_every_optimizer_step(ip) -> None:
    ip.run_cell(
        "lin = torch.nn.Linear(16, 4)\nopt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
        "xb = torch.randn(8, 16)"
    )
    cell = "for _ in range(3):\n    opt.zero_grad()\n    lin(xb).sum().backward()\n    opt.step()"
    magic(ip, "-o r --quiet --repeat 1", cell)
    assert ip.user_ns["r"].timing.steps_per_run == 3


@pytest.mark.parametrize("once", ["", "--once"])
def test_cell_with_its_own_profiler_keeps_timings_and_says_why_no_trace(ip, once) -> None:
    cell = "with torch.profiler.profile() as inner_prof:\n    P = A @ A\n"
    magic(ip, f"-o r --quiet --repeat 2 {once}", cell)
    r = ip.user_ns["r"]
    assert r.timing is not None and r.timing.runs == (1 if once else 2)
    assert r.trace is None
    assert any(n.startswith("no trace: the cell runs a torch profiler") for n in r.notes)
    assert not profiler_running()
    assert "inner_prof" in ip.user_ns


def test_help_lists_the_options(ip) -> None:
    doc = ip.find_cell_magic("gpuprofile").__doc__
    for option in (
        "--warmup",
        "--repeat",
        "--number",
        "--once",
        "--timing-only",
        "--stack",
        "--memory",
        "--top",
        "--sort",
        "--trace",
        "-o NAME",
        "--quiet",
    ):
        assert option in doc
    with capture_output() as cap:
        ip.run_cell("%%gpuprofile?")
    assert "--timing-only" in cap.stdout


def test_the_parser_declares_every_option_in_order(ip) -> None:
    """magics/options.py lists the options; the magic's parser, and so its help, holds
    each of them in that order."""
    from gpuprof_nb.magics.options import GPUPROFILE_OPTIONS as OPTIONS

    parser = ip.find_cell_magic("gpuprofile").parser
    declared = [tuple(a.option_strings) for a in parser._actions if a.option_strings]
    assert declared == [flags for flags, _ in OPTIONS]


def test_stack_and_memory_reach_the_profiler(ip) -> None:
    magic(ip, "-o r --quiet --repeat 1 --stack --memory", "P = A @ A")
    r = ip.user_ns["r"]
    assert any(o.stack for o in r.trace.ops)
    assert r.trace.memory


def test_without_torch_a_clear_error_and_nothing_runs(ip, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    ip.user_ns["runs"] = 0
    with pytest.raises(UsageError, match="needs PyTorch.*pip install torch"):
        magic(ip, "", "runs += 1")
    assert ip.user_ns["runs"] == 0


@pytest.mark.gpu
def test_cuda_cell_gets_event_timing_and_a_kernels_table(ip) -> None:
    ip.run_cell("G = torch.randn(2048, 2048, device='cuda')")
    magic(ip, "-o r --quiet --repeat 3", "for _ in range(4):\n    H = G @ G")
    r = ip.user_ns["r"]
    assert r.timing.device_us is not None and len(r.timing.device_us) == 3
    assert r.timing.device_name == torch.cuda.get_device_name()
    assert not any("CPU mode" in n for n in r.notes)
    kernels = [e for e in r.artifact["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) >= 4
    top = r.kernels.rows[0]
    assert top.kind == "kernel" and top.calls >= 4
    assert r.ops.rows[0].name in ("aten::mm", "aten::matmul")
    assert r.ops.sort_key == "self_device_us"
    assert 0 < r.summary.busy_fraction <= 1


def test_option_line_expands_dollar_names_and_braces_as_ipython_does(ip) -> None:
    """The magic skips IPython's variable expansion (a copy of the whole namespace per call)
    unless the line has `$` or `{`; then it expands exactly as IPython would."""
    ip.user_ns.update(runs=0, out_name="expanded_report", n_repeat=2)
    magic(ip, "-o $out_name --quiet --timing-only --warmup 0 --repeat {n_repeat}", COUNTING_CELL)
    assert ip.user_ns["expanded_report"].timing.runs == 2 and ip.user_ns["runs"] == 2
    # Locals of the frame IPython's own expansion reads (two above run_cell_magic: here,
    # since `magic` calls it) count too.
    local_repeat = 3  # noqa: F841
    magic(ip, "-o r --quiet --timing-only --warmup 0 --repeat {local_repeat}", COUNTING_CELL)
    assert ip.user_ns["r"].timing.runs == 3
    # Nothing to expand: the line is parsed as it is (a lone '}' is no placeholder).
    with pytest.raises(UsageError, match="unrecognized arguments: }"):
        magic(ip, "--quiet }", COUNTING_CELL)
