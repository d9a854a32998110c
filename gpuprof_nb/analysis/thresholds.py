"""The numbers the idle-time breakdown and the diagnosis rules compare against, in one place.

Each constant says why it has its value. Shares are fractions of the profiled window (or of
the steps, when the trace has steps); durations are microseconds; sizes are bytes.
"""

from __future__ import annotations

# --- idle-time breakdown -------------------------------------------------------------------

# A device gap shorter than this between two kernels is launch latency, not a stall: one
# cudaLaunchKernel costs about 5-10 us of host time, so a host that launches back to back
# still leaves gaps of a few microseconds; anything up to ~20 us is the launch path itself.
LAUNCH_GAP_MAX_US = 20.0

# On a CPU-only trace a gap between two torch ops shorter than this is dispatcher and
# interpreter cost of issuing the next op (a Python statement calling one op costs a few
# microseconds); longer gaps are the user's own Python.
CPU_DISPATCH_GAP_MAX_US = 20.0

# A device gap that starts within this long after a blocking synchronisation returned was
# caused by it: the sync drained the queue and the host had nothing in flight. The slack
# covers the few microseconds between the kernel's end and the runtime call returning.
SYNC_SLACK_US = 50.0

# --- reporting ------------------------------------------------------------------------------

# A finding is reported when fixing it could recover at least this share of the time: below
# 3% the gain drowns in run-to-run noise (notebook timings vary by a few percent).
MIN_REPORT_SHARE = 0.03

# Severity from the recoverable share: a third of the time or more is the first thing to fix;
# a tenth is worth a change; below that it is a detail.
SEVERITY_HIGH_SHARE = 0.30
SEVERITY_MEDIUM_SHARE = 0.10

# Without a clear bottleneck (no finding at medium or above) the diagnosis says so.

# --- launch overhead ------------------------------------------------------------------------

# GPU kernels shorter than this are dominated by launch cost (a launch costs 5-10 us on the
# host, so the device finishes them before the host can issue the next one).
TINY_KERNEL_US = 10.0

# CPU ops shorter than this spend most of their time in dispatch (argument parsing,
# dispatcher, allocation: several microseconds each, more under the profiler), not in math.
TINY_CPU_OP_US = 50.0

# Fewer kernels than this per step cost well under a millisecond of launches (5-10 us each):
# below it, "many small kernels" is not the story even when each kernel is tiny.
MIN_KERNELS_FOR_OVERHEAD = 50

# Fewer ops than this per step cannot make a cell overhead-bound whatever their size.
MIN_OPS_FOR_OVERHEAD = 200

# --- memory-bound / compute-bound / precision -------------------------------------------------

# Fusion (torch.compile, fused kernels) typically halves the time of chains of elementwise
# and normalisation ops: they read and write the same tensors once instead of once per op.
MEMORY_BOUND_RECOVERABLE = 0.5

# Matmuls and convolutions taking at least half of the busy time make a cell compute-bound.
COMPUTE_BOUND_MIN_SHARE = 0.5

# bf16/fp16 tensor cores run GEMMs 2x or more faster than fp32 (TF32 included), so moving
# fp32 GEMMs to bf16 recovers about half of their time.
PRECISION_RECOVERABLE = 0.5

# Tensor cores that run bf16 arrived with compute capability 8.0 (Ampere); fp16 with 7.0.
PRECISION_MIN_CC = (7, 0)
BF16_MIN_CC = (8, 0)

# --- dtype casts ------------------------------------------------------------------------------

# A handful of casts per step is normal (inputs, loss); this many or more is a round-trip.
DTYPE_CAST_MIN_PER_STEP = 8

# --- host-device copies -----------------------------------------------------------------------

# Pinned host memory reaches ~20 GB/s over PCIe 4; pageable copies rarely pass ~6 GB/s.
# Below this effective bandwidth the copies are worth moving to pinned memory.
PINNED_BANDWIDTH_BYTES_PER_S = 10e9

# --- cold start -------------------------------------------------------------------------------

# A first run more than twice the median is a cold start (allocation, autotuning, compile),
# beyond the usual first-run jitter of tens of percent.
COLD_START_RATIO = 2.0

# A host op this long (100 ms) with the device idle, that is the only call of its name or at
# least COLD_OP_RATIO times its other calls, is one-time setup: lazy CUDA context creation
# in the first .to("cuda"), cuDNN autotuning in the first convolution, first allocations.
COLD_OP_MIN_US = 100_000.0
COLD_OP_RATIO = 10.0

# The profiler's own start-up: the first op of a CUDA profiling window waits for CUPTI's first
# launches, milliseconds before its first kernel against tens of microseconds for the same op
# later (benchmarks/RESULTS.md, "Measurements behind design choices", M4).
# The window's first op counts as setup when it ran before any kernel, took at least this long,
# and at least COLD_OP_RATIO times its other calls with the same inputs.
PROFILER_START_MIN_US = 1_000.0

# --- memory growth ----------------------------------------------------------------------------

# Allocated memory rising by less than this over the cell is allocator noise (block rounding,
# cached workspaces), not a leak.
MIN_GROWTH_BYTES = 1 << 20

# Growth counts as steady when the level rises in at least this share of step-to-step moves
# (a real leak rises in most steps, even when the allocator now and then reuses a freed block;
# a cache warming up rises once and stops).
GROWTH_RISING_SHARE = 0.6

# Without steps the memory events are cut into this many slices of equal event counts to
# watch the level move (enough points to see a trend, few enough to span whole iterations).
GROWTH_SLICES = 8

# --- distributed runs -------------------------------------------------------------------------

# A rank is a straggler when the others wait for it at collectives. A call ends on every rank
# together, so the rank that arrives last has the shortest call: a straggler's calls are
# shorter than its peers' median in most calls (this fraction of them; in a balanced run
# each rank is shorter about half the time) ...
STRAGGLER_MIN_LEAD_CALLS = 0.75

# ... by a median of this share of a step or more (less is not worth chasing) ...
STRAGGLER_MIN_WAIT_SHARE = 0.05

# ... and, with 3 ranks or more, by this many times the run's own noise: the median size of
# the other ranks' leads over each other (on a busy host single calls move by several ms on
# any rank). Over 24 balanced 4-rank gloo runs on the 2-core machine the largest median
# lead of any rank was 1.2x that noise; over 12 runs with a rank planted 50 ms slow per step
# the slow rank's was 2.6x to 22x. The bar sits between (their geometric mean).
STRAGGLER_MIN_LEAD_OVER_NOISE = 1.75

# ... over at least this many calls matched on every rank (fewer cannot tell a pattern).
STRAGGLER_MIN_MATCHED_CALLS = 3

# Compute per step differing by this fraction of the median between the busiest and the
# idlest rank is a load imbalance worth reporting.
LOAD_IMBALANCE_MIN_SPREAD = 0.10

# --- noisy measurements (analysis/noise.py) ---------------------------------------------------

# Timed samples whose slowest took more than this many times the fastest were not measured
# on a steady machine: on a quiet one the samples of a cell agree within a few percent, and
# a spread this wide means the clock, the caches or other work changed under the cell
# (model/timing.NOISY_RATIO, the same figure the timing line warns at).
NOISY_SAMPLE_SPREAD = 1.5

# Other processes kept this share of the machine's CPU cores busy, on average, while the
# cell ran (per-core busy time less this process's own): from half the machine on, the
# cell's threads share cores with other work, and on a small machine every op can be
# delayed (a 2-core VM with one other busy process reads 0.5).
NOISY_OTHER_WORK_SHARE = 0.5

# The cell's thread waited this share of its run for a core while other processes ran (the
# line events read the scheduler's run delay, Linux): its times then count someone else's
# work.
NOISY_WAITED_SHARE = 0.1

# compare: the cell's thread waited for a core this much more of its timed runs on one side
# than on the other (Linux's run delay, measured around the timed samples): that much of the
# difference is other processes' doing (a 10% wait stretches the run by 1 / 0.9 = 1.11x).
NOISY_WAITED_CHANGE = 0.1

# compare, where the wait is not measured: other processes held this much more of the
# machine's cores during one side than during the other: the machine changed between the two
# runs by as much as a quarter of its cores, which on a small machine moves a cell's time by a
# third or more (1 / (1 - 0.25)).
NOISY_OTHER_WORK_CHANGE = 0.25

# A noisy measurement is a high-severity finding from a spread this wide, or with other work
# holding this much of the machine: numbers that far off can reorder every other finding.
NOISY_HIGH_SPREAD = 3.0
NOISY_HIGH_OTHER_WORK_SHARE = 0.75

# --- compare ----------------------------------------------------------------------------------

# A difference is said to look like noise when at least this share of it lies in ops and
# kernels both sides ran the same number of times under the same names: the user's change
# left them as they were, so their times moving says the machine's speed moved.
SHARED_UNCHANGED_SHARE = 0.5

# The most timed samples a side is told to take to settle a comparison: past it, the noise
# is drift between runs (other work, clocks), which more samples of one run do not remove.
MAX_RUNS_TO_SETTLE = 200
