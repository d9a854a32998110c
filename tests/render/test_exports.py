"""Exports: to_json (a versioned schema, units in names), to_markdown, and the headline
numbers logged to W&B, MLflow and TensorBoard, each read back with the library's own reader
in a temporary directory, offline. Numbers are checked against the raw trace JSON or the
snapshots' recorded truth."""

from __future__ import annotations

import gzip
import json
import math
import statistics
import struct
from pathlib import Path

import pytest

import gpuprof_nb
from gpuprof_nb.analysis.report import analyze, analyze_memory
from gpuprof_nb.errors import GpuprofError
from gpuprof_nb.io.snapshot import load_snapshot
from gpuprof_nb.io.trace import load_trace

DATA = Path(__file__).parents[1] / "data"
RANK = DATA / "gloo_run" / "balanced" / "rank-0.json.gz"
SLOW = DATA / "gloo_run" / "slow_rank1" / "rank-0.json.gz"
SNAPSHOT = DATA / "snapshots" / "train_time.pickle"


def _raw_steps_us(path: Path) -> list[float]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [
        float(e["dur"])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]


@pytest.fixture(scope="module")
def profile():
    return analyze(load_trace(RANK))


@pytest.fixture(scope="module")
def reports(profile):
    return {
        "profile": profile,
        "memory": analyze_memory(load_snapshot(SNAPSHOT)),
        "run": gpuprof_nb.analyze_run(RANK.parent, progress=False),
        "comparison": gpuprof_nb.compare(RANK, SLOW),
    }


def _units_in_names(headline: dict[str, float]) -> None:
    units = ("_us", "_bytes", "_fraction", "_count", "_ratio", "_ratio_ci_low", "_ratio_ci_high")
    for name, value in headline.items():
        assert name.endswith(units) or name.endswith("_bytes_per_step"), name
        assert isinstance(value, float) and math.isfinite(value), (name, value)


def test_every_report_exports_the_versioned_schema(reports) -> None:
    for kind, report in reports.items():
        text = report.to_json()
        record = json.loads(text)
        assert record["schema"] == "gpuprof_nb.report" and record["schema_version"] == 2
        assert record["kind"] == kind and record["gpuprof_nb_version"] == gpuprof_nb.__version__
        _units_in_names(record["headline"])
        assert record["headline"] == report.headline()
        assert report.to_json() == text  # stable: the same bytes every time
        assert "NaN" not in text and "Infinity" not in text


def test_profile_numbers_match_the_raw_trace(reports, tmp_path: Path) -> None:
    record = reports["profile"].to_dict()
    steps = _raw_steps_us(RANK)
    assert record["headline"]["step_time_us"] == pytest.approx(statistics.median(steps))
    assert record["steps_us"] == pytest.approx(steps)
    assert record["headline"]["steps_count"] == len(steps)
    findings = record["diagnosis"]["findings"]
    for f in findings[:3]:
        assert record["headline"][f"finding/{f['kind']}/share_fraction"] == f["share_fraction"]
        assert 0.0 <= f["share_fraction"] <= 1.0
    written = tmp_path / "out" / "r.json"
    reports["profile"].to_json(written)
    assert json.loads(written.read_text()) == record


def test_memory_and_comparison_numbers(reports) -> None:
    truth = json.loads((DATA / "snapshots" / "expected.json").read_text())["train_time.pickle"]
    memory = reports["memory"].to_dict()
    assert memory["headline"]["peak_memory_bytes"] == truth["true_peak_bytes"]
    comparison = reports["comparison"].to_dict()
    before, after = _raw_steps_us(RANK), _raw_steps_us(SLOW)
    assert comparison["before_time_us"] == pytest.approx(statistics.median(before))
    assert comparison["after_time_us"] == pytest.approx(statistics.median(after))
    assert comparison["verdict"]["kind"] == "slower"
    assert comparison["verdict"]["samples_from"] == "profiled steps"
    assert comparison["headline"]["speedup_ratio"] == pytest.approx(
        statistics.median(before) / statistics.median(after)
    )


def test_markdown_for_a_pull_request(reports, tmp_path: Path) -> None:
    md = reports["profile"].to_markdown(tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == md
    assert md.startswith("### gpuprof_nb profile")
    assert "| `step_time_us` | 29.9 ms |" in md  # 29,875 us, the raw JSON's median step
    assert "<details><summary>Full report</summary>" in md
    assert reports["profile"].text() in md
    c = reports["comparison"].to_markdown()
    assert "**Slower: after takes 2.54x" in c and "| what changed most |" in c
    for report in reports.values():
        assert report.to_markdown().count("```") % 2 == 0
    # Each finding's whole fix, every line of it, comes before the folded full report.
    findings = reports["profile"].diagnosis.findings
    assert findings
    summary = md.split("<details>")[0]
    for f in findings:
        for line in f.fix.strip().splitlines():
            assert f"  {line}".rstrip() in summary, line


def test_tensorboard_scalars_read_back_with_its_event_accumulator(profile, tmp_path) -> None:
    tensorboard = pytest.importorskip("torch.utils.tensorboard", reason="needs tensorboard")
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="needs tensorboard"
    )
    writer = tensorboard.SummaryWriter(str(tmp_path / "tb"))
    written = profile.to_tensorboard(writer, step=7)
    writer.close()
    events = accumulator.EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(written)
    for tag, value in written.items():
        (scalar,) = events.Scalars(tag)
        assert scalar.step == 7 and scalar.value == pytest.approx(value, rel=1e-6)
    assert written["gpuprof/step_time_us"] == profile.headline()["step_time_us"]


def test_mlflow_metrics_read_back_with_its_client(profile, tmp_path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow", reason="needs mlflow (the tracking extra)")
    # mlflow 3 keeps the file store only on request; a database backend needs the full
    # package (SQLAlchemy), which the test extra leaves out.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as run:
            logged = profile.log_to(run, step=3)
        with mlflow.start_run() as second:
            module_logged = profile.log_to(mlflow)
    finally:
        mlflow.set_tracking_uri(None)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert client.get_run(run.info.run_id).data.metrics == pytest.approx(logged)
    history = client.get_metric_history(run.info.run_id, "gpuprof/step_time_us")
    assert [(m.step, m.value) for m in history] == [
        (3, pytest.approx(logged["gpuprof/step_time_us"]))
    ]
    assert client.get_run(second.info.run_id).data.metrics == pytest.approx(module_logged)


def _wandb_records(path: Path):
    """The records of a W&B transaction log (the .wandb file), decoded with W&B's own
    protobuf schema. The file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks
    of chunks (crc32c, length, type) a record may span."""
    from wandb.proto import wandb_internal_pb2

    buf = path.read_bytes()
    assert buf[:4] == b":W&B"
    pos, block, parts = 7, 32768, []
    while pos + 7 <= len(buf):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", buf[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        data = buf[pos + 7 : pos + 7 + length]
        pos += 7 + length
        parts = [data] if kind in (1, 2) else [*parts, data]
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def test_wandb_offline_run_holds_the_headline(profile, tmp_path, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb", reason="needs wandb (the tracking extra)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="gpuprof-test", dir=str(tmp_path))
    try:
        logged = profile.log_to(run, step=5)
    finally:
        run.finish()
        # W&B's service process writes the log; finish() can return before it has (seen: a
        # 7-byte file, header only). Shutting the service down flushes it.
        wandb.teardown()
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = list(_wandb_records(log))
    assert any(r.WhichOneof("record_type") == "exit" for r in records), "the log is unfinished"
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    assert history, "no history record in the run's log"
    # A key is whole in `key`, or split at "/" into `nested_key` (W&B's own choice per key).
    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in history[-1].item}
    assert items["_step"] == 5
    for name, value in logged.items():
        assert items[name] == pytest.approx(value, rel=1e-9)


def test_not_a_tracker_is_a_library_error(profile) -> None:
    with pytest.raises(GpuprofError, match="not a tracker run"):
        profile.log_to(object())
    with pytest.raises(GpuprofError, match="add_scalar"):
        profile.to_tensorboard(object())
    with pytest.raises(GpuprofError, match="step"):
        profile.to_tensorboard(object(), step=-1)
