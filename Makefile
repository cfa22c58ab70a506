# The README's two commands: `make run` (the local stack) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_PATHS := shared bbr epp sim bench tests

.PHONY: venv run test lint unit bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(STAMP)

venv: $(STAMP)

## run: start Envoy + BBR + EPP + simulated model servers on loopback, send a demo, keep running
run: venv
	$(VENV)/bin/gateway-stack $(RUN_ARGS)

## test: lint, type-check and the whole default test suite (real Envoy included)
test: venv lint
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy

## bench: the full benchmark suite (minutes); results go to bench/RESULTS.md
bench: venv
	$(PY) -m bench.bbr_overhead

bench-quick: venv
	$(PY) -m bench.bbr_overhead --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
