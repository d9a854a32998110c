"""Named baselines: `gpuprof baseline save/list/show` and `gpuprof compare --baseline`, in
a subprocess on real traces; the files are readable and hold the verdict's inputs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpuprof_nb.analysis.report import analyze
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.trace import load_trace
from gpuprof_nb.model.timing import TimingStats
from gpuprof_nb.session.analyze import compare
from gpuprof_nb.session.baselines import load_baseline, save_baseline


def test_save_then_gate_on_a_named_baseline(cli, pair, tmp_path: Path) -> None:
    saved = cli("baseline", "save", "main", pair["base"], cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    assert "saved baseline main (8 profiled steps)" in saved.stdout
    where = tmp_path / ".gpuprof" / "baselines"
    record = json.loads((where / "main.json").read_text())
    assert record["schema"] == "gpuprof_nb.baseline" and record["schema_version"] == 1
    assert record["samples_from"] == "profiled steps" and record["per"] == "step"
    steps = [s.dur_us for s in load_trace(pair["base"]).steps]
    assert record["samples_us"] == pytest.approx(steps)
    assert record["headline"]["step_time_us"] == pytest.approx(statistics.median(steps))
    assert (where / "main.trace.json.gz").is_file()

    slower = cli("compare", "--baseline", "main", pair["slow"], cwd=tmp_path)
    assert slower.returncode == 1, slower.stdout[-500:]
    assert "baseline main" in slower.stdout
    same = cli("compare", "--baseline", "main", pair["base"], cwd=tmp_path)
    assert same.returncode == 0 and "same measurement" in same.stdout

    listing = cli("baseline", "list", cwd=tmp_path)
    assert listing.returncode == 0 and listing.stdout.startswith("main\t")
    shown = cli("baseline", "show", "main", cwd=tmp_path)
    assert json.loads(shown.stdout) == record


def test_the_directory_comes_from_the_flag_or_the_environment(cli, pair, tmp_path) -> None:
    flag, env = tmp_path / "flag", tmp_path / "env"
    assert cli("baseline", "save", "a", pair["base"], "--baselines", flag).returncode == 0
    assert (flag / "a.json").is_file()
    assert (
        cli("baseline", "save", "b", pair["base"], env={"GPUPROF_BASELINES": str(env)}).returncode
        == 0
    )
    assert (env / "b.json").is_file()
    assert cli("compare", "--baseline", "a", pair["slow"], "--baselines", flag).returncode == 1
    gate = cli("compare", "--baseline", "b", pair["slow"], env={"GPUPROF_BASELINES": str(env)})
    assert gate.returncode == 1


def test_unknown_and_broken_baselines_are_exit_2_and_one_line(cli, pair, tmp_path) -> None:
    result = cli("compare", "--baseline", "nope", pair["base"], cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "no baseline 'nope'" in result.stderr and "Traceback" not in result.stderr
    where = tmp_path / ".gpuprof" / "baselines"
    where.mkdir(parents=True)
    (where / "bad.json").write_text("{not json")
    broken = cli("compare", "--baseline", "bad", pair["base"], cwd=tmp_path)
    assert broken.returncode == 2 and "cannot read baseline bad" in broken.stderr
    snap = Path(__file__).parents[1] / "data" / "snapshots" / "oom.pickle"
    refused = cli("baseline", "save", "x", snap, cwd=tmp_path)
    assert refused.returncode == 2 and "memory snapshot" in refused.stderr
    assert cli("baseline", "save", "../x", pair["base"], cwd=tmp_path).returncode == 2
    assert not (tmp_path / ".gpuprof" / "x.json").exists()


def test_a_baseline_keeps_timed_samples_and_gives_the_notebooks_verdict(pair, tmp_path) -> None:
    trace = load_trace(pair["base"])
    # What %%gpuprofile measured without the profiler: 5 runs of the 8-step cell.
    before = analyze(
        trace, timing=TimingStats(wall_us=(20e3, 20.4e3, 19.8e3, 20.1e3, 20.2e3), steps_per_run=8)
    )
    after = analyze(
        load_trace(pair["slow"]),
        timing=TimingStats(wall_us=(48e3, 47.5e3, 48.3e3, 48.1e3, 47.9e3), steps_per_run=8),
    )
    path = save_baseline("timed", before, directory=tmp_path)
    record = json.loads(path.read_text())
    assert record["samples_from"] == "timed runs"
    assert record["samples_us"] == pytest.approx([t / 8 for t in before.timing.wall_us])
    assert record["timing"]["wall_us"] == list(before.timing.wall_us)
    again = load_baseline("timed", tmp_path)
    assert again.timing == before.timing
    notebook = compare(before, after)
    from_file = compare(again, after)
    assert from_file.verdict == notebook.verdict and notebook.verdict.kind == "slower"
    assert from_file.samples_from == "timed runs"


def test_bad_names_and_sources_are_library_errors(pair, tmp_path) -> None:
    for name in ("", "../up", ".hidden", "a b", "x" * 101, 3):
        with pytest.raises(GpuprofError, match="baseline name"):
            save_baseline(name, pair["base"], directory=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(GpuprofError, match="a int"):
        save_baseline("ok", 3, directory=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(GpuprofError, match="no baseline 'ok'"):
        load_baseline("ok", tmp_path)
