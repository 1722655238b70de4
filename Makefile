# Quick start: `make demo` trains and evaluates a small ViT on the embedded dataset; `make test` runs
# the whole test suite. Both set up .venv first (once; later runs only check it).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean-venv

setup:
	@bash tools/setup_env.sh

demo: setup
	$(PY) tools/demo.py

test: setup
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: setup
	$(PY) tools/analysis/benchmark.py

clean-venv:
	rm -rf $(VENV)
