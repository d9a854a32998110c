"""analyze_run: every rank on an executor (a process pool, a Dask cluster, any
concurrent.futures.Executor), the inputs it takes, what it says when they are wrong, and
the report it shows."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import Executor, Future
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.distributed import combine
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.results.report import ProfileReport
from gpuprof_nb.session import distributed as run_session
from gpuprof_nb.session.distributed import summarize_path

GLOO = Path(__file__).parent / "data" / "gloo_run"
SLOW = GLOO / "slow_rank1"
SLOW_RANK = 1


def _same(a, b) -> None:
    """Two RunReports with the same numbers, whatever ran them."""
    assert a.ranks == b.ranks
    assert a.stragglers == b.stragglers
    assert a.collectives == b.collectives
    assert a.diagnosis == b.diagnosis
    assert a.failures == b.failures and a.notes == b.notes


@pytest.fixture(scope="module")
def inline():
    """The run summarised in this process, one rank after another: the reference."""
    return combine([summarize_path(str(p)) for p in sorted(SLOW.glob("*.json.gz"))])


def test_default_pool_over_a_directory(inline):
    report = gpuprof_nb.analyze_run(SLOW, progress=False)
    _same(report, inline)
    assert report.stragglers[0] == SLOW_RANK and report.world_size == 4


def test_a_glob_a_list_and_trace_objects(inline):
    _same(gpuprof_nb.analyze_run(str(SLOW / "rank-*.json.gz"), progress=False), inline)
    paths = sorted(SLOW.glob("*.json.gz"), reverse=True)  # order does not matter
    _same(gpuprof_nb.analyze_run([str(p) for p in paths], progress=False), inline)
    traces = [load_trace(p) for p in paths]
    _same(gpuprof_nb.analyze_run(traces, progress=False), inline)


def test_dask_local_cluster_gives_the_same_numbers(inline):
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        report = gpuprof_nb.analyze_run(SLOW, executor=client.get_executor(), progress=False)
        assert len(client.scheduler_info()["workers"]) == 2
    _same(report, inline)


class _Raising(Executor):
    """An executor whose task for one file fails in the worker itself."""

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        if "rank-2" in str(args[0]):
            future.set_exception(MemoryError("worker ran out of memory"))
        else:
            future.set_result(fn(*args, **kwargs))
        return future


def test_a_worker_failure_is_named_and_the_rest_still_count():
    report = gpuprof_nb.analyze_run(SLOW, executor=_Raising(), progress=False)
    assert [r.rank for r in report.ranks] == [0, 1, 3]
    (failure,) = report.failures
    assert "rank-2.json.gz" in failure and "MemoryError: worker ran out of memory" in failure
    assert any("1 of 4 ranks are missing (2)" in n for n in report.notes)
    assert "Failed:" in report.text() and "rank-2.json.gz" in report.text()


class _Broken(Executor):
    """An executor whose worker processes died: every task fails with BrokenProcessPool."""

    def submit(self, fn, /, *args, **kwargs):
        from concurrent.futures.process import BrokenProcessPool

        future: Future = Future()
        future.set_exception(BrokenProcessPool("a process was terminated abruptly"))
        return future


def test_a_dead_pool_says_what_to_do():
    with pytest.raises(
        GpuprofError,
        match=r"the worker processes died \(BrokenProcessPool\)"
        r".*if __name__ == \"__main__\"",
    ):
        gpuprof_nb.analyze_run(SLOW, executor=_Broken(), progress=False)


def test_an_unreadable_rank_file(tmp_path):
    for p in SLOW.glob("*.json.gz"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "rank-3.json.gz").write_bytes(b"\x1f\x8b not really gzip")
    report = gpuprof_nb.analyze_run(tmp_path, progress=False)
    assert [r.rank for r in report.ranks] == [0, 1, 2]
    assert len(report.failures) == 1 and "rank-3.json.gz" in report.failures[0]
    assert report.stragglers[:1] == (SLOW_RANK,)


def test_bad_inputs_say_what_and_where(tmp_path):
    with pytest.raises(GpuprofError, match="no trace files in this directory"):
        gpuprof_nb.analyze_run(tmp_path, progress=False)
    with pytest.raises(GpuprofError, match="the glob matches no file"):
        gpuprof_nb.analyze_run(str(tmp_path / "rank-*.json"), progress=False)
    with pytest.raises(GpuprofError, match="no such file or directory"):
        gpuprof_nb.analyze_run(str(tmp_path / "nowhere"), progress=False)
    with pytest.raises(GpuprofError, match=r"traces\[1\] is a int"):
        gpuprof_nb.analyze_run([str(SLOW / "rank-0.json.gz"), 3], progress=False)
    with pytest.raises(GpuprofError, match="no traces given"):
        gpuprof_nb.analyze_run([], progress=False)


def test_duplicate_ranks_and_different_runs(tmp_path):
    shutil.copy(SLOW / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    shutil.copy(SLOW / "rank-0.json.gz", tmp_path / "again.json.gz")
    with pytest.raises(GpuprofError, match=re.escape("rank 0 is given twice")) as err:
        gpuprof_nb.analyze_run(tmp_path, progress=False)
    assert "again.json.gz" in str(err.value) and "rank-0.json.gz" in str(err.value)
    nccl = Path(__file__).parent / "data" / "a100_nccl" / "nccl_data.json.gz"  # world size 2
    with pytest.raises(GpuprofError, match="different runs"):
        gpuprof_nb.analyze_run([SLOW / "rank-1.json.gz", nccl], progress=False)


def test_rank_loads_its_full_report_again():
    report = gpuprof_nb.analyze_run(SLOW, progress=False)
    one = report.rank(SLOW_RANK)
    assert isinstance(one, ProfileReport)
    assert one.trace.source.endswith("rank-1.json.gz")
    with pytest.raises(GpuprofError, match=r"rank 7 is not in this run \(ranks read: 0, 1, 2, 3\)"):
        report.rank(7)


def test_progress_bar_over_ranks_in_a_kernel(live_display, monkeypatch):
    shown, updates = live_display.shown, live_display.updates
    monkeypatch.setattr(run_session, "live_kernel", lambda: True)
    gpuprof_nb.analyze_run(SLOW, executor=_Raising())
    assert len(shown) == 1  # the bar
    assert [u.data for u in updates] == ["ranks: 4/4 ranks done"]
    shown.clear()
    gpuprof_nb.analyze_run(SLOW, executor=_Raising(), progress=False)
    assert shown == []


def test_the_report_shows_tabs_and_text():
    report = gpuprof_nb.analyze_run(SLOW, progress=False)
    bundle = report._repr_mimebundle_()
    html, text = bundle["text/html"], bundle["text/plain"]
    for tab in ("Diagnosis", "Ranks", "Collectives", "Summary"):
        assert f">{tab}<" in html and f"-- {tab} --" in text
    # The heatmap: one cell per rank and step, each with its number on hover.
    cells = re.findall(r"<title>rank (\d+), step (\d+): compute ([^<]+)</title>", html)
    assert len(cells) == sum(len(steps) for _, steps in report.step_compute_us) == 4 * 8
    assert "1 (straggler)" in text and "Rank 1 holds the others back" in text
    assert repr(report).startswith("<RunReport 4 ranks, stragglers: 1")
