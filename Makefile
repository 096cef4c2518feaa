# agw — run `make help` for the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSTEM := $(VENV)/.system-packages
# Debian packages: bubblewrap contains the _bash_ tool; chromium runs the browser tests.
APT_PACKAGES := bubblewrap chromium

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

$(SYSTEM): Makefile | $(STAMP)
	@if command -v bwrap >/dev/null && test -x /usr/bin/chromium; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	else echo "please install the Debian packages: $(APT_PACKAGES)"; exit 1; fi
	touch $(SYSTEM)

install: $(STAMP) $(SYSTEM) ## Create the virtualenv, install the project and its system packages

run: install ## Start the service on embedded defaults (gRPC :50051)
	$(PY) -m service

test: install ## Run the whole test suite (checks that gen/ is fresh first)
	$(PY) scripts/gen.py --check
	$(PY) -m pytest -q

gen: $(STAMP) ## Regenerate gen/ from proto/
	$(PY) scripts/gen.py

lint: $(STAMP) ## ruff + mypy on our code
	$(VENV)/bin/ruff check service tests scripts bench
	$(VENV)/bin/ruff format --check service tests scripts bench
	$(VENV)/bin/mypy

bench: install ## Benchmarks: baselines and the gateway, measured in one run
	$(PY) -m bench

.PHONY: help install run test gen lint bench
