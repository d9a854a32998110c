"""Hostile rank sets for analyze_run: FIFOs and directories among the trace files, ranks and
world sizes no run has, a rank whose file was replaced after the run was read, one rank with
a huge number of collective calls, and wrong arguments. Each must give the library's own
error, or a report whose failures name the bad ranks, within the harness's limits."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

from harness import Case

BALANCED = Path(__file__).parents[1] / "data" / "gloo_run" / "balanced"
PRELUDE = "import gpuprof_nb\nfrom concurrent.futures import ThreadPoolExecutor\n"
_ONE_OP = json.dumps(
    {
        "schemaVersion": 1,
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}
        ],
    }
)


def _run(target: str) -> str:
    # Threads: the default process pool would spend seconds starting (the pool path is
    # tested in tests/test_runs.py).
    return (
        f"result = gpuprof_nb.analyze_run({target!r}, executor=ThreadPoolExecutor(2), "
        "progress=False)"
    )


def _copy_ranks(folder: Path) -> None:
    folder.mkdir()
    for f in sorted(BALANCED.glob("rank-*.json.gz")):
        shutil.copy(f, folder / f.name)


def test_bad_files_in_a_rank_set_are_named_never_a_hang(hostile, tmp_path: Path) -> None:
    fifo_set = tmp_path / "fifo"
    _copy_ranks(fifo_set)
    os.mkfifo(fifo_set / "rank-9.json")
    dir_set = tmp_path / "dirs"
    _copy_ranks(dir_set)
    (dir_set / "rank-8.json").mkdir()
    bomb_set = tmp_path / "bomb"
    _copy_ranks(bomb_set)
    with gzip.open(bomb_set / "rank-7.json.gz", "wb") as f:
        f.write(b'{"traceEvents": [' + b" " * (64 << 20))
    fails = "len(result.failures) == 1 and len(result.ranks) == 4"
    cases = [
        Case(
            "fifo-in-set",
            _run(str(fifo_set)),
            "accept",
            check=fails + " and 'FIFO' in result.failures[0]",
        ),
        Case("dir-in-set", _run(str(dir_set)), "accept", check=fails),
        Case(
            "bomb-in-set",
            _run(str(bomb_set)),
            "accept",
            check=fails,
        ),
        Case("fifo-alone", _run(str(fifo_set / "rank-9.json")), "refuse", words="FIFO"),
        Case("empty-dir", _run(str(tmp_path / "nothing")), "refuse"),
    ]
    (tmp_path / "nothing").mkdir()
    hostile(cases, prelude=PRELUDE, seconds=180)


def test_ranks_and_world_sizes_no_run_has_are_refused(hostile, tmp_path: Path) -> None:
    cases = []
    for name, dist in {
        "negative-rank": {"rank": -1},
        "rank-10**12": {"rank": 10**12},
        "rank-past-world": {"rank": 5, "world_size": 4},
        "world-10**12": {"rank": 0, "world_size": 10**12},
        "world-0": {"rank": 0, "world_size": 0},
    }.items():
        folder = tmp_path / name
        folder.mkdir()
        data = json.loads(gzip.decompress((BALANCED / "rank-0.json.gz").read_bytes()))
        data["distributedInfo"] = {**(data.get("distributedInfo") or {}), **dist}
        (folder / "x.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
        cases.append(Case(name, _run(str(folder / "x.json.gz")), "refuse", words="rank"))
    # A rank number of 200 digits in a file name (names are limited to 255 bytes).
    digits = tmp_path / "digits"
    digits.mkdir()
    (digits / ("rank-" + "9" * 200 + ".json")).write_text(_ONE_OP)
    cases.append(Case("rank-digits-in-name", _run(str(digits)), "refuse"))
    hostile(cases, prelude=PRELUDE)


def test_a_replaced_rank_file_is_not_taken_for_the_one_read(hostile, tmp_path) -> None:
    folder = tmp_path / "run"
    _copy_ranks(folder)
    code = f"""
import os, time
run = gpuprof_nb.analyze_run({str(folder)!r}, executor=ThreadPoolExecutor(2), progress=False)
path = {str(folder / "rank-1.json.gz")!r}
with open(path, "ab") as f:
    f.write(b"\\0")
result = run.rank(1)
"""
    cases = [
        Case("replaced", code, "refuse", words="changed since"),
        Case(
            "rank-bad-types",
            f"run = gpuprof_nb.analyze_run({str(BALANCED)!r}, executor=ThreadPoolExecutor(2),"
            " progress=False)\n"
            "for bad in (-1, 10**12, 1.5, 'one', None):\n"
            "    try:\n"
            "        run.rank(bad)\n"
            "    except gpuprof_nb.GpuprofError:\n"
            "        continue\n"
            "    raise AssertionError(bad)\n"
            "result = run.rank(0)",
            "accept",
        ),
    ]
    hostile(cases, prelude=PRELUDE)


def test_a_rank_with_a_huge_number_of_collectives_stays_bounded(hostile, tmp_path) -> None:
    """One rank's collectives are matched up to MAX_MATCHED_CALLS per kind (a note says so)."""
    code = """
from gpuprof_nb.analysis.distributed import MAX_MATCHED_CALLS, combine
from gpuprof_nb.results.distributed import RankSummary
n = MAX_MATCHED_CALLS + 50_000
calls = (("allreduce", tuple(float(i % 7 + 1) for i in range(n))),)
ranks = [
    RankSummary(rank=r, source=f"rank-{r}.json", world_size=4, device="cpu", on_device=False,
                steps=10, median_step_us=1000.0, window_us=1e6, busy_us=5e5, compute_us=4e5,
                comm_us=1e5, exposed_comm_us=5e4, collective_calls=calls)
    for r in range(4)
]
result = combine(ranks)
assert any(f"first {MAX_MATCHED_CALLS:,} are matched" in n for n in result.notes), result.notes
"""
    hostile([Case("huge-rank", code, "accept")], prelude=PRELUDE, memory_mb=1500)


def test_wrong_arguments_are_the_librarys_errors(hostile, tmp_path: Path) -> None:
    shut = "pool = ThreadPoolExecutor(1)\npool.shutdown()\n"
    cases = [
        Case("none", "result = gpuprof_nb.analyze_run(None)", "refuse"),
        Case("number", "result = gpuprof_nb.analyze_run(5)", "refuse"),
        Case("bytes", "result = gpuprof_nb.analyze_run(b'x')", "refuse"),
        Case("list-of-none", "result = gpuprof_nb.analyze_run([None])", "refuse"),
        Case("empty-list", "result = gpuprof_nb.analyze_run([])", "refuse"),
        Case(
            "executor-string",
            f"result = gpuprof_nb.analyze_run({str(BALANCED)!r}, executor='x')",
            "refuse",
            words="executor",
        ),
        Case(
            "executor-shut-down",
            shut + f"result = gpuprof_nb.analyze_run({str(BALANCED)!r}, executor=pool,"
            " progress=False)",
            "refuse",
            words="shut down",
        ),
        Case(
            "progress-string",
            f"result = gpuprof_nb.analyze_run({str(BALANCED)!r}, progress='yes')",
            "refuse",
        ),
        Case("glob-none", f"result = gpuprof_nb.analyze_run({str(tmp_path / '*.zz')!r})", "refuse"),
    ]
    hostile(cases, prelude=PRELUDE)
