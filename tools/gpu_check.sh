#!/usr/bin/env bash
# The GPU truth pass in one command (`make gpu-check`), for a lent GPU machine; rehearsed on
# CPU it runs the same steps and the CUDA-only parts skip.
#
#   bash tools/gpu_check.sh OUT [RECORD_DIR]
#
# 1. installs what the image lacks from .whl/ (filled here by `make gpu-wheels`; nothing can
#    be downloaded there);
# 2. writes OUT/env.txt (nvidia-smi, Python, torch, packages);
# 3. records the planted traces, snapshots and figures (tools/record_gpu.py) into RECORD_DIR
#    (default OUT/record) and packs them into OUT/record.tar.gz;
# 4. runs the `gpu`-marked tests one at a time (they time the device), OUT/pytest-gpu.log;
# 5. (only when asked, STEPS="... fit") runs tools/gpu_fit_check.py into OUT/fit (issue 37);
#    (only when asked, STEPS="... modules") runs tools/gpu_modules_check.py into OUT/modules
#    (issue 35: device time per module, MFU against measured ceilings, CUDA graph replays);
#    (only when asked, STEPS="... graph") records a CUDA graph's capture and replay traces and a
#    directly launched Triton kernel (tools/record_graph_capture.py) into RECORD_DIR/graph;
#    (only when asked, STEPS="... bench") measures comparison 10 of the benchmarks, the magic
#    on a real training cell, on the GPU: OUT/RESULTS-gpu.md (benchmarks/run.py --device cuda);
# 6. runs the whole suite and every tutorial through nbval, OUT/pytest-all.log (on
#    pytest-xdist workers where it is installed, one test file per worker).
# Each step has a time limit (RECORD_TIMEOUT, GPU_TESTS_TIMEOUT, SUITE_TIMEOUT, BENCH_TIMEOUT
# seconds) so a short lease still brings back what finished; OUT/summary.txt says how each
# step ended. STEPS (default "record gpu suite") picks steps 3 to 6; install and env always run.
set -u
OUT=${1:-build/gpu-check}
RECORD_DIR=${2:-$OUT/record}
PY=${PYTHON:-python3}
STEPS=" ${STEPS:-record gpu suite} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
mkdir -p "$OUT" "$RECORD_DIR"
export KINETO_LOG_LEVEL=6 MPLBACKEND=Agg PYTHONHASHSEED=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

if "$PY" -c "import IPython, ipywidgets, ipykernel, nbval, nbconvert, msgspec, isal, distributed" \
    2>/dev/null; then
  note "install: the notebook stack is already there"
elif ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --find-links .whl --no-compile \
    -r tools/gpu-requirements.txt > "$OUT/pip.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    # The image's environment is not writable: every wheel into a folder of its own instead.
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      >> "$OUT/pip.log" 2>&1
    rc=$?
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  note "install from .whl: rc=$rc"
else
  note "install: the notebook stack is missing and .whl/ is empty (run make gpu-wheels here)"
fi

{
  date -u
  nvidia-smi 2>&1 || echo "no nvidia-smi"
  "$PY" - <<'PY'
import sys
import torch
print("python", sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
      torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, p.total_memory, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs")
PY
  "$PY" -m pip list 2>/dev/null
} > "$OUT/env.txt" 2>&1
note "env: $(grep -m1 '^torch' "$OUT/env.txt")"

if want record; then
  timeout "${RECORD_TIMEOUT:-300}" "$PY" tools/record_gpu.py "$RECORD_DIR" ${RECORD_ARGS:-} \
    > "$OUT/record.log" 2>&1
  note "record: rc=$? ($(tail -1 "$OUT/record.log"))"
  tar czf "$OUT/record.tar.gz" -C "$RECORD_DIR" .
fi

if want graph; then
  # (only when asked, STEPS="... graph") the real traces issue 38's offline parts wait for:
  # a CUDA graph's capture and replay, and a Triton kernel launched directly.
  timeout "${GRAPH_TIMEOUT:-180}" "$PY" tools/record_graph_capture.py "$RECORD_DIR/graph" \
    > "$OUT/graph.log" 2>&1
  note "graph: rc=$? ($(tail -1 "$OUT/graph.log"))"
fi

if want gpu; then
  timeout "${GPU_TESTS_TIMEOUT:-180}" "$PY" -m pytest -p no:cacheprovider -m gpu tests \
    -q -rs -v > "$OUT/pytest-gpu.log" 2>&1
  note "gpu tests: rc=$? ($(tail -1 "$OUT/pytest-gpu.log"))"
fi

if want fit; then
  # Issue 37: will it fit on CUDA snapshots (tools/gpu_fit_check.py; about a minute).
  timeout "${FIT_TIMEOUT:-150}" "$PY" tools/gpu_fit_check.py "$OUT/fit" > "$OUT/fit.log" 2>&1
  note "fit: rc=$? ($(tail -1 "$OUT/fit.log"))"
fi

if want modules; then
  # Issue 35: modules, MFU and CUDA graphs on the device (tools/gpu_modules_check.py).
  timeout "${MODULES_TIMEOUT:-180}" "$PY" tools/gpu_modules_check.py "$OUT/modules" \
    > "$OUT/modules.log" 2>&1
  note "modules: rc=$? ($(tail -1 "$OUT/modules.log"))"
fi

if want bench; then
  GPUPROF_BENCH_SAVE_TRACE="$OUT/training_cell.json.gz" \
    timeout "${BENCH_TIMEOUT:-240}" "$PY" benchmarks/run.py --only training --device cuda \
    --out "$OUT/RESULTS-gpu.md" --cache-dir "$OUT/bench-cache" > "$OUT/bench.log" 2>&1
  note "bench: rc=$? ($(tail -1 "$OUT/bench.log"))"
fi

if want suite; then
  workers=()
  if "$PY" -c "import xdist" 2>/dev/null; then
    workers=(-n "${JOBS:-4}" --dist loadfile)
  fi
  OMP_NUM_THREADS=${SUITE_THREADS:-2} timeout "${SUITE_TIMEOUT:-300}" "$PY" -m pytest \
    -p no:cacheprovider tests tutorials --nbval-lax -q -rfEs -m "not gpu" "${workers[@]}" \
    > "$OUT/pytest-all.log" 2>&1
  note "suite: rc=$? ($(tail -1 "$OUT/pytest-all.log"))"
fi
