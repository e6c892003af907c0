# kgrade: `make run` and `make test` each do all set-up from a fresh clone.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1
STAMP := $(VENV)/.kgrade-installed
# Where make test keeps its PostgreSQL and Redis (started by deploy/dev/services.sh).
TEST_ENV := var/test-services.env
# Browser assets: npm packages pinned in frontend/package-lock.json, built by frontend/build.mjs.
FRONTEND := frontend
VENDOR := service/static/vendor
NPM_STAMP := $(FRONTEND)/node_modules/.kgrade-npm
ASSETS_STAMP := $(VENDOR)/.built

.PHONY: help install assets run test services stop-services lint format clean deploy-check

help:
	@echo "make run    set up, migrate and serve kgrade on http://$(HOST):$(PORT) (SQLite)"
	@echo "make test   set up, start PostgreSQL/Redis, run the whole suite"
	@echo "make lint   ruff check + format check"
	@echo "make assets npm ci + build the pinned browser assets into $(VENDOR)/ (part of set-up)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: pip then takes the CPU build from local disk, and the project's
# `torch>=2.4` is already satisfied instead of pulling a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# npm ci only when the lock changed; the build only when its inputs did. npm ci empties
# node_modules first, so the stamp inside it goes with it.
$(NPM_STAMP): $(FRONTEND)/package-lock.json $(FRONTEND)/package.json
	@command -v npm >/dev/null && command -v node >/dev/null || { \
	  echo "error: npm/node not found: install Debian's nodejs and npm (apt-get install -y nodejs npm)" >&2; \
	  exit 1; }
	cd $(FRONTEND) && npm ci --no-audit --no-fund
	touch $@

$(ASSETS_STAMP): $(NPM_STAMP) $(FRONTEND)/build.mjs $(wildcard $(FRONTEND)/src/*)
	node $(FRONTEND)/build.mjs
	touch $@

assets: $(ASSETS_STAMP)

install: $(STAMP) assets

run: install
	$(BIN)/kgrade serve --host $(HOST) --port $(PORT)

services: install
	deploy/dev/services.sh start $(TEST_ENV)

stop-services:
	deploy/dev/services.sh stop $(TEST_ENV)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install services lint
	set -a; source $(TEST_ENV); set +a; \
	KGRADE_REQUIRE_SERVICES=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The compose stack for real: build the image, bring up API, migrate, Redis, PostgreSQL and a CPU
# worker, smoke-test them, tear down. Needs a Docker engine; not part of `make test` (minutes).
# docs/deploy-check.md records a run.
deploy-check: install
	deploy/check/run.sh

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: stop-services
	rm -rf $(VENV) var build *.egg-info .pytest_cache .ruff_cache $(FRONTEND)/node_modules $(VENDOR)
