"""Record the CPU snapshots tests/data/fit holds: one training step of a small transformer
language model (2 encoder layers, d=32, vocabulary 256, sequence 16, Adam) through the CPU
fallback with its step record, as `%%memsnap --fit batch_size` records it (a warm-up at 4,
then 4, then 8), and once more at 16 (what the 2x prediction is checked against offline).

    python tools/make_fit_snapshots.py [OUT_DIR]   # default tests/data/fit
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch  # noqa: E402

from gpuprof_nb.capture import memory  # noqa: E402
from gpuprof_nb.capture.batches import record_batch_sizes  # noqa: E402
from gpuprof_nb.io.snapshot import save_snapshot, snapshot_from_dict  # noqa: E402

VOCAB, D, LAYERS, SEQ = 256, 32, 2, 16


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D, 2, 4 * D, dropout=0.0, batch_first=True)
            for _ in range(LAYERS)
        )
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.head(h)
        return out


def main(out_dir: Path) -> None:
    memory.cuda_available = lambda: False  # the CPU fallback even on a GPU machine
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters())
    ns = {"model": model, "opt": opt, "batch_size": 8}

    def step() -> None:
        b = ns["batch_size"]
        x = torch.randint(0, VOCAB, (b, SEQ))
        y = torch.randint(0, VOCAB, (b, SEQ))
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()

    runs = record_batch_sizes(step, ns, "batch_size")
    ns["batch_size"] = 16
    at16 = memory.record_memory(step, namespace=ns)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, capture in (("tiny_b4", runs.other), ("tiny_b8", runs.main), ("tiny_b16", at16)):
        path = save_snapshot(snapshot_from_dict(capture.snapshot), out_dir / f"{name}.pickle")
        print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data/fit"))
