# Quick start: `make demo` trains and evaluates a small ViT on the embedded dataset; `make test` runs
# the whole test suite. Both set up the virtualenv first (once; later runs only check it): the current
# stack (maintained OpenMMLab forks, newest torch, numpy 2) in .venv, or with `STACK=classic` the upstream
# releases on torch 2.9 with torch_xla (TPUs) in .venv-classic. The set-up compiles nothing;
# `MMCV_OPS=compiled make setup` builds mmcv's operators for this host instead, and `make setup-plan`
# prints what the set-up would do on this host (docs/installation.md).
STACK ?= current
export STACK
VENV ?= $(if $(filter classic,$(STACK)),.venv-classic,.venv)
export VENV
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# `make test` runs test files in parallel, one pytest worker per core up to 4 (each multi-process test
# starts 2 ranks); a file's tests stay together in one worker, in order, and the files go out in the
# order tests/conftest.py gives (longest first, by the durations a whole run records in
# tests/durations.json). PYTEST_JOBS=0: one process.
PYTEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n > 4 ? 4 : n )))

.PHONY: setup demo test bench clean-venv

setup:
	@bash tools/setup_env.sh

.PHONY: setup-plan
setup-plan:
	@bash tools/setup_env.sh --plan

demo: setup
	$(PY) tools/demo.py

test: setup
	$(PY) -m pytest tests -n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

bench: setup
	$(PY) tools/analysis/benchmark.py

clean-venv:
	rm -rf $(VENV)

# `make wheelhouse` (where PyPI is reachable): wheelhouse/ with the wheels of the stack that a host's
# torch does not bring. `make gpu-report` (on a CUDA host): measures the stack and writes
# work_dirs/gpu_report/report.md and report.json; without .venv it makes one from wheelhouse/ beside
# HOST_PYTHON's torch (or runs the set-up). docs/benchmarks.md#gpu-report.
.PHONY: wheelhouse gpu-report
HOST_PYTHON ?= python3
GPU_REPORT_ARGS ?=
# The compiled wheels are for one Python: WHEELHOUSE_ARGS="--python-version 3.12" for a host with 3.12.
WHEELHOUSE_ARGS ?=

wheelhouse: setup
	$(PY) requirements/make_wheelhouse.py build --out wheelhouse $(WHEELHOUSE_ARGS)

gpu-report:
	@if [ ! -x "$(PY)" ]; then \
	  if [ -f wheelhouse/requirements.txt ]; then \
	    $(HOST_PYTHON) requirements/make_wheelhouse.py venv --wheelhouse wheelhouse --venv $(VENV); \
	  else bash tools/setup_env.sh; fi; \
	fi
	$(PY) tools/analysis/gpu_report.py $(GPU_REPORT_ARGS)
