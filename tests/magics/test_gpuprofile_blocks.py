"""%%gpuprofile --number: short cells timed in blocks of back-to-back runs, long ones not;
the cached option parsing and compiled cells stay exact."""

from __future__ import annotations

import linecache
import os

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")

from IPython.core.error import UsageError  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402

from gpuprof_nb.capture.timing import BLOCK_TARGET_US  # noqa: E402


@pytest.fixture(scope="module")
def ip(ipython_shell):
    ipython_shell.run_cell("import time\nimport torch\nruns = 0")
    return ipython_shell


def magic(ip, line: str, cell: str):
    return ip.run_cell_magic("gpuprofile", line, cell)


def test_forced_number_runs_blocks_and_says_so(ip) -> None:
    ip.user_ns["runs"] = 0
    with capture_output() as cap:
        magic(ip, "-o r --timing-only --warmup 1 --repeat 2 --number 5", "runs += 1")
    r = ip.user_ns["r"]
    assert ip.user_ns["runs"] == 1 + 2 * 5  # warm-up, then two blocks of five
    assert r.timing.number == 5 and r.timing.runs == 2 and r.timing.timed_runs == 10
    assert any("each timed sample is 5 back-to-back runs (--number)" in n for n in r.notes)
    # --timing-only prints its text, as %timeit does; the stored report renders both ways.
    assert not cap.outputs
    assert "5 back-to-back runs" in cap.stdout
    # The Summary's runs row says what a sample is, in the printed text and in both bundles.
    assert "2 timed samples of 5 back-to-back runs" in cap.stdout
    bundle = r._repr_mimebundle_()
    assert "2 timed samples of 5 back-to-back runs" in bundle["text/plain"]
    assert "2 timed samples of 5 back-to-back runs" in bundle["text/html"]


def test_short_cell_gets_blocks_automatically(ip, fake_clock) -> None:
    # A 5 us cell: the warm-up run sizes a calibration block of 200 runs (1 ms at its pace),
    # whose pace sizes the samples: 3 blocks of 200 runs, each run 5 us.
    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --timing-only --warmup 1 --repeat 3", "runs += 1\nspend(5)")
    r = ip.user_ns["r"]
    k = r.timing.number
    assert k == BLOCK_TARGET_US / 5 == 200 and r.timing.calibration_runs == 200
    assert ip.user_ns["runs"] == 1 + 200 + 3 * 200 == r.timing.cell_runs
    assert any(
        f"each timed sample is {k:,} back-to-back runs (chosen from a calibration" in n
        for n in r.notes
    )
    # Per run, not per block.
    assert r.timing.wall_us == (5.0, 5.0, 5.0)


def test_long_cell_runs_once_per_sample(ip) -> None:
    # time.sleep never returns early, so every run is over half the block target.
    ip.user_ns.update(runs=0, pause_s=BLOCK_TARGET_US / 1e6)
    magic(ip, "-o r --quiet --warmup 1 --repeat 2", "runs += 1\ntime.sleep(pause_s)")
    r = ip.user_ns["r"]
    assert r.timing.number == 1 and ip.user_ns["runs"] == 1 + 2 + 1
    assert not any("back-to-back" in n for n in r.notes)
    assert min(r.timing.wall_us) >= BLOCK_TARGET_US


def test_cell_changing_grad_mode_is_timed_run_by_run(ip) -> None:
    ip.user_ns["runs"] = 0
    magic(
        ip,
        "-o r --quiet --timing-only --warmup 1 --repeat 3",
        "runs += 1\ntorch.set_grad_enabled(not torch.is_grad_enabled())",
    )
    assert ip.user_ns["r"].timing.number == 1 and ip.user_ns["runs"] == 4
    assert torch.is_grad_enabled()


def test_cell_turning_autocast_on_is_reset_before_every_run(ip) -> None:
    """Only autocast changes (grad mode stays): every run starts with autocast off, as the
    first did."""
    ip.user_ns.update(runs=0, seen=[])
    magic(
        ip,
        "-o r --quiet --timing-only --warmup 2 --repeat 3",
        "runs += 1\nseen.append(torch.is_autocast_enabled('cpu'))\n"
        "torch.set_autocast_enabled('cpu', True)",
    )
    assert ip.user_ns["seen"] == [False] * 5 and ip.user_ns["r"].timing.number == 1
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_dtype_changed_while_off_is_put_back(ip) -> None:
    before = torch.get_autocast_dtype("cpu")
    other = torch.float16 if before != torch.float16 else torch.bfloat16
    ip.user_ns.update(runs=0, other=other)
    magic(
        ip,
        "-o r --quiet --timing-only --warmup 1 --repeat 3",
        "runs += 1\ntorch.set_autocast_dtype('cpu', other)",
    )
    assert torch.get_autocast_dtype("cpu") == before and not torch.is_autocast_enabled("cpu")


def test_a_cell_run_under_autocast_keeps_it_between_runs(ip) -> None:
    """Started with autocast on: a run that turns it off is reset to on before the next,
    and it is on again afterwards."""
    ip.user_ns.update(runs=0, seen=[])
    torch.set_autocast_enabled("cpu", True)
    try:
        magic(
            ip,
            "-o r --quiet --timing-only --warmup 1 --repeat 3",
            "runs += 1\nseen.append(torch.is_autocast_enabled('cpu'))\n"
            "torch.set_autocast_enabled('cpu', False)",
        )
        assert torch.is_autocast_enabled("cpu")
    finally:
        torch.set_autocast_enabled("cpu", False)
    assert ip.user_ns["seen"] == [True] * 4


@pytest.mark.parametrize("line", ["--number 4", ""])
def test_error_inside_a_block_propagates_and_restores_modes(ip, line: str) -> None:
    ip.user_ns.update(runs=0, fail_on=4)  # 1 warm-up, then inside the first block
    cell = (
        "runs += 1\n"
        "if runs == fail_on:\n"
        "    torch.set_grad_enabled(False)\n"
        "    torch.set_autocast_enabled('cpu', True)\n"
        "    raise ArithmeticError('boom at run %d' % runs)\n"
    )
    with pytest.raises(ArithmeticError) as info:
        magic(ip, f"--quiet --timing-only --warmup 1 --repeat 3 {line}", cell)
    assert str(info.value) == "boom at run 4" and ip.user_ns["runs"] == 4
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    tb = info.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert "raise ArithmeticError" in linecache.getline(
        tb.tb_frame.f_code.co_filename, tb.tb_lineno
    )


@pytest.mark.parametrize(
    "line, why",
    [
        ("--number 0", "--number must be 1 or more, got 0"),
        ("--number -3", "--number must be 1 or more, got -3"),
        ("--number 2 --once", "--once runs the cell once"),
        ("--number two", "invalid int value: 'two'"),
    ],
)
def test_bad_number_says_what_and_runs_nothing(ip, line: str, why: str) -> None:
    ip.user_ns["runs"] = 0
    for _ in range(2):  # a bad line is refused every time (never cached as parsed)
        with pytest.raises(UsageError) as info:
            magic(ip, line, "runs += 1")
        assert why in str(info.value) and "usage:" in str(info.value)
    assert ip.user_ns["runs"] == 0


def test_rerun_cell_reports_errors_under_its_own_execution_number(ip) -> None:
    """The compiled cell is reused on a re-run; its traceback must still name this run's
    `In[n]`, in the cell's own lines, inside a function the cell defines too."""
    cell = "def inner():\n    raise LookupError('from inner')\n\ninner()\n"
    names = []
    saved = ip.execution_count
    try:
        for count in (901, 902, 902):
            ip.execution_count = count
            with pytest.raises(LookupError) as info:
                magic(ip, "--quiet --timing-only --number 1", cell)
            tb = info.tb
            while tb.tb_next is not None:
                tb = tb.tb_next
            filename = tb.tb_frame.f_code.co_filename
            names.append(filename)
            assert tb.tb_frame.f_code.co_name == "inner" and tb.tb_lineno == 2
            assert ip.compile.format_code_name(filename) == ("Cell", f"In[{count}]")
            assert "raise LookupError" in linecache.getline(filename, 2)
    finally:
        ip.execution_count = saved
    assert names[0] != names[1] and names[1] == names[2]


def ipykernel_compiler(ip, monkeypatch, record):
    """Give `ip` ipykernel's compiler, calling record(raw_code, number) for every cell name
    it makes."""
    compiler = pytest.importorskip("ipykernel.compiler")

    class Recording(compiler.XCachingCompiler):
        def get_code_name(self, raw_code, code, number):
            record(raw_code, number)
            return super().get_code_name(raw_code, code, number)

    recording = Recording()
    recording.flags = ip.compile.flags
    monkeypatch.setattr(ip, "compile", recording)
    return recording


def test_under_ipykernels_compiler_cells_are_named_from_a_digest(ip, monkeypatch) -> None:
    """ipykernel names a registered cell by a pure-Python hash of its raw code (~0.4 ms for
    3 KB); the magic hands it a short digest instead, and tracebacks still name this run's
    `In[n]` and show the cell's lines."""
    seen: list[str] = []
    recording = ipykernel_compiler(ip, monkeypatch, lambda raw_code, _: seen.append(raw_code))
    big = "runs += 1\n" + "".join(f"v{i} = {i}\n" for i in range(300)) + "raise KeyError('x')\n"
    names = []
    saved = ip.execution_count
    try:
        for count, cell in ((911, big), (912, big), (913, big.replace("v1 ", "w1 "))):
            ip.execution_count = count
            with pytest.raises(KeyError) as info:
                magic(ip, "--quiet --timing-only --number 1", cell)
            filename = info.traceback[-1].frame.code.raw.co_filename
            names.append(filename)
            assert recording.format_code_name(filename) == ("Cell", f"In[{count}]")
            assert "raise KeyError" in linecache.getline(filename, 302)
    finally:
        ip.execution_count = saved
    assert len(big) > 3000 and seen and max(map(len, seen)) < 80
    assert names[0] == names[1] != names[2]


def test_under_ipykernels_compiler_a_rerun_updates_only_its_number(ip, monkeypatch) -> None:
    """ipykernel names a cell by its text alone, so a re-run keeps its file name: the magic
    asks the compiler once whether names hold the execution number, then re-runs only move
    the name to this run's In[n] (no hash), and a function the cell defined, raising in a
    later run, names that run. Lines dropped from linecache are registered again."""
    calls: list[int] = []
    counting = ipykernel_compiler(ip, monkeypatch, lambda _, number: calls.append(number))
    cell = "def boom():\n    raise IndexError('late')\n\nruns += 1\n"
    saved = ip.execution_count
    try:
        names, hashed = [], []
        for count in (931, 932, 933, 934):
            ip.execution_count = count
            if count == 934:
                linecache.clearcache()
            magic(ip, "--quiet --timing-only --warmup 0 --repeat 1 --number 1", cell)
            filename = ip.user_ns["boom"].__code__.co_filename
            names.append(filename)
            hashed.append(len(calls))
            assert counting.format_code_name(filename) == ("Cell", f"In[{count}]")
            assert "raise IndexError" in linecache.getline(filename, 2)
            if count == 933:
                with pytest.raises(IndexError) as info:
                    ip.user_ns["boom"]()
                raised_in = info.traceback[-1].frame.code.raw.co_filename
                assert counting.format_code_name(raised_in) == ("Cell", "In[933]")
    finally:
        ip.execution_count = saved
    assert len(set(names)) == 1
    # First run: hashed once to register; second: the two-call probe; third: nothing;
    # fourth (linecache cleared): registered again.
    assert hashed == [1, 3, 3, 4]


def test_name_keys_are_the_cell_when_short_and_a_digest_when_long() -> None:
    from gpuprof_nb.capture.cell import name_key_of as _name_key

    short = "runs += 1\n"
    assert _name_key(short) == short
    long_a, long_b = "x = 1\n" * 40, "x = 2\n" * 40
    assert len(_name_key(long_a)) == len(_name_key(long_b)) < len(long_a)
    assert _name_key(long_a) != _name_key(long_b) and _name_key(long_a) == _name_key(long_a)
    # A cell whose text is some digest key is not its own key (keys come from cells at least
    # as long as a key), so it cannot take that other cell's name.
    assert _name_key(_name_key(long_a)) != _name_key(long_a)


def test_rerun_cell_sees_new_future_flags(ip) -> None:
    """A `from __future__` import in an earlier cell changes how later cells compile; a cell
    compiled before must not be reused as it was."""
    cell = "def annotated(x: undefined_name) -> None:\n    pass\nnote = annotated.__annotations__\n"
    flags = ip.compile.flags
    try:
        with pytest.raises(NameError):
            magic(ip, "--quiet --timing-only --number 1", cell)
        ip.run_cell("from __future__ import annotations")
        magic(ip, "--quiet --timing-only --number 1", cell)
        assert ip.user_ns["note"]["x"] == "undefined_name"
    finally:
        ip.compile.flags = flags


def test_blocks_leave_no_names_behind_and_run_the_cell_k_times(ip) -> None:
    ip.user_ns.update(runs=0, seen=[])
    before = set(ip.user_ns)
    magic(
        ip,
        "-o r --quiet --timing-only --warmup 1 --repeat 3 --number 7",
        "runs += 1\nseen.append(runs)\nlocal_name = runs * 2",
    )
    assert set(ip.user_ns) - before == {"local_name"}  # r existed before (earlier tests)
    assert ip.user_ns["seen"] == list(range(1, 1 + 1 + 3 * 7))
    assert ip.user_ns["local_name"] == 2 * (1 + 3 * 7)


def test_future_import_cell_is_timed_in_blocks_too(ip) -> None:
    flags = ip.compile.flags
    ip.user_ns["runs"] = 0
    try:
        magic(
            ip,
            "-o r --quiet --timing-only --warmup 1 --repeat 2 --number 3",
            "from __future__ import annotations\nruns += 1",
        )
    finally:
        ip.compile.flags = flags
    assert ip.user_ns["runs"] == 1 + 2 * 3 and ip.user_ns["r"].timing.number == 3


def test_a_report_that_cannot_render_is_shown_as_ipython_shows_any_failing_repr(
    ip, monkeypatch
) -> None:
    """The report's bundle goes straight to the display publisher; if building it fails,
    IPython's own display() handles the object (it prints the error and falls back to
    repr), and the magic itself neither raises nor loses the -o report."""
    from gpuprof_nb.results.report import ProfileReport

    def broken(self, include=None, exclude=None):
        raise RuntimeError("bundle broke")

    monkeypatch.setattr(ProfileReport, "_repr_mimebundle_", broken)
    with capture_output() as cap:
        magic(ip, "-o shown_anyway --number 1 --repeat 1 --warmup 0", "pass")
    assert ip.user_ns["shown_anyway"].timing.runs == 1
    assert "bundle broke" in cap.stdout + cap.stderr
    assert cap.outputs[0].data["text/plain"] == repr(ip.user_ns["shown_anyway"])


def test_a_timing_only_report_that_cannot_render_prints_its_repr_and_why(ip, monkeypatch) -> None:
    from gpuprof_nb.results.report import ProfileReport

    def broken(self):
        raise RuntimeError("text broke")

    monkeypatch.setattr(ProfileReport, "text", broken)
    with capture_output() as cap:
        magic(ip, "-o printed_anyway --timing-only --number 1 --repeat 1", "pass")
    report = ip.user_ns["printed_anyway"]
    assert report.timing.runs == 1
    assert cap.stdout == (
        f"{report!r}\n(the report's text could not be rendered: RuntimeError: text broke)\n"
    )
    assert not cap.outputs


def test_a_slow_first_run_does_not_stop_blocks_for_a_short_cell(ip, fake_clock) -> None:
    # The first run takes 1 ms (a cold start), every later one 2 us: the first timed run
    # shows the cell is short, so it starts a calibration instead of being kept.
    ip.user_ns["runs"] = 0
    magic(
        ip,
        "-o r --quiet --timing-only --warmup 1 --repeat 3",
        "spend(1000 if runs == 0 else 2)\nruns += 1",
    )
    r = ip.user_ns["r"]
    assert r.timing.warmup_wall_us == (1000.0,)  # the cold start, kept apart
    assert r.timing.number == 500 and r.timing.runs == 3
    assert r.timing.wall_us == (2.0, 2.0, 2.0)
    # warm-up, the probe run not kept, the calibration block, three samples.
    assert ip.user_ns["runs"] == 1 + 1 + 500 + 3 * 500 == r.timing.cell_runs


def test_default_warmup_runs_a_short_cell_until_the_budget_and_counts_every_run(
    ip, fake_clock
) -> None:
    """Without --warmup, a short cell warms up for about WARMUP_BUDGET_US; every run the cell
    made is accounted for by the report (warm-up + samples x runs per sample + profiled)."""
    from gpuprof_nb.capture.timing import WARMUP_BUDGET_US

    ip.user_ns["runs"] = 0
    magic(ip, "-o r --quiet --repeat 3", "runs += 1\nspend(7)")
    t = ip.user_ns["r"].timing
    # 714 runs of 7 us make 4998 us, under the 5 ms budget; the 715th passes it.
    assert WARMUP_BUDGET_US == 5000 and len(t.warmup_wall_us) == 715
    assert t.number == 142 and t.wall_us == (7.0, 7.0, 7.0)
    # Every run is accounted for: warm-up + calibration + samples x K, then the profiled run.
    assert ip.user_ns["runs"] == t.cell_runs + 1 == 715 + 142 + 3 * 142 + 1
