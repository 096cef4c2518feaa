# agw — run `make help` for the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSTEM := $(VENV)/.system-packages
# Debian packages: bubblewrap contains the _bash_ tool; chromium runs the browser tests;
# postgresql and redis-server back the scale-out state (tests start throwaway servers).
APT_PACKAGES := bubblewrap chromium postgresql redis-server

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q -e clients/python
	touch $(STAMP)

# The Node client's packages (and buf, for the proto lint), from the npm registry.
NODE_MODULES := clients/node/node_modules/.package-lock.json
BUF          := clients/node/node_modules/.bin/buf
$(NODE_MODULES): clients/node/package.json clients/node/package-lock.json
	@command -v npm >/dev/null || { echo "please install Node.js (>= 18) and npm"; exit 1; }
	cd clients/node && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_MODULES)

$(SYSTEM): Makefile | $(STAMP)
	@if command -v bwrap >/dev/null && test -x /usr/bin/chromium \
	  && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v redis-server >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else echo "please install the Debian packages: $(APT_PACKAGES)"; exit 1; fi
	touch $(SYSTEM)

install: $(STAMP) $(SYSTEM) $(NODE_MODULES) ## Create the virtualenv, install the project, the clients and the system packages

run: $(STAMP) ## Start the service on embedded defaults (gRPC :50051, HTTP and page :8080)
	$(PY) -m service

test: install ## Run the whole test suite (checks that gen/ is fresh first)
	$(PY) scripts/gen.py --check
	$(PY) -m pytest -q

gen: $(STAMP) ## Regenerate gen/ from proto/
	$(PY) scripts/gen.py

lint: $(STAMP) lint-proto ## ruff + mypy on our code, the layering contracts, buf lint on proto/
	$(VENV)/bin/ruff check service tests scripts bench clients
	$(VENV)/bin/ruff format --check service tests scripts bench clients
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy clients/python/agw_client
	$(VENV)/bin/lint-imports --no-cache

lint-proto: $(NODE_MODULES) ## buf lint of proto/ (rules and exceptions in buf.yaml)
	$(BUF) lint

bench: install ## Benchmarks: baselines, the gateway, the SSE adapter, 1 vs 2 workers, the memory soak, model routing
	$(PY) -m bench
	$(PY) -m bench.sse
	$(PY) -m bench.replicas
	$(PY) -m bench.workers
	$(PY) -m bench.soak
	$(PY) -m bench.routing

bench-scale: install ## Benchmarks of scale-out: 1 process vs 3 replicas (Postgres + Redis), the Redis hop
	$(PY) -m bench.replicas
	$(PY) -m bench.redis_hop

bench-litellm: install ## The LiteLLM proxy vs the gateway, same paced streams (installs litellm[proxy] in bench/.venv-litellm)
	$(PY) -m bench.litellm

.PHONY: help install run test gen lint lint-proto bench bench-scale bench-litellm
