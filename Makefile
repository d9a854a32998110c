# gpuprof_nb: everything the project needs, installed by the project itself.
# Override any variable on the command line, e.g. `make test TORCH_VERSION=2.14.1`.

PYTHON        ?= python3
VENV          ?= .venv
# The tested torch release, pinned here and nowhere else.
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for installing torch, e.g. `--index-url <a CPU-only wheel index>`
# on a machine without a GPU where the default index serves CUDA builds.
TORCH_PIP_ARGS ?=
export KINETO_LOG_LEVEL ?= 6
export MPLBACKEND ?= Agg
export PYTHONHASHSEED ?= 0

BIN   := $(VENV)/bin
PY    := $(BIN)/python
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: all venv install test unit notebooks lint demo lab bench browser-deps clean gpu-wheels \
	gpu-check

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first and on its own, so the package's `torch>=...` requirement is already met
# and pip never reaches for a different (multi-GB CUDA) build.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[test,browser,distributed]"
	touch $@

venv install: $(STAMP)

# The whole suite: unit tests per layer, the browser test, and nbval on every tutorial.
test: $(STAMP) browser-deps
	$(BIN)/ruff check gpuprof_nb tests benchmarks tools
	$(BIN)/ruff format --check gpuprof_nb tests benchmarks tools
	$(BIN)/pytest -p no:cacheprovider tests tutorials --nbval-lax -q -rs

# Debian's chromium for the browser test (needs root for apt-get; skipped otherwise).
browser-deps:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "browser-deps: could not install chromium; the browser test will say why"; \
	else echo "browser-deps: no /usr/bin/chromium and no root for apt-get; the browser test will be skipped"; fi

lint: $(STAMP)
	$(BIN)/ruff check gpuprof_nb tests benchmarks tools
	$(BIN)/ruff format --check gpuprof_nb tests benchmarks tools
	$(BIN)/mypy

demo: $(STAMP)
	@mkdir -p build
	$(BIN)/jupyter nbconvert --to notebook --execute tutorials/01_quickstart.ipynb \
	  --output-dir build --output 01_quickstart.executed.ipynb --ExecutePreprocessor.timeout=600
	$(BIN)/jupyter nbconvert --to html build/01_quickstart.executed.ipynb \
	  --output-dir build --output 01_quickstart
	@echo "executed notebook: $(CURDIR)/build/01_quickstart.executed.ipynb"
	@echo "standalone HTML:   $(CURDIR)/build/01_quickstart.html"

lab: $(STAMP)
	$(BIN)/jupyter lab tutorials/

# Benchmarks (writes benchmarks/RESULTS.md). HolisticTraceAnalysis gets its own venv under
# benchmarks/.cache (git-ignored), never the test venv. pyinstrument (pinned; not a
# dependency of the package or its tests) goes into $(PY) for section 11, which measures its
# sampler beside the profiled run. A shorter run:
# `make bench BENCH_ARGS="--big-trace-mb 256 --big-snapshot-mb 256 --repeats 3"`.
bench: $(STAMP)
	$(PY) -m pip install --quiet "pyinstrument==5.1.3"
	@test -f benchmarks/.cache/venv-bench/.hta-0.5.0 || { \
	  $(PYTHON) -m venv benchmarks/.cache/venv-bench && \
	  benchmarks/.cache/venv-bench/bin/pip install --quiet \
	    "HolisticTraceAnalysis==0.5.0" "orjson==3.13.0" && \
	  touch benchmarks/.cache/venv-bench/.hta-0.5.0; }
	$(PY) benchmarks/run.py --hta-python benchmarks/.cache/venv-bench/bin/python $(BENCH_ARGS)

# The GPU truth pass on a lent GPU machine (docs/gpu-results.md). Its image has torch but not
# the notebook stack, and reaches no package index: `make gpu-wheels` here fills .whl/
# (git-ignored) with what it lacks (tools/gpu-requirements.txt and their dependencies) for its
# Python on x86-64; `make gpu-check` there, or `bash tools/gpu_check.sh OUT` where make is
# missing, installs them, records the GPU fixtures and runs the whole suite. On CPU it runs
# the same steps and skips what needs CUDA.
GPU_PYTHON_VERSION ?= 3.12
GPU_OUT ?= build/gpu-check
GPU_PLATFORMS := manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
	manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64

gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download --quiet --only-binary=:all: --implementation cp \
	  --python-version $(GPU_PYTHON_VERSION) $(addprefix --platform ,$(GPU_PLATFORMS)) \
	  -d .whl -r tools/gpu-requirements.txt
	@echo "$$(ls .whl | wc -l) wheels, $$(du -sh .whl | cut -f1), in .whl/"

gpu-check:
	PYTHON=$(if $(wildcard $(PY)),$(PY),python3) bash tools/gpu_check.sh $(GPU_OUT)

clean:
	rm -rf build .pytest_cache
