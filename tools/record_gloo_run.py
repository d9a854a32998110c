"""Record a real multi-rank training run on CPU: N processes train a small model with
DistributedDataParallel over gloo, each under torch.profiler, and each rank writes its own
trace (rank-<r>.json.gz), as a distributed job's ranks do. One rank can be made slow: each
step it first computes for --slow-ms more (matrix products until that much wall time has
passed, so the delay holds however the processes share the cores), as a straggler with more
work or a slower device would.

    KINETO_LOG_LEVEL=6 .venv/bin/python tools/record_gloo_run.py OUT_DIR
        [--ranks 4] [--steps 8] [--slow-rank 2] [--slow-ms 50] [--batch 512]

The trainer is `train_rank` below: tests and the distributed tutorial import it.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import socket
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_rank(
    rank: int,
    world: int,
    port: int,
    out: str,
    steps: int,
    slow_rank: int,
    slow_ms: float,
    batch: int = 512,
) -> None:
    """One rank: a DDP step per ProfilerStep, profiled; rank `slow_rank` (-1: none) computes
    `slow_ms` more in each step, before its forward."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 256), torch.randn(batch, 256)
    extra_s = slow_ms / 1e3 if rank == slow_rank else 0.0
    a = torch.randn(256, 256)

    def step() -> None:
        opt.zero_grad()
        until = time.perf_counter() + extra_s
        while time.perf_counter() < until:  # the straggler's extra work (no collective)
            torch.mm(a, a)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()

    step()  # warm-up, not profiled
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with record_function(f"ProfilerStep#{i}"):
                step()
    path = Path(out) / f"rank-{rank}.json"
    prof.export_chrome_trace(str(path))
    with open(path, "rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    dist.destroy_process_group()


def record(
    out: Path,
    ranks: int = 4,
    steps: int = 8,
    slow_rank: int = -1,
    slow_ms: float = 50.0,
    batch: int = 512,
) -> list[Path]:
    """Run the job (one process per rank, spawned) and return the traces it wrote."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mp.spawn(
        train_rank,
        args=(ranks, port, str(out), steps, slow_rank, slow_ms, batch),
        nprocs=ranks,
        join=True,
    )
    return sorted(out.glob("rank-*.json.gz"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=50.0)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args(argv)
    for path in record(
        Path(args.out), args.ranks, args.steps, args.slow_rank, args.slow_ms, args.batch
    ):
        print(path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
