"""Chrome/Kineto trace JSON (torch.profiler `export_chrome_trace`) -> `model.trace.Trace`.

Every format quirk lives here, so analysis sees one shape:

- 2021 Kineto traces: capitalised categories (`Operator`, `Runtime`, `Kernel`, `Memcpy`,
  `Memset`), GPU thread ids like `"stream 7"`, lowercase `'external id'`, `computeProperties`
  instead of `deviceProperties`, and `ProfilerStep#N` / `Optimizer.step#...` recorded as
  `Operator` (they become annotations here, as in newer traces).
- Current traces: `cpu_op`, `user_annotation`, `python_function`, `cuda_runtime`,
  `cuda_driver`, `kernel`, `gpu_memcpy`, `gpu_memset`, `cuda_sync`, `[memory]` instants.
- AMD/ROCm: hip* calls under `cuda_runtime`, the GPU's pid as device, kernel args with `kind`.
- Host thread ids given as digit strings (`"24572"`) become ints, so one thread has one key.
- `gpu_user_annotation` events (record_function ranges on the device's timeline: pid is
  the device, tid the stream) become `Trace.gpu_annotations`.
- Categories we do not model (flows, `fwdbwd`, `cuda_profiler_range`, MTIA runtime events,
  ...) are skipped, but their timed events still count for `Trace.bounds_us`.

Negative durations (seen in truncated Kineto exports) are clamped to 0 and counted in
`Trace.load_warnings`; they never make an interval run backwards.

Three modules, by job:

- load.py: the entry points (`load_trace`, `trace_from_dict`, `save_trace_dict`,
  `copy_trace_file`): opening the file through the guards (a regular file; gzip by its
  magic bytes, bounded against bombs), choosing the decoder, the builder's result.
- decode.py: JSON text -> events. One decoder, msgspec's typed batches; one fallback, the
  standard library's scanner one event at a time; both driven by one stream reader.
- build.py: events -> model objects (`Builder.model_events`, the one place that decides
  what an event becomes, whichever decoder read it), then the Trace.

Why a decoder and a fallback, both behind a stream reader (each measured or required):

- The stream reader decodes the file from a buffer read in chunks, and each event becomes a
  slotted model object at once, so peak memory is the model plus a chunk's worth of events,
  not every event dict (what `json.load` builds): benchmarks/RESULTS.md, "3. Trace
  analysis" (peak columns, the 1 GB trace) and "14. Hostile inputs" (200 MB of NUL padding
  refused after one chunk).
- msgspec decodes the runs of whole events in the buffer in one call each, into light
  structs that hold only the fields the model reads (args: only the keys in _ARG_KEYS;
  nested ones such as shapes and call stacks stay JSON text, converted once per distinct
  text). It is what makes loading faster than `json.load`; the standard-library reader
  alone is several times slower: RESULTS.md, "JSON library choice" (benchmarks/
  json_choice.py: `load_trace` with and without msgspec).
- The standard-library reader stays as the fallback, for what the fast path cannot do: a
  run msgspec refuses (NaN and Infinity, which Python's json writes; bad JSON, where it
  gives the located error message), and everything when msgspec is not installed (it is
  optional at run time). tests/io/test_trace_fast.py checks that both give equal Traces and
  the same error messages on every trace.
"""

from __future__ import annotations

# save_trace_dict and copy_trace_file are for the package's own callers (results/report.py,
# session/profile.py); MAX_TIME_US is the bound on event times.
from gpuprof_nb.io.trace.build import MAX_TIME_US as MAX_TIME_US
from gpuprof_nb.io.trace.load import copy_trace_file as copy_trace_file
from gpuprof_nb.io.trace.load import load_trace, trace_from_dict
from gpuprof_nb.io.trace.load import save_trace_dict as save_trace_dict

__all__ = ["load_trace", "trace_from_dict"]
