# Quick start: `make demo` trains and evaluates a small ViT on the embedded dataset; `make test` runs
# the whole test suite. Both set up .venv first (once; later runs only check it). The set-up compiles
# nothing; `MMCV_OPS=compiled make setup` builds mmcv's operators for this host instead, and
# `make setup-plan` prints what the set-up would do on this host (docs/installation.md).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean-venv

setup:
	@bash tools/setup_env.sh

.PHONY: setup-plan
setup-plan:
	@bash tools/setup_env.sh --plan

demo: setup
	$(PY) tools/demo.py

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: setup
	$(PY) tools/analysis/benchmark.py

clean-venv:
	rm -rf $(VENV)
