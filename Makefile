# agw — run `make help` for the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSTEM := $(VENV)/.system-packages
# Debian packages: bubblewrap contains the _bash_ tool; chromium runs the browser tests;
# postgresql and redis-server back the scale-out state (tests start throwaway servers);
# haproxy is the gRPC load balancer of the rolling-restart test.
APT_PACKAGES := bubblewrap chromium haproxy postgresql redis-server

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
	  && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v redis-server >/dev/null \
	  && command -v haproxy >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else echo "please install the Debian packages: $(APT_PACKAGES)"; exit 1; fi
	touch $(SYSTEM)

install: $(STAMP) $(SYSTEM) $(NODE_MODULES) ## Create the virtualenv, install the project, the clients and the system packages

run: $(STAMP) ## Start the service on embedded defaults (gRPC :50051, HTTP and page :8080)
	$(PY) -m service

test: install ## Run the whole test suite (checks that gen/ is fresh first), then build the docs site strictly
	$(PY) scripts/gen.py --check
	$(PY) -m pytest -q
	$(MKDOCS) build --strict --quiet

# The documentation site (mkdocs.yml; docs/ built into build/site/, git-ignored).
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(STAMP) ## Build the documentation site from docs/ into build/site/ (--strict: broken links fail)
	$(MKDOCS) build --strict

gen: $(STAMP) ## Regenerate gen/ from proto/
	$(PY) scripts/gen.py

# The web page's browser libraries (marked, DOMPurify, highlight.js), vendored under
# service/gateway/static/vendor/ and committed: `make run` needs no network.
vendor: $(STAMP) ## Refresh the page's vendored libraries from npm (pinned in scripts/vendor/package.json)
	@command -v npm >/dev/null || { echo "please install Node.js (>= 18) and npm"; exit 1; }
	cd scripts/vendor && npm ci --no-audit --no-fund --loglevel=error
	$(PY) scripts/vendor.py

lint: $(STAMP) lint-proto ## ruff + mypy on our code, the layering contracts, buf lint on proto/
	$(VENV)/bin/ruff check service tests scripts bench clients
	$(VENV)/bin/ruff format --check service tests scripts bench clients
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy clients/python/agw_client
	$(VENV)/bin/lint-imports --no-cache

lint-proto: $(NODE_MODULES) ## buf lint of proto/ (rules and exceptions in buf.yaml)
	$(BUF) lint

bench: install ## Benchmarks (about 12 min): baselines, the gateway, the SSE adapter, 1 vs 3 replicas, 1 vs 2 workers, the memory soak, model routing, durable runs
	@echo "make bench: about 12 minutes on 2 cores (make bench-quick: a 1-minute smoke run)"
	$(PY) -m bench
	$(PY) -m bench.sse
	$(PY) -m bench.replicas
	$(PY) -m bench.workers
	$(PY) -m bench.soak
	$(PY) -m bench.routing
	$(PY) -m bench.durability --out bench/results/durability.json

# The same modules with tiny sizes: checks that they run, figures not representative.
QUICK_OUT := bench/results/quick
bench-quick: install ## The benchmarks with tiny sizes (about 1 min): a smoke run, results in bench/results/quick/
	@echo "make bench-quick: about 1 minute; figures of tiny sizes, not representative"
	$(PY) -m bench --quick --out $(QUICK_OUT)/latest.json
	$(PY) -m bench.sse --burst-events 500 --streams 4 --paced-events 50 --repeats 1 --codec-rounds 2000
	$(PY) -m bench.replicas --streams 3 --deltas 20 --rounds 1 --out $(QUICK_OUT)/replicas.json
	$(PY) -m bench.workers --quick --rounds 1 --out $(QUICK_OUT)/workers.json
	$(PY) -m bench.soak --quick
	$(PY) -m bench.routing --calls 2000 --deltas 50 --rounds 1 --failover-calls 10
	$(PY) -m bench.durability --quick --out $(QUICK_OUT)/durability.json

bench-scale: install ## Benchmarks of scale-out (about 1 min): 1 process vs 3 replicas (Postgres + Redis), the Redis hop
	$(PY) -m bench.replicas
	$(PY) -m bench.redis_hop

bench-litellm: install ## The LiteLLM proxy vs the gateway, same paced streams (installs litellm[proxy] in bench/.venv-litellm)
	$(PY) -m bench.litellm

.PHONY: help install run test docs vendor gen lint lint-proto bench bench-quick bench-scale bench-litellm
