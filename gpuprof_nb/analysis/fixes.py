"""What to change, in words and code, for every finding kind: one catalogue for the
diagnosis (GPU programs, CPU programs) and the memory analysis. The rules say what they
found; the fix for a kind is looked up here."""

from __future__ import annotations

from gpuprof_nb.results.diagnosis import FindingKind

FIXES: dict[FindingKind, str] = {
    "dataloader": (
        "Load batches in worker processes and overlap the copy with compute:\n"
        "loader = DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True,\n"
        "                    persistent_workers=True, prefetch_factor=4)\n"
        "x = x.to(device, non_blocking=True)"
    ),
    "host_sync": (
        "Keep values on the device and read them rarely: log every N steps instead of\n"
        "calling .item() / .cpu() / print(tensor) each step:\n"
        "if step % 50 == 0:\n"
        "    print(loss.item())\n"
        "and drop explicit torch.cuda.synchronize() calls from the loop."
    ),
    "launch_overhead": (
        "Fuse the many small ops into few kernels and cut launch cost:\n"
        "model = torch.compile(model)                         # fusion\n"
        'model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs, static shapes\n'
        "opt = torch.optim.AdamW(model.parameters(), fused=True)\n"
        "or give each op more work: a larger batch, vectorised code instead of Python loops."
    ),
    "python_overhead": (
        "Move work out of Python: vectorise loops over elements or samples into tensor ops,\n"
        "precompute what does not change per step, and compile the step:\n"
        "step = torch.compile(step)"
    ),
    "memory_bound": (
        "Fuse elementwise, normalisation and softmax chains so tensors are read once:\n"
        "model = torch.compile(model)\n"
        "use fused kernels (F.scaled_dot_product_attention, fused optimizers), and bf16\n"
        'to halve the bytes moved: with torch.autocast("cuda", dtype=torch.bfloat16): ...'
    ),
    "compute_bound": (
        "Time already goes to large matmuls/convolutions. Next steps: lower precision on\n"
        'tensor cores (with torch.autocast("cuda", dtype=torch.bfloat16): ...), keep\n'
        "dimensions multiples of 8, or faster hardware."
    ),
    "precision": (
        "Run matmuls and convolutions in bf16 on tensor cores:\n"
        'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
        "    loss = model(x).loss\n"
        'or at least allow TF32: torch.set_float32_matmul_precision("high")'
    ),
    "dtype_cast": (
        "Cast once, not every step: convert inputs and weights to the working dtype up front\n"
        "(model.to(dtype=torch.bfloat16) or torch.autocast), and avoid .float()/.half()\n"
        "round-trips inside the loop."
    ),
    "host_device_copy": (
        "Keep data on the device, and copy from pinned memory without blocking:\n"
        "loader = DataLoader(dataset, ..., pin_memory=True)\n"
        "x = x.to(device, non_blocking=True)\n"
        "(or x = x.pin_memory().to(device, non_blocking=True))"
    ),
    "communication": (
        "Overlap collectives with compute and communicate less often:\n"
        "model = DDP(model, bucket_cap_mb=25, gradient_as_bucket_view=True)\n"
        "accumulate gradients over k micro-batches (with model.no_sync(): ...) and step once,\n"
        "or shard with FSDP."
    ),
    "cold_start": (
        "A one-off: the first run pays for lazy initialisation (CUDA context, library\n"
        "handles), first allocations and autotuning or compilation; later runs do not.\n"
        "It matters when this code runs only a few times per process (short jobs, a fresh\n"
        "server): keep models and compiled functions alive and reuse them, warm up once at\n"
        "start-up with a representative input, and set torch.backends.cudnn.benchmark only\n"
        "for fixed input shapes."
    ),
    "recompilation": (
        "Stop shapes or Python values from changing between calls, or mark them dynamic:\n"
        "model = torch.compile(model, dynamic=True)\n"
        "pad inputs to a few bucket sizes; see why with TORCH_LOGS=recompiles."
    ),
    "straggler": (
        "One rank holds the others back at every collective. Find what it does more of: open\n"
        "its own report (run.rank(n)) and compare it with a fast rank's\n"
        "(gpuprof_nb.compare(run.rank(fast), run.rank(n))). Usual causes: a slower or busier\n"
        "host or GPU (check nvidia-smi, thermal throttling, other jobs), uneven data (longer\n"
        "sequences on that rank: bucket by length), or extra work only it does (logging,\n"
        "checkpointing, evaluation on rank 0: move it off the critical path)."
    ),
    "load_imbalance": (
        "Ranks do unequal work per step, so the fastest wait for the slowest at every\n"
        "collective. Balance the shards (DistributedSampler with drop_last, equal sequence\n"
        "lengths per rank: pack or bucket), and keep rank-only work (logging, metrics,\n"
        "checkpoints) out of the step."
    ),
    "noisy_measurement": (
        "Measure on a steady machine: close other work (other notebooks and kernels, training\n"
        "jobs, builds, browser tabs), then time again with more samples and compare medians:\n"
        "%%gpuprofile --repeat 10\n"
        "If the spread stays wide, look for what changes between runs inside the cell (data\n"
        "loading, caching, allocation) before trusting any one number."
    ),
    "memory_growth": (
        "Something keeps every step's tensors (and their graphs) alive. Store numbers,\n"
        "not tensors: total += loss.item()  (not total += loss), losses.append(loss.detach()),\n"
        "remove hooks you no longer need. If memory is fragmented as well:\n"
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    ),
}


# Fixes for runs without device activity: no CUDA autocast, CUDA graphs or pinned memory,
# which would not apply (or would fail) on a CPU-only run.
CPU_FIXES: dict[FindingKind, str] = {
    "dataloader": (
        "Load batches in worker processes so the model never waits for them:\n"
        "loader = DataLoader(dataset, batch_size=..., num_workers=4,\n"
        "                    persistent_workers=True, prefetch_factor=4)\n"
        "and move heavy Python transforms into tensor ops or cache their results."
    ),
    "launch_overhead": (
        "Fuse the many small ops and give each more work:\n"
        "model = torch.compile(model)   # fusion into few C++ kernels\n"
        "opt = torch.optim.AdamW(model.parameters(), foreach=True)\n"
        "or a larger batch, vectorised code instead of Python loops."
    ),
    "memory_bound": (
        "Fuse elementwise, normalisation and softmax chains so tensors are read once:\n"
        "model = torch.compile(model)\n"
        "and use fused kernels (F.scaled_dot_product_attention); on a CPU with bf16\n"
        'support (AVX-512 BF16/AMX) try: with torch.autocast("cpu", dtype=torch.bfloat16): ...'
    ),
    "memory_growth": (
        "Something keeps every step's tensors (and their graphs) alive. Store numbers,\n"
        "not tensors: total += loss.item()  (not total += loss), losses.append(loss.detach()),\n"
        "remove hooks you no longer need, and run evaluation under torch.no_grad()."
    ),
    "cold_start": (
        "A one-off: the first run pays for lazy initialisation (thread pools, library\n"
        "handles), first allocations and compilation; later runs do not. It matters when\n"
        "this code runs only a few times per process: keep models and compiled functions\n"
        "alive and reuse them, and warm up once at start-up with a representative input."
    ),
    "compute_bound": (
        "Time already goes to large matmuls/convolutions. Next steps: bf16 where the CPU\n"
        'has fast bf16 (with torch.autocast("cpu", dtype=torch.bfloat16): ...; measure it,\n'
        "it is slower on CPUs without AMX/AVX-512 BF16), more threads\n"
        "(torch.set_num_threads), or a GPU."
    ),
}


FP16_FIX = (
    "This GPU has fp16 (not bf16) tensor cores: use fp16 autocast with a gradient scaler:\n"
    'scaler = torch.amp.GradScaler("cuda")\n'
    'with torch.autocast("cuda", dtype=torch.float16):\n'
    "    loss = model(x).loss\n"
    "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"
)


# The memory analysis (analysis/memory/): what to do about each memory finding.
MEMORY_FIXES: dict[str, str] = {
    "oom": (
        "Free what the failing step does not need (del tensors kept from earlier "
        "cells, .item() for logged losses), shrink the batch or use gradient "
        "accumulation, and wrap activations in "
        "torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)."
    ),
    # Added to the oom fix when the allocator held enough cached memory, in pieces.
    "oom_fragmented": (
        " Cached memory was fragmented: set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before importing torch."
    ),
    "fragmentation": (
        "Let segments grow instead of splitting: "
        "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True' before "
        "importing torch. Keep tensor sizes steady across steps (pad to buckets); "
        "call torch.cuda.empty_cache() only between phases, never in the loop."
    ),
    "memory_growth": (
        "Something keeps tensors (and their autograd graphs) alive across steps. "
        "Log numbers, not tensors: losses.append(loss.item()) or loss.detach(); "
        "run evaluation under torch.no_grad(); remove hooks you no longer need."
    ),
    # memory_growth without steps: what the cell left allocated.
    "left_allocated": (
        "Expected for new parameters, optimizer state or results you keep. If it "
        "grows each time the cell runs, something keeps tensors alive: store "
        "loss.item() instead of loss, and del intermediates you no longer need."
    ),
}


def peak_memory_advice(*, optimizer_state_at_peak: bool, cpu: bool = False) -> str:
    """Return the peak_memory fix: the ways to lower a peak, the optimizer's first when its
    state was among what was live at the peak. `cpu`: the memory was the host's (the CPU
    fallback), where CUDA's autocast and allocator settings do not apply."""
    advice = [
        "activation checkpointing: torch.utils.checkpoint.checkpoint(block, x, "
        "use_reentrant=False) recomputes activations in backward instead of keeping them",
        "bf16 autocast where the CPU has fast bf16 (AMX/AVX-512 BF16): with "
        "torch.autocast('cpu', dtype=torch.bfloat16): halves activation memory"
        if cpu
        else "bf16 autocast: with torch.autocast('cuda', dtype=torch.bfloat16): halves "
        "activation memory",
        "8-bit or sharded optimizer state (bitsandbytes AdamW8bit, FSDP); "
        "AdamW(fused=True) avoids temporary copies"
        if optimizer_state_at_peak
        else "8-bit optimizers (bitsandbytes) or AdamW(fused=True) when "
        "optimizer state or its temporaries are large",
    ]
    if not cpu:
        advice.append(
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when reserved memory "
            "runs far above the peak"
        )
    return "To lower the peak: " + "; ".join(advice) + "."
