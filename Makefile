# agw — run `make help` for the targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTOS := $(shell find proto -name '*.proto')

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## Create the virtualenv and install the project

run: $(STAMP) ## Start the service on embedded defaults (gRPC :50051)
	$(PY) -m service

test: $(STAMP) ## Run the whole test suite (checks that gen/ is fresh first)
	$(PY) scripts/gen.py --check
	$(PY) -m pytest -q

gen: $(STAMP) ## Regenerate gen/ from proto/
	$(PY) scripts/gen.py

lint: $(STAMP) ## ruff + mypy on our code
	$(VENV)/bin/ruff check service tests scripts bench
	$(VENV)/bin/ruff format --check service tests scripts bench
	$(VENV)/bin/mypy

bench: $(STAMP) ## Benchmarks: baselines and the gateway, measured in one run
	$(PY) -m bench

.PHONY: help install run test gen lint bench
