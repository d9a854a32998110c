"""`gpuprof compare` as a CI job runs it, in a subprocess on real traces: the exit code for
slower, faster, the same code twice, a noisy pair and bad input; its output the same as the
notebook's comparison."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.session.analyze import compare

DATA = Path(__file__).parents[1] / "data"
GLOO = DATA / "gloo_run"
BERT_NAME = "gaunernst_bert-small-uncased__1016001.json.gz"


def _steps_us(path: Path) -> list[float]:
    """ProfilerStep durations read straight from the JSON (the verdict's samples)."""
    raw = path.read_bytes()
    events = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]
    return [
        float(e["dur"])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]


def _one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "error:" in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_planted_slowdown_fails_the_gate_with_the_notebooks_comparison(cli, pair) -> None:
    result = cli("compare", pair["base"], pair["slow"])
    assert result.returncode == 1, result.stdout + result.stderr
    *body, last = result.stdout.rstrip("\n").split("\n")
    assert last.startswith("gpuprof: REGRESSION (exit 1): slower")
    # The printed comparison is the notebook's, byte for byte.
    notebook = compare(
        pair["base"], pair["slow"], before_label="base.json", after_label="slow.json"
    )
    assert "\n".join(body) == notebook.text()
    # Its ratio is the ratio of the median step times in the raw JSON.
    truth = statistics.median(_steps_us(pair["slow"])) / statistics.median(_steps_us(pair["base"]))
    assert notebook.verdict.ratio == pytest.approx(truth, rel=1e-6)
    assert truth > 1.5
    assert f"after takes {notebook.verdict.ratio:.3g}x" in last
    assert result.stderr == ""  # no progress off a terminal


def test_the_same_change_reversed_passes_and_fail_on_any_fails_it(cli, pair) -> None:
    faster = cli("compare", pair["slow"], pair["base"])
    assert faster.returncode == 0, faster.stdout
    assert "gpuprof: PASS (exit 0): faster" in faster.stdout
    strict = cli("compare", pair["slow"], pair["base"], "--fail-on", "any")
    assert strict.returncode == 1 and "--fail-on any" in strict.stdout


def test_a_trace_compared_with_itself_is_never_a_regression(cli, pair) -> None:
    for path in (pair["base"], pair["noisy"], GLOO / "slow_rank1" / "rank-1.json.gz"):
        for extra in ((), ("--threshold", "0%"), ("--fail-on", "any")):
            result = cli("compare", path, path, *extra)
            assert result.returncode == 0, (path, extra, result.stdout[-500:])
            assert "same measurement" in result.stdout


def test_the_same_code_twice_is_not_a_regression(cli, pair) -> None:
    result = cli("compare", pair["base"], pair["again"])
    assert result.returncode in (0, 3), result.stdout[-800:]


def test_noise_that_covers_the_difference_asks_for_a_retry(cli, pair) -> None:
    result = cli("compare", pair["base"], pair["noisy"])
    assert result.returncode == 3, result.stdout[-800:]
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("gpuprof: NOISY (exit 3): the noise covers the difference")
    c = compare(pair["base"], pair["noisy"])
    assert c.verdict.kind == "no clear change" and c.verdict.ci_high > 1.2 > c.verdict.ci_low


def test_real_rank_traces_with_known_truth(cli) -> None:
    # The same 4-rank gloo job, balanced and with rank 1 made slow: every rank's step is
    # 2-3x longer in the slow run (tests/data/gloo_run/README.md).
    balanced, slow = GLOO / "balanced" / "rank-0.json.gz", GLOO / "slow_rank1" / "rank-0.json.gz"
    assert cli("compare", balanced, slow).returncode == 1
    assert cli("compare", slow, balanced).returncode == 0
    # Two ranks of the balanced run: steps that scatter by +-25% around the same pace are
    # never a regression; here the interval reaches 1.2x, so the gate says noisy.
    peers = cli("compare", balanced, GLOO / "balanced" / "rank-2.json.gz")
    assert peers.returncode in (0, 3), peers.stdout[-600:]


def test_a_threshold_and_outputs(cli, pair, tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    result = cli("compare", pair["base"], pair["slow"], "--threshold", "5%", "-o", out)
    assert result.returncode == 1
    record = json.loads(out.read_text())
    assert record["kind"] == "comparison" and record["verdict"]["noise_floor_fraction"] == 0.05
    assert record["verdict"]["samples_from"] == "profiled steps"
    assert result.stdout.strip().startswith("gpuprof: REGRESSION")
    md = tmp_path / "c.md"
    assert cli("compare", pair["base"], pair["slow"], "-o", md).returncode == 1
    assert md.read_text().startswith("### gpuprof_nb before and after")


def test_one_window_traces_are_judged_on_their_ratio(cli) -> None:
    # Traces without steps: one profiled window a side, no samples.
    a, b = DATA / "gpu" / "memory_bound.json.gz", DATA / "gpu" / "memory_bound_no_warmup.json.gz"
    for before, after in ((a, b), (b, a)):
        c = compare(before, after)
        assert c.per == "window" and c.verdict is None
        result = cli("compare", before, after)
        assert "one profiled window" in result.stdout
        assert result.returncode == (1 if 1 / c.speedup > 1.2 else 0), result.stdout[-400:]
        # A 5% threshold leaves a band between it and the 20% a window can drift: noisy.
        strict = cli("compare", before, after, "--threshold", "5%")
        ratio = 1 / c.speedup
        want = 1 if ratio > 1.2 else 3 if ratio > 1.05 else 0
        assert strict.returncode == want


@pytest.mark.parametrize(
    ("make", "needles"),
    [
        (lambda d: d / "missing.json", ("missing.json", "no such file")),
        (lambda d: DATA / "snapshots" / "oom.pickle", ("memory snapshot", "not a profiler trace")),
        (lambda d: _write(d / "bad.json.gz", b"\x1f\x8b" + b"x" * 64), ("bad.json.gz", "gzip")),
        (
            lambda d: _write(
                d / "cut.json.gz", (DATA / "h100_bert_small" / BERT_NAME).read_bytes()[:20000]
            ),
            ("cut.json.gz", "gzip stream ends early"),
        ),
        (lambda d: _write(d / "text.json", b"hello"), ("text.json",)),
        (lambda d: d, ("a directory",)),
        (lambda d: DATA / "memory_timeline_raw" / "memory_timeline.raw.gz", ("not a trace",)),
    ],
)
def test_bad_input_is_exit_2_and_one_line(cli, pair, tmp_path: Path, make, needles) -> None:
    bad = make(tmp_path)
    _one_line_error(cli("compare", bad, pair["base"]), *needles)
    _one_line_error(cli("compare", pair["base"], bad), *needles)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_usage_mistakes_are_exit_2_and_one_line(cli, pair) -> None:
    _one_line_error(cli("compare", pair["base"]), "BEFORE AFTER")
    _one_line_error(cli("compare", pair["base"], pair["slow"], "--threshold", "lots"), "lots")
    _one_line_error(cli("compare", pair["base"], pair["slow"], "--threshold", "-5%"))
    _one_line_error(cli("compare", pair["base"], pair["slow"], "--fail-on", "faster"))
    _one_line_error(cli("compare", pair["base"], "--baseline", "no such name"), "not usable")
    assert cli("nonsense").returncode == 2


def test_help_reads_like_the_readme(cli) -> None:
    top = cli("--help")
    assert top.returncode == 0
    for word in ("report", "compare", "baseline", "exit codes", "noise covers"):
        assert word in top.stdout
    sub = cli("compare", "--help")
    assert sub.returncode == 0 and "--fail-on" in sub.stdout and "--threshold" in sub.stdout
    assert cli("--version").stdout.strip() == f"gpuprof_nb {gpuprof_nb.__version__}"
