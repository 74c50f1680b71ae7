# floodwall: `make demo` and `make test` work on a fresh Debian machine as root.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RABBIT := /usr/lib/rabbitmq/bin/rabbitmq-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all demo test unit integration lint bench deps clean

all: test

# --- what is installed ---------------------------------------------------------------
$(RABBIT):
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		rabbitmq-server

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo]'
	touch $@

deps: $(RABBIT) $(VENV)/.installed

# --- the two commands ----------------------------------------------------------------
demo: deps
	$(PY) -m proxy.demo

test: deps lint
	# pytest's exit code 5 (no tests collected) is a failure like any other non-zero code.
	$(PY) -m pytest -q -p no:cacheprovider; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; exit $$rc

# --- parts ---------------------------------------------------------------------------
unit: $(VENV)/.installed
	$(PY) -m pytest -q --ignore=tests/integration

integration: deps
	$(PY) -m pytest -q tests/integration

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check proxy tests bench
	$(VENV)/bin/mypy

bench: deps
	$(PY) -m bench.relay

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
