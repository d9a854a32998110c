"""The ladder's rendering: escaping, plots, comparison, and no torch needed to show a report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.ladder import load
from gpuprof_nb.ladder.verdicts import (
    BatchPoint,
    BatchSweep,
    LadderReport,
    RungResult,
    read_three_runs,
)
from gpuprof_nb.render.ladder import (
    comparison_sections,
    fmt_samples,
    ladder_sections,
    plot_batch_sweep,
    plot_rungs,
)


def _rung(name, status, step_us, reason="", peak=1000 * 2**20):
    return RungResult(
        name,
        f"{name} <settings>",
        status,
        reason,
        step_times_us=(step_us, step_us, step_us),
        samples_per_step=32,
        peak_memory_bytes=peak,
        final_loss=0.5,
        loss_drift=0.0,
    )


def _report(label="a", bf16_step_us=500.0):
    rungs = (
        _rung("fp32", "baseline", 1000.0, "reference"),
        _rung("bf16", "kept", bf16_step_us, "<script>alert(1)</script>", peak=600 * 2**20),
        RungResult("compile", "fp32", "skipped", "no <gcc>"),
    )
    return LadderReport(
        rungs=rungs,
        three_run=read_three_runs(32000.0, 64000.0, None),
        device_name="cpu",
        memory_method="tensor bytes at the step peak",
        steps=3,
        warmup=1,
        batch_size=32,
        seed=0,
        loss_tolerance=0.05,
        label=label,
        batch_sweep=BatchSweep(
            "fp32",
            (
                BatchPoint(8, "ok", (100.0, 100.0)),
                BatchPoint(16, "ok", (150.0, 150.0)),
                BatchPoint(32, "oom", error="does not fit"),
            ),
        ),
    )


def test_html_is_escaped_and_text_has_the_same_numbers():
    report = _report()
    sections = ladder_sections(report)
    html = "".join(s.html for s in sections)
    text = "\n".join(s.text for s in sections)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;settings&gt;" in html
    # 32 samples in 1000 us and 500 us: 32,000 and 64,000 samples/s, by hand.
    for shown in ("32,000", "64,000", "2.00x", "0.60x"):
        assert shown in text and shown in html
    assert fmt_samples(80000.0) == "80,000" and fmt_samples(12.345) == "12.3"
    assert [s.title for s in sections] == [
        "Summary",
        "Three-run reading",
        "Rungs",
        "Chart",
        "Batch sweep",
        "Settings",
    ]
    sweep_text = sections[4].text
    assert "80,000" in sweep_text and "107,000" not in sweep_text  # 16 / 150 us = 106,667
    assert "106,667" in sweep_text


def test_plots_take_an_axis_and_return_a_figure():
    from matplotlib.figure import Figure

    report = _report()
    fig = plot_rungs(report)
    assert isinstance(fig, Figure)
    own = Figure()
    ax = own.subplots()
    assert plot_batch_sweep(report.batch_sweep, ax=ax) is own
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "bf16 (kept)" in labels and not any("compile" in x for x in labels)


def test_comparison_across_sessions(tmp_path):
    before = _report("before", bf16_step_us=500.0)
    after = _report("after", bf16_step_us=400.0)
    after.save(tmp_path / "after.json")
    comparison = load(tmp_path / "after.json").compare(before)
    row = next(r for r in comparison.rows if r.name == "bf16")
    assert row.speed_ratio == pytest.approx(500.0 / 400.0)
    text = comparison_sections(comparison)[0].text
    assert "1.25x" in text and "80,000" in text and "64,000" in text
    # bf16's steps went from 500 to 400 us each: faster, beyond the noise.
    assert row.verdict is not None and row.verdict.kind == "faster"
    assert "faster" in text
    assert comparison.this_speedup == pytest.approx(2.5)
    bundle = comparison._repr_mimebundle_()
    assert "1.25x" in bundle["text/html"]


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(GpuprofError, match="not JSON"):
        load(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(GpuprofError, match="not a gpuprof_nb ladder report"):
        load(bad)
    data = _report().to_dict()
    del data["rungs"][0]["status"]
    bad.write_text(json.dumps(data))
    with pytest.raises(GpuprofError, match="missing or has the wrong type"):
        load(bad)
    with pytest.raises(GpuprofError, match="cannot open"):
        load(tmp_path / "absent.json")


def test_reports_load_and_render_without_torch(tmp_path):
    path = _report().save(tmp_path / "r.json")
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'IPython', 'ipywidgets'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from gpuprof_nb.ladder import load\n"
        f"r = load({str(path)!r})\n"
        "b = r._repr_mimebundle_()\n"
        "assert 'Optimisation ladder' in b['text/plain']\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PYTHONPATH": ":".join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
