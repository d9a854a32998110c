"""Hostile magic options: counts of 10**30, keywords as -o names, FIFOs and directories as
--trace and --save paths, a --save that fails after the cell ran, labels Kineto writes
wrongly. Each is a UsageError before the cell runs (checked: the cell's counter stays 0), or
a report kept where the error says, under the harness's limits (harness.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import Case

PRELUDE = """
from IPython.testing.globalipapp import start_ipython
from IPython.core.error import UsageError
import torch
torch.set_num_threads(1)
ip = start_ipython()
ip.extension_manager.load_extension("gpuprof_nb")
ip.user_ns["ran"] = 0
ip.user_ns["torch"] = torch
def gp(line, cell="ran += 1"):
    return ip.run_cell_magic("gpuprofile", line, cell)
def mem(line, cell="ran += 1"):
    return ip.run_cell_magic("memsnap", line, cell)
"""


def _refused(name: str, call: str, words: str | None = None) -> Case:
    # Refused before the cell runs: the error, and `ran` still 0.
    code = f"try:\n    {call}\nfinally:\n    assert ip.user_ns['ran'] == 0, 'the cell ran'\n"
    return Case(name, code, "refuse", words=words)


@pytest.mark.slow
def test_options_are_checked_before_the_cell_runs(hostile, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        _refused("repeat-10**30", "gp('--repeat {10**30}')", "at most"),
        _refused("repeat-huge-literal", "gp('--repeat ' + '9' * 40)", "at most"),
        _refused("number-huge", "gp('--number 10000000000')", "at most"),
        _refused("warmup-huge", "gp('--warmup 100000000')", "at most"),
        _refused("top-huge", "gp('--top 100000000000')", "at most"),
        _refused("repeat-zero", "gp('--repeat 0')"),
        _refused("repeat-text", "gp('--repeat many')"),
        _refused("memsnap-repeat-huge", "mem('--repeat ' + '9' * 30)", "at most"),
        _refused("memsnap-entries-huge", "mem('--max-entries 10000000000000')", "at most"),
        _refused("trace-fifo", f"gp('--trace {fifo}')", "FIFO"),
        _refused("trace-dir", f"gp('--trace {tmp_path}')", "directory"),
        _refused("trace-under-file", f"gp('--trace {blocker}/t.json')"),
        _refused("save-fifo", f"mem('--save {fifo}')", "FIFO"),
        _refused("save-dir", f"mem('--save {tmp_path}')", "directory"),
        _refused("baseline-keyword", "gp('--baseline None')", "keyword"),
    ]
    # Will it fit's options (issue 37): sizes past any machine, variables that cannot be.
    ip_ns = "ip.user_ns"
    cases += [
        _refused("budget-1e400", "mem('--budget 1e400GiB')", "at most"),
        _refused("budget-digits", "mem('--budget ' + '9' * 400)"),
        _refused("budget-zero", "mem('--budget 0')"),
        _refused("budget-text", "mem('--budget lots')"),
        _refused("budget-nan", "mem('--budget nan')"),
        _refused("apply-without-budget", "mem('--apply')"),
        _refused("fit-empty", "mem(\"--fit ''\", 'ran += 1; x = b')"),
        _refused("fit-keyword", "mem('--fit class', 'ran += 1')", "keyword"),
        _refused("fit-undefined", "mem('--fit nope', 'ran += 1; x = nope')"),
        _refused(
            "fit-huge-value",
            f"{ip_ns}.__setitem__('b', 10**30) or mem('--fit b', 'ran += 1; x = b')",
            "at most",
        ),
        _refused(
            "fit-float-value",
            f"{ip_ns}.__setitem__('b', 8.0) or mem('--fit b', 'ran += 1; x = b')",
        ),
        _refused("fit-with-repeat", "mem('--fit b --repeat 2', 'ran += 1; x = b')"),
    ]
    for name in ("None", "class", "True", "lambda", "1x", "a-b"):
        cases.append(_refused(f"gp-o-{name}", f"gp('-o {name}')"))
        cases.append(_refused(f"mem-o-{name}", f"mem('-o {name}')"))
    hostile(cases, prelude=PRELUDE, seconds=300)


@pytest.mark.slow
def test_a_failed_save_keeps_the_report_and_labels_survive(hostile, tmp_path: Path) -> None:
    failing = f"""
import gpuprof_nb.io.snapshot as snapshot_io
def full_disk(snapshot, path):
    raise OSError(28, "No space left on device")
snapshot_io.save_snapshot = full_disk
try:
    mem("-o kept --quiet --save {tmp_path / "s.pickle"}", "x = torch.ones(1000); ran += 1")
except UsageError as exc:
    assert "stored in `kept`" in str(exc), exc
else:
    raise AssertionError("no error")
assert ip.user_ns["ran"] == 1
result = ip.user_ns["kept"]
"""
    labels = """
gp("-o r --quiet --repeat 1", '''
with torch.profiler.record_function('say "hi" \\\\\\\\ back'):
    torch.ones(3) + 1
''')
result = ip.user_ns["r"]
"""
    cases = [
        Case("save-fails-after-run", failing, "accept", check="result.snapshot is not None"),
        Case(
            "quoted-label",
            labels,
            "accept",
            check="""'say "hi" \\\\ back' in [o.name for o in result.trace.ops]""",
        ),
    ]
    hostile(cases, prelude=PRELUDE, seconds=300)
