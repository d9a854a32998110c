"""`gpuprof report`, in a subprocess on real traces and snapshots: the notebook's report as
text, standalone HTML, Markdown and JSON; a run's directory read in parallel; progress only
on a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.report import analyze, analyze_memory
from gpuprof_nb.cli import standalone_html
from gpuprof_nb.io.snapshot import load_snapshot
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.render.terminal import Activity, TerminalProgress

DATA = Path(__file__).parents[1] / "data"
BERT = DATA / "h100_bert_small" / "gaunernst_bert-small-uncased__1016001.json.gz"
SNAPSHOT = DATA / "snapshots" / "train_time.pickle"
RUN = DATA / "gloo_run" / "slow_rank1"


def test_text_is_the_notebooks_text(cli) -> None:
    result = cli("report", BERT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == analyze(load_trace(str(BERT))).text() + "\n"
    assert result.stderr == ""


def test_html_is_the_notebooks_html_in_a_page(cli, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = cli("report", BERT, "-o", out)
    assert result.returncode == 0, result.stderr
    page = out.read_text(encoding="utf-8")
    notebook = analyze(load_trace(str(BERT)))._repr_mimebundle_()["text/html"]
    assert page.startswith("<!DOCTYPE html>") and notebook in page
    assert page == standalone_html(
        analyze(load_trace(str(BERT))), "gpuprof_nb profile: " + BERT.name
    )
    assert "<script" not in page


def test_markdown_and_json(cli, tmp_path: Path) -> None:
    report = analyze(load_trace(str(BERT)))
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert cli("report", BERT, "-o", md).returncode == 0
    assert md.read_text() == report.to_markdown()
    assert cli("report", BERT, "-o", js).returncode == 0
    record = json.loads(js.read_text())
    assert record == json.loads(report.to_json())
    assert record["kind"] == "profile" and record["schema_version"] == 2
    printed = cli("report", BERT, "--format", "json")
    assert json.loads(printed.stdout) == record


def test_a_snapshot_gets_the_memory_report(cli) -> None:
    result = cli("report", SNAPSHOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == analyze_memory(load_snapshot(SNAPSHOT)).text() + "\n"


def test_a_directory_gets_the_run_report(cli, tmp_path: Path) -> None:
    notebook = gpuprof_nb.analyze_run(RUN, progress=False)
    for extra in ((), ("--workers", "2")):
        out = tmp_path / "run.json"
        result = cli("report", RUN, "-o", out, *extra)
        assert result.returncode == 0, result.stderr
        record = json.loads(out.read_text())
        assert record["kind"] == "run" and record["stragglers"] == list(notebook.stragglers)
        assert [r["rank"] for r in record["ranks"]] == [r.rank for r in notebook.ranks]
    files = sorted(RUN.glob("*.json.gz"))
    listed = cli("report", *files)
    assert listed.returncode == 0 and listed.stdout == notebook.text() + "\n"


def test_a_dask_scheduler_reads_the_ranks(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    from gpuprof_nb.cli import main

    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        out = io.StringIO()
        code = main(["report", str(RUN), "--scheduler", cluster.scheduler_address, "-q"], out=out)
    assert code == 0
    assert out.getvalue() == gpuprof_nb.analyze_run(RUN, progress=False).text() + "\n"


def test_bad_input_is_exit_2_and_one_line(cli, tmp_path: Path) -> None:
    for args, needle in (
        (("report", tmp_path / "none.json"), "no such file"),
        (("report", tmp_path), "no trace files"),
        (("report", BERT, SNAPSHOT), "memory snapshot among"),
        (("report", BERT, "-o", tmp_path / "r.pdf"), "cannot tell the format"),
        (("report", BERT, "--workers", "0"), "workers"),
    ):
        result = cli(*args)
        assert result.returncode == 2, (args, result.stdout[-300:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_only() -> None:
    tty, pipe = _Terminal(), io.StringIO()
    for stream in (tty, pipe):
        bar = TerminalProgress(3, stream=stream)
        for i in range(3):
            bar.finish(f"rank {i}")
        bar.close()
        with Activity("loading x", stream=stream):
            pass
    assert "3/3 ranks" in tty.getvalue() and "loading x: done" in tty.getvalue()
    assert pipe.getvalue() == ""
    quiet = _Terminal()
    TerminalProgress(2, stream=quiet, enabled=False).finish("x")
    with Activity("y", stream=quiet, enabled=False):
        pass
    assert quiet.getvalue() == ""
