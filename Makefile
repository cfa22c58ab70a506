# The README's two commands: `make run` (the local stack) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_PATHS := shared modelserver bbr epp sim sidecar bench devkit tests examples/plugin-package

.PHONY: venv run test test-vllm lint bench bench-cpu bench-quick bench-compare bench-compare-quick bench-twin \
	bench-advise bench-twin-quick bench-agreement bench-inference-perf bench-list bench-run bench-report clean

# pip's output (index warnings, setuptools notices) goes to $(VENV)/install.log, so the
# first screen of `make run` shows the stack, not the install; a failure prints its tail.
# The example third-party plugin package is installed too: the tests schedule through it.
$(STAMP): pyproject.toml examples/plugin-package/pyproject.toml
	@echo "setting up $(VENV) (first run only, a few minutes; log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install -q --upgrade pip && \
	   $(PY) -m pip install -q -e '.[test,bench,local]' && \
	   $(PY) -m pip install -q --no-deps --force-reinstall "$$($(PY) -m shared.otelproto)" && \
	   $(PY) -m pip install -q --no-deps -e examples/plugin-package; \
	 } > $(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log; \
	   echo "setting up $(VENV) failed: see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

venv: $(STAMP)

## run: start Envoy + BBR + EPP + simulated model servers on loopback, send a demo, keep running
run: venv
	$(VENV)/bin/gateway-stack $(RUN_ARGS)

## test: lint, type-check and the whole default test suite (real Envoy included): two
## pytest-xdist workers (the tests mostly wait on processes), then the tests that hold a time
## or rate to a bound (marker `serial`) alone, so a neighbour cannot starve them.
test: venv lint
	$(PY) -m pytest -q -n 2 -m "not slow and not serial"
	$(PY) -m pytest -q -m "serial and not slow"

## test-vllm: the gateway in front of real vLLM servers (CPU build, tiny local model); not in
## `make test`. The vLLM venv is cached in .cache/. VLLM_ARGS="--vllm-url http://H:P ..." uses
## servers you run instead (docs/real-vllm.md).
VLLM_VENV ?= .cache/vllm-venv
test-vllm: venv
	bash tests/vllm/setup_venv.sh $(VLLM_VENV)
	$(PY) -m pytest -q -p no:cacheprovider tests/vllm --real-vllm --vllm-venv $(VLLM_VENV) $(VLLM_ARGS)

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy

## bench: gateway overhead (BBR and the EPP against the no-op floor, both body modes), the
## EPP's CPU cost and pick latency (a few minutes); copy figures into bench/RESULTS.md
bench: venv
	$(PY) -m bench.epp_cpu --bbr --tracing
	$(PY) -m bench.epp_cpu --bbr --mode BUFFERED --scrape-pods ''
	$(PY) -m bench.micro pick
	$(PY) -m bench run sim-saturation --real
	$(PY) -m bench run sim-prefix --real

## bench-cpu: the EPP's CPU per request and per streamed token beside the no-op floor, each
## under a 1-CPU budget, and where it goes (py-spy); CPU_ARGS="--cpus 0.5 --save FILE"
bench-cpu: venv
	$(PY) -m bench.epp_cpu --split $(CPU_ARGS)

bench-quick: venv
	$(PY) -m bench.epp_cpu --quick --bbr

## bench-list / bench-run / bench-report: the scenario toolkit (docs/benchmarks.md, top).
## make bench-run SCENARIO=pd RUN_ARGS="--servers 32 --workload my.yaml" (virtual time;
## RUN_ARGS="--real" through Envoy); make bench-report rewrites RESULTS.md's generated sections
SCENARIO ?= shared-prefix
bench-list: venv
	$(PY) -m bench list

bench-run: venv
	$(PY) -m bench run $(SCENARIO) $(RUN_ARGS)

bench-report: venv
	$(PY) -m bench report $(REPORT_ARGS)

## bench-compare: routing quality vs Envoy and the peer routers in real time: the four routing
## scenarios, 5 seeds x 8 servers, medians and 95% intervals (~85 min on 2 shared CPUs; saved
## and put in RESULTS.md); COMPARE_ARGS="--seeds 2 --contenders envoy-rr,epp-tuned" narrows it
COMPARE_SCENARIOS ?= shared-prefix lora sharegpt bursts
bench-compare: venv
	$(PY) -m bench.peers install
	for s in $(COMPARE_SCENARIOS); do \
	  $(PY) -m bench run $$s --real --save $(COMPARE_ARGS) || exit 1; \
	done
	$(PY) -m bench report

## bench-compare-quick: the CI smoke of real time (every contender, one short run each)
bench-compare-quick: venv
	$(PY) -m bench run smoke --real

## bench-twin: the routing scenarios in virtual time, real EPP scheduler (4 workloads x 10 seeds
## x {8, 32} servers, saved and put in RESULTS.md); TWIN_ARGS="--contenders envoy-rr,epp-tuned"
## narrows every run. Your own config on your fleet: a scenario of your own (docs/benchmarks.md)
## Then the P/D split advisor (bench-advise) answers "which P:D split for this workload and SLO".
TWIN_SCENARIOS ?= shared-prefix lora sharegpt bursts
bench-twin: venv
	for s in $(TWIN_SCENARIOS); do for n in 8 32; do \
	  $(PY) -m bench run $$s --virtual --seeds 10 --servers $$n --save $(TWIN_ARGS) || exit 1; \
	done; done
	$(PY) -m bench report
	$(PY) -m bench advise $(ADVISE_SCENARIO) $(ADVISE_ARGS)

## bench-advise: which prefill:decode split gives the most SLO goodput (docs/pd.md, "Which
## split"); ADVISE_SCENARIO=my-scenario.yaml ADVISE_ARGS="--servers 8 --tpot-ms 25" for yours
ADVISE_SCENARIO ?= pd-split
bench-advise: venv
	$(PY) -m bench advise $(ADVISE_SCENARIO) $(ADVISE_ARGS)

bench-twin-quick: venv
	$(PY) -m bench run shared-prefix --virtual --seeds 2 --duration 10

## bench-agreement: twin vs the real-time stack on a short live case (< 1 min); with
## AGREEMENT_ARGS="--from-run .cache/bench-compare/<ts>" it replays a saved full comparison
bench-agreement: venv
	$(PY) -m bench.twin.agreement $(AGREEMENT_ARGS)

## bench-inference-perf: inference-perf (own Python >= 3.12 venv, local tokenizer) against a
## running `make run`; IP_ARGS="--workload sharegpt --rate 4 --duration 30"
bench-inference-perf: venv
	$(PY) -m bench.inference_perf install
	$(PY) -m bench.inference_perf run $(IP_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
