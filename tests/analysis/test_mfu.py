"""Model FLOPs utilisation against counts made by hand: exact FLOPs on matmul stacks, the
6*N*T + attention estimate on a small GPT trained one step, HFU beside MFU under
activation checkpointing, real H100 recordings, and never an impossible value."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("KINETO_LOG_LEVEL", "6")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpuprof_nb import load_trace  # noqa: E402
from gpuprof_nb.analysis.report import analyze  # noqa: E402
from gpuprof_nb.capture.modules import ModuleRecorder  # noqa: E402
from gpuprof_nb.capture.profiler import profile_cell  # noqa: E402
from gpuprof_nb.io.trace import trace_from_dict  # noqa: E402
from gpuprof_nb.model.device import DeviceSpec  # noqa: E402
from gpuprof_nb.model.timing import TimingStats  # noqa: E402

DATA = Path(__file__).parent.parent / "data"
# A peak above what any CPU reaches (a 16-core GPU host beat 200 GFLOP/s): MFU must stay
# at most 1 for these tests' cells wherever they run.
CPU = DeviceSpec(
    name="a CPU measured by hand",
    kind="cpu",
    fp32_flops_per_s=50e12,
    bandwidth_bytes_per_s=20e9,
    source="test",
    measured=True,
)


def window_us(artifact: dict) -> float:
    """The recorded work's span, from the raw events (the profiler's own span left out)."""
    spans = [
        (e["ts"], e["ts"] + e["dur"])
        for e in artifact["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("cpu_op", "user_annotation")
        and not str(e.get("name")).startswith("PyTorch Profiler")
    ]
    return max(b for _, b in spans) - min(a for a, _ in spans)


def matmul_stack(n: int = 4, m: int = 128, k: int = 256) -> tuple[dict, int]:
    torch.manual_seed(0)
    weights = [torch.randn(k, k) for _ in range(n)]
    x = torch.randn(m, k)

    def cell() -> None:
        y = x
        for w in weights:
            y = y @ w

    return profile_cell(cell, cuda=False), n * 2 * m * k * k


def test_matmul_stack_mfu_is_the_hand_count_over_the_window_and_the_peak() -> None:
    artifact, flops = matmul_stack()
    report = analyze(trace_from_dict(artifact), CPU)
    m = report.mfu
    assert m is not None and not m.on_device
    assert m.model_flops_per_step == flops == m.hardware_flops_per_step
    assert m.step_us == pytest.approx(window_us(artifact))
    assert m.roof == "fp32" and m.peak_flops_per_s == CPU.fp32_flops_per_s and m.measured_peak
    assert m.mfu == pytest.approx(flops / (m.step_us * 1e-6) / CPU.fp32_flops_per_s)
    assert m.hfu is None and m.unformulated_share == pytest.approx(0.0, abs=0.02)
    assert "CPU run" in " ".join(m.notes)


def test_timed_runs_set_the_step_and_steps_per_run_divide_the_flops() -> None:
    artifact, flops = matmul_stack()
    timing = TimingStats(wall_us=(2000.0, 2100.0, 2200.0), steps_per_run=2)
    m = analyze(trace_from_dict(artifact), CPU, timing=timing).mfu
    assert m is not None
    assert m.step_us == pytest.approx(1050.0)  # median run 2100 us over 2 steps
    assert m.model_flops_per_step == flops / 2
    assert m.mfu == pytest.approx((flops / 2) / 1050e-6 / CPU.fp32_flops_per_s)
    assert "timed runs" in m.step_source


def test_cpu_without_measured_ceilings_says_what_mfu_would_need() -> None:
    artifact, _ = matmul_stack()
    m = analyze(trace_from_dict(artifact)).mfu
    assert m is not None and m.mfu is None and m.peak_flops_per_s is None
    assert any("measure_ceilings()" in n and n.startswith("no MFU") for n in m.notes)


def test_a_peak_below_the_achieved_rate_is_never_shown_as_mfu() -> None:
    artifact, _ = matmul_stack()
    tiny = DeviceSpec(name="too low", kind="cpu", fp32_flops_per_s=1e6, bandwidth_bytes_per_s=1e6)
    m = analyze(trace_from_dict(artifact), tiny).mfu
    assert m is not None and m.mfu is None and m.hfu is None
    assert any("cannot be" in n for n in m.notes)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(x).split(d, 2)
        )
        a = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, ckpt: bool) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.ckpt = ckpt

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            if self.ckpt:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln(x))


def gpt_step(ckpt: bool) -> tuple[object, GPT, tuple[int, int, int, int]]:
    torch.manual_seed(0)
    vocab, d, heads, layers, seq, batch = 512, 256, 4, 4, 128, 4
    model = GPT(vocab, d, heads, layers, seq, ckpt)
    ids = torch.randint(0, vocab, (batch, seq))

    def step() -> None:
        model(ids).logsumexp(-1).mean().backward()

    step()
    artifact = profile_cell(
        step, cuda=False, samplers=[("modules", ModuleRecorder({"model": model}))]
    )
    return trace_from_dict(artifact), model, (d, layers, seq, batch)


def test_transformer_flops_agree_with_6NT_plus_attention_within_the_unformulated_share() -> None:
    trace, model, (d, layers, seq, batch) = gpt_step(ckpt=False)
    m = analyze(trace, CPU).mfu
    assert m is not None
    # N: the weight matrices (no embeddings, biases or norms), as 6*N*T counts them.
    n = sum(
        p.numel()
        for name, p in model.named_parameters()
        if name.endswith("weight") and p.dim() == 2 and not name.startswith(("tok", "pos"))
    )
    tokens = batch * seq
    # Attention: QK^T and AV, 2*2*seq*d FLOPs a token a layer forward, x3 with backward.
    estimate = 6 * n * tokens + 12 * layers * d * seq * tokens
    assert abs(m.model_flops_per_step - estimate) / estimate <= max(m.unformulated_share, 0.01)
    # The tokens the root module took: batch x seq a step.
    assert m.tokens_per_s == pytest.approx(tokens / (m.step_us * 1e-6))
    assert m.samples_per_s == pytest.approx(batch / (m.step_us * 1e-6))


def test_checkpointing_puts_hfu_beside_mfu_with_the_recomputed_forward() -> None:
    plain, _, _ = gpt_step(ckpt=False)
    ckpt, model, (d, layers, seq, batch) = gpt_step(ckpt=True)
    m_plain = analyze(plain, CPU).mfu
    m = analyze(ckpt, CPU).mfu
    assert m_plain is not None and m is not None and m.hfu is not None and m.mfu is not None
    # Recompute is the blocks' forward again: per layer, the four Linear layers (2*tokens*
    # in*out each) and the attention's two matmuls (2*2*seq*d a token).
    tokens = batch * seq
    linear = 2 * tokens * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)
    attention = 4 * seq * d * tokens
    expected = layers * (linear + attention)
    assert m.recompute_flops_per_step == pytest.approx(expected, rel=0.03)
    # Model FLOPs do not change with checkpointing; hardware FLOPs gain the recompute.
    assert m.model_flops_per_step == pytest.approx(m_plain.model_flops_per_step, rel=0.02)
    assert m.hfu / m.mfu == pytest.approx(m.hardware_flops_per_step / m.model_flops_per_step)


def test_h100_matmuls_mfu_against_the_datasheet_bf16_peak() -> None:
    trace = load_trace(DATA / "gpu" / "compute_bound.json.gz")
    report = analyze(trace)
    m = report.mfu
    assert m is not None and m.on_device and m.roof == "bf16" and not m.measured_peak
    mm = [o for o in trace.ops if o.name == "aten::mm"]
    n = mm[0].input_dims[0][0]  # type: ignore[index]
    assert m.model_flops_per_step == len(mm) * 2 * n**3
    assert m.peak_flops_per_s == pytest.approx(989.5e12, rel=0.01)
    assert 0 < m.mfu <= 1  # type: ignore[operator]
    assert m.mfu == pytest.approx(m.model_flops_per_step / (m.step_us * 1e-6) / m.peak_flops_per_s)
    text = report.text()
    summary = text[text.index("-- Summary --") :]
    assert summary.splitlines()[2].startswith("MFU")  # a GPU run leads with it


def test_a_measured_ceiling_the_step_beats_gives_way_to_the_datasheet() -> None:
    # Seen on an H100: 4096^2 bf16 matmuls ran at 1.05x what measure_ceilings() had measured
    # (8192^2, throttled). MFU is then against the datasheet's peak, and says why.
    trace = load_trace(DATA / "gpu" / "compute_bound.json.gz")
    sheet = analyze(trace).mfu
    assert sheet is not None and sheet.mfu is not None and not sheet.measured_peak
    name = sheet.peak_source.split(": ", 1)[1].split(" (")[0]
    low = DeviceSpec(
        name=name,
        kind="cuda",
        fp32_flops_per_s=1e12,
        bandwidth_bytes_per_s=1e12,
        tf32_flops_per_s=1e12,
        fp16_flops_per_s=1e12,
        bf16_flops_per_s=sheet.mfu * 989.5e12 / 2,  # half of what the step reached
        fp64_flops_per_s=1e12,
        memory_bytes=80 * 2**30,
        source="measured here",
        measured=True,
    )
    m = analyze(trace, low).mfu
    assert m is not None and not m.measured_peak and m.peak_source.startswith("datasheet")
    assert m.mfu == pytest.approx(sheet.mfu, rel=1e-9)
    assert any("too low for it" in n for n in m.notes)
    # An unknown GPU has no datasheet to fall back to: no MFU, never one above 1.
    unknown = DeviceSpec(**{**_fields(low), "name": "Mystery Accelerator 9000"})
    m = analyze(trace, unknown).mfu
    assert m is not None and m.mfu is None and any("cannot be" in n for n in m.notes)


def _fields(spec: DeviceSpec) -> dict[str, object]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}
